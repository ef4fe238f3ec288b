"""The arms of the multi-hop QA bench (``python -m bench.qa``): the datasets, and for each method its recipe, how it
is trained, and the environment its services get over the recipe. The report (``bench._qa_report``) tables them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# name -> the dataset (its fixed held-out split is what every arm is evaluated on)
DATASETS = {"hotpotqa": "bundled:hotpotqa-dev", "2wiki": "bundled:2wiki-dev"}
# An arm's recipe kind -> configs/<stem>.toml, ``{}`` being the dataset's name.
RECIPES = {"flat": "smol-{}", "coda": "smol-coda-{}", "thinker": "smol-thinker-{}"}
SEARCHER_ADAPTER = "searcher"  # the name thinker-searcher's frozen searcher adapter is served under
TITLES = {"hotpotqa": "HotpotQA (distractor dev, hard)", "2wiki": "2WikiMultihopQA (dev)"}


@dataclass(frozen=True)
class Arm:
    """One method of the bench. ``recipe``: a key of ``RECIPES``. ``training``: None (untrained, evaluated
    once), ``"sft"`` (the recipe's demonstrations only, for the whole ``--train-s``) or ``"rl"`` (a warm start
    of ``--warm-steps`` SFT steps, then GRPO + RED, inside the same budget). ``env``: set for every service of
    its runs that trains or evaluates (trainer, rollout, the eval job), over the recipe."""

    label: str
    recipe: str = "flat"
    training: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    shots: int = 0  # untrained arms: this many training questions and their answers in the system turn


ARMS = {
    "zero-shot": Arm("(a) zero-shot, search protocol"),
    "naive-rag": Arm("(b) naive RAG, top-3, one turn", env={"CODA_ROLLOUT_AGENT": "naive-rag"}),
    "naive-rag-4shot": Arm(
        "(b') naive RAG, 4 training examples in the prompt", env={"CODA_ROLLOUT_AGENT": "naive-rag"}, shots=4
    ),
    "sft": Arm("(c) SFT only", training="sft"),
    "rag-sft": Arm(
        "(c') RAG + SFT, one turn: naive RAG fine-tuned on its own demonstrations",
        training="sft",
        env={"CODA_ROLLOUT_AGENT": "naive-rag"},
    ),
    "flat": Arm("(d) flat Search-R1, GRPO + RED", training="rl"),
    "coda-sft": Arm("(e) CoDA planner + executor, SFT only", "coda", "sft"),
    "coda": Arm("(f) CoDA planner + executor, GRPO + RED", "coda", "rl"),
    "coda-shared": Arm(
        "(g) CoDA, GRPO + RED, shared reward (ablation)",
        "coda",
        "rl",
        {"CODA_ROLLOUT_CODA__REWARD_MODE": "shared", "CODA_TRAINER_ROLE_BASELINE": "inherit"},
    ),
    "thinker-searcher": Arm("(h) Thinker + frozen searcher, GRPO + RED", "thinker", "rl"),
    # Rejection-sampling fine-tuning: the same warm start, then the policy's own correct samples as its
    # demonstrations (advantage 1 where the reward reaches the threshold, else 0): the arm RL must beat.
    "rft": Arm(
        "(i) flat, warm start + rejection-sampling fine-tuning", training="rl", env={"CODA_TRAINER_ADVANTAGE": "rft"}
    ),
    "coda-rft": Arm(
        "(j) CoDA, warm start + rejection-sampling fine-tuning",
        "coda",
        "rl",
        # per-role rewards are 6*F1 - 3 + shaping: 0 is F1 ~0.5, as the flat arm's 0.5
        {"CODA_TRAINER_ADVANTAGE": "rft", "CODA_TRAINER_RFT_THRESHOLD": "0"},
    ),
}
METHODS = {name: arm.label for name, arm in ARMS.items()}
TRAINED = tuple(name for name, arm in ARMS.items() if arm.training)
RL = tuple(name for name, arm in ARMS.items() if arm.training == "rl")
SFT_ONLY = tuple(name for name, arm in ARMS.items() if arm.training == "sft")
CODA_LIKE = tuple(name for name, arm in ARMS.items() if arm.recipe == "coda")  # rows with the planner's tasks
