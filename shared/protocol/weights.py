"""Weight-update events: the trainer announces each published policy version on the ``weights`` stream."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class WeightUpdate(BaseModel):
    """Policy version ``version`` is live on the inference server(s)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0, description="Monotonically increasing policy version")
    kind: Literal["lora", "full"] = Field(description="LoRA adapter load or full-weight reload")
    model_name: str = Field(description="Model name requests must use for this version, e.g. policy-v3")
    path: str = Field(description="Where the weights were written (adapter dir or safetensors dir)")
    step: int = Field(ge=0, description="Trainer optimizer step that produced the weights")
    created_at: float = Field(description="Unix time the version went live")
    publish_seconds: float = Field(0.0, ge=0, description="Time from save start to live")


class AdmissionMark(BaseModel):
    """How many published groups the trainer had taken when policy ``version`` went live: what the admission
    rule counts from (``shared.stream``, where the rule, its formula and the mark's life are explained).
    ``version`` ties the mark to the weights it was written with: a rollout applies it only once it serves
    that version."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0, description="Policy version live when the mark was written")
    consumed: int = Field(
        description="Published groups the trainer had taken from the stream (may be < 0 while "
        "foreign groups wait in it)"
    )
