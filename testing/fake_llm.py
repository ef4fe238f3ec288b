"""A scripted stand-in for the policy server that speaks vLLM's ``/v1/completions`` shape.

It exists for what the real model cannot give: exact, prepared turns (protocol tests) and a fixed latency
per call or per generated token, with a cap on the requests served at once like vLLM's ``max_num_seqs``
(the rollout and fleet benchmarks). A *script* decides each reply from the decoded prompt; the server then
behaves like vLLM: the reply is cut after the first stop string (kept in ``text``, as with
``include_stop_str_in_output``), otherwise EOS is appended; the generation is capped at ``max_tokens``
(``finish_reason="length"``); ids come back in ``token_ids`` and as ``token_id:N`` logprob tokens with
deterministic logprobs. Every request is recorded so tests can check what the agents sent.

``protocol_script`` is a policy that follows every recipe's protocol (search, delegate, answer), so whole
episodes run end to end without a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from agents.prompts import PLANNER_SYSTEM, TokenizerLike
from shared.http import ApiError, error_body
from shared.protocol.inference import (
    TOKEN_ID_PREFIX,
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    UsageInfo,
)
from shared.protocol.weights import parse_adapter_name


@dataclass(frozen=True)
class FakeCall:
    model: str
    prompt_ids: list[int]
    prompt_text: str
    stop: list[str]
    max_tokens: int
    token_ids: list[int]
    text: str


Script = Callable[[str, str], str]  # (prompt text, model) -> the text the model writes this turn


def fake_logprob(position: int) -> float:
    """Deterministic, distinguishable logprobs: -0.01, -0.02, … cycling every 50 tokens."""
    return -0.01 * (position % 50 + 1)


@dataclass
class FakeLLM:
    tok: TokenizerLike
    script: Script
    delay_s: float = 0.0  # added to every completion (the benchmark's fixed per-call latency)
    weight_version: int | None = None  # like vLLM: not reported (ours reports the loaded version)
    record: bool = True  # keep every request in ``calls`` (off for long benchmark runs)
    requests: int = 0  # completion requests received over HTTP, failed ones included
    calls: list[FakeCall] = field(default_factory=list)
    loras: dict[str, str] = field(default_factory=dict)
    token_delay_s: float = 0.0  # added per generated token, after the reply is made (a decode step's time)
    max_num_seqs: int | None = None  # requests served at once (vLLM's max_num_seqs); more wait. None: no cap
    load_delay_s: float = 0.0  # added to every adapter load (the time a real server takes to read one)
    _failures: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_next(self, count: int, status: int = 500) -> None:
        """The next ``count`` completion requests answer ``status`` (fault injection)."""
        with self._lock:
            self._failures.extend([status] * count)

    def _take_failure(self) -> int | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    def complete(self, req: CompletionRequest) -> CompletionResponse:
        if not (isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int)):
            raise ApiError("the fake LLM takes one prompt of token ids", 400)
        model = req.model or "policy"
        if parse_adapter_name(model) is not None and model not in self.loras:
            raise ApiError(f"The model `{model}` does not exist.", 404, "NotFoundError")
        prompt_text = self.tok.decode(req.prompt)
        ids, text, finish, stop_reason = self._reply(self.script(prompt_text, model), req)
        if self.record:
            self.calls.append(
                FakeCall(
                    model=model,
                    prompt_ids=list(req.prompt),
                    prompt_text=prompt_text,
                    stop=_stops(req.stop),
                    max_tokens=req.max_tokens or 16,
                    token_ids=ids,
                    text=text,
                )
            )
        logprobs = CompletionLogProbs(
            tokens=[f"{TOKEN_ID_PREFIX}{i}" for i in ids],
            token_logprobs=[fake_logprob(k) for k in range(len(ids))],
            text_offset=[0] * len(ids),
            top_logprobs=None,
        )
        choice = CompletionChoice(
            index=0,
            text=text,
            logprobs=logprobs,
            finish_reason=finish,
            stop_reason=stop_reason,
            token_ids=ids if req.return_token_ids else None,
            prompt_token_ids=list(req.prompt) if req.return_token_ids else None,
        )
        usage = UsageInfo(
            prompt_tokens=len(req.prompt), completion_tokens=len(ids), total_tokens=len(req.prompt) + len(ids)
        )
        return CompletionResponse(model=model, choices=[choice], usage=usage, weight_version=self.weight_version)

    def _reply(self, reply: str, req: CompletionRequest) -> tuple[list[int], str, str, str | None]:
        stops = _stops(req.stop)
        hits = [(reply.find(s), s) for s in stops if s and s in reply]
        stop_reason = None
        if hits:
            at, stop_reason = min(hits)
            reply = reply[: at + len(stop_reason)]
        ids = self.tok.encode(reply)
        eos = [] if stop_reason or self.tok.eos_token_id is None else [self.tok.eos_token_id]
        ids = ids + eos
        limit = req.max_tokens or 16
        if len(ids) > limit:
            ids, stop_reason, finish = ids[:limit], None, "length"
            reply = self.tok.decode(ids)
        else:
            finish = "stop"
        text = reply if req.include_stop_str_in_output or not stop_reason else reply[: -len(stop_reason)]
        return ids, text, finish, stop_reason

    def app(self) -> FastAPI:
        """A bare FastAPI app (no house middlewares): the fake's own CPU cost must stay small next to the
        agents' on a shared benchmark host. Errors use the house/vLLM error body."""
        app = FastAPI(title="coda-stack fake LLM", description="Scripted vLLM-shaped completions server")

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok", "service": "fake-llm"}

        # Made here, in the server's own event loop; a request holds a slot for its whole latency.
        slots = asyncio.Semaphore(self.max_num_seqs) if self.max_num_seqs else contextlib.nullcontext()

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            self.requests += 1
            try:
                req = CompletionRequest.model_validate_json(await request.body())
                async with slots:
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    status = self._take_failure()
                    if status is not None:
                        raise ApiError("injected failure", status, "InternalServerError")
                    response = self.complete(req)
                    if self.token_delay_s:
                        await asyncio.sleep(self.token_delay_s * response.usage.completion_tokens)
                return Response(response.model_dump_json(), media_type="application/json")
            except ValidationError as exc:
                return JSONResponse(error_body(f"invalid completion request: {exc.errors()[:3]}", 400), 400)
            except ApiError as exc:
                return JSONResponse(error_body(exc.message, exc.status_code, exc.type_), exc.status_code)

        @app.get("/v1/models")
        async def models() -> ModelList:
            return ModelList(data=[ModelCard(id=name) for name in ["policy", *self.loras]])

        @app.post("/v1/load_lora_adapter")
        async def load_lora(request: Request) -> str:
            body = await request.json()
            if self.load_delay_s:
                await asyncio.sleep(self.load_delay_s)
            self.loras[body["lora_name"]] = body.get("lora_path", "")
            return f"Success: LoRA adapter '{body['lora_name']}' added successfully."

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora(request: Request) -> Response:
            name = (await request.json())["lora_name"]
            if self.loras.pop(name, None) is None:
                message = f"The lora adapter '{name}' cannot be found."
                return JSONResponse(error_body(message, 404, "NotFoundError"), 404)
            return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")

        return app


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


# ---------------------------------------------------------------- a policy that follows every protocol
def _last_question(prompt: str) -> str:
    found = re.findall(r"(?:Question|Query): ([^\n<]*)", prompt)
    return found[-1].strip() if found else "the question"


def _after_question(prompt: str) -> str:
    """What follows the question line: the episode so far (instructions mention tags too, so skip them)."""
    parts = re.split(r"(?:Question|Query): .*", prompt)
    return parts[-1] if len(parts) > 1 else prompt


def protocol_script(prompt: str, model: str) -> str:
    """One search (or delegation) per episode, then an answer built from what came back."""
    done = _after_question(prompt)
    if "Read this math problem" in prompt:
        return (
            '{"should_decompose": true, "subproblems": ["count all items", "apply the change"], '
            '"plan": "multiply, then add or subtract"}'
        )
    if "Work out one part" in prompt:
        return '{"solution": "3 * 4", "result": 12}'
    if "Put these partial results together" in prompt or "Solve this math problem" in prompt:
        return '{"final_calculation": "12 + 1", "final_answer": 13}'
    if "<tools>" in prompt:
        if "<tool_response>" not in prompt.split("</tools>")[-1]:
            query = json.dumps({"name": "search", "arguments": {"query": _last_question(prompt)}})
            return f"<think>I should search.</think><tool_call>{query}</tool_call>"
        return "<think>The documents answer it.</think> yes"
    if PLANNER_SYSTEM[:40] in prompt:
        if "<result>" not in done:
            return f"<think>I need one fact.</think><task> {_last_question(prompt)} </task>"
        result = done.rsplit("<result>", 1)[1].split("</result>", 1)[0].strip()
        return f"<think>The helper found it.</think><answer> {result or 'unknown'} </answer>"
    if "<documents>" not in done and "<information>" not in done:
        return f"<think>Let me look it up.</think><search> {_last_question(prompt)} </search>"
    docs = re.findall(r"Doc 1\(Title: \"?([^\")]*)", done)
    answer = docs[-1] if docs else "unknown"
    refine = f"<refine>The first document is about {answer}.</refine>" if "<documents>" in done else ""
    return f"<think>Found it.</think>{refine}<answer> {answer} </answer>"


def main(argv: list[str] | None = None) -> None:
    """``python -m testing.fake_llm``: serve the scripted fake on 127.0.0.1 (benchmarks, manual runs)."""
    import argparse

    import uvicorn

    from agents.prompts import load_tokenizer
    from shared.log import configure_logging

    p = argparse.ArgumentParser(
        prog="python -m testing.fake_llm", description="The scripted protocol-following fake LLM (vLLM API shape)."
    )
    p.add_argument("--port", type=int, default=8002, help="port on 127.0.0.1 (default 8002)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="fixed latency added to every completion")
    p.add_argument("--token-delay-ms", type=float, default=0.0, help="latency added per generated token")
    p.add_argument("--max-num-seqs", type=int, default=0, help="completions served at once, like vLLM's (0: no cap)")
    p.add_argument("--load-delay-ms", type=float, default=0.0, help="latency added to every LoRA adapter load")
    p.add_argument("--no-record", action="store_true", help="do not keep requests in memory (long runs)")
    p.add_argument(
        "--tokenizer",
        default="char",
        help="tokenizer directory the agents use ('char': the one-id-per-character test tokenizer)",
    )
    args = p.parse_args(argv)
    configure_logging()
    fake = FakeLLM(
        load_tokenizer(args.tokenizer),
        protocol_script,
        delay_s=args.delay_ms / 1000,
        token_delay_s=args.token_delay_ms / 1000,
        max_num_seqs=args.max_num_seqs or None,
        load_delay_s=args.load_delay_ms / 1000,
        record=not args.no_record,
    )
    uvicorn.run(fake.app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
