"""The sync check waits for the rollout to load a published version (``wait_served``): an adapter is served once
listed, full weights once the server reports the version; a server that cannot tell is taken to serve it."""

from __future__ import annotations

from types import SimpleNamespace

from services.trainer.sync_check import serves, wait_served
from shared.inference_client import InferenceError
from shared.protocol import WeightUpdate


def _event(kind: str, version: int = 3) -> WeightUpdate:
    name = f"policy-v{version}" if kind == "lora" else "policy"
    return WeightUpdate(version=version, kind=kind, model_name=name, path="/w", step=1, created_at=0.0)


class Server:
    """Serves version ``version`` after ``loads_after`` questions (the rollout's load landing meanwhile)."""

    def __init__(self, loads_after: int, version: int = 3, info: int | None = None) -> None:
        self.asked, self.loads_after, self.version, self.info = 0, loads_after, version, info

    def _loaded(self) -> bool:
        self.asked += 1
        return self.asked > self.loads_after

    def models(self):
        names = ["policy"] + ([f"policy-v{self.version}"] if self._loaded() else [])
        return [SimpleNamespace(id=n) for n in names]

    def served_version(self):
        if self.info is not None:
            raise InferenceError(self.info, "no such method")
        return self.version if self._loaded() else 0


def test_waits_until_the_adapter_or_the_full_version_is_served():
    for kind in ("lora", "full"):
        server = Server(loads_after=2)
        assert wait_served(server, _event(kind), timeout_s=5, poll_s=0.01)
        assert server.asked == 3


def test_gives_up_after_the_timeout():
    assert not wait_served(Server(loads_after=10**6), _event("lora"), timeout_s=0.05, poll_s=0.01)


def test_a_server_that_cannot_tell_its_full_version_is_taken_to_serve_it():
    assert serves(Server(loads_after=10**6, info=404), _event("full"))
