"""Every route of every service, classified: a route that can change state (POST, PUT, PATCH, DELETE) either
requires the control token or is named below with the reason it stays open, so a new one cannot slip through.
The apps are built, not started: no model, index or Redis is involved."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from shared.http import is_control_route

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
# The routes that require the token: they change what the policy server serves (weights, adapters) or whether
# and how it serves (pause, resume, the prefix cache). /collective_rpc also answers coda_weight_info (a read),
# but its update_weights_from_path loads a checkpoint: the route as a whole is a control route, as in vLLM.
PROTECTED = {
    "inference": {
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/collective_rpc",
        "/pause",
        "/resume",
        "/reset_prefix_cache",
    },
}
# POST routes that stay open, and why: each is a query that changes no state of the service. They cost compute,
# which the port's binding (127.0.0.1 unless BIND_ADDRESS opens it) limits; the stack's clients send the token
# anyway, so a server that wants it for them too (vLLM with VLLM_API_KEY) serves them.
OPEN = {
    "inference": {"/v1/completions"},  # sampling reads the weights; OpenAI clients without a key keep working
    "retriever": {"/retrieve"},  # a search of a read-only index
    "searcher": {"/search"},  # one episode of the frozen searcher model: retrieval and sampling
}
# The docs FastAPI adds (plain Starlette routes, GET only).
DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def _apps() -> dict[str, FastAPI]:
    from services.inference.app import create_inference_app
    from services.inference.config import InferenceSettings
    from services.retriever.app import build_app as retriever_app
    from services.retriever.config import RetrieverSettings
    from services.rollout.app import build_app as rollout_app
    from services.rollout.config import RolloutSettings
    from services.searcher.app import build_app as searcher_app
    from services.searcher.config import SearcherSettings
    from services.trainer.app import build_app as trainer_app

    return {
        "inference": create_inference_app(InferenceSettings()),
        "retriever": retriever_app(RetrieverSettings()),
        "searcher": searcher_app(SearcherSettings()),
        "rollout": rollout_app(RolloutSettings()),
        "trainer": trainer_app(lambda: None)[0],
    }


@pytest.fixture(scope="module")
def apps() -> dict[str, FastAPI]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CODA_RECIPE", raising=False)  # each service's defaults
        return _apps()


def test_every_state_changing_route_is_protected_or_allowed_by_name(apps):
    for service, app in apps.items():
        for route in app.routes:
            if not isinstance(route, APIRoute):
                assert route.path in DOCS, f"{service}: {route.path} ({type(route).__name__}) is not classified here"
                continue
            protected = is_control_route(route)
            if protected:
                assert route.path in PROTECTED.get(service, set()), f"{service}: add {route.path} to PROTECTED"
            elif route.methods & MUTATING:
                assert route.path in OPEN.get(service, set()), (
                    f"{service}: {sorted(route.methods)} {route.path} changes state without the control token: "
                    "give it dependencies=shared.http.CONTROL, or add it to OPEN with the reason it may stay open"
                )


def test_the_lists_name_only_routes_that_exist(apps):
    for name, table in (("PROTECTED", PROTECTED), ("OPEN", OPEN)):
        for service, paths in table.items():
            present = {route.path for route in apps[service].routes if isinstance(route, APIRoute)}
            assert paths <= present, f"{name} names routes {service} does not have: {sorted(paths - present)}"


def test_every_weight_and_control_route_of_the_policy_server_requires_the_token(apps):
    routes = {route.path: route for route in apps["inference"].routes if isinstance(route, APIRoute)}
    assert {path for path, route in routes.items() if is_control_route(route)} == PROTECTED["inference"]


def test_the_trainer_and_the_rollout_answer_only_reads(apps):
    """Today neither takes an order over HTTP (GET /status, /health, /metrics): the first that does must be
    protected, which the test above enforces."""
    for service in ("trainer", "rollout"):
        for route in apps[service].routes:
            if isinstance(route, APIRoute):
                assert route.methods <= {"GET", "HEAD"}, f"{service}: {route.path}"
