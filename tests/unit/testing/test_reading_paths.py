"""A newcomer reaches each goal from the top of the README in at most 600 words (testing/reading_paths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing import reading_paths
from testing.reading_paths import GOALS, LIMIT, Step, count, counts, words


@pytest.mark.parametrize("goal", list(GOALS))
def test_each_goal_is_reached_in_at_most_600_words(goal):
    n, path = counts()[goal]
    steps = " → ".join(f"{s.page} {s.section or s.sentence}" for s in path)
    assert n <= LIMIT, f"{goal}: {n} words on README.md → {steps} (limit {LIMIT}): trim those sections"


def test_words_skip_comments_link_targets_and_table_rules():
    text = "| a | b |\n|---|---|\n| [x](docs/x.md) | <!-- from: f.md: {r @ c} -->0.5<!-- end --> — |\n"
    assert words(text) == 4  # a, b, [x], 0.5: not the rule, the link target, the template, "|" or "—"


def test_a_step_the_docs_do_not_link_to_fails(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# t\n\nintro words\n\n## Go\n\nsee [the page](docs/a.md)\n")
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Here\n\nfour words of text\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## There\n\ntext\n")
    path = [Step("README.md", "Go"), Step("docs/a.md", "Here")]
    assert count(path, root=tmp_path) == 2 + 4 + 5  # headings are read too
    with pytest.raises(ValueError, match="linked from no section"):
        count([Step("README.md", "Go"), Step("docs/b.md", "There")], root=tmp_path)


def test_main_prints_every_goal(capsys):
    assert reading_paths.main([]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(GOALS)
