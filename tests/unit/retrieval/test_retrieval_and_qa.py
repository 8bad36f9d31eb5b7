"""WIKI_MINI: the shipped corpus, the bm25s index as a global resource, the search tool and the QA rewards."""

from __future__ import annotations

import json

import pytest

from agentfly.context import RolloutContext
from agentfly.resources import ResourceEngine
from agentfly.retrieval import WIKI_MINI, BM25Index, load_passages, wiki_mini_qa
from agentfly.retrieval.corpus import CORPUS_PATH, generate
from agentfly.rewards.builtin.qa import exact_match, f1, normalize_answer
from agentfly.tools.builtin.search import search


def test_the_shipped_corpus_is_what_the_generator_makes_and_every_answer_is_in_its_passage() -> None:
    passages, questions = generate(seed=0)
    assert len(passages) >= 3000 and len(questions) >= 3000
    assert [json.loads(line) for line in CORPUS_PATH.read_text().splitlines()] == passages
    by_id = {p["id"]: p["text"] for p in passages}
    assert all(q["answer"] in by_id[q["passage"]] for q in questions)
    train, test = wiki_mini_qa("train"), wiki_mini_qa("test")
    assert not {q["id"] for q in train} & {q["id"] for q in test}
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.25
    assert wiki_mini_qa("test", hops=2) and all(q["hops"] == 2 for q in wiki_mini_qa("test", hops=2))


async def test_bm25_finds_the_passage_that_answers_a_one_hop_question() -> None:
    index = BM25Index()
    await index.start()
    questions = wiki_mini_qa("test", hops=1, limit=200)
    found = [q["passage"] in [h.id for h in await index.search(q["question"], k=3)] for q in questions]
    assert sum(found) / len(found) > 0.95
    with pytest.raises(ValueError, match="empty query"):
        await index.search("   ")
    await index.close()


async def test_the_search_tool_shares_one_global_index_across_rollouts() -> None:
    q = wiki_mini_qa("test", hops=1, limit=1)[0]
    async with ResourceEngine([WIKI_MINI]) as engine:
        a = RolloutContext(sample=q, rollout_id="a", group_id="g", resources=engine)
        b = RolloutContext(sample=q, rollout_id="b", group_id="g", resources=engine)
        out = await search.invoke({"query": q["question"], "k": 2}, context=a)
        assert out.ok and out.observation.startswith("[1] ") and q["answer"] in out.observation
        await search.invoke({"query": "river"}, context=b)
        assert await a.resource("wiki") is await b.resource("wiki")
        await a.aclose()
        await b.aclose()
        stats = engine.stats()["wiki"]
        assert (stats["scope"], stats["size"], stats["created"], stats["in_use"]) == ("global", 1, 1, 0)


def test_a_corpus_line_without_text_is_rejected_with_its_line_number(tmp_path) -> None:
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:2: a passage needs a string 'text' field"):
        load_passages(bad)


@pytest.mark.parametrize(("prediction", "answer", "em", "f"), [
    ("The Tenchend Sea.", "Tenchend Sea", 1.0, 1.0),
    ("<answer>1643</answer>", "1643", 1.0, 1.0),
    ("It flows into the Tenchend", "Tenchend Sea", 0.0, 1 / 3),  # P = 1/4, R = 1/2
    ("copper", ["iron", "Copper"], 1.0, 1.0),
    (None, "x", 0.0, 0.0),
])
def test_exact_match_and_f1_follow_squad_normalisation(prediction, answer, em, f) -> None:
    assert exact_match(prediction, answer) == em
    assert f1(prediction, answer) == pytest.approx(f)


def test_normalisation_drops_case_punctuation_and_articles() -> None:
    assert normalize_answer("  The  Old-Town, an  inn ") == "oldtown inn"
