"""Weight-update events: the trainer announces each published policy version on the ``weights`` stream.

A LoRA version is served under an adapter name unique to its run: ``<served>-<run>-v<N>`` (``adapter_name``
builds it, ``parse_adapter_name`` reads it back), e.g. ``policy-3f9c01ab-v7``. ``run`` is the id the trainer
keeps in Redis beside the version counter (``<version key>:run``, ``new_run_id``): a wiped Redis starts a new
run, whose ``v3`` is never taken for an adapter of the run before that a server still holds (the rollout's
fleet watch unloads those). Names of the release before (``policy-v7``: no run) parse with ``run=""``.
"""

from __future__ import annotations

import re
import secrets
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

_ADAPTER = re.compile(r"^(?P<served>.+?)(?:-(?P<run>[0-9a-f]{8}))?-v(?P<version>\d+)$")


class AdapterName(NamedTuple):
    served: str  # the served base model's name
    run: str  # the run that published it ("" for a name of the release before)
    version: int


def new_run_id() -> str:
    """A fresh run id: 8 hex digits."""
    return secrets.token_hex(4)


def adapter_name(served: str, run: str, version: int) -> str:
    """The name LoRA version ``version`` of run ``run`` is served under: ``<served>-<run>-v<version>``."""
    if not re.fullmatch(r"[0-9a-f]{8}", run):
        raise ValueError(f"a run id is 8 hex digits, not {run!r}")
    return f"{served}-{run}-v{version}"


def parse_adapter_name(name: str) -> AdapterName | None:
    """``adapter_name``'s parts, or None for a name that is no adapter's (a base model's)."""
    m = _ADAPTER.match(name)
    return None if m is None else AdapterName(m["served"], m["run"] or "", int(m["version"]))


class WeightUpdate(BaseModel):
    """Policy version ``version`` is live on the inference server(s)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0, description="Monotonically increasing policy version")
    kind: Literal["lora", "full"] = Field(description="LoRA adapter load or full-weight reload")
    model_name: str = Field(
        description="Model name requests must use for this version: the served name (full), or the "
        "adapter's (LoRA, ``adapter_name``: e.g. policy-3f9c01ab-v3)",
    )
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
