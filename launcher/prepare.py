"""What a run needs before it trains, described once for ``make train`` and for compose's ``prepare`` job.

    python -m launcher prepare --recipe configs/tiny-cpu.toml     # compose: the one-shot `prepare`
    python -m launcher eval --label final                        # compose: `make compose-eval`

The steps (``LocalStack.prepare_all`` runs them, each skipped when its result is already there):
1. the tiny model: tokenizer trained on the task's text and the agents' instructions, random-init weights;
2. the retriever's index of the corpus;
3. SFT demonstrations (make-sft) from documents a retriever actually returned, for RED co-training;
4. the greedy held-out eval at step 0.

``make train`` writes them into a fresh run folder (``Layout.for_run``). Compose's ``prepare`` job writes
them where the recipe and the compose file say the services read them (``Layout.for_recipe``): the recipe's
``[trainer] model`` and ``[retriever] index_dir``, and ``sft_path(COMPOSE_ROOT, ...)``, which compose
passes to the trainer as ``CODA_TRAINER_SFT_DATA`` (tests/integration/deploy checks that the two agree).
On a restart of the stack the job finds them all in its volumes and exits at once.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path

from launcher.config import StackSettings

# Compose mounts the `runs` volume at /app/runs and the jobs run in /app: this is the same folder.
COMPOSE_ROOT = Path("runs")
# The bundled corpora by the index folder the recipes name; another index_dir needs $CORPUS (compose).
BUNDLED_INDEXES = {
    "runs/index/lookup": ("data/lookup/corpus.jsonl", []),
    "runs/index/hotpotqa": (
        "data/hotpotqa/corpus.jsonl",
        ["--embeddings", "data/hotpotqa/corpus_emb_all-MiniLM-L6-v2_fp16.npy"],
    ),
    # Its first 6,785 rows are the corpus above byte for byte: their vectors are given, the other 7,675 rows are
    # encoded once (the index is cached by content).
    "runs/index/hotpotqa-dev": (
        "data/hotpotqa-dev/corpus.jsonl.xz",
        ["--embeddings", "data/hotpotqa/corpus_emb_all-MiniLM-L6-v2_fp16.npy"],
    ),
    "runs/index/2wiki-dev": ("data/2wiki-dev/corpus.jsonl.xz", []),
}


# The files whose code decides what a demonstration holds (besides the data, the prompts, the settings and the
# agent module that defines the format).
DEMONSTRATION_CODE = (
    "agents/plans.py",
    "agents/hotpot_plans.py",
    "agents/plan_values.py",
    "agents/hotpot_values.py",
    "agents/gold_paragraphs.py",
    "agents/coda_demos.py",
    "tools/make_sft.py",
    "agents/core/demonstrations.py",
)


def content_key(*parts: object) -> str:
    """A short hash of ``parts``: a file's bytes for a ``Path`` to a file, the text of anything else."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.read_bytes() if isinstance(part, Path) and part.is_file() else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def sft_path(root: Path, stack: StackSettings) -> Path | None:
    """Where the demonstrations are written and read; None when the recipe's ``[stack] sft`` is off."""
    return root / "sft.jsonl" if stack.sft else None


@dataclass(frozen=True)
class Layout:
    """Where the prepared things live."""

    model: Path
    index: Path
    corpus: str  # what the index is built from
    index_args: tuple[str, ...]  # more `services.retriever build` flags
    sft: Path | None
    evals: Path  # one folder per eval label (step0, final)
    tiny: bool = True  # the model is a local folder (built or imported here, or given), not a hub id
    source: str | None = None  # where a missing model comes from: None builds a tiny one, else tools.import_gguf's

    @classmethod
    def for_run(cls, run: Path, stack: StackSettings, sft_format: str = "search") -> Layout:
        """``make train``: everything inside the run's own folder, but for a real model (``[stack] model``):
        that is shared by every run, and imported once from ``[stack] model_source`` when missing; its index and
        demonstrations are cached under ``<run_root>/../cache`` by the hash of what they are made from (the
        demonstrations' also by the prompts they show), so a new run of the same recipe starts without
        rebuilding them. (The tiny model is built per run with its own tokenizer, so its run keeps its own.)"""
        if stack.model == "tiny":
            return cls(
                model=run / "model",
                index=run / "index",
                corpus=stack.corpus,
                index_args=(),
                sft=sft_path(run, stack),
                evals=run / "eval",
                source=None,
            )
        from agents import demo_format
        from agents.datasets import REPO_ROOT

        cache = Path(stack.run_root).parent / "cache"
        index_args = next((args for corpus, args in BUNDLED_INDEXES.values() if corpus == stack.corpus), [])
        index_key = content_key(Path(stack.corpus), *index_args)
        sft_key = content_key(
            index_key,
            Path(stack.train_qa),
            stack.train_qa,
            stack.sft_split,
            stack.model,
            stack.sft_topk,
            stack.sft_think,
            sft_format,
            stack.system_prompt,
            *([] if stack.env_turn == "inline" else [stack.env_turn]),  # inline: the cache keys of earlier runs
            *([stack.sft_limit] if stack.sft_limit else []),
            # What the demonstrations show besides the data: after a prompt edit they are made again, never
            # read from a file that holds the old prompt.
            demo_format(sft_format).fingerprint(),
            stack.sft_hops,
            stack.sft_max_obs_tokens,
            # The code that writes them: a plan or demonstration rule changed means other demonstrations.
            *(REPO_ROOT / f for f in DEMONSTRATION_CODE),
            Path(inspect.getfile(demo_format(sft_format).write)),
        )
        return cls(
            model=Path(stack.model),
            index=cache / f"index-{index_key}",
            corpus=stack.corpus,
            index_args=tuple(index_args),
            sft=cache / f"sft-{sft_key}.jsonl" if stack.sft else None,
            evals=run / "eval",
            source=stack.model_source or "",
        )

    @classmethod
    def for_recipe(cls, recipe: str, stack: StackSettings, root: Path = COMPOSE_ROOT) -> Layout:
        """Compose: the paths the recipe gives the services (the models, indexes and runs volumes)."""
        from services.retriever.config import RetrieverSettings
        from services.trainer.config import TrainerSettings

        # The model the trainer trains (and, in the cpu profile, the policy server serves: a recipe keeps
        # [inference] model equal to it); the gpu profile's recipes name hub models, which are not built here.
        model = TrainerSettings.load(recipe).model
        index = RetrieverSettings.load(recipe).index_dir
        corpus, args = index_source(index, stack)
        tiny = is_local(model, root)
        # A hub model (the gpu profile) is not made here, but its demonstrations are: make-sft needs only its
        # tokenizer, and both trainers read them (CODA_TRAINER_SFT_DATA), as make train's trainer does.
        return cls(
            model=Path(model),
            index=Path(index),
            corpus=corpus,
            index_args=tuple(args),
            sft=sft_path(root, stack),
            evals=root / "eval",
            tiny=tiny,
        )


def index_source(index_dir: str, stack: StackSettings) -> tuple[str, list[str]]:
    """The corpus of an index folder: ``$CORPUS`` (+ ``$INDEX_ARGS``), a bundled one, or ``[stack] corpus``."""
    if os.environ.get("CORPUS"):
        return os.environ["CORPUS"], os.environ.get("INDEX_ARGS", "").split()
    key = Path(index_dir).as_posix().removeprefix("/app/")
    if key in BUNDLED_INDEXES:
        corpus, args = BUNDLED_INDEXES[key]
        return corpus, list(args)
    return stack.corpus, []


def is_local(model: str, root: Path) -> bool:
    """A model folder of ours (under the runs folder, or absolute) rather than a hub id like ``org/name``."""
    path = Path(model)
    return path.is_absolute() or path.parts[:1] == root.parts[:1] or path.exists()


# ---------------------------------------------------------------- the steps' commands and what they leave
def tiny_model_args(stack: StackSettings, out: Path, texts: list[str], extra_tokens: Path | None) -> list[str]:
    args = [
        "services.inference",
        "make-tiny",
        "--out",
        str(out),
        "--size",
        stack.model_size,
        "--seed",
        str(stack.model_seed),
        "--vocab-size",
        str(stack.vocab_size),
        "--max-len",
        str(stack.max_context),
        "--text",
        *texts,
    ]
    return args + (["--extra-tokens", str(extra_tokens)] if extra_tokens else [])


def import_args(layout: Layout) -> list[str]:
    """``tools.import_gguf`` for ``layout.source``: ``package:NAME`` (a GGUF shipped in a wheel) or a GGUF file."""
    kind, _, name = layout.source.partition(":")
    src = ["--package", name] if kind == "package" else ["--gguf", layout.source]
    return ["tools.import_gguf", "--out", str(layout.model), *src]


def index_args(layout: Layout) -> list[str]:
    return ["services.retriever", "build", "--corpus", layout.corpus, "--out", str(layout.index), *layout.index_args]


def make_sft_args(stack: StackSettings, layout: Layout, retriever_url: str, fmt: str = "search") -> list[str]:
    """make-sft's arguments; ``fmt``: the name of the agent's demonstration format (``Agent.demonstrations``)."""
    return (
        [
            "tools.make_sft",
            "--model",
            str(layout.model),
            "--retriever-url",
            retriever_url,
            "--qa",
            stack.train_qa,
            "--out",
            str(layout.sft),
            "--topk",
            str(stack.sft_topk),
            "--format",
            fmt,
            "--split",
            stack.sft_split,
        ]
        + ([] if stack.sft_think else ["--no-think"])
        + ([] if stack.system_prompt is None else ["--system-prompt", stack.system_prompt])
        + ["--env-turn", stack.env_turn]
        + (["--limit", str(stack.sft_limit)] if stack.sft_limit else [])
        + ["--hops", stack.sft_hops, "--max-obs-tokens", str(stack.sft_max_obs_tokens)]
    )


def eval_overrides(stack: StackSettings) -> dict[str, str]:
    """The ``[rollout]`` settings the held-out eval replaces with the stack's: its prompts are not the training
    prompts, so neither are their fields ('' = none: ``eval_dataset`` is loaded by name, and the recipe's
    ``[rollout] prompt_field`` of the training file is not applied to it)."""
    return {
        "dataset": stack.eval_dataset,
        "split": stack.eval_split,
        "prompt_field": stack.eval_prompt_field or "",
        "gold_field": stack.eval_gold_field or "",
    }


def eval_args(stack: StackSettings, out: Path) -> list[str]:
    """The greedy held-out eval (what make train prints at step 0 and at the end)."""
    args = ["services.rollout", "eval"]
    for key, value in eval_overrides(stack).items():
        args += ["--" + key.replace("_", "-"), value]
    args += ["--eval-output", str(out)]
    return args + (["--eval-limit", str(stack.eval_limit)] if stack.eval_limit else [])


def check_datasets(recipe: str, stack: StackSettings, *, training: bool = True) -> None:
    """Load the prompts the run will read, as the rollout and the eval will, before anything starts: the
    training prompts (``training``) and the held-out eval's. A bad one fails here with a ``ValueError`` that
    names the setting, instead of killing the run at its first step or at its first eval."""
    from services.rollout.config import RolloutSettings

    checks = [("rollout", "", {})] if training else []  # (table, prefix of its settings, the eval's overrides)
    if stack.eval_limit != 0:
        checks.append(("stack", "eval_", eval_overrides(stack)))
    for table, prefix, overrides in checks:
        settings = RolloutSettings.load(recipe, **overrides)
        what = (
            f"[{table}] {prefix}dataset = {settings.dataset!r} ({prefix}prompt_field {settings.prompt_field!r}, "
            f"{prefix}split {settings.split!r})"
        )
        try:
            records = settings.records()
        except (OSError, ValueError) as exc:
            raise ValueError(f"{what}: {exc}") from exc
        if not records:
            raise ValueError(f"{what}: no prompts in that split")


def has_model(layout: Layout) -> bool:
    return (layout.model / "config.json").is_file()


def has_index(layout: Layout) -> bool:
    return (layout.index / "manifest.json").is_file()


def has_sft(layout: Layout) -> bool:
    return layout.sft is None or (layout.sft.is_file() and layout.sft.stat().st_size > 0)


def has_eval(layout: Layout, label: str) -> bool:
    return any((layout.evals / label).glob("*.json"))


def entity_titles(corpus: str) -> str:
    """The corpus titles, one per line (made whole tokens of the tiny tokenizer)."""
    rows = Path(corpus).read_text().splitlines()
    return "".join(_title(json.loads(line)) + "\n" for line in rows if line.strip())


def _title(row: dict) -> str:
    contents = row["contents"]
    return contents.split("\n", 1)[0].strip().strip('"')


def prompt_text(repeats: int = 30) -> str:
    """Every agent's instructions, as lines for the tokenizer's training text.

    The tiny model's tokenizer is trained on what the model will read: without the instructions, their words
    split into many byte-level pieces and a prompt costs several hundred tokens (more than a tiny context).
    """
    from agents import prompts

    messages = (
        prompts.search_agent_messages("?")
        + prompts.planner_messages("?")
        + prompts.executor_messages("?")
        + prompts.searcher_messages("?", 2)
        + prompts.tool_agent_messages("?")
    )
    texts = [m["content"] for m in messages] + [prompts.decomposer_prompt("?"), prompts.worker_direct_prompt("?")]
    lines = [line for text in texts for line in text.splitlines() if line.strip()]
    return "\n".join(lines * repeats) + "\n"
