"""``python -m services.rollout eval``: greedy episodes on a held-out split, EM/F1 per data source.

Each episode is also scored with the recipe's reward (``[rollout] reward``, else the agent's own; the very
function the rollout trains on, ``scoring.score_episode``): the ``reward`` column, so that a reward of the
user's own that has nothing to do with gold answers still shows what training changed. (A group-level
re-combination of the components, the tool agent's ``reward_combination``, has no group here: it is left out.)

Writes a table to stdout and a JSON file under ``eval_output``: per-source means and every prediction, each row
with the agent's own record of the episode (``facts``: CoDA's tasks and its executors' answers) and how each of
its trajectories ended (``trajectories``: role, finish reason, turns, the end of the last turn).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import redis

from agents.core.episode import Episode
from agents.core.llm import PolicyState
from agents.datasets import PromptRecord, question_type
from agents.question_kinds import question_kind
from services.rollout.config import RolloutSettings
from services.rollout.embedding import make_embedder
from services.rollout.loader import LOAD_TIMEOUT_S
from services.rollout.runtime import agent_context
from services.rollout.scoring import answer_metrics, score_episode, search_metrics
from services.rollout.weight_sync import WeightSync
from shared.log import get_logger

log = get_logger(__name__)


async def evaluate(settings: RolloutSettings, records: list[PromptRecord], *, tok=None) -> dict:
    limit = asyncio.Semaphore(settings.eval_concurrency or settings.max_running_groups)
    rows: list[dict] = []
    embed = make_embedder(settings.embedder)

    async with agent_context(settings, greedy=True, tok=tok) as ctx:
        if settings.eval_policy == "live":
            await follow_live_policy(settings, ctx.policy.state)
        model = ctx.policy.state.model_name

        def searched(record: PromptRecord, episode: Episode | None) -> dict[str, float]:
            return search_metrics(record, episode) if settings.agent_spec.reaches_retriever else {}

        async def one(record: PromptRecord) -> None:
            async with limit:
                episode = None
                try:
                    episode = await settings.agent_spec.run(ctx, record)
                    reward, error = score_episode(settings, record, episode, embed).reward, None
                except Exception as exc:  # one failed prompt is a scored miss, not the end of the eval
                    reward, error = 0.0, repr(exc)[:300]
            answer = episode.answer if episode else None
            rows.append(
                {
                    "prompt_id": record.prompt_id,
                    "data_source": record.data_source or "all",
                    "question": record.question,
                    "golden_answers": record.golden_answers,
                    "prediction": answer,
                    "error": error,
                    "type": question_type(record),
                    "kind": question_kind(record.question, record.golden_answers),
                    "queries": (list(episode.search.queries) if episode else None),
                    "searches": episode.search.num_searches if episode else 0,
                    "generated_tokens": episode.generated_tokens if episode else 0,
                    "facts": facts_of(episode),
                    "trajectories": trajectories_of(episode),
                    "reward": reward,
                    **answer_metrics(settings.agent, record, answer),
                    **searched(record, episode),
                }
            )

        await asyncio.gather(*(one(r) for r in records))
    return {**summarise(rows), "model": model}


def facts_of(episode: Episode | None) -> dict | None:
    """The agent's own record of the episode (CoDA: each delegated task and its executor's answer), so that an
    eval shows how a hierarchical policy split its questions, not only what it answered."""
    facts = episode.facts if episode else None
    if not dataclasses.is_dataclass(facts) or isinstance(facts, type):
        return None
    return json.loads(json.dumps(dataclasses.asdict(facts)))  # tuples as the lists the written file holds


def trajectories_of(episode: Episode | None) -> list[dict]:
    """How each trajectory of the episode ended (a CoDA planner and its executors: which one stopped without
    an answer, and after what): role, finish reason, turns, and the end of the model's last turn."""
    if episode is None:
        return []
    return [
        {"role": t.role, "finish": t.finish_reason, "turns": t.num_turns, "last_turn": (t.turns or [""])[-1][-300:]}
        for t in episode.trajectories
    ]


async def follow_live_policy(settings: RolloutSettings, state: PolicyState) -> None:
    """Point ``state`` at the policy the trainer last published (a LoRA run's is an adapter, not the served
    base model) and load it into the server if it is behind (the rollout loads weights; no rollout may be
    running beside the eval). Without Redis, or before the first publish, the base model is evaluated; the log
    says which."""
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    sync = WeightSync(settings, state, client)
    try:
        await sync.start()
        if state.history and not await sync.serve_live(settings.inference_url, LOAD_TIMEOUT_S):
            log.warning(
                "the policy server does not serve the live version: the eval's requests may fail",
                extra={"server": settings.inference_url, "version": state.version},
            )
    except redis.RedisError as exc:
        log.warning(
            "Redis unreachable: evaluating the served base model, not the trained policy",
            extra={"model": state.model_name, "error": repr(exc)[:200]},
        )
    finally:
        await sync.aclose()
        client.close()
    log.info("evaluating", extra={"model": state.model_name, "version": state.version})


def summarise(rows: list[dict]) -> dict:
    by_source: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_source[row["data_source"]].append(row)
    metrics = [
        k
        for k in ("em", "f1", "sub_em", "numeric", "search_entity", "search_hit", "reward")
        if rows and all(k in r for r in rows)
    ]
    table = {
        src: {"n": len(rs), **{m: sum(r[m] for r in rs) / len(rs) for m in metrics}}
        for src, rs in sorted(by_source.items())
    }
    if rows:
        table["ALL"] = {"n": len(rows), **{m: sum(r[m] for r in rows) / len(rows) for m in metrics}}
    return {
        "metrics": metrics,
        "by_source": table,
        "failed": sum(r["error"] is not None for r in rows),
        "rows": sorted(rows, key=lambda r: r["prompt_id"]),
    }


def format_table(result: dict) -> str:
    metrics = result["metrics"]
    lines = ["| data source | n | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for src, row in result["by_source"].items():
        lines.append(f"| {src} | {row['n']} | " + " | ".join(_cell(m, row[m]) for m in metrics) + " |")
    return "\n".join(lines)


def _cell(metric: str, value: float) -> str:
    """A share in percent; the reward as it is (a recipe's reward is any float, not a share)."""
    return f"{value:.3f}" if metric == "reward" else f"{100 * value:.1f}"


def run_eval(settings: RolloutSettings) -> tuple[Path, dict]:
    """Run the split, write the JSON file; returns its path and the result (``format_table`` renders it)."""
    records = settings.records()
    if settings.eval_kind != "all":
        records = [r for r in records if question_kind(r.question, r.golden_answers) == settings.eval_kind]
    if settings.eval_limit:
        records = records[: settings.eval_limit]
    if not records:
        raise SystemExit(f"no prompts in split {settings.split!r} of {settings.dataset}")
    start = time.time()
    result = asyncio.run(evaluate(settings, records))
    result.update(
        agent=settings.agent, dataset=settings.dataset, split=settings.split, seconds=round(time.time() - start, 2)
    )
    out = Path(settings.eval_output)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{settings.agent}-{settings.split}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    return path, result
