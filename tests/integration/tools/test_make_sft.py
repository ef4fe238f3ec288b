"""make-sft against the real retriever (bundled HotpotQA index, served over HTTP): every document in a
demonstration is one the retriever returned, and none of it is trained on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from shared.redis_server import free_port
from tools.make_sft import main

DATA = Path(__file__).resolve().parents[3] / "data" / "hotpotqa"


@pytest.fixture(scope="module")
def retriever_url(tmp_path_factory):
    from services.retriever.app import build_app
    from services.retriever.build import BuildOptions, build_index
    from services.retriever.config import RetrieverSettings

    index = tmp_path_factory.mktemp("index")
    build_index(
        BuildOptions(corpus=DATA / "corpus.jsonl", out=index, embeddings=DATA / "corpus_emb_all-MiniLM-L6-v2_fp16.npy")
    )
    app = build_app(RetrieverSettings.load(index_dir=str(index), mode="sparse", cpu_threads=1))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "retriever did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


@pytest.mark.slow
def test_make_sft_uses_retrieved_documents_and_masks_them(tmp_path, retriever_url, capsys):
    from agents.prompts import HFTokenizer
    from services.inference.factory import build_tiny_model, read_texts

    model = build_tiny_model(tmp_path / "model", read_texts([str(DATA / "corpus.jsonl")], limit=300))
    out = tmp_path / "sft.jsonl"
    assert (
        main(
            [
                "--model",
                str(model),
                "--retriever-url",
                retriever_url,
                "--qa",
                str(DATA / "qa_supported.jsonl"),
                "--out",
                str(out),
                "--limit",
                "40",
            ]
        )
        == 0
    )
    assert "demonstrations" in capsys.readouterr().out
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(demos) <= 40
    corpus = {}
    with open(DATA / "corpus.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            corpus[row["id"]] = row["contents"]
    tok = HFTokenizer(str(model))
    for d in demos:
        ids, mask = d["token_ids"], d["loss_mask"]
        trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        untrained = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert d["doc_ids"] and "<answer>" in trained and "<information>" in untrained
        for doc_id in d["doc_ids"]:
            body = corpus[doc_id].split("\n", 1)[1]  # the real corpus row's passage text
            snippet = body[:40]
            assert snippet in untrained and snippet not in trained
    # The CoDA layout: executor rows carry the documents (masked), planner rows only the helper's result.
    coda = tmp_path / "sft-coda.jsonl"
    assert (
        main(
            [
                "--model",
                str(model),
                "--retriever-url",
                retriever_url,
                "--qa",
                str(DATA / "qa_supported.jsonl"),
                "--out",
                str(coda),
                "--limit",
                "10",
                "--format",
                "coda",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in coda.read_text().splitlines()]
    assert rows and {r["role"] for r in rows} == {"executor", "planner"}
    for r in rows:
        untrained = tok.decode([t for t, m in zip(r["token_ids"], r["loss_mask"], strict=True) if not m])
        assert ("<documents>" in untrained) == (r["role"] == "executor")
