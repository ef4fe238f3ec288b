"""The docs check: links and anchors, example commands against the Makefile and a command's --help."""

from __future__ import annotations

from pathlib import Path

from testing.docs_check import (
    check_examples,
    check_links,
    check_pointers,
    example_commands,
    make_invocation,
    makefile_targets,
    makefile_variables,
    python_invocation,
    run_checks,
)
from testing.docs_pages import anchors, slug
from testing.docs_snippets import check_snippets, render_snippet

MAKEFILE = """\
RECIPE ?= x
train: setup  ## run
\t$(PY) -m launcher train --recipe configs/$(or $(RECIPE),smol-cpu).toml $(ARGS)
lint:
\truff
"""
HELP = {
    ("-m", "launcher", "train"): "usage: ... [--recipe RECIPE] [--new] [--resume [RUN]]",
    ("-m", "shared.redis_server"): "usage: ... --port PORT [--dir DIR]",
}


def _page(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    (tmp_path / "Makefile").write_text(MAKEFILE)
    path = tmp_path / name
    path.write_text(text)
    return path


def _examples(tmp_path: Path, text: str) -> list[str]:
    path = _page(tmp_path, text)
    make = makefile_targets(tmp_path / "Makefile"), makefile_variables(tmp_path / "Makefile")
    return [p.what for p in check_examples(path, make, HELP.get, root=tmp_path)]


def test_slug_follows_github():
    assert slug("`make train` against a real vLLM") == "make-train-against-a-real-vllm"
    assert slug("Security: who may drive the stack") == "security-who-may-drive-the-stack"
    assert slug("The trainer (`services/trainer`, port 8003)") == "the-trainer-servicestrainer-port-8003"


def test_anchors_number_duplicates_and_skip_code_blocks():
    text = "# A\n## A\n```\n# not a heading\n```\n"
    assert anchors(text) == {"a", "a-1"}


def test_broken_links_and_anchors_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("# Title\n## Part two\n")
    page = _page(
        tmp_path,
        "[ok](docs/x.md#part-two) [web](https://example.com) [self](#here)\n# Here\n"
        "[bad](docs/y.md) [anchor](docs/x.md#part-three) `[in code](nowhere.md)`\n",
    )
    problems = [p.what for p in check_links(page, root=tmp_path)]
    assert problems == [
        "link to docs/y.md: no such file",
        "link to docs/x.md#part-three: no heading #part-three in x.md",
    ]


def test_commands_come_from_code_blocks_and_inline_spans():
    text = "run `make train RECIPE=a` now\n```bash\npython -m m serve \\\n  --port 1  # comment\n```\n"
    commands = [c for _, c in example_commands(text)]
    assert "make train RECIPE=a" in commands
    assert "python -m m serve  --port 1  # comment" in commands


def test_invocations_parse():
    assert make_invocation("CODA_X=1 make train ARGS=--new") == ("train", ["ARGS"])
    assert make_invocation("make <target>") is None
    assert python_invocation(".venv/bin/python -m launcher train --recipe x.toml | tee log") == (
        ["-m", "launcher", "train"],
        ["--recipe"],
    )
    assert python_invocation("torchrun --nnodes 2 -m services.trainer train --zero-stage 2") == (
        ["-m", "services.trainer", "train"],
        ["--zero-stage"],
    )
    assert python_invocation("python bench/qa.py [--again]") == (["bench/qa.py"], ["--again"])
    assert python_invocation("python -m bench.qa --report-only") == (["-m", "bench.qa"], ["--report-only"])
    assert python_invocation("pip install x") is None


def test_examples_are_checked_against_the_makefile_and_help(tmp_path):
    good = "`make train RECIPE=tiny-cpu` `python -m launcher train --recipe a --new` `python -m shared.redis_server --port 1`"
    assert _examples(tmp_path, good) == []
    bad = "`make trian` `make train FOO=1` `python -m launcher train --recipes a` `python -m nothing.here --x`"
    assert _examples(tmp_path, bad) == [
        "`make trian`: the Makefile has no target 'trian'",
        "`make train FOO=1`: the Makefile reads no variable FOO",
        "`python -m launcher train --recipes a`: -m launcher train accepts no --recipes",
        "`python -m nothing.here --x`: `python -m nothing.here --help` fails",
    ]


def test_a_word_after_the_module_may_be_an_argument(tmp_path):
    # `python -m shared.redis_server foo --port 1`: no subcommand "foo", so the module's own help decides
    assert _examples(tmp_path, "`python -m shared.redis_server foo --port 1`") == []


RESULTS = """\
# A profile

Warm start (10 steps): lookup F1 0.958.

| layout | s/step (median) | peak RSS (MB) |
|---|---|---|
| before | 32.6 (32.0–33.1) | 8,069 |
| shared | 21.0 (19.5–21.7) | 3,602 |

| arm | seeds | F1 |
|---|---|---|
| RED | 0 | 0.972 |
| RED | 2 | 0.979 |
"""
QUOTE = (
    "<!-- from: bench/results/p.md: {before @ s/step (median) @ num} → {shared @ s/step (median) @ num} s, "
    "{before @ peak RSS (MB)} MB, mean {RED ; 2 @ F1}, warm {re:lookup F1 (\\d\\.\\d+)} -->"
)


def _results(tmp_path: Path, quoted: str) -> Path:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "p.md").write_text(RESULTS)
    return _page(tmp_path, f"| One step | {QUOTE}{quoted}<!-- end --> |\n")


def test_snippet_fields_read_tables_and_text():
    rendered = render_snippet(RESULTS, QUOTE.split(": ", 2)[2].removesuffix(" -->"))
    assert rendered == "32.6 → 21.0 s, 8,069 MB, mean 0.979, warm 0.958"


def test_a_quoted_number_that_agrees_passes(tmp_path):
    page = _results(tmp_path, "32.6 → 21.0 s, 8,069 MB, mean 0.979, warm 0.958")
    assert check_snippets(page, root=tmp_path) == []


def test_a_changed_number_fails_and_write_puts_the_results_file_back(tmp_path):
    page = _results(tmp_path, "34.5 → 20.0 s, 8,069 MB, mean 0.979, warm 0.958")  # planted disagreement
    problems = [p.what for p in check_snippets(page, root=tmp_path)]
    assert len(problems) == 1 and "34.5 → 20.0 s" in problems[0] and "32.6 → 21.0 s" in problems[0]
    assert check_snippets(page, root=tmp_path, write=True) == []
    assert "32.6 → 21.0 s, 8,069 MB" in page.read_text() and check_snippets(page, root=tmp_path) == []


def test_a_results_file_that_lost_the_number_fails(tmp_path):
    page = _results(tmp_path, "32.6 → 21.0 s, 8,069 MB, mean 0.979, warm 0.958")
    (tmp_path / "bench" / "results" / "p.md").write_text(RESULTS.replace("| shared |", "| shared, 2 threads |"))
    assert [p.what for p in check_snippets(page, root=tmp_path)] == [
        "quotes bench/results/p.md: no table with a column 's/step (median)' and a row 'shared'"
    ]


def test_section_pointers_in_comments_must_name_a_heading(tmp_path):
    (tmp_path / "README.md").write_text("# Title\n## Security: who may drive it\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "scaling-out.md").write_text("# Scaling out\n## A fleet of policy servers\n")
    code = tmp_path / "compose.yml"
    code.write_text(
        '# fine: README "Security", docs/scaling-out.md ("A fleet of policy\n# servers"), README § Security\n'
        "# fine: docs/scaling-out.md#a-fleet-of-policy-servers\n"
        '# dead: README, "Scaling out" and docs/scaling-out.md#the-trainer and DESIGN.md §9\n'
    )
    assert [str(p) for p in check_pointers(code, root=tmp_path)] == [
        "compose.yml:4: points to 'README, \"Scaling out\"': README.md has no such heading",
        "compose.yml:4: points to 'docs/scaling-out.md#the-trainer': docs/scaling-out.md has no such heading",
        "compose.yml:4: points to 'DESIGN.md §9': no such file DESIGN.md",
    ]


TWO_DATASETS = """\
# QA

## HotpotQA (dev)

| method | F1 |
|---|---|
| SFT only | 0.180 |

## 2WikiMultihopQA (dev)

| method | F1 |
|---|---|
| SFT only | 0.317 |
"""


def test_a_section_picks_the_table_under_its_heading():
    """One results file, one table per dataset with the same rows: `SECTION # ROW @ COLUMN` says which."""
    template = "{SFT only @ F1} = {HotpotQA # SFT only @ F1}, 2Wiki {2WikiMultihopQA # SFT only @ F1 @ num}"
    assert render_snippet(TWO_DATASETS, template) == "0.180 = 0.180, 2Wiki 0.317"
    try:
        render_snippet(TWO_DATASETS, "{MuSiQue # SFT only @ F1}")
    except ValueError as error:
        assert "no heading that starts with 'MuSiQue'" in str(error)
    else:
        raise AssertionError("a section that is not there must fail")


def _repository(tmp_path: Path, quoted: str, comment: str) -> Path:
    """A checkout in miniature: a README quoting a results file, a code file pointing into the README."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "qa.md").write_text(TWO_DATASETS)
    (tmp_path / "Makefile").write_text(MAKEFILE)
    snippet = "<!-- from: bench/results/qa.md: F1 {2WikiMultihopQA # SFT only @ F1} -->"
    (tmp_path / "README.md").write_text(f"# Title\n\n## Results\n\n| qa | {snippet}F1 {quoted}<!-- end --> |\n")
    (tmp_path / "stack.py").write_text(f"# {comment}\n")
    return tmp_path


def _planted(root: Path) -> list[str]:
    """What the whole check says of ``root``, but for the generated pages this miniature has none of."""
    return [str(p) for p in run_checks(root, help_of=HELP.get) if "not current: regenerate" not in p.what]


def test_the_whole_check_passes_a_checkout_that_agrees(tmp_path):
    assert _planted(_repository(tmp_path, "0.317", 'the numbers: README "Results"')) == []


def test_the_whole_check_fails_on_a_quoted_number_its_results_file_contradicts(tmp_path):
    problems = _planted(_repository(tmp_path, "0.371", 'the numbers: README "Results"'))  # planted: 0.371
    assert problems == [
        "README.md:5: says 'F1 0.371' where bench/results/qa.md says 'F1 0.317' (python -m testing.docs_check --write)"
    ]


def test_the_whole_check_fails_on_a_dead_section_pointer_in_a_code_comment(tmp_path):
    problems = _planted(_repository(tmp_path, "0.317", 'the numbers: README "Benchmarks"'))  # planted: no such heading
    assert problems == ["stack.py:1: points to 'README \"Benchmarks\"': README.md has no such heading"]
