"""A small synthetic lookup world: the embedded default's task (``make train``).

Each invented person has one short document of facts (city, job, pet). Questions name the person and ask for
one fact, so a model can only answer by searching for the name and reading the document: nothing in a
question reveals its answer. The held-out split asks about (person, fact) pairs that never occur in training,
so its answers can only come from retrieval, never from memorised training targets.

Deterministic for a seed; names are made of a few syllables so that a tokenizer trained on the corpus keeps
them as whole-word tokens (short, learnable episodes for a tiny model).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

SYLLABLES = (
    "ka",
    "zor",
    "vel",
    "mi",
    "tan",
    "ro",
    "bek",
    "lu",
    "dar",
    "si",
    "quo",
    "fen",
    "ral",
    "no",
    "gis",
    "tu",
    "pom",
    "xa",
    "rin",
    "ez",
)
CITIES = (
    "Tamsk",
    "Orvale",
    "Beldun",
    "Quarro",
    "Minsa",
    "Zelkirk",
    "Pardo",
    "Ulmet",
    "Skarra",
    "Venhold",
    "Lorimar",
    "Dask",
)
JOBS = ("baker", "pilot", "farmer", "doctor", "painter", "sailor", "teacher", "miner", "tailor", "singer")
PETS = ("cat", "dog", "parrot", "turtle", "rabbit", "goat", "owl", "lizard")

# relation -> (question template, sentence template, values)
RELATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "city": ("Where does {name} live?", "{name} lives in {value}.", CITIES),
    "job": ("What is the job of {name}?", "{name} works as {a} {value}.", JOBS),
    "pet": ("Which pet does {name} keep?", "{name} keeps {a} {value}.", PETS),
}


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    golden_answers: list[str]
    entity: str
    relation: str
    gold_doc_id: str

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": self.golden_answers,
            "metadata": {"entity": self.entity, "relation": self.relation, "gold_doc_id": self.gold_doc_id},
        }


@dataclass(frozen=True)
class World:
    corpus: list[dict]  # wiki-18 rows: {"id", "contents": '"Title"\ntext'}
    train: list[Question]
    test: list[Question]


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


def _names(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        parts = rng.sample(SYLLABLES, rng.choice((2, 3)))
        names.add("".join(parts).capitalize())
    return sorted(names)


def make_world(num_people: int = 120, test_fraction: float = 0.2, seed: int = 0) -> World:
    """The corpus (one document per person, row index = id) and the train/held-out question splits."""
    rng = random.Random(seed)
    people = _names(rng, num_people)
    rng.shuffle(people)
    corpus, questions = [], []
    for doc_id, name in enumerate(people):
        facts = {rel: rng.choice(values) for rel, (_, _, values) in RELATIONS.items()}
        text = " ".join(
            RELATIONS[rel][1].format(name=name, value=value, a=_article(value)) for rel, value in facts.items()
        )
        corpus.append({"id": str(doc_id), "contents": f'"{name}"\n{text}'})
        for rel, value in facts.items():
            questions.append(
                Question(
                    id=f"{name.lower()}-{rel}",
                    question=RELATIONS[rel][0].format(name=name),
                    golden_answers=[value],
                    entity=name,
                    relation=rel,
                    gold_doc_id=str(doc_id),
                )
            )
    rng.shuffle(questions)
    # Hold out at most one fact per person, so every held-out person is still seen in training.
    held, seen_people = [], set()
    for q in questions:
        if len(held) < test_fraction * len(questions) and q.entity not in seen_people:
            held.append(q)
            seen_people.add(q.entity)
    held_ids = {q.id for q in held}
    train = [q for q in questions if q.id not in held_ids]
    return World(corpus=corpus, train=train, test=sorted(held, key=lambda q: q.id))


def write_world(world: World, out: str | Path) -> dict[str, Path]:
    """Write ``corpus.jsonl``, ``train.jsonl`` and ``test.jsonl`` (FlashRAG QA format) under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl", "train": out / "train.jsonl", "test": out / "test.jsonl"}
    rows = {
        "corpus": world.corpus,
        "train": [q.to_json() for q in world.train],
        "test": [q.to_json() for q in world.test],
    }
    for key, path in paths.items():
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[key]))
    return paths


def main() -> None:
    import argparse

    from shared.log import configure_logging, get_logger

    parser = argparse.ArgumentParser(description="Write the synthetic lookup world (corpus + QA splits).")
    parser.add_argument("--out", default="data/lookup", help="output folder (default: data/lookup)")
    parser.add_argument("--people", type=int, default=120, help="number of people / documents (default 120)")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="held-out share of questions")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args()
    configure_logging()
    world = make_world(args.people, args.test_fraction, args.seed)
    paths = write_world(world, args.out)
    get_logger(__name__).info(
        "lookup world written",
        extra={
            "documents": len(world.corpus),
            "train": len(world.train),
            "test": len(world.test),
            "files": ", ".join(str(p) for p in paths.values()),
        },
    )


if __name__ == "__main__":
    main()
