"""Rollout settings: one pydantic-settings class (env prefix ``CODA_ROLLOUT_``, recipe table ``[rollout]``).

The knobs only one agent reads are defined beside that agent (``agents.coda.CoDAParams``, …): the settings hold
one field per agent module, typed by its params model and named by its table (``coda`` ← ``[rollout.coda]``,
``CODA_ROLLOUT_CODA__…``, ``--coda JSON``), built from the agent list (``agents.agent_params``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, create_model, field_validator, model_validator

from agents import AGENTS, Agent, agent_params, get_agent, load_reward
from agents.coda import CoDAParams
from agents.core.turns import Budget
from agents.datasets import PromptRecord, load_prompts, select_split
from agents.recursive_reasoner import RecursiveReasonerParams
from shared.contract import contract_field, contract_names
from shared.server_registry import DEFAULT_PREFIX
from shared.settings import ServiceSettings, service_config

AGENT_TABLES = agent_params()  # table name → its agent module's params model, from the agent list


def _table_doc(params: type) -> str:
    return (params.__doc__ or "").strip().splitlines()[0]


# One field per agent module's knobs; a model made from the list, so that adding an agent edits nothing here.
AgentKnobs = create_model(
    "AgentKnobs",
    **{table: (p, Field(default_factory=p, description=_table_doc(p))) for table, p in AGENT_TABLES.items()},
)


class RolloutSettings(ServiceSettings, AgentKnobs):
    model_config = service_config("CODA_ROLLOUT_")
    toml_section: ClassVar[str] = "rollout"
    contract_fields: ClassVar[dict[str, str]] = contract_names()
    # model_name (CODA_ROLLOUT_MODEL_NAME, --model-name): the old spelling, warned; it goes in the next release.
    moved_keys: ClassVar[dict[str, str]] = {"model_name": "served_model_name"}
    shared_keys: ClassVar[dict[str, str]] = {
        "model": "tokenizer",
        "system_prompt": "system_prompt",
        "env_turn": "env_turn",
        "redis_url": "redis_url",
        **contract_fields,
    }

    agent: str = Field(
        "search-r1",
        description=f"Agent protocol whose episodes run, with its reward (agents.AGENTS: {', '.join(sorted(AGENTS))})",
    )
    reward: str | None = Field(
        None,
        description="Reward function 'package.module:function' (a plain f(completion, "
        "gold, row) -> float | dict, or an @episode_reward); default: "
        "the agent's own",
    )
    host: str = Field("127.0.0.1", description="Bind address of the status API")
    port: int = Field(8004, ge=1, le=65535, description="Port of the status API (/health, /metrics, /status)")

    # ------------------------------------------------------------ services
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding the streams and version key")
    stream: str = contract_field("stream")
    stream_maxlen: int = Field(10_000, ge=1, description="Approximate cap on the trajectories stream length")
    weights_stream: str = contract_field("weights_stream")
    version_key: str = contract_field("version_key")
    admission_key: str = contract_field("admission_key")
    published_key: str = contract_field("published_key")
    inference_url: str = Field("http://127.0.0.1:8002", description="Policy inference server (vLLM API)")
    inference_urls: list[str] = Field(
        default_factory=list,
        description="More policy servers beside inference_url: episodes go to the least loaded one serving the "
        "live weights, each episode on one server for all its turns (services.rollout.fleet)",
    )
    servers_key: str = Field(
        DEFAULT_PREFIX,
        description="Redis key prefix under which policy servers announce themselves (inference's redis_url + "
        "advertise_url); those announced join the fleet, those gone leave it ('': only the listed servers)",
    )
    fleet_probe_s: float = Field(
        2.0,
        gt=0,
        description="How often the fleet's servers are probed (up? which weight version?) and the "
        "announcements read; a weight update probes at once",
    )
    episode_attempts: int = Field(
        2,
        ge=1,
        description="Tries of one episode, each on another server, when its server fails mid-episode "
        "(refused, dropped, timed out, 502/503/504/429 after the client's retries); the failed try is "
        "discarded whole, then the group fails as an inference outage",
    )
    keep_adapters: int = Field(
        3,
        ge=1,
        description="Under LoRA: adapters kept loaded on each server (the rollout loads every published version "
        "into every server, with the control token CODA_CONTROL_TOKEN for one on another host), newest first "
        "(at most the trainer's keep_weights; older ones are unloaded, as a server holds max_loras)",
    )
    server_wait_s: float = Field(
        30.0,
        gt=0,
        description="How long an episode waits for a server that is up and serves the live weights before "
        "it fails as an inference outage (503)",
    )
    served_model_name: str = contract_field("served_model_name")
    frozen_model_name: str | None = Field(
        None, description="Served name of the frozen worker (default: served_model_name)"
    )
    tokenizer: str = Field("", description="Tokenizer directory of the served model ('char': the test tokenizer)")
    retriever_url: str = Field("http://127.0.0.1:8000", description="Retriever (Search-R1 /retrieve API)")
    searcher_url: str = Field("http://127.0.0.1:8001", description="Searcher service (thinker-searcher)")
    llm_http: Literal["aiohttp", "httpx"] = Field(
        "aiohttp", description="HTTP library for LLM calls: aiohttp (about 10x less CPU per call) or httpx"
    )
    retrieval_batch_ms: float = Field(
        2.0,
        ge=0,
        description="Window in which concurrent episodes' searches are sent as one /retrieve request (0: one each)",
    )
    http_timeout_s: float = Field(300.0, gt=0, description="Timeout of one LLM/retriever/searcher call")
    retry_attempts: int = Field(
        4,
        ge=1,
        description="Tries per HTTP call on 429/502/503/504 and connection errors (never on other 4xx or 500; shared.retry)",
    )
    retry_backoff_s: float = Field(0.2, ge=0, description="First retry wait; doubles per retry (max 5 s)")

    # ------------------------------------------------------------ data
    dataset: str = Field(
        "bundled:lookup", description="Prompts: a .parquet/.jsonl path, bundled:NAME or synthetic:arithmetic[:N]"
    )
    prompt_field: str | None = Field(
        None,
        description="Read any JSONL: the field holding each row's prompt (the row is kept whole for rewards; "
        "none or '': the dataset is loaded by name). Only for dataset: the held-out eval of make train has its own "
        "([stack] eval_prompt_field)",
    )
    gold_field: str | None = Field(
        None, description="With prompt_field: the field of the gold answer(s), if any (none or '': none)"
    )
    split: str = Field("all", description="train | eval (hashed split of one file) | all | a row split name")
    eval_fraction: float = Field(0.1, ge=0, le=1, description="Share of prompt ids held out by split=eval")
    seed: int = Field(0, description="Shuffle seed of the prompt order")
    epochs: int | None = Field(None, ge=1, description="Passes over the prompts (null: cycle forever)")
    choice_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of the choice questions (yes/no, or the answer named in the question: "
        "agents.question_kinds) kept in each epoch's training order; every open question is kept. A choice is "
        "half-won by a coin flip, so its reward teaches guessing more than reading; 1: all (the order as before), "
        "0: none (refused if that leaves no prompt). Seeded by seed",
    )

    # ------------------------------------------------------------ sampling and admission
    n_samples: int = Field(4, ge=1, description="Episodes per prompt (the GRPO group size)")
    groups_per_step: int = contract_field("groups_per_step")
    max_staleness: int = contract_field("max_staleness")
    admission_scope: Literal["process", "redis"] = Field(
        "process", description="process: this rollout alone; redis: shared by every rollout replica"
    )
    max_running_groups: int = Field(64, ge=1, description="Groups in flight at once (concurrency cap)")
    drop_flat_groups: bool = Field(
        False,
        description="Dynamic sampling (DAPO): a scored group without learning signal (all its samples, of every role, "
        "got the same reward: the trainer's advantage is 0 whatever its role_baseline; shared.protocol.trajectory) is not published; its "
        "admission slot goes to a new prompt at once, so each training step gets groups that teach (counted: "
        "groups_total{outcome=no_signal}). Costs rollout time, and those groups' KL/entropy terms",
    )
    max_prompt_failures: int = Field(
        3,
        ge=1,
        description="Failures in a row, by the prompt's own fault (a reward error, a 400 or plain 500), before it is dropped; failures during a dependency outage do not count",
    )
    temperature: float = contract_field("temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="Policy nucleus sampling mass")
    top_k: int = Field(
        0,
        ge=0,
        description="Policy top-k sampling: keep the k most likely tokens (0: off, the inference server's own "
        "default), sent with every completion request",
    )
    frozen_temperature: float = Field(0.0, ge=0, description="Frozen worker temperature (0: greedy, stable reward)")

    # ------------------------------------------------------------ turn budgets
    max_turns: int = Field(4, ge=1, description="Action turns of the main role (policy/planner/thinker)")
    max_tokens_per_turn: int = Field(256, ge=1, description="Generated tokens per turn")
    max_obs_tokens: int = Field(512, ge=1, description="Tokens of one observation's content")
    max_context_tokens: int = Field(4096, ge=64, description="Prompt + appended tokens of one trajectory")
    topk: int = Field(3, ge=1, description="Documents per search")
    system_prompt: str | None = Field(
        None,
        description="A system turn before every prompt that has none ('' for an empty one; none: the chat template "
        "decides, and SmolLM2's adds its own 16-token default)",
    )
    env_turn: Literal["inline", "user", "tool"] = Field(
        "inline",
        description="Where observations and environment messages go: inline in the assistant's turn (Search-R1), "
        "or as a user/tool turn rendered by the chat template (set it in [shared] so make-sft's demonstrations match)",
    )

    # ------------------------------------------------------------ rewards
    answer_metric: Literal["em", "f1", "sub_em", "cover_em"] | None = Field(
        None, description="Answer score (default: the agent's: f1 for coda, em otherwise)"
    )
    embedder: Literal["hashing", "minilm"] = Field(
        "hashing", description="Embeddings for similarity rewards: hashing (fast, lexical) or minilm"
    )

    # ------------------------------------------------------------ eval
    eval_output: str = Field("runs/eval", description="Folder of eval JSON results")
    eval_limit: int | None = Field(None, ge=1, description="Evaluate at most this many prompts")
    eval_kind: Literal["all", "open", "choice"] = Field(
        "all",
        description="Evaluate only the open questions (the gold answer is not yes/no and not named in the "
        "question: found by reading) or only the choice ones (agents.question_kinds), before eval_limit",
    )
    eval_concurrency: int | None = Field(
        None,
        ge=1,
        description="Episodes evaluated at once (default: max_running_groups). Against a CPU server keep it near "
        "its max_num_seqs: more only queue there, and a request queued past http_timeout_s fails its episode",
    )
    eval_policy: Literal["live", "base"] = Field(
        "live",
        description="live: the policy the trainer last published (its LoRA adapter when it trains one), "
        "found on the weights stream; base: served_model_name as served (also when Redis is down)",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_sync_weights(cls, data: object) -> object:
        """``sync_weights`` is gone rather than ignored: it could turn the only loading of weights off."""
        if isinstance(data, dict) and "sync_weights" in data:
            raise ValueError(
                "sync_weights was removed: the rollout's fleet watch alone loads the published weights into "
                "every policy server (the trainer no longer does), so it cannot be turned off. Delete the key."
            )
        return data

    @field_validator("agent")
    @classmethod
    def _known_agent(cls, value: str) -> str:
        get_agent(value)  # a ValueError naming the known agents
        return value

    @field_validator("prompt_field", "gold_field")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        # '' is how a command line says "none": make train's eval passes it so that [rollout]'s field, which
        # names a field of the training dataset, is not applied to the eval dataset.
        return value or None

    @field_validator("reward")
    @classmethod
    def _loadable_reward(cls, value: str | None) -> str | None:
        if value is not None:
            load_reward(value)  # fail at start-up, not at the first episode
        return value

    @property
    def agent_spec(self) -> Agent:
        """The agent's registry entry (``agents.AGENTS[agent]``), not the recipe TOML."""
        return get_agent(self.agent)

    @property
    def reward_spec(self) -> str:
        return self.reward or self.agent_spec.reward

    def records(self) -> list[PromptRecord]:
        """The prompts of ``split`` of ``dataset``: what ``serve`` trains on, what ``eval`` asks (and what
        ``make train`` loads once before anything starts, to fail early)."""
        records = load_prompts(self.dataset, self.prompt_field, self.gold_field)
        return select_split(records, self.split, self.eval_fraction)

    def budgets(self) -> dict[str, Budget]:
        main = Budget(self.max_turns, self.max_tokens_per_turn, self.max_obs_tokens, self.max_context_tokens)
        executor_turns = CoDAParams.of(self).executor_max_turns
        executor = Budget(executor_turns, self.max_tokens_per_turn, self.max_obs_tokens, self.max_context_tokens)
        worker_tokens = RecursiveReasonerParams.of(self).worker_max_tokens
        worker = Budget(1, worker_tokens, self.max_obs_tokens, self.max_context_tokens)
        return {
            "policy": main,
            "planner": main,
            "thinker": main,
            "executor": executor,
            "worker": worker,
            "searcher": main,
        }

    @property
    def metric(self) -> str:
        return self.answer_metric or self.agent_spec.metric
