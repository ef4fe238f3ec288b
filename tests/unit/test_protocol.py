"""Round trips for every wire type: pydantic JSON and the stream's msgpack encoding give the same object."""

from __future__ import annotations

import msgpack
import pytest
from pydantic import ValidationError

import shared.protocol as protocol
from shared.protocol import Sample, TrajectoryGroup, WeightUpdate
from shared.protocol.trajectory import WIRE_VERSION
from shared.stream import decode, encode
from tests.factories import make_group, make_sample, make_weight_update

DOC = {"id": "0", "contents": '"Velkadar"\nVelkadar lives in Orvale.'}
# One valid instance of every wire type the protocol package exports (HTTP bodies and Redis messages).
MESSAGES = [
    make_sample(),
    make_group(),
    make_weight_update(),
    protocol.RetrieveRequest(queries=["Where does Velkadar live?"], topk=2, return_scores=True, mode="sparse"),
    protocol.RetrieveResponse(result=[[protocol.ScoredDocument(document=protocol.Document(**DOC), score=1.5)]]),
    protocol.Document(**DOC),
    protocol.RetrievedDocument(**DOC, score=0.25),
    protocol.ScoredDocument(document=protocol.Document(**DOC), score=0.5),
    protocol.CompletionRequest(model="policy", prompt=[1, 2, 3], max_tokens=4, logprobs=0, stop=["</search>"]),
    protocol.CompletionResponse.model_validate(
        {
            "model": "policy",
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            "choices": [
                {
                    "index": 0,
                    "text": "ab",
                    "finish_reason": "stop",
                    "stop_reason": "</search>",
                    "token_ids": [7, 8],
                    "logprobs": {
                        "tokens": ["token_id:7", "token_id:8"],
                        "token_logprobs": [-0.5, -1.0],
                        "text_offset": [0, 1],
                        "top_logprobs": [None, None],
                    },
                }
            ],
        }
    ),
    protocol.ModelList.model_validate({"data": [{"id": "policy", "max_model_len": 1024}]}),
    protocol.LoadLoRAAdapterRequest(lora_name="policy-v1", lora_path="runs/weights/v1"),
    protocol.UnloadLoRAAdapterRequest(lora_name="policy-v1"),
    protocol.CollectiveRpcRequest(method="update_weights_from_path", kwargs={"path": "runs/weights/v2"}),
    protocol.SearchRequest(query="Where does Velkadar live?", max_turns=2),
    protocol.SearchResponse(summary="Orvale", trajectory=["<search> Velkadar </search>"], num_searches=1, success=True),
    protocol.AdmissionMark(version=3, consumed=12),
]


def test_every_exported_wire_type_has_a_round_trip_case():
    exported = {name for name in protocol.__all__ if isinstance(getattr(protocol, name), type)}
    covered = {type(m).__name__ for m in MESSAGES}
    assert exported - covered == set()


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_json_round_trip(message):
    again = type(message).model_validate_json(message.model_dump_json())
    assert again == message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_msgpack_round_trip(message):
    fields = encode(message)
    assert fields[b"type"] == type(message).__name__.encode()
    assert decode(type(message), fields) == message


def test_msgpack_is_more_compact_than_json():
    group = make_group(n=8)
    assert len(encode(group)[b"data"]) < len(group.model_dump_json())


def test_sample_rejects_misaligned_arrays():
    good = make_sample().model_dump()
    good["logprobs"] = good["logprobs"][:-1]
    with pytest.raises(ValidationError, match="logprobs has 6 entries for 7 tokens"):
        Sample.model_validate(good)


def test_sample_rejects_trained_prompt_tokens():
    doc = make_sample().model_dump()
    doc["loss_mask"][0] = 1
    with pytest.raises(ValidationError, match="prompt tokens must have loss_mask 0"):
        Sample.model_validate(doc)


def test_group_rejects_duplicate_and_dangling_ids():
    doc = make_group().model_dump()
    doc["samples"][1]["sample_id"] = doc["samples"][0]["sample_id"]
    with pytest.raises(ValidationError, match="unique"):
        TrajectoryGroup.model_validate(doc)
    doc = make_group().model_dump()
    doc["samples"][1]["parent_id"] = "nobody"
    with pytest.raises(ValidationError, match="not in the group"):
        TrajectoryGroup.model_validate(doc)


def version_1(group: TrajectoryGroup) -> dict:
    """``group`` as a wire-version-1 writer sent it: the agent under ``recipe``, no ``wire_version``."""
    doc = group.model_dump(mode="json")
    doc["recipe"] = doc.pop("agent")
    del doc["wire_version"]
    return doc


def test_group_writes_the_agent_under_its_new_name():
    doc = make_group().model_dump(mode="json")
    assert doc["agent"] == "search-r1" and "recipe" not in doc
    assert doc["wire_version"] == WIRE_VERSION == 2


def test_a_version_1_group_still_parses_and_is_written_back_as_the_current_version():
    group = make_group()
    old = version_1(group)
    on_stream = {b"type": b"TrajectoryGroup", b"data": msgpack.packb(old, use_bin_type=True)}
    for parsed in (TrajectoryGroup.model_validate(old), decode(TrajectoryGroup, on_stream)):
        assert parsed == group and parsed.agent == "search-r1"
        again = TrajectoryGroup.model_validate_json(parsed.model_dump_json())
        assert again == group and "recipe" not in again.model_dump()


def test_a_group_from_a_newer_writer_is_refused():
    doc = make_group().model_dump(mode="json") | {"wire_version": WIRE_VERSION + 1}
    with pytest.raises(ValidationError, match="wire_version"):
        TrajectoryGroup.model_validate(doc)


def test_group_ids_are_unique_by_default():
    assert make_group().group_id != make_group().group_id


def test_min_version_looks_only_at_trained_tokens():
    sample = make_sample()
    assert sample.min_version() == 2
    assert sample.num_trained_tokens == 4


def test_weight_update_rejects_unknown_kind():
    doc = make_weight_update().model_dump() | {"kind": "delta"}
    with pytest.raises(ValidationError):
        WeightUpdate.model_validate(doc)


def test_decode_reports_what_is_wrong():
    with pytest.raises(ValueError, match="no 'data' field"):
        decode(WeightUpdate, {b"x": b"1"})
    with pytest.raises(ValueError, match="not msgpack"):
        decode(WeightUpdate, {b"data": b"\xc1"})
    with pytest.raises(ValueError, match="does not validate as WeightUpdate"):
        decode(WeightUpdate, encode(make_group()))


@pytest.mark.parametrize("prompt", [[0.5] * 100_000, [[0.5] * 100_000], ["a", *[1] * 100_000]])
def test_a_long_prompt_with_bad_items_is_refused_at_the_first_one(prompt):
    with pytest.raises(ValidationError) as err:
        protocol.CompletionRequest(prompt=prompt)
    assert err.value.error_count() <= 8  # at most a couple per form the prompt may take, not one per item


def test_adapter_names_carry_the_served_name_the_run_and_the_version():
    run = protocol.new_run_id()
    assert len(run) == 8 and run != protocol.new_run_id()
    for served in ("policy", "Qwen/Qwen3-0.6B", "my-model-v2"):
        name = protocol.adapter_name(served, run, 12)
        assert name == f"{served}-{run}-v12"
        assert protocol.parse_adapter_name(name) == (served, run, 12)
    assert protocol.parse_adapter_name("policy-v7") == ("policy", "", 7)  # the release before: no run
    assert protocol.parse_adapter_name("policy") is None and protocol.parse_adapter_name("searcher") is None
    with pytest.raises(ValueError, match="8 hex digits"):
        protocol.adapter_name("policy", "run-a", 1)


def test_the_fleet_watch_unloads_another_runs_adapters_and_its_own_old_ones():
    from agents.core.llm import PolicyState
    from services.rollout.fleet import Fleet
    from services.rollout.fleet_watch import FleetWatch

    state = PolicyState(model_name="policy", served_model_name="policy")
    watch = FleetWatch(
        Fleet([], state.live_version), state, redis_client=None, servers_key="", every_s=1, keep_adapters=2
    )
    ours, theirs = "0000aaaa", "0000bbbb"
    ids = {"policy", "searcher", "policy-v3", *(f"policy-{theirs}-v{v}" for v in (3, 9))}
    ids |= {f"policy-{ours}-v{v}" for v in (1, 2, 3)} | {f"other-{theirs}-v1"}
    event = make_weight_update(version=4).model_copy(update={"model_name": f"policy-{ours}-v4"})
    foreign = ["policy-0000bbbb-v3", "policy-0000bbbb-v9", "policy-v3"]
    # another model's adapters are left alone; this run's v3 is kept beside v4 (keep_adapters 2)
    assert watch.stale(ids, event) == sorted([*foreign, f"policy-{ours}-v1", f"policy-{ours}-v2"])


async def test_a_full_server_is_made_room_for_before_the_load():
    """A rollout killed between a load and its unloads leaves its server at max_loras: the next watch frees
    the slots before it loads (it loaded after, so every load was refused and nothing was ever freed)."""
    from agents.core.llm import PolicyState
    from services.rollout.fleet import Fleet
    from services.rollout.fleet_watch import FleetWatch
    from shared.inference_client import InferenceError

    run, max_loras = "0000aaaa", 4

    class FullServer:
        def __init__(self) -> None:
            self.held = {f"policy-{run}-v{v}" for v in (222, 223, 224, 225)}  # keep_adapters 3, +1 loaded

        async def load_lora(self, name: str, path: str, **_) -> None:
            if len(self.held) >= max_loras:
                raise InferenceError(f"HTTP 400: {max_loras} LoRA adapters are loaded")
            self.held.add(name)

        async def unload_lora(self, name: str) -> None:
            self.held.discard(name)

    state = PolicyState(model_name="policy", served_model_name="policy")
    watch = FleetWatch(
        Fleet(["http://a"], state.live_version), state, redis_client=None, servers_key="", every_s=1, keep_adapters=3
    )
    server = FullServer()
    watch.clients["http://a"] = server
    event = make_weight_update(version=226).model_copy(update={"model_name": f"policy-{run}-v226"})
    await watch._sync("http://a", event, {"policy", *server.held})
    assert server.held == {f"policy-{run}-v{v}" for v in (224, 225, 226)}
    assert watch.loads == 1
