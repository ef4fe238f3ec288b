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
