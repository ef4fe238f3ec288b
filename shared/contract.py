"""The pipeline contract: what the rollout and the trainer must agree on, defined once.

A step is ``groups_per_step`` groups for both sides; a group older than ``max_staleness`` versions is one the
rollout must not admit and the trainer drops; the trainer scores tokens at the rollout's sampling
``temperature``; and both name the same model, streams and keys. Each service's settings class takes these
fields from here (``contract_field``: one type, default and description each) under the contract's names
(``ServiceSettings.contract_fields``; env ``CODA_<SERVICE>_<FIELD>``), and a recipe sets them once in
``[shared]``. (The rollout's ``model_name`` and the trainer's ``served_model``, their names of
``served_model_name`` from before, still work for one release, with a warning: ``ServiceSettings.moved_keys``.)

At start-up the rollout and the trainer announce their contract in Redis (``announce``): the first one writes
it, the next ones compare, and a service whose contract differs refuses to start, naming each field. The
announcement lives as long as the Redis data it guards (the streams, the version and the counters): the same
contract announced again (a restart, another rollout replica) passes, and a deliberate change of recipe on an
old Redis deletes the announcement first (``clear``: ``redis-cli DEL pipeline:contract``). ``make train``
clears it each time it starts the trainer and the rollout together, so a resumed run may change its recipe;
what it still catches there is a service started with an override the other did not get. Two pipelines in
one Redis use two databases (``redis_url`` …/0, …/1): the announcement is one key per database.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field

CONTRACT_KEY = "pipeline:contract"
_ANNOUNCED_BY = "_announced_by"  # hash field naming the service whose announcement was first


class PipelineContract(BaseModel):
    """The values every service of one pipeline must hold alike (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    served_model_name: str = Field(
        "policy",
        description="Name the inference server serves the policy under: the rollout samples from it (full "
        "weights replace the ones served under it; a LoRA version is served as <name>-<run id>-vN)",
    )
    # 4, the rollout's former default rather than the trainer's 8: the default agent samples 4 episodes per
    # group, so a step is 16 episodes, which a CPU-only `make train` finishes in a sensible time; a recipe that
    # sets neither now gets one step size on both sides instead of two.
    groups_per_step: int = Field(
        4,
        ge=1,
        description="Trajectory groups per optimizer step: the trainer takes this many per step, the rollout's "
        "admission counts in steps of it",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="Policy versions a group may lag behind (0: on-policy): the rollout admits no older, the "
        "trainer drops older samples",
    )
    # > 0: the trainer divides the logits by it; greedy decoding is the eval's, not a training setting.
    temperature: float = Field(
        1.0, gt=0, description="Policy sampling temperature; the trainer scores tokens at it (logits / T)"
    )
    stream: str = Field("trajectories", description="Redis stream of the trajectory groups")
    weights_stream: str = Field("weights", description="Redis stream of the trainer's weight-update events")
    version_key: str = Field("policy:version", description="Redis key holding the live policy version")
    admission_key: str = Field(
        "policy:admission", description="Redis key of the trainer's admission mark (groups it has taken)"
    )
    published_key: str = Field(
        "rollout:published",
        description="Redis counter of the groups the rollout published (the 'accepted' term of admission)",
    )


DEFAULT_CONTRACT = PipelineContract()


def contract_field(name: str) -> Any:
    """The contract's field ``name`` (constraints, default, description) for a service's settings class:

    ``groups_per_step: int = contract_field("groups_per_step")``. A copy, as pydantic completes the field of
    the class it lands in."""
    return copy.deepcopy(PipelineContract.model_fields[name])


def contract_names(**renamed: str) -> dict[str, str]:
    """Contract field → the settings field holding it: the same name, unless ``renamed`` (a service's own
    name for it; none has one now)."""
    unknown = set(renamed) - set(PipelineContract.model_fields)
    if unknown:
        raise ValueError(f"not pipeline contract fields: {sorted(unknown)}")
    return {name: renamed.get(name, name) for name in PipelineContract.model_fields}


class ContractMismatch(RuntimeError):
    """This service's contract differs from the one announced in Redis: it must not start."""


def announce(client: redis.Redis, contract: PipelineContract, service: str) -> None:
    """Announce ``contract`` (first announcer wins, field by field), then compare it with what is announced.

    Raises ``ContractMismatch`` naming each differing field. One transaction: two services starting at once
    cannot each write half of theirs. Field by field (HSETNX), so a field added to the contract later is
    filled in by the first service that knows it instead of failing against an older announcement."""
    mine = contract.model_dump(mode="json")
    pipe = client.pipeline(transaction=True)
    for name, value in mine.items():
        pipe.hsetnx(CONTRACT_KEY, name, json.dumps(value))
    pipe.hsetnx(CONTRACT_KEY, _ANNOUNCED_BY, service)
    pipe.hgetall(CONTRACT_KEY)
    announced = {_text(k): _text(v) for k, v in pipe.execute()[-1].items()}
    theirs = {name: json.loads(announced[name]) for name in mine}
    differing = [(name, value, theirs[name]) for name, value in mine.items() if theirs[name] != value]
    if differing:
        raise ContractMismatch(mismatch_message(service, announced.get(_ANNOUNCED_BY, "?"), differing))


def mismatch_message(service: str, by: str, differing: list[tuple[str, Any, Any]]) -> str:
    fields = "; ".join(f"{name} = {mine!r} here, {theirs!r} announced" for name, mine, theirs in differing)
    return (
        f"the {service}'s pipeline contract differs from the one the {by} announced in Redis "
        f"(key {CONTRACT_KEY}): {fields}. Set these once, in the recipe's [shared] table (or the same "
        f"CODA_<SERVICE>_* override for every service). If the change is deliberate (another recipe on this "
        f"Redis), delete the announcement first: redis-cli DEL {CONTRACT_KEY}"
    )


def clear(client: redis.Redis) -> None:
    """Forget the announced contract: the next service to start announces its own."""
    client.delete(CONTRACT_KEY)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
