"""Clients written the way existing RL code calls a Search-R1 retriever work unchanged against ours.

``search_r1_batch_search`` follows Search-R1's ``llm_agent/generation.py`` (``requests.post(...).json()``,
``_passages2string``); ``verl_call_search_api`` follows verl's ``tools/utils/search_r1_like_utils.py``
(JSON headers, timeout 30, retries only on 5xx/connection errors, its own passage formatting).
"""

from __future__ import annotations

import json
import time

import requests

from tests.integration.retriever.conftest import NUM_DOCS


def passages2string(retrieval_result: list[dict]) -> str:
    """Search-R1's formatting: title = first line (quotes kept), text = the other lines."""
    out = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        out += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return out


def search_r1_batch_search(url: str, queries: list[str], topk: int = 3) -> list[str]:
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    results = requests.post(url, json=payload).json()["result"]
    return [passages2string(r) for r in results]


def verl_call_search_api(url: str, query_list: list[str], topk: int = 3, retries: int = 10):
    payload = {"queries": query_list, "topk": topk, "return_scores": True}
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    for attempt in range(retries):
        try:
            response = requests.post(url, headers=headers, json=payload, timeout=30)
            if response.status_code in (500, 502, 503, 504):
                time.sleep(1 * (attempt + 1))
                continue
            response.raise_for_status()
            return response.json(), None
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout):
            time.sleep(1 * (attempt + 1))
    return None, "retries exhausted"


def verl_format(api_response: dict) -> str:
    pretty = []
    for retrieval in api_response["result"]:
        formatted = ""
        for idx, doc_item in enumerate(retrieval):
            content = doc_item["document"]["contents"].strip()
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            formatted += f"Doc {idx + 1} (Title: {title})\n{text}\n\n"
        pretty.append(formatted.strip())
    return json.dumps({"result": "\n---\n".join(pretty)})


def test_search_r1_client(url):
    blocks = search_r1_batch_search(
        url,
        [
            "Were Scott Derrickson and Ed Wood of the same nationality?",
            "Which magazine was started first, Arthur's Magazine or First for Women?",
        ],
    )
    assert len(blocks) == 2
    for block in blocks:
        lines = [line for line in block.split("\n") if line.startswith("Doc ")]
        assert [line.split("(")[0] for line in lines] == ["Doc 1", "Doc 2", "Doc 3"]
        assert all(line.startswith(f'Doc {i + 1}(Title: "') for i, line in enumerate(lines))
    assert '(Title: "Ed Wood")' in blocks[0] or '(Title: "Scott Derrickson")' in blocks[0]
    assert "magazine" in blocks[1].lower()


def test_verl_client(url):
    response, error = verl_call_search_api(url, ["Ed Wood filmography", "First for Women magazine"])
    assert error is None
    text = json.loads(verl_format(response))["result"]
    assert text.count("\n---\n") == 1 and text.count("Doc 1 (Title: ") == 2 and "Doc 3 (Title: " in text


def test_search_r1_response_shape(url):
    body = requests.post(url, json={"queries": ["q one", "Ed Wood"], "topk": 3, "return_scores": True}).json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    for items in body["result"]:
        assert len(items) == 3
        for item in items:
            assert set(item) == {"document", "score"} and isinstance(item["score"], float)
            doc = item["document"]
            assert isinstance(doc["id"], str) and 0 <= int(doc["id"]) < NUM_DOCS
            assert isinstance(doc["contents"], str) and doc["contents"].startswith('"')
        scores = [item["score"] for item in items]
        assert scores == sorted(scores, reverse=True)


def test_document_is_the_corpus_row_verbatim(url):
    from tests.integration.retriever.conftest import CORPUS

    item = requests.post(url, json={"queries": ["Scott Derrickson"], "topk": 1, "return_scores": True}).json()
    doc = item["result"][0][0]["document"]
    with open(CORPUS) as f:
        rows = [json.loads(line) for line in f]
    assert doc == rows[int(doc["id"])]
