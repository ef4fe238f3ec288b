"""The inference server: vLLM's OpenAI-compatible routes (the subset the stack uses) over the batching engine.

Routes: ``POST /v1/completions``, ``GET /v1/models``, ``POST /v1/load_lora_adapter``,
``POST /v1/unload_lora_adapter``, ``POST /collective_rpc`` (method ``update_weights_from_path``), vLLM's
dev-mode ``/pause``, ``/resume``, ``/is_paused`` and ``/reset_prefix_cache``, plus the house ``/health`` and
``/metrics``. Startup loads the model and starts the engine thread onto ``app.state``; with ``redis_url`` and
``advertise_url`` set, the server then announces itself to the rollouts (``shared.server_registry``).

Every route that changes what is served (the adapters, the weights, pause/resume, the prefix cache) requires
the control token (``shared.auth``, ``shared.http.CONTROL``); completions, ``/v1/models``, ``/is_paused``, ``/health`` and ``/metrics``
change nothing and stay open, as the port itself is published on 127.0.0.1 unless ``BIND_ADDRESS`` opens it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path

import redis
from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, PlainTextResponse

from services.inference.completions import build_request, build_response
from services.inference.config import InferenceSettings
from services.inference.engine import AdapterNotLoaded, Engine, EnginePaused
from services.inference.metrics import InferenceMetrics
from services.inference.model import ModelRunner
from services.inference.weights import (
    WeightsError,
    apply_checkpoint,
    check_adapter,
    check_checkpoint,
    load_adapter,
    read_checkpoint,
    resolve_under,
    unload_adapter,
)
from shared.http import CONTROL, ApiError, create_app
from shared.log import get_logger
from shared.precision import resolve_device
from shared.protocol.inference import (
    INFO_METHOD,
    RELOAD_METHOD,
    CollectiveRpcRequest,
    CompletionRequest,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    UnloadLoRAAdapterRequest,
)
from shared.server_registry import Heartbeat

log = get_logger(__name__)


class Server:
    """What the routes share: settings, model, engine, metrics, and the adapters' paths."""

    def __init__(self, settings: InferenceSettings, metrics: InferenceMetrics) -> None:
        import torch

        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.settings, self.metrics = settings, metrics
        self.runner = ModelRunner(
            settings.model,
            settings.max_model_len,
            settings.precision,
            resolve_device(settings.device),
            merge_adapter=settings.merge_adapter,
            kv_dtype=settings.kv_dtype,
        )
        self.runner.on_merge = lambda op: metrics.adapter_merges.labels(op).inc()
        self.name = settings.served_model_name or settings.model
        self.root = Path(settings.weights_root)
        self.adapter_paths: dict[str, str] = {}
        self.engine = Engine(
            self.runner,
            max_num_seqs=settings.max_num_seqs,
            logprobs_mode=settings.logprobs_mode,
            seed=settings.seed,
            metrics=metrics,
            prefix_cache_tokens=settings.prefix_cache_tokens,
            prefix_cache_bytes=int(settings.prefix_cache_mb * 2**20),
            max_prefill_batch=settings.max_prefill_batch,
            pause_wait_s=settings.pause_wait_s,
        )
        self.lock = asyncio.Lock()  # one weight change at a time (checks and the change must not interleave)
        metrics.running.set_function(lambda: self.engine.num_running)
        metrics.waiting.set_function(lambda: self.engine.num_waiting)
        metrics.prefix_cache_bytes.set_function(lambda: self.engine.prefix.nbytes)

    def resolve_model(self, name: str | None) -> str | None:
        """The adapter a request's ``model`` names (None = base), or vLLM's 404."""
        if name is None or name == self.name:
            return None
        if name in self.runner.adapters:
            return name
        raise ApiError(
            f"The model `{name}` does not exist. Valid aliases: {self.name}.", 404, "NotFoundError", param="model"
        )

    async def run_op(self, run, ready=None):
        return await asyncio.wrap_future(self.engine.control(run, ready))


def start_heartbeat(settings: InferenceSettings) -> Heartbeat | None:
    """Announce this server to the rollouts (``shared.server_registry``) when given both a Redis URL and the
    URL they reach it at; None (nothing announced) otherwise, the default."""
    if not (settings.redis_url and settings.advertise_url):
        return None
    url = settings.advertise_url.replace("{hostname}", socket.gethostname()).rstrip("/")
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    return Heartbeat(client, settings.servers_key, url, settings.announce_every_s).start()


def _api_error(exc: WeightsError) -> ApiError:
    status = exc.status_code
    return ApiError(str(exc), status, "NotFoundError" if status == 404 else "BadRequestError")


def create_inference_app(settings: InferenceSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server = await asyncio.to_thread(Server, settings, metrics)
        server.engine.start()
        app.state.server = server
        log.info("inference server ready", extra={"model": server.name, "port": settings.port})
        # Announced only once it serves: a rollout may send episodes the moment it reads the key.
        heartbeat = start_heartbeat(settings)
        try:
            yield
        finally:
            if heartbeat is not None:  # withdrawn first: no new episodes while the engine stops
                await asyncio.to_thread(heartbeat.stop)
            server.engine.stop()

    def engine_ready() -> str:  # 503 while paused, failing every step, or dead (shared.health's convention)
        return app.state.server.engine.check_health()

    app, registry = create_app(
        "inference",
        lifespan=lifespan,
        health_checks={"engine": engine_ready},
        max_body_bytes=settings.max_body_bytes,
        description="CPU policy server speaking vLLM's OpenAI-compatible API subset",
    )
    metrics = InferenceMetrics(registry)
    _generation_routes(app)
    _lora_routes(app)
    _weight_routes(app)
    return app


def _generation_routes(app: FastAPI) -> None:
    @app.post(
        "/v1/completions",
        tags=["vllm"],
        summary="Sample completions of token-id (or text) prompts",
        description="While the engine is paused (`POST /pause`) a request waits for `/resume` at most "
        "`pause_wait_s` (default 60 s), then gets 503; an internal failure of one request is "
        "a 500 for that request only.",
    )
    async def completions(body: CompletionRequest) -> JSONResponse:
        server: Server = app.state.server
        adapter = server.resolve_model(body.model)
        # Off the event loop: tokenising a long text prompt is CPU work that would stall every other request.
        request = await asyncio.to_thread(
            build_request,
            body,
            server.runner,
            adapter,
            max_num_seqs=server.settings.max_num_seqs,
            default_max_tokens=server.settings.max_tokens_default,
        )
        try:
            sequences, version = await asyncio.wrap_future(server.engine.submit(request))
        except AdapterNotLoaded as exc:
            raise ApiError(str(exc), 404, "NotFoundError") from None
        except EnginePaused as exc:
            raise ApiError(str(exc), 503, "ServiceUnavailableError") from None
        except Exception as exc:  # the engine failed this request only (and logged why); vLLM's 500 body
            raise ApiError(f"inference failed: {type(exc).__name__}: {exc}", 500, "InternalServerError") from None
        response = build_response(body, body.model or server.name, sequences, version, server.runner)
        return JSONResponse(response.model_dump(mode="json"))

    @app.get("/v1/models", tags=["vllm"], summary="The base model and the loaded LoRA adapters")
    async def models() -> ModelList:
        server: Server = app.state.server
        cards = [ModelCard(id=server.name, root=server.settings.model, max_model_len=server.runner.max_model_len)]
        cards += [ModelCard(id=name, root=path, parent=server.name) for name, path in server.adapter_paths.items()]
        return ModelList(data=cards)

    @app.get(
        "/status", tags=["house"], summary="What the engine did since start: prefill/decode counters, prefix cache"
    )
    async def status() -> JSONResponse:
        import torch

        server: Server = app.state.server
        engine, runner = server.engine, server.runner
        return JSONResponse(
            {
                "model": server.name,
                "weight_version": engine.version,
                "running": engine.num_running,
                "waiting": engine.num_waiting,
                "autocast_bf16": runner.autocast,
                "kv_dtype": str(runner.kv_dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(),
                "num_parameters": runner.num_parameters(),
                "engine": dict(engine.counters),
                "prefix_cache": engine.prefix.stats(),
            }
        )


def _lora_routes(app: FastAPI) -> None:
    @app.post(
        "/v1/load_lora_adapter",
        tags=["vllm"],
        summary="Load a PEFT LoRA adapter under a model name",
        dependencies=CONTROL,
    )
    async def load_lora(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        server: Server = app.state.server
        if not body.lora_name or not body.lora_path:
            raise ApiError("Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput")
        async with server.lock:
            replace = body.lora_name in server.runner.adapters
            if replace and not body.load_inplace:
                raise ApiError(
                    f"The lora adapter '{body.lora_name}' has already been loaded. If you want to "
                    "load the adapter in place, set 'load_inplace' to True.",
                    400,
                    "InvalidUserInput",
                )
            if not replace and len(server.runner.adapters) >= server.settings.max_loras:
                raise ApiError(
                    f"{len(server.runner.adapters)} LoRA adapters are loaded, the most this server "
                    f"holds (max_loras={server.settings.max_loras}); unload one first",
                    400,
                )
            start = time.perf_counter()
            try:
                path = resolve_under(server.root, body.lora_path, "lora_path")
                # Reads and checks every tensor: off the event loop.
                await asyncio.to_thread(check_adapter, path, server.settings.max_lora_rank)
                name, old_path = body.lora_name, server.adapter_paths.get(body.lora_name)
                ready = (lambda: server.engine.adapter_idle(name)) if replace else None

                def load() -> None:
                    server.engine.prefix.drop_adapter(name)  # a replaced adapter's cached KV is stale
                    try:
                        load_adapter(server.runner, name, path, replace)
                    except Exception:
                        if replace and old_path and name not in server.runner.adapters:
                            load_adapter(server.runner, name, Path(old_path))  # the replaced one goes back
                        raise

                await server.run_op(load, ready)
            except WeightsError as exc:
                raise _api_error(exc) from None
            except Exception as exc:  # peft refusing the checked adapter (wrong base…); load_adapter undid it
                log.warning("LoRA adapter refused", extra={"path": body.lora_path, "error": repr(exc)})
                raise ApiError(
                    f"could not load LoRA adapter from {body.lora_path!r}: {type(exc).__name__}: {exc}", 400
                ) from None
            finally:  # a failed in-place load has already unloaded the old adapter: list what is served
                for stale in set(server.adapter_paths) - server.runner.adapters:
                    server.adapter_paths.pop(stale)
                server.metrics.adapters.set(len(server.runner.adapters))
            server.adapter_paths[body.lora_name] = str(path)
            server.metrics.reloads.labels("lora").inc()
            server.metrics.reload_seconds.labels("lora").observe(time.perf_counter() - start)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", tags=["vllm"], summary="Unload a LoRA adapter", dependencies=CONTROL)
    async def unload_lora(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        server: Server = app.state.server
        name = body.lora_name
        async with server.lock:
            if name not in server.runner.adapters:
                raise ApiError(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")

            # Requests decoding with it finish first; new ones wait, then get a 404 for the unknown model.
            def unload() -> None:
                server.engine.prefix.drop_adapter(name)
                unload_adapter(server.runner, name)

            await server.run_op(unload, lambda: server.engine.adapter_idle(name))
            server.adapter_paths.pop(name, None)
            server.metrics.adapters.set(len(server.runner.adapters))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _weight_routes(app: FastAPI) -> None:
    @app.post(
        "/pause",
        tags=["vllm"],
        summary="vLLM dev-mode pause: finish in-flight requests, admit none",
        description="Until `/resume`, /health answers 503 (not ready) and a completion waits at most "
        "`pause_wait_s` (default 60 s), then gets 503 with a message saying the engine is "
        "paused; clients retry 503 (shared.retry).",
        dependencies=CONTROL,
    )
    async def pause(mode: str = Query("abort")) -> JSONResponse:
        server: Server = app.state.server
        if mode != "wait":
            raise ApiError(f"pause mode {mode!r} is not supported by this server; use mode=wait", 400)
        await server.run_op(lambda: server.engine.set_paused(True), server.engine.idle)
        return JSONResponse({"status": "paused"})

    @app.post("/resume", tags=["vllm"], summary="vLLM dev-mode resume after /pause", dependencies=CONTROL)
    async def resume() -> JSONResponse:
        server: Server = app.state.server
        await server.run_op(lambda: server.engine.set_paused(False))
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused", tags=["vllm"], summary="Whether admission is paused")
    async def is_paused() -> JSONResponse:
        return JSONResponse({"is_paused": app.state.server.engine.paused})

    @app.post(
        "/reset_prefix_cache",
        tags=["vllm"],
        summary="Forget every cached prefix (the KV of past prompts)",
        description="Requests already decoding keep their own KV; later prompts prefill from scratch until "
        "the cache fills again.",
        dependencies=CONTROL,
    )
    async def reset_prefix_cache() -> JSONResponse:
        server: Server = app.state.server
        # On the engine thread, between steps: that thread reads and fills the cache while it decodes.
        await server.run_op(server.engine.prefix.clear)
        return JSONResponse({})

    @app.post(
        "/collective_rpc",
        tags=["vllm"],
        summary="vLLM dev-mode RPC: update_weights_from_path, coda_weight_info",
        dependencies=CONTROL,
    )
    async def collective_rpc(body: CollectiveRpcRequest) -> JSONResponse:
        server: Server = app.state.server
        if body.method is None:
            raise ApiError("Missing 'method' in request body", 400, "Bad Request")
        if body.method == INFO_METHOD:  # the same answer as vLLM's worker extension: the version as a string
            return JSONResponse({"results": [{"weight_version": str(server.engine.version)}]})
        if body.method != RELOAD_METHOD:
            raise ApiError(
                f"method {body.method!r} is not available on this server; only {RELOAD_METHOD!r} and {INFO_METHOD!r}",
                400,
            )
        path_arg = body.args[0] if body.args else body.kwargs.get("path") or body.kwargs.get("weight_dir")
        if not path_arg:
            raise ApiError(f"{RELOAD_METHOD} needs the weights directory as args[0] or kwargs['path']", 400)
        try:
            version = int(body.kwargs["version"]) if "version" in body.kwargs else None
        except ValueError:
            raise ApiError(f"version must be an integer, got {body.kwargs['version']!r}", 400) from None
        result = await _reload(server, path_arg, version)
        return JSONResponse({"results": [result]})


async def _reload(server: Server, path_arg: str, version: int | None) -> dict:
    """Read and check the checkpoint off the engine thread, then drain and swap on it."""
    start = time.perf_counter()
    async with server.lock:
        try:
            path = resolve_under(server.root, path_arg, "weights path")
            # Reading and checking (every value) take seconds on a real model: off the event loop.
            tensors = await asyncio.to_thread(lambda: check_checkpoint(server.runner, read_checkpoint(path)))
        except WeightsError as exc:
            raise _api_error(exc) from None
        new_version = version if version is not None else server.engine.version + 1

        def swap() -> int:
            count = apply_checkpoint(server.runner, tensors)
            server.engine.prefix.clear()  # cached KV belongs to the old weights
            server.engine.version = new_version
            return count

        count = await server.run_op(swap, server.engine.idle)
    seconds = time.perf_counter() - start
    server.metrics.weight_version.set(new_version)
    server.metrics.reloads.labels("full").inc()
    server.metrics.reload_seconds.labels("full").observe(seconds)
    log.info(
        "weights reloaded",
        extra={"path": str(path), "version": new_version, "tensors": count, "seconds": round(seconds, 3)},
    )
    # The entry vLLM's worker extension returns (shared/vllm_worker_extension.py): the version as the string it
    # was sent as (collective_rpc passes strings only), then our extra "seconds".
    return {"weight_version": str(new_version), "tensors": count, "path": str(path), "seconds": round(seconds, 4)}
