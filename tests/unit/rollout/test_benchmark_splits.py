"""The bundled real benchmarks (HotpotQA and 2Wiki dev): a fixed split by hashed question id that no training
path can cross, the alias rule of 2Wiki's scoring, and the legacy set's non-dev questions kept apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.answers import answer_scores
from agents.datasets import FIXED_SPLITS, HELDOUT, load_prompts, question_type, select_split, wiki_type_from_shape
from launcher.config import StackSettings
from services.rollout.config import RolloutSettings
from tools.make_sft import qa_rows

REPO = Path(__file__).resolve().parents[3]
# Pinned: a changed fraction or hash would move questions between the halves, and earlier results with them.
SIZES = {"hotpotqa-dev": (615, 312), "2wiki-dev": (1305, 306)}


@pytest.mark.parametrize("name", sorted(FIXED_SPLITS))
def test_the_fixed_split_holds_out_at_least_300_questions_and_never_moves(name):
    records = load_prompts(f"bundled:{name}")
    held = select_split(records, "eval")
    total, n_held = SIZES[name]
    assert len(records) == total and len(held) == n_held >= 300
    assert all(r.split == HELDOUT and r.prompt_id.startswith(f"{name}/{HELDOUT}/") for r in held)
    # The recipe's eval_fraction does not move a fixed split (a recipe could otherwise train on held-out ones).
    for fraction in (0.0, 0.1, 0.9):
        assert select_split(records, "eval", fraction) == held
        assert select_split(records, HELDOUT, fraction) == held


@pytest.mark.parametrize("name", sorted(FIXED_SPLITS))
def test_no_held_out_question_reaches_training_or_demonstrations(name):
    source = f"bundled:{name}"
    held = select_split(load_prompts(source), "eval")
    held_questions = {r.question.strip().lower() for r in held}
    # What the rollout trains on (services/rollout/app.py reads the split like this, with the recipe's fraction).
    rollout = select_split(load_prompts(source), "train", 0.1)
    # What make-sft demonstrates (its --split train; --limit takes the first rows of the same list).
    demos = qa_rows(source, "train")
    assert rollout and demos and len(rollout) + len(held) == len(load_prompts(source))
    for question in [r.question for r in rollout] + [row["question"] for row in demos]:
        assert question.strip().lower() not in held_questions
    assert not {r.prompt_id for r in rollout} & {r.prompt_id for r in held}
    assert not {row["id"] for row in demos} & {r.prompt_id for r in held}


def benchmark_recipes() -> list[tuple[str, RolloutSettings]]:
    """Every shipped recipe whose rollout trains on a bundled benchmark, with its rollout settings."""
    recipes = [(str(path), RolloutSettings.load(str(path))) for path in sorted((REPO / "configs").glob("*.toml"))]
    found = [(path, rollout) for path, rollout in recipes if rollout.dataset.removeprefix("bundled:") in FIXED_SPLITS]
    assert len(found) >= 4  # smol-hotpotqa, smol-2wiki, smol-coda-hotpotqa, smol-coda-2wiki
    return found


def test_every_shipped_recipe_on_a_benchmark_trains_on_train_and_evaluates_held_out():
    for path, rollout in benchmark_recipes():
        stack = StackSettings.load(path)
        assert rollout.split == "train", path
        assert stack.train_qa == rollout.dataset and stack.sft_split == "train", path
        assert stack.eval_dataset == rollout.dataset and stack.eval_split in ("eval", HELDOUT), path


def test_every_benchmark_recipe_cuts_its_demonstrations_as_its_rollout_cuts():
    for path, rollout in benchmark_recipes():
        # Uncut, two observations of three 2Wiki passages reached 3,097 tokens (past max_context_tokens).
        assert StackSettings.load(path).sft_max_obs_tokens == rollout.max_obs_tokens, path


def test_every_benchmark_recipe_evaluates_no_more_episodes_at_once_than_its_server_decodes():
    from services.inference.config import InferenceSettings

    for path, rollout in benchmark_recipes():
        # Past the server's max_num_seqs episodes only queue; with 64 at once, 25 of 150 held-out two-search
        # episodes waited longer than http_timeout_s and were scored as failures.
        assert rollout.eval_concurrency is not None, path
        assert rollout.eval_concurrency <= InferenceSettings.load(path).max_num_seqs, path


def test_2wiki_scores_the_best_alias():
    record = next(r for r in load_prompts("bundled:2wiki-dev") if "City of Light" in r.golden_answers)
    assert record.golden_answers[0] == "Paris"
    assert answer_scores("City of Light", record.golden_answers)["em"] == 1.0
    assert answer_scores("the city of light", record.golden_answers)["f1"] == 1.0
    # F1 is the max over aliases, not over their union: "Paris France" matches "Paris, France" exactly.
    assert answer_scores("Paris France", record.golden_answers)["f1"] == 1.0
    assert answer_scores("Lyon", record.golden_answers)["f1"] == 0.0


def test_question_types_are_read_from_the_data():
    hotpot = {question_type(r) for r in load_prompts("bundled:hotpotqa-dev")}
    wiki = {question_type(r) for r in load_prompts("bundled:2wiki-dev")}
    assert hotpot == {"bridge", "comparison"}
    assert wiki == {"compositional", "comparison", "inference", "bridge_comparison"}  # 558 from the shape


def test_2wiki_types_from_the_questions_shape_agree_with_every_source_label():
    labelled = [r for r in load_prompts("bundled:2wiki-dev") if r.metadata.get("type")]
    assert len(labelled) == 747
    shape = [wiki_type_from_shape(r.question, len(r.metadata["supporting_titles"])) for r in labelled]
    assert shape == [r.metadata["type"] for r in labelled]


@pytest.mark.parametrize(
    ("question", "titles", "kind"),
    [
        ("Who is the father of the director of film Monsieur N.?", 2, "compositional"),
        ("Who is the maternal grandmother of Eleanor Of Brittany?", 2, "inference"),
        ("Who is Archduchess Rosa Of Austria's mother-in-law?", 2, "inference"),
        ("Who was born first out of Aivar Kuusmaa and Andy Summers?", 2, "comparison"),
        ("Which film has the director who died first, Three Violent People or Girls In White?", 4, "bridge_comparison"),
        ("What nationality is the director of film Paradox (2016 Film)?", 2, "compositional"),
    ],
)
def test_2wiki_type_from_shape_by_hand(question, titles, kind):
    assert wiki_type_from_shape(question, titles) == kind


def test_the_legacy_sets_non_dev_questions_are_never_reported_as_hotpotqa():
    records = load_prompts("bundled:hotpotqa")
    non_dev = [r for r in records if r.data_source == "hotpotqa-nondev"]
    assert len(non_dev) == 100 and all(r.metadata["source"] == "amor_dev_distractor" for r in non_dev)
    dev_ids = {r.prompt_id.rsplit("/", 1)[-1] for r in load_prompts("bundled:hotpotqa-dev")}
    assert not {r.prompt_id.rsplit("/", 1)[-1] for r in non_dev} & dev_ids
