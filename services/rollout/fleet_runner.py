"""Runs each episode on one server of the fleet, and again from scratch on another when that server fails.

An episode leases a server (``services.rollout.fleet``) and keeps it for all its turns: its policy and frozen
generators are bound to that server's client, and its ``PolicyState`` is a copy of the live one taken when the
lease was granted, so every turn asks for the same model name (one weight version per episode; under LoRA the
older adapter stays loaded for the trainer's keep window, and the lease was granted only because the server
serves the live version).

A server that fails mid-episode (``shared.retry``: refused, dropped or timed out, 502/503/504/429 after the
client's own retries) is marked down and the episode starts over on another server, at most
``episode_attempts`` tries in all. What the failed try produced is dropped whole: an episode is returned only
when it finished, and a group is scored and published only when all its episodes finished, so nothing is
half-scored and nothing reaches the stream twice. When no other server can take it, the last failure is
raised as it was, and the producer counts the group failed in an inference outage (its prompt is re-queued
uncounted). Failures that are not the server's (a 4xx, a 500, the retriever, a bug) are raised at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from agents.core.context import AgentContext, Episode
from agents.core.llm import FrozenGenerator, PolicyGenerator, PolicyState
from agents.datasets import PromptRecord
from services.rollout.config import RolloutSettings
from services.rollout.fleet import Fleet, Server
from services.rollout.runtime import llm_client
from shared.inference_client import AiohttpCompletions, InferenceClient, InferenceError
from shared.log import get_logger
from shared.retry import Failure, classify

log = get_logger(__name__)


class FleetRunner:
    """``await run(record) -> Episode`` on the fleet; ``classify`` names the server an httpx error came from."""

    def __init__(
        self,
        settings: RolloutSettings,
        ctx: AgentContext,
        fleet: Fleet,
        *,
        answers: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.s, self.ctx, self.fleet = settings, ctx, fleet
        self.agent = settings.agent_spec  # resolved once, not for every episode
        # What ``classify`` names an httpx error by; "inference" is replaced by the episode's own server.
        self.services = {
            "inference": settings.inference_url,
            "retriever": settings.retriever_url,
            "searcher": settings.searcher_url,
        }
        self.answers = answers  # the outage gate's probe of "inference": does any server take episodes?
        self.clients: dict[str, InferenceClient | AiohttpCompletions] = {}
        self.contexts: dict[str, tuple[tuple[int, str, str], AgentContext]] = {}  # url → (version key, context)

    def _client(self, url: str) -> InferenceClient | AiohttpCompletions:
        if url not in self.clients:
            self.clients[url] = llm_client(self.s, url)
        return self.clients[url]

    def episode_context(self, server: Server) -> AgentContext:
        """``ctx`` with its generators bound to ``server`` and to the live version as it is now.

        One context per server and version, made at the first episode that needs it and shared by the episodes
        after it (as the single-URL path shares ``ctx``): nothing in it belongs to one episode, and making it
        per episode was a measurable part of the fleet's cost at hundreds of episodes a second."""
        live = self.ctx.policy
        if not isinstance(live, PolicyGenerator):
            raise TypeError(f"the fleet runs a PolicyGenerator's episodes, not {type(live).__name__}'s")
        state = live.state
        key = (state.version, state.model_name, state.served_model_name)
        cached = self.contexts.get(server.url)
        if cached is not None and cached[0] == key:
            return cached[1]
        pinned = PolicyState(*key)
        client = self._client(server.url)
        policy = PolicyGenerator(client, pinned, live.sampling, live.behind_wait_s, live.behind_retry_s)
        frozen = self.ctx.frozen
        if isinstance(frozen, FrozenGenerator):  # the same server: its prefix cache has the episode
            frozen = FrozenGenerator(client, frozen.model, frozen.sampling)
        ctx = replace(self.ctx, policy=policy, frozen=frozen)
        self.contexts[server.url] = (key, ctx)  # the older version's context goes: its episodes hold their own
        return ctx

    async def run(self, record: PromptRecord) -> Episode:
        tried: set[str] = set()
        last: BaseException | None = None
        for attempt in range(self.s.episode_attempts):
            server = await self.fleet.acquire(tried, self.s.server_wait_s)
            if server is None:
                break
            if attempt:
                self.fleet.restarts += 1
            try:
                return await self.agent.run(self.episode_context(server), record)
            except Exception as exc:
                if not self.server_failed(exc, server.url):
                    raise
                self.fleet.failed(server)
                tried.add(server.url)
                last = exc
                log.warning(
                    "policy server failed mid-episode; the episode starts over elsewhere if it can",
                    extra={
                        "server": server.url,
                        "prompt_id": record.prompt_id,
                        "attempt": attempt + 1,
                        "error": repr(exc)[:200],
                    },
                )
            finally:
                self.fleet.release(server)
        if last is not None:
            raise last
        # A 503 is what it is: no server serves now (all down or behind the live version). Transient, so the
        # producer re-queues the prompt uncounted and pauses admission until a server takes episodes again.
        raise InferenceError(
            503,
            f"no policy server is up and serving version {self.fleet.live()} after {self.s.server_wait_s:g} s "
            f"(servers: {sorted(self.fleet.servers) or 'none'})",
        )

    def server_failed(self, exc: BaseException, url: str) -> bool:
        """True when ``exc`` is a transient failure of the policy server at ``url`` (not of another service)."""
        failure = classify(exc, {**self.services, "inference": url})
        return failure.service == "inference" and failure.transient

    def classify(self, exc: BaseException) -> Failure:
        """``shared.retry.classify`` with ``inference`` meaning whichever fleet server an httpx error came
        from (the aiohttp transport's errors are the LLM's anyway)."""
        url = str(exc.request.url) if getattr(exc, "_request", None) is not None else ""
        server = next((u for u in self.clients if url.startswith(u)), self.services.get("inference", ""))
        return classify(exc, {**self.services, "inference": server})

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
