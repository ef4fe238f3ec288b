"""A trajectory role is declared by the agent that trains it (``Agent.roles``, an ``AgentRole`` each): the role
tags of format rewards, the strict grammars and the stop strings are read from those declarations
(``agents.roles()``), and the wire type's ``Role`` lists exactly the declared names."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest

from agents import AGENTS, roles
from agents.core.turns import AgentRole, role_format_score, validate_sequence
from shared.protocol.trajectory import Role
from shared.tags import OBSERVATION_TAGS


def test_the_wire_role_lists_exactly_the_roles_the_agents_declare():
    declared, wire = set(roles()), set(get_args(Role))
    assert declared == wire, (
        f"agents declare roles {sorted(declared - wire)} the wire type lacks, and the wire type lists "
        f"{sorted(wire - declared)} no agent declares: edit the Role literal in shared/protocol/trajectory.py "
        "(the trainer validates it; shared/ cannot import agents/) to match the agents' AgentRole declarations"
    )


def test_every_agent_declares_its_roles():
    for agent in AGENTS.values():
        assert agent.roles and all(isinstance(r, AgentRole) for r in agent.roles), agent.name


def test_the_tables_read_the_declarations():
    from agents.coda import EXECUTOR, PLANNER
    from agents.search_r1 import POLICY, THINKER

    assert roles() == {r.name: r for r in (POLICY, THINKER, PLANNER, EXECUTOR)}
    assert PLANNER.stop_strings == ["</task>", "</answer>"]
    assert EXECUTOR.stop_strings == POLICY.stop_strings == ["</search>", "</answer>"]
    assert role_format_score("<think>a</think><refine>r</refine>", "executor") == 0.5  # 2 of its 4 tags
    assert validate_sequence(
        "<think>a</think><task>q</task><result>r</result><think>b</think><answer>x</answer>", "planner"
    )[0]


def test_a_role_writes_vocabulary_tags_and_no_observation_tags():
    for role in roles().values():
        assert not set(role.tags) & set(OBSERVATION_TAGS), role.name
    with pytest.raises(ValueError, match=r"not in shared\.tags\.TAGS"):
        AgentRole("x", tags=("shout",))
    with pytest.raises(ValueError, match="not all among its tags"):
        AgentRole("x", tags=("think",), actions=("answer",))


def test_a_role_without_a_grammar_validates_nothing():
    bare = AgentRole("planner")  # a JSON planner (recursive-reasoner): no tags, no grammar
    assert not bare.matches(["think", "answer"]) and bare.stop_strings == []


def test_two_agents_may_not_declare_one_role_differently(monkeypatch):
    import agents
    from agents.coda import PLANNER

    other = AgentRole("planner", tags=("think", "answer"), actions=("answer",), grammar="think answer ")
    entries = {
        "a": AGENTS["coda"],
        "json": AGENTS["recursive-reasoner"],  # a bare planner beside a tagged one is fine
        "b": replace(AGENTS["coda"], name="b", roles=(other,)),
    }
    monkeypatch.setattr(agents, "_collect", lambda: entries)
    agents.roles.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="declares role 'planner' unlike another agent"):
            agents.roles()
        del entries["b"]
        agents.roles.cache_clear()
        assert agents.roles()["planner"] == PLANNER
    finally:
        agents.roles.cache_clear()
