"""What an agent is (``Agent``, its registry entry), its own knobs (``AgentParams``), what its reward is given
(``Scoring``) and how rewards are named and loaded.

An ``Agent`` entry binds an agent protocol to everything that varies with it: the episode driver, the reward, the
services its episodes reach, the roles it trains (``AgentRole``: the tags each writes, its grammar and stop
strings, declared in the agent's module) and its default answer metric. The rollout, its eval and
``make train`` ask the entry instead of branching on the agent's name. (The class keeps its old name for now;
"recipe" elsewhere means the experiment's TOML file, ``configs/*.toml``.)

An agent's own knobs (CoDA's executor budget and reward weights, …) are an ``AgentParams`` model in the agent's
module, defaults and descriptions included, named by its recipe table (``table``): the rollout's settings hold one
field per table, built from the agent list, so CoDA's are ``[rollout.coda]`` keys (``CODA_ROLLOUT_CODA__…``
variables, ``--coda JSON``). The agent reads its own with ``of(settings)``.

An agent's demonstrations, what make-sft writes for its SFT, are a ``DemoFormat`` in the agent's module
(``agents.core.demonstrations`` holds what every format shares); make-sft only calls it.

Rewards are named ``package.module:function`` (``[rollout] reward``) and loaded once at start-up. Two kinds:
- a plain function ``f(completion: str, gold: list[str], row: dict) -> float | dict[str, float]``: the policy's
  generated text, the row's gold answers and the whole dataset row. A dict is a set of named components; its
  ``reward`` entry is the scalar when present, otherwise the components' sum.
- an episode reward, marked with ``@episode_reward``: ``f(episode: Episode, scoring: Scoring) ->
  RewardResult``; the shipped agents' rewards are these (they read the typed episode facts).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from pydantic import BaseModel, ConfigDict

from agents.core.episode import AgentContext, Episode, RewardResult
from agents.core.turns import AgentRole
from agents.datasets import PromptRecord

if TYPE_CHECKING:
    from agents.core.demonstrations import DemoFormat

AgentFn = Callable[[AgentContext, PromptRecord], Awaitable[Episode]]
SERVICES = frozenset({"retriever", "searcher", "frozen"})


class Embedder(Protocol):
    def __call__(self, texts: Sequence[str]) -> Any: ...


class AgentParams(BaseModel):
    """Base of one agent module's knobs: subclass it beside the agent, name its recipe table (``table``) and give
    it to the module's ``Agent`` entries (``params=``); the rollout's settings then hold it as ``[rollout.<table>]``."""

    model_config = ConfigDict(extra="forbid")
    table: ClassVar[str]  # its recipe table under [rollout] and its field of the rollout's settings

    @classmethod
    def of(cls, settings: Any) -> Self:
        """This agent's knobs as ``settings`` hold them: the rollout's settings (their ``table`` field), or any
        object with some of the flat attributes (a test's stand-in; the ones it lacks take their defaults)."""
        own = getattr(settings, cls.table, None)
        if isinstance(own, cls):
            return own
        return cls.model_validate({n: getattr(settings, n) for n in cls.model_fields if hasattr(settings, n)})


@dataclass(frozen=True)
class Scoring:
    """What a reward may read besides the episode: the prompt's row, the rollout's settings (reward weights,
    budgets), the answer metric in force and the embedder of similarity rewards."""

    record: PromptRecord
    settings: Any
    metric: str = "em"
    embed: Embedder | None = None


EpisodeReward = Callable[[Episode, Scoring], RewardResult]
GroupCombine = Callable[[Any, list[RewardResult]], list[RewardResult]]


def episode_reward(fn: Callable[..., RewardResult]) -> Callable[..., RewardResult]:
    """Marks ``fn(episode, scoring) -> RewardResult`` as an episode reward (not a plain completion reward)."""
    fn.episode_reward = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class Agent:
    name: str  # the agent protocol's name: ``[rollout] agent``
    run: AgentFn  # the episode driver
    reward: str  # default reward, ``module:function`` (``[rollout] reward`` replaces it)
    needs: frozenset[str] = frozenset()  # services its episodes call: retriever, searcher, frozen (worker)
    # The trajectory roles it trains, declared in its module (their tags, grammar, stop strings; ``agents.roles()``
    # collects them). Default: a ``policy`` that declares no tags.
    roles: tuple[AgentRole, ...] = (AgentRole("policy"),)
    metric: str = "em"  # default answer metric (``[rollout] answer_metric`` replaces it)
    combine: GroupCombine | None = None  # a group-level re-combination of the rewards' components
    answer_extras: Callable[[PromptRecord, str | None], dict[str, float]] | None = None  # more eval scores
    params: type[AgentParams] | None = None  # its own knobs, [rollout.<params.table>]; None: none
    demonstrations: DemoFormat | None = None  # what make-sft writes for its SFT; None: it has none
    description: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.needs) - SERVICES
        if unknown:
            raise ValueError(f"agent {self.name!r}: unknown services {sorted(unknown)}; known: {sorted(SERVICES)}")

    @property
    def reaches_retriever(self) -> bool:
        """Its episodes reach the retriever, directly or through the searcher service."""
        return bool(self.needs & {"retriever", "searcher"})


# ---------------------------------------------------------------- reward loading
def _result(value: float | Mapping[str, float], where: str) -> RewardResult:
    if isinstance(value, Mapping):
        components = {str(k): float(v) for k, v in value.items()}
        reward = components.pop("reward") if "reward" in components else sum(components.values())
        return RewardResult(reward=float(reward), components=components)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return RewardResult(reward=float(value), components={})
    raise TypeError(f"reward {where} returned {type(value).__name__}; want a float or a dict of floats")


def completion_reward(fn: Callable[..., Any], where: str) -> EpisodeReward:
    """An episode reward from a plain ``fn(completion, gold, row)``: the completion is what the policy wrote
    (its own turns, never the environment's text), the row is the dataset row as read."""

    def score(episode: Episode, scoring: Scoring) -> RewardResult:
        record = scoring.record
        row = {
            "id": record.prompt_id,
            "question": record.question,
            "golden_answers": list(record.golden_answers),
            **record.metadata,
        }
        return _result(fn(episode.main.generated_text, list(record.golden_answers), row), where)

    return score


@functools.cache
def load_reward(spec: str) -> EpisodeReward:
    """The reward named ``package.module:function``; a ``ValueError`` that says what is wrong otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward {spec!r}: want 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {spec!r}: cannot import {module_name!r} ({exc}); is it on PYTHONPATH?") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: {module_name} has no function {attr!r}")
    if getattr(fn, "episode_reward", False):
        return fn
    params = [
        p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) < 3 and not any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values()):
        raise ValueError(
            f"reward {spec!r}: a plain reward takes (completion, gold, row); "
            f"{attr} takes {len(params)} positional arguments"
        )
    return completion_reward(fn, spec)
