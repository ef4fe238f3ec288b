"""``RewardResult``: a scalar reward plus the named parts it was built from (logged and sent to the trainer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardResult:
    """``reward`` is what the policy is trained on; ``components`` are the named terms, for logs and plots.

    ``components`` maps onto ``shared.protocol.Sample.reward_components`` unchanged.

    ``per_trajectory`` (hierarchical agents): a trajectory's own reward, keyed by its ``TokenTrajectory.sample_id``
    (fixed when the trajectory is made, so the reward can name it). A trajectory not in it, and every trajectory
    when it is None, gets this result. ``reward``/``components`` stay the episode's: eval and RED read them.
    """

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    per_trajectory: Mapping[str, RewardResult] | None = None

    def __float__(self) -> float:
        return float(self.reward)

    def for_trajectory(self, sample_id: str) -> RewardResult:
        """The reward of the trajectory ``sample_id``: its own if the reward gave one, the episode's otherwise."""
        own = self.per_trajectory.get(sample_id) if self.per_trajectory else None
        return own if own is not None else self
