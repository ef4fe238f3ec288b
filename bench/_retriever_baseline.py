"""The peer retriever ``bench.retriever`` compares ours with, built the way Search-R1's ``retrieval_server.py``
and FlashRAG's are: a plain FastAPI route that encodes and searches each request in the thread pool (same encoder
and FAISS index as ours, read from our index folder).

    python -m bench._retriever_baseline --index runs/index/hotpotqa --port 8100
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def baseline_serve(index_dir: Path, port: int) -> None:
    """The baseline server: Search-R1's retrieval_server.py design (encode + search per request, thread pool)."""
    import faiss
    import torch
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    from transformers import AutoModel, AutoTokenizer

    from services.retriever.encoder import resolve_model_path

    manifest = json.loads((index_dir / "manifest.json").read_text())
    path = resolve_model_path(manifest["encoder"]["name"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    index = faiss.read_index(str(index_dir / "dense.faiss"))
    corpus = [json.loads(line) for line in (index_dir / "corpus.jsonl").read_text().splitlines()]

    @torch.no_grad()
    def encode(queries: list[str]) -> np.ndarray:
        inputs = tokenizer(queries, max_length=256, padding=True, truncation=True, return_tensors="pt")
        hidden = model(**inputs, return_dict=True).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
        return emb.numpy().astype(np.float32, order="C")

    class QueryRequest(BaseModel):
        queries: list[str]
        topk: int | None = None
        return_scores: bool = False

    app = FastAPI()

    def retrieve(request: QueryRequest):  # a plain def: FastAPI runs it in its thread pool, one per request
        k = request.topk or 3
        scores, ids = index.search(encode(request.queries), k)
        result = []
        for row_ids, row_scores in zip(ids.tolist(), scores.tolist(), strict=True):
            docs = [corpus[i] for i in row_ids]
            result.append(
                [{"document": d, "score": s} for d, s in zip(docs, row_scores, strict=True)]
                if request.return_scores
                else docs
            )
        return {"result": result}

    retrieve.__annotations__["request"] = QueryRequest  # a local class: postponed annotations cannot find it
    app.post("/retrieve")(retrieve)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    encode(["warm-up"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--index", type=Path, required=True, help="one of our index folders (manifest.json, dense.faiss)"
    )
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    args = parser.parse_args()
    baseline_serve(args.index, args.port)


if __name__ == "__main__":
    main()
