"""Reward functions: pure Python/numpy, no torch, no network of their own (clients and embedders are passed in).

Modules: ``retrieval`` (refine, information reverse-rank, MRR), ``similarity`` (embedding cosine,
subproblem independence), ``efficiency`` (token efficiency, think fraction),
``planner_json`` (tolerant JSON-plan parsing), ``formulas`` (the CoDA, recursive-reasoner and tool-agent
rewards), ``combine`` (reward combination inside a prompt group), ``peco``. The answer rewards (EM/F1, the
6·F1−3 mapping) live with the answer normalisation in ``agents.answers``, the format scores and the strict
sequence validator beside the tag parser in ``agents.core.turns``, ``RewardResult`` beside ``Episode`` in
``agents.core.episode`` and Search-R1's reward in ``agents.search_r1``. Every agent's reward returns a
``RewardResult``: the scalar and its named components.
"""
