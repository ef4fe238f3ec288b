"""Client of the searcher service's ``POST /search`` (the Thinker's delegation), pooled, with bounded retries."""

from __future__ import annotations

import httpx

from shared.protocol.search import SearchRequest, SearchResponse
from shared.retry import RetryPolicy, arequest


class AsyncSearcherClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 300.0,
        policy: RetryPolicy = RetryPolicy(),
        max_connections: int = 128,
    ) -> None:
        base = base_url.rstrip("/")
        self.url = base if base.endswith("/search") else base + "/search"
        self.policy = policy
        self._client = httpx.AsyncClient(
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def search(self, query: str, max_turns: int | None = None) -> SearchResponse:
        body = SearchRequest(query=query, max_turns=max_turns).model_dump()
        response = await arequest(self._client, "POST", self.url, json=body, policy=self.policy)
        return SearchResponse.model_validate(response.json())

    async def aclose(self) -> None:
        await self._client.aclose()
