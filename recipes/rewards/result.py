"""``RewardResult``: a scalar reward plus the named parts it was built from (logged and sent to the trainer)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardResult:
    """``reward`` is what the policy is trained on; ``components`` are the named terms, for logs and plots.

    ``components`` maps onto ``shared.protocol.Sample.reward_components`` unchanged.
    """

    reward: float
    components: dict[str, float] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.reward)
