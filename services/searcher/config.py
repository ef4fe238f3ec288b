"""Searcher settings: env prefix ``CODA_SEARCHER_``, recipe table ``[searcher]``."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from agents.core.turns import Budget
from shared.settings import ServiceSettings, service_config


class SearcherSettings(ServiceSettings):
    model_config = service_config("CODA_SEARCHER_")
    toml_section: ClassVar[str] = "searcher"
    shared_keys: ClassVar[dict[str, str]] = {"model": "tokenizer", "served_model_name": "served_model_name"}
    # model_name (CODA_SEARCHER_MODEL_NAME, --model-name): the old spelling, warned; it goes in the next release.
    moved_keys: ClassVar[dict[str, str]] = {"model_name": "served_model_name"}

    host: str = Field("127.0.0.1", description="Bind address")
    port: int = Field(8001, ge=1, le=65535, description="HTTP port")
    inference_url: str = Field("http://127.0.0.1:8002", description="Inference server (vLLM API)")
    served_model_name: str = Field(
        "policy", description="Served name of the frozen searcher model (never a LoRA version's adapter)"
    )
    tokenizer: str = Field("", description="Tokenizer directory of that model ('char': the test tokenizer)")
    retriever_url: str = Field("http://127.0.0.1:8000", description="Retriever (Search-R1 /retrieve API)")
    max_turns: int = Field(3, ge=1, description="Search turns when a request sends no max_turns")
    max_turns_limit: int = Field(8, ge=1, description="Largest max_turns a request may ask for (else 400)")
    max_tokens_per_turn: int = Field(256, ge=1, description="Generated tokens per turn")
    max_obs_tokens: int = Field(512, ge=1, description="Tokens of one <information> block's content")
    max_context_tokens: int = Field(4096, ge=64, description="Prompt + appended tokens of one search episode")
    topk: int = Field(3, ge=1, description="Documents per search")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0: greedy, a stable tool)")
    http_timeout_s: float = Field(120.0, gt=0, description="Timeout of one LLM/retriever call")
    retry_attempts: int = Field(
        4,
        ge=1,
        description="Tries per call on 429/502/503/504 and connection errors (never on other 4xx or 500; shared.retry)",
    )

    def budget(self) -> Budget:
        return Budget(self.max_turns, self.max_tokens_per_turn, self.max_obs_tokens, self.max_context_tokens)
