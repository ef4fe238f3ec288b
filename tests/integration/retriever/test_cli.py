"""The CLI: instant ``--help`` for every subcommand, and ``build`` end to end on a slice of the corpus."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from services.retriever.dense import FaissIndex
from tests.integration.retriever.conftest import CORPUS, EMBEDDINGS


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.retriever", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_help_is_instant_and_helpful():
    start = time.perf_counter()
    for args in ([], ["build"], ["serve"], ["eval"]):
        out = cli(*args, "--help")
        assert out.returncode == 0, out.stderr
    assert time.perf_counter() - start < 20  # four interpreter starts; no torch/faiss import
    serve = cli("serve", "--help").stdout
    assert "--index" in serve and "--max-topk" in serve and "CODA_RETRIEVER_" in serve
    assert "factory" in cli("build", "--help").stdout


def test_build_cli_on_a_corpus_slice(tmp_path):
    lines = CORPUS.read_text().splitlines()[:60]
    corpus, emb = tmp_path / "corpus.jsonl", tmp_path / "emb.npy"
    corpus.write_text("\n".join(lines) + "\n")
    np.save(emb, np.load(EMBEDDINGS)[:60])
    out = cli(
        "build",
        "--corpus",
        str(corpus),
        "--embeddings",
        str(emb),
        "--out",
        str(tmp_path / "idx"),
        "--faiss",
        "HNSW32",
        "--query-prefix",
        "query: ",
        "--passage-prefix",
        "passage: ",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["rows"] == 60
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["faiss_factory"] == "HNSW32" and manifest["encoder"]["dim"] == 384
    assert manifest["corpus"]["rows"] == 60 and manifest["bm25"]["stemmer"] == "english"
    assert (manifest["encoder"]["query_prefix"], manifest["encoder"]["passage_prefix"]) == ("query: ", "passage: ")
    assert {"bm25s", "faiss-cpu"} <= set(manifest["versions"])


def test_bad_corpus_is_a_clear_error(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "0", "contents": "ok"}\n{not json\n')
    out = cli("build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"))
    assert out.returncode != 0 and "bad.jsonl:2" in out.stderr


@pytest.fixture
def one_faiss_thread():
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # k-means training on a shared 2-core box is many times faster single-threaded
    yield
    faiss.omp_set_num_threads(before)


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF8,Flat", "IVF8,PQ8x4"])
def test_faiss_factories_search_and_never_pad(factory, one_faiss_thread):
    vectors = np.load(EMBEDDINGS)[:500].astype(np.float32)
    index = FaissIndex.build(vectors, factory, "nprobe=8" if factory.startswith("IVF") else "")
    ids, scores = index.search(vectors[:5], 600)  # k beyond the 500 vectors
    assert ids.shape == (5, 500)
    assert ids[:, 0].tolist() == [0, 1, 2, 3, 4] or factory.endswith("PQ8x4")  # a vector finds itself
    assert np.all(np.isneginf(scores[ids < 0])) and np.all(np.isfinite(scores[ids >= 0]))


def test_build_reads_an_xz_corpus_and_encodes_only_the_rows_after_the_given_vectors(tmp_path):
    """The bundled real corpora ship as .jsonl.xz; HotpotQA dev's begins with the rows whose vectors ship."""
    import lzma

    from services.retriever.build import BuildOptions, _passage_vectors
    from services.retriever.corpus import read_jsonl
    from services.retriever.encoder import Encoder

    lines = CORPUS.read_text().splitlines()[:12]
    corpus, emb = tmp_path / "corpus.jsonl.xz", tmp_path / "emb.npy"
    with lzma.open(corpus, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    np.save(emb, np.load(EMBEDDINGS)[:8])  # vectors for the first 8 of 12 rows
    contents = [row["contents"] for row in read_jsonl(corpus)]
    assert contents == [json.loads(line)["contents"] for line in lines]
    vectors, meta = _passage_vectors(BuildOptions(corpus=corpus, out=tmp_path, embeddings=emb), contents)
    assert vectors.shape == (12, 384) and meta["given"] == 8
    given = np.load(EMBEDDINGS)[:8].astype(np.float32)
    np.testing.assert_allclose(vectors[:8], given / np.linalg.norm(given, axis=1, keepdims=True), atol=1e-6)
    encoded = Encoder("all-MiniLM-L6-v2").encode_passages(contents, show_progress=False)
    np.testing.assert_allclose(vectors[8:], encoded[8:], atol=1e-4)
    # Mixing is sound: the shipped (fp16) vectors are what this encoder gives for their rows.
    assert float(np.min(np.sum(vectors[:8] * encoded[:8], axis=1))) > 0.999
    with pytest.raises(ValueError, match="do not match"):
        _passage_vectors(BuildOptions(corpus=corpus, out=tmp_path, embeddings=emb), contents[:4])
