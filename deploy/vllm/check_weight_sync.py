"""Check a live policy server's weight sync against a plain ``transformers`` forward pass.

What the trainer relies on, checked on the server the stack will actually use (vLLM, or our CPU server):

1. ``base``: the served model's sampled-token logprobs equal a forward pass over the same ids;
2. ``reload``: after ``update_weights_from_path`` (how the rollout loads a full-weight publish: pause, collective_rpc,
   prefix-cache reset, resume) they equal the forward pass of the *new* weights;
3. ``lora``: a request naming a hot-loaded adapter gets the adapter's logprobs (``peft`` forward);
4. ``restore``: reloading the original weights and unloading the adapter gives back step 1's tokens.

    python -m deploy.vllm.check_weight_sync --url http://localhost:8002 --model DIR \\
        --weights OTHER_WEIGHTS_DIR [--adapter PEFT_DIR] [--out result.json]

``--model`` is the folder the server was started with (config, tokenizer, weights); ``--weights`` a folder of
safetensors for the same architecture with different values (a later checkpoint); both must be readable by
the server at the same paths. Sampling is seeded (temperature 1), so each step compares the tokens the server
chose, under the weights it claims to have. Exit status 0 when every step is within ``--tol``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from services.rollout.loader import load_into, unload_from  # the one way weights get in
from shared.inference_sync import SyncInferenceClient

ADAPTER_NAME = "sync-check"


def load_reference(model_dir: str, weights_dir: str | None = None, adapter: str | None = None):
    """The served architecture with ``weights_dir``'s tensors (default: the model's own), optionally + LoRA."""
    import torch
    from transformers import AutoModelForCausalLM

    from shared.vllm_worker_extension import iter_tensors, safetensors_files

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if weights_dir:
        state = dict(iter_tensors(safetensors_files(weights_dir)))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:  # tied heads are not saved
            raise SystemExit(f"{weights_dir} does not fit {model_dir}: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def forward_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    lp = logits.log_softmax(-1)[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    return lp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1).tolist()


class Checker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client = SyncInferenceClient(args.url, timeout=args.timeout)
        self.base = self.client.models()[0].id
        self.rows: list[dict[str, Any]] = []

    def sample(self, model: str) -> tuple[list[int], list[float]]:
        out = self.client.complete(
            model, self.args.prompt, max_tokens=self.args.max_tokens, temperature=1.0, seed=self.args.seed
        )
        choice = out.choices[0]
        return list(choice.token_ids), list(choice.logprobs or [])

    def compare(self, step: str, served_as: str, reference) -> list[int]:
        tokens, served = self.sample(served_as)
        ours = forward_logprobs(reference, self.args.prompt, tokens)
        diff = max((abs(a - b) for a, b in zip(served, ours, strict=True)), default=0.0)
        row = {
            "step": step,
            "model": served_as,
            "tokens": len(tokens),
            "max_abs_diff": diff,
            "mean_logprob": sum(served) / max(len(served), 1),
            "ok": bool(tokens) and diff <= self.args.tol,
        }
        self.rows.append(row)
        print(
            f"{step:8s} {served_as:12s} {len(tokens):3d} tokens  max |server − forward| = {diff:.2e}  "
            f"mean logprob {row['mean_logprob']:.3f}  {'ok' if row['ok'] else 'FAIL'}",
            flush=True,
        )
        return tokens

    def run(self) -> bool:
        a = self.args
        base_tokens = self.compare("base", self.base, load_reference(a.model))
        load_into(a.url, "full", self.base, a.weights, a.version, timeout_s=a.timeout)
        reloaded = self.compare("reload", self.base, load_reference(a.model, a.weights))
        if reloaded == base_tokens:
            print("note: the new weights sampled the same tokens as the old ones; is --weights really different?")
        if a.adapter:
            load_into(a.url, "lora", ADAPTER_NAME, a.adapter, timeout_s=a.timeout)
            try:
                self.compare("lora", ADAPTER_NAME, load_reference(a.model, a.weights, a.adapter))
            finally:
                unload_from(a.url, ADAPTER_NAME, timeout_s=a.timeout)
        load_into(a.url, "full", self.base, a.model, a.version + 1, timeout_s=a.timeout)
        restored = self.compare("restore", self.base, load_reference(a.model))
        same = restored == base_tokens
        self.rows[-1]["same_tokens_as_base"] = same
        self.rows[-1]["ok"] = self.rows[-1]["ok"] and same
        if not same:
            print("FAIL restore: the original weights did not give back the first step's tokens")
        return all(r["ok"] for r in self.rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://localhost:8002", help="the OpenAI server's base URL")
    p.add_argument("--model", required=True, help="the folder the server was started with")
    p.add_argument("--weights", required=True, help="safetensors folder of the same architecture, other values")
    p.add_argument("--adapter", help="a PEFT LoRA folder for the same model (optional)")
    p.add_argument("--prompt-ids", default="5,17,300,42,9", help="comma-separated prompt token ids")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--version", type=int, default=1000, help="weight version sent with the first reload")
    p.add_argument("--tol", type=float, default=1e-4, help="largest allowed |server − forward| logprob")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    args.prompt = [int(x) for x in args.prompt_ids.split(",")]
    checker = Checker(args)
    ok = checker.run()
    if args.out:
        args.out.write_text(
            json.dumps({"url": args.url, "served": checker.base, "tol": args.tol, "rows": checker.rows}, indent=1)
            + "\n"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
