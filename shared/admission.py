"""The admission mark (``AdmissionMark``): the trainer writes it, the rollout reads it, ``AdmissionMarks`` does both.

Ownership: the mark belongs to the trainer. Only the trainer writes it (its ``Publisher``, with each version
it publishes and after a step that published none); the rollout only reads it (its ``WeightFollower``, which
hands ``consumed`` to the admission gate once it serves the mark's version). ``AdmissionMarks`` is the only
code that touches the key; the rule the mark feeds is ``shared.staleness.admission_limit``.

``consumed`` is counted in the rollout's own unit, its publish counter: ``published − undelivered``, where
``undelivered`` is the number of stream entries the trainer's consumer group has not been served yet
(``shared.stream.served_count``, which reads both atomically), less the backlog a restarted trainer
retrains (see ``services.trainer.loop``). Entries served but not yet acknowledged (pending: trained and
awaiting a checkpoint) count as consumed: they are in the trainer's hands and need no new groups. Foreign
entries (pushed by anything but the rollout) are not in the counter; while they wait undelivered they make
``consumed`` smaller (the rollout waits a little longer), and once taken they cost the rollout nothing.
"""

from __future__ import annotations

from typing import Any

from shared.contract import DEFAULT_CONTRACT
from shared.protocol import AdmissionMark


class AdmissionMarks:
    """The admission mark under ``key`` in Redis: ``write`` (the trainer's side), ``read`` (the rollout's)."""

    def __init__(self, client: Any, key: str = DEFAULT_CONTRACT.admission_key) -> None:
        """``client``: a redis client (or the trainer's outage-waiting wrapper of one)."""
        self.client = client
        self.key = key

    def write(self, version: int, consumed: int, pipe: Any = None) -> None:
        """Record that ``consumed`` published groups were taken when ``version`` went live; into ``pipe``
        (a transaction the caller executes) when given, so the mark goes out together with the version."""
        (self.client if pipe is None else pipe).set(
            self.key, AdmissionMark(version=version, consumed=consumed).model_dump_json()
        )

    def read(self) -> AdmissionMark | None:
        """The trainer's last mark, or None when it never wrote one (then the rollout falls back to versions).
        Raises ``ValueError`` for a value that is not a mark."""
        raw = self.client.get(self.key)
        return None if raw is None else AdmissionMark.model_validate_json(raw)
