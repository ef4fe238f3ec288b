"""The turn engine every agent role runs: generate → parse one action → act → append the observation.

Protocol (shared by all agents, parameterised per role by ``RoleSpec``):
- A turn ends at a stop string (the closers of the role's action tags) or at EOS; the ids are kept as
  sampled, EOS included. The turn's text is that of its whole last token, even where a BPE merge carries
  characters past the stop string (``</task>.``; ``llm.whole_tokens``), so text, ids and action agree.
- The first complete action block decides the turn (Search-R1's and CoDA's ``<(search|answer)>(.*?)</\\1>`` rule); all
  blocks with that tag in the turn are handed to ``act`` together (a planner's tasks run concurrently).
- ``answer`` ends the episode. No valid action → the role's invalid-action message is appended (masked),
  unless the model ended its turn with EOS, which ends the episode without an answer.
- Observations are wrapped (``agents.prompts.OBSERVATION_WRAP``) and their content truncated to
  ``max_obs_tokens``; the wrapper tags always stay intact. A role's ``env_frame`` puts all environment text in a
  chat turn of its own (``[rollout] env_turn``; ``agents.prompts.env_frame``), else it stays inline.
- Each role has its own turn budget. When it runs out, one forced final turn asks for the answer (only
  ``</answer>`` stops it, nothing is executed), as Search-R1 does.
- The context never grows past ``max_context_tokens`` (nothing is left-truncated: that would break
  token-in/token-out); the episode ends with ``finish_reason="length"`` instead.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.core.llm import Generation, Generator, whole_tokens
from agents.prompts import FINAL_ANSWER_NUDGE, INLINE, OBSERVATION_WRAP, TokenizerLike
from shared.tags import TAGS, close_tag, open_tag

if TYPE_CHECKING:  # episode.py imports Budget from here
    from agents.core.episode import TokenTrajectory


@dataclass(frozen=True)
class Budget:
    max_turns: int = 4  # action turns before the forced final turn
    max_tokens: int = 256  # generated tokens per turn
    max_obs_tokens: int = 512  # content tokens of one observation
    max_context_tokens: int = 4096  # prompt + everything appended


@dataclass(frozen=True)
class Action:
    tag: str
    content: str


@dataclass(frozen=True)
class Observation:
    """What the environment appends: ``before + content + after``; only ``content`` is ever truncated.

    ``tag`` names the wrapper of an observation (documents, results, ...); a message (invalid action, nudge)
    has none. Rewards find observations by tag and never read messages.
    """

    content: str
    before: str = ""
    after: str = ""
    tag: str | None = None
    own_turn: bool = False  # already rendered as a chat turn (a tool agent's tool result): never framed again

    @classmethod
    def wrapped(cls, tag: str, content: str) -> Observation:
        before, after = OBSERVATION_WRAP[tag]
        return cls(content=content, before=before, after=after, tag=tag)


def parse_tag_actions(text: str, tags: tuple[str, ...]) -> list[Action]:
    """All complete blocks of the first action tag that occurs in ``text`` (contents stripped)."""
    pattern = re.compile(rf"<({'|'.join(map(re.escape, tags))})>(.*?)</\1>", re.DOTALL)
    matches = [(m.group(1), m.group(2).strip()) for m in pattern.finditer(text)]
    if not matches:
        return []
    first = matches[0][0]
    return [Action(tag, content) for tag, content in matches if tag == first]


ActFn = Callable[[list[Action]], Awaitable[Observation]]


@dataclass(frozen=True)
class AgentRole:
    """A trajectory role as the agent that trains it declares it, beside its driver (``Agent.roles``).

    ``agents.roles()`` collects the declarations into the tables the role-keyed helpers read: the tags a format
    score counts (``role_format_score``), the strict grammar (``validate_sequence``) and the stop strings. The
    name is the wire type's ``Role`` (``shared.protocol.trajectory``), which lists the declared names again
    (``tests/unit/agents/test_roles.py`` checks that the two agree).
    """

    name: str  # the samples' ``role`` on the wire
    tags: tuple[str, ...] = ()  # tags it writes itself (format rewards); () for a role that writes none
    actions: tuple[str, ...] = ()  # the action tags among them, "answer" included: a turn ends at their closers
    # Its strict grammar over the sequence of top-level tag blocks (space-joined, each followed by a space),
    # observation tags included: a valid trajectory alternates call → observation. None: no grammar.
    grammar: str | None = None

    def __post_init__(self) -> None:
        unknown = [t for t in self.tags if t not in TAGS]
        if unknown:
            raise ValueError(f"role {self.name!r}: tags {unknown} are not in shared.tags.TAGS")
        if not set(self.actions) <= set(self.tags):
            raise ValueError(f"role {self.name!r}: actions {self.actions} are not all among its tags {self.tags}")

    @property
    def stop_strings(self) -> list[str]:
        """Strings that end one of its turns: the closers of its action tags."""
        return [close_tag(t) for t in self.actions]

    def matches(self, tags: Sequence[str]) -> bool:
        """Does the top-level tag sequence ``tags`` follow its grammar? (False where it has none.)"""
        if self.grammar is None:
            return False
        return _compiled(self.grammar).fullmatch("".join(f"{t} " for t in tags)) is not None


@functools.cache
def _compiled(grammar: str) -> re.Pattern[str]:
    return re.compile(grammar)


@dataclass(frozen=True)
class RoleSpec:
    actions: tuple[str, ...]  # action tags the role writes, "answer" included
    invalid_message: str
    budget: Budget = field(default_factory=Budget)
    forced_final: bool = True
    stop: tuple[str, ...] = ()  # default: the closers of ``actions``
    parse: Callable[[str], list[Action]] | None = None  # default: ``parse_tag_actions``
    answer_on_eos: Callable[[str], str | None] | None = None  # e.g. a tool agent's plain final reply
    final_message: str = FINAL_ANSWER_NUDGE  # appended before the forced final turn
    final_stop: tuple[str, ...] = (close_tag("answer"),)
    env_frame: tuple[str, str] = INLINE  # around environment text (``agents.prompts.env_frame``)

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop) if self.stop else [close_tag(t) for t in self.actions]

    def actions_in(self, text: str) -> list[Action]:
        return self.parse(text) if self.parse else parse_tag_actions(text, self.actions)


@dataclass
class TurnOutcome:
    answer: str | None
    actions: list[Action] = field(default_factory=list)  # every executed action, in order
    invalid_turns: int = 0


def encode_observation(tok: TokenizerLike, obs: Observation, max_obs_tokens: int) -> tuple[list[int], str, str]:
    """``(ids, text, content)``: the wrapped observation's ids and text, and its (possibly truncated) content."""
    content_ids = tok.encode(obs.content)
    content = obs.content
    if len(content_ids) > max_obs_tokens:
        content_ids = content_ids[:max_obs_tokens]
        content = tok.decode(content_ids)
    ids = tok.encode(obs.before) + content_ids + tok.encode(obs.after)
    return ids, obs.before + content + obs.after, content


def append_observation(
    traj: TokenTrajectory, tok: TokenizerLike, obs: Observation, budget: Budget, frame: tuple[str, str] = INLINE
) -> None:
    if not obs.own_turn and frame != INLINE:
        obs = Observation(obs.content, frame[0] + obs.before, obs.after + frame[1], obs.tag, own_turn=True)
    ids, text, content = encode_observation(tok, obs, budget.max_obs_tokens)
    traj.add_observation(ids, text, tag=obs.tag, content=content)


async def _generate(
    traj: TokenTrajectory, llm: Generator, tok: TokenizerLike, stop: list[str], max_tokens: int
) -> Generation:
    """One turn sampled on the trajectory's exact ids and appended to it, its text covering its whole ids."""
    gen = whole_tokens(await llm.generate(traj.next_prompt(), stop=stop, max_tokens=max_tokens), tok)
    traj.add_generation(gen)
    return gen


async def run_turns(
    traj: TokenTrajectory, llm: Generator, tok: TokenizerLike, spec: RoleSpec, act: ActFn
) -> TurnOutcome:
    """Drive one role's episode on ``traj`` until an answer, EOS, the context cap or the turn budget."""
    outcome = TurnOutcome(answer=None)
    budget = spec.budget
    for _ in range(budget.max_turns):
        room = budget.max_context_tokens - len(traj.ids)
        if room <= 0:
            traj.finish_reason = "length"
            return outcome
        gen = await _generate(traj, llm, tok, spec.stop_strings, min(budget.max_tokens, room))
        actions = spec.actions_in(gen.text)
        if actions and actions[0].tag == "answer":
            outcome.answer = actions[0].content
            return outcome
        if not actions:
            if gen.hit_eos:
                outcome.answer = spec.answer_on_eos(gen.text) if spec.answer_on_eos else None
                return outcome
            outcome.invalid_turns += 1
            append_observation(traj, tok, Observation(spec.invalid_message), budget, spec.env_frame)
            continue
        outcome.actions += actions
        append_observation(traj, tok, await act(actions), budget, spec.env_frame)
    if spec.forced_final:
        await _forced_final(traj, llm, tok, spec, outcome)
    traj.finish_reason = "budget"
    return outcome


async def _forced_final(
    traj: TokenTrajectory, llm: Generator, tok: TokenizerLike, spec: RoleSpec, outcome: TurnOutcome
) -> None:
    """One last turn in which only an answer counts; nothing it asks for is executed."""
    append_observation(traj, tok, Observation(spec.final_message), spec.budget, spec.env_frame)
    room = spec.budget.max_context_tokens - len(traj.ids)
    if room <= 0:
        return
    gen = await _generate(traj, llm, tok, list(spec.final_stop), min(spec.budget.max_tokens, room))
    answers = parse_tag_actions(gen.text, ("answer",))
    if answers:
        outcome.answer = answers[0].content
    elif gen.hit_eos and spec.answer_on_eos:
        outcome.answer = spec.answer_on_eos(gen.text)


# Format scores and the strict tag-sequence validator, beside the tag parser the turns use. A role's tag list and
# grammar are those its agent declares (``AgentRole``, collected by ``agents.roles()``), so a role is scored on the
# tags it writes itself whatever its prompt holds (upstream CoDA picked the list by looking for ``<refine>`` in the
# text; ``docs/upstream.md``).
_BLOCK = re.compile(r"<(?P<tag>[a-z_]+)>(?P<body>.*?)</(?P=tag)>", re.DOTALL)
_ANY_TAG = re.compile("|".join(re.escape(t) for tag in TAGS for t in (open_tag(tag), close_tag(tag))))


def tag_format_score(response: str, tags: Sequence[str]) -> float:
    """Graduated score: ``Σ_tag 1/N · 1[count(<tag>) > 0 and count(<tag>) == count(</tag>)]``, N = len(tags).

    E.g. the executor list has 4 tags, so each balanced, present tag is worth 0.25.
    """
    if not tags:
        return 0.0
    ok = sum(1 for t in tags if 0 < response.count(open_tag(t)) == response.count(close_tag(t)))
    return ok / len(tags)


def _role(name: str) -> AgentRole:
    from agents import roles  # the agents' declarations, collected on first use (they import this module)

    return roles()[name]


def role_format_score(response: str, role: str) -> float:
    """``tag_format_score`` with the tags ``role`` writes itself (its ``AgentRole.tags``)."""
    return tag_format_score(response, _role(role).tags)


def nonempty_tag_format_score(response: str, tags: Sequence[str]) -> float:
    """``tag_format_score`` that pays only for content: ``Σ_tag 1/N · 1[tag present, balanced, and every
    <tag>…</tag> block holds non-whitespace text]``.

    ``tag_format_score`` pays for ``<answer></answer>``, so a policy learns the tags without saying anything in
    them. "Every block": the number of ``<tag>…</tag>`` blocks must equal the number of opening tags (a stray
    ``</tag>`` before its ``<tag>``, or a nested one, leaves fewer blocks and fails), and none may be blank.
    """
    if not tags:
        return 0.0
    return sum(1 for t in tags if _filled(response, t)) / len(tags)


def nonempty_role_format_score(response: str, role: str) -> float:
    """``nonempty_tag_format_score`` with the tags ``role`` writes itself (its ``AgentRole.tags``)."""
    return nonempty_tag_format_score(response, _role(role).tags)


def _filled(response: str, tag: str) -> bool:
    opens = response.count(open_tag(tag))
    if not 0 < opens == response.count(close_tag(tag)):
        return False
    blocks = re.findall(f"{re.escape(open_tag(tag))}(.*?){re.escape(close_tag(tag))}", response, flags=re.DOTALL)
    return len(blocks) == opens and all(b.strip() for b in blocks)


def tag_sequence(response: str) -> tuple[list[str] | None, str]:
    """Split ``response`` into top-level ``<tag>…</tag>`` blocks: ``(tags, "")`` or ``(None, reason)``.

    Only whitespace may sit between blocks; a block may not contain another vocabulary tag.
    """
    tags: list[str] = []
    pos, n = 0, len(response)
    while True:
        while pos < n and response[pos].isspace():
            pos += 1
        if pos == n:
            return tags, ""
        m = _BLOCK.match(response, pos)
        if m is None:
            return None, f"text outside a tag block at offset {pos}"
        if m["tag"] not in TAGS:
            return None, f"unknown tag <{m['tag']}> at offset {pos}"
        if _ANY_TAG.search(m["body"]):
            return None, f"nested tag inside <{m['tag']}> at offset {pos}"
        tags.append(m["tag"])
        pos = m.end()


def validate_sequence(response: str, role: str = "policy") -> tuple[bool, str]:
    """Strict validator: does ``response`` follow its role's grammar (``AgentRole.grammar``, declared by the
    role's agent)? Returns ``(valid, reason)``. Top-level blocks, whitespace only between them; the response is
    the text after the prompt. E.g. policy/thinker (``agents.search_r1``): think → (search → information →
    think)* → answer; planner and executor: ``agents.coda``.
    """
    tags, reason = tag_sequence(response)
    if tags is None:
        return False, reason
    if not tags:
        return False, "no tag blocks"
    spec = _role(role)
    if spec.grammar is None:
        return False, f"the {role} role declares no grammar"
    if not spec.matches(tags):
        return False, f"tag order {' → '.join(tags)} does not match the {role} grammar"
    return True, ""


def is_valid_sequence(response: str, role: str = "policy") -> bool:
    """``validate_sequence(...)[0]``."""
    return validate_sequence(response, role)[0]
