"""The ``judge`` and ``reward_model`` resources on real local models: the tiny model (whose replies are noise,
so every verdict fails to parse: the failures must be counted and visible), a replayed judge whose verdicts
are given (the parsing and the score scale), and a sequence-classification model built with random weights.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

import agentfly as af
from agentfly.engines import HFEngine, ReplayEngine
from agentfly.resources import ResourceEngine
from agentfly.resources.judge import Judge, JudgeParseError, RewardModel, judge_spec, reward_model_spec
from agentfly.rewards.builtin import preference_vs_reference, rubric_judge

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_hf(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def replayed(tiny_hf: tuple[Any, Any], reply: str) -> ReplayEngine:
    model, tokenizer = tiny_hf
    return ReplayEngine(tokenizer, lambda prompt: reply, model=model)


async def test_a_judge_gathers_concurrent_calls_into_batches_and_never_exceeds_its_concurrency(
    tiny_hf: tuple[Any, Any]
) -> None:
    model, tokenizer = tiny_hf
    engine = HFEngine(model=model, tokenizer=tokenizer)
    judge = Judge(engine, max_concurrency=3, max_batch=8, sampling=af.Sampling(temperature=0.0, max_new_tokens=6))
    results = await asyncio.gather(*(judge.score(question=f"What is {i}+1?", answer=str(i + 1), rubric="correct")
                                     for i in range(10)), return_exceptions=True)
    stats = judge.stats()
    assert stats["calls"] == 10 and stats["errors"] == 0
    assert stats["max_in_flight"] <= 3 and engine.stats()["max_batch"] <= 3
    assert 1 < stats["max_batch"] <= 3 and stats["batches"] < 10  # batched, within the bound
    # The tiny model's replies are noise: every verdict is a counted, visible parse failure, never a 0.
    assert all(isinstance(r, JudgeParseError) for r in results)
    assert stats["parse_failures"] == 10 and stats["latency_p99_ms"] > 0


async def test_score_maps_the_judges_grade_onto_0_to_1_and_compare_averages_both_orders(
    tiny_hf: tuple[Any, Any]
) -> None:
    judge = Judge(replayed(tiny_hf, "The answer is right but terse.\nScore: 7"))
    assert await judge.score(question="2+2?", answer="4", rubric="correct") == pytest.approx(6 / 9)
    always_a = Judge(replayed(tiny_hf, "Winner: A"))
    # "A" wins both times: once it is the answer, once the reference, so the answer gets 1 and 0 -> 0.5.
    assert await always_a.compare(question="2+2?", answer="4", reference="four") == 0.5
    assert await always_a.compare(question="2+2?", answer="4", reference="four", both_orders=False) == 1.0
    tie = Judge(replayed(tiny_hf, "Winner: tie"))
    assert await tie.compare(question="q", answer="a", reference="b") == 0.5
    out_of_range = Judge(replayed(tiny_hf, "Score: 42"))
    with pytest.raises(JudgeParseError, match="Score: N"):
        await out_of_range.score(question="q", answer="a", rubric="r")
    assert out_of_range.stats()["parse_failures"] == 1


def test_a_reward_that_declares_a_resource_must_take_the_context() -> None:
    from agentfly.rewards.reward import RewardError

    with pytest.raises(RewardError, match="context"):
        @af.reward(resource="judge")
        def no_context(final_answer: str) -> float:
            return 0.0
    assert rubric_judge.resource == "judge" and preference_vs_reference.resource == "judge"


async def test_the_rubric_judge_reward_reads_the_judge_resource_and_a_parse_failure_is_the_trajectorys_error(
    tiny_model_dir: Path
) -> None:
    from agentfly.tasks import arithmetic

    samples = arithmetic.generate(2, seed=0)
    spec = judge_spec(model_dir=str(tiny_model_dir), sampling=af.Sampling(temperature=0.0, max_new_tokens=6),
                      max_concurrency=2)
    resources = ResourceEngine([spec])
    model_dir = str(tiny_model_dir)
    async with resources:
        agent = af.Agent(model=_policy(model_dir), reward=rubric_judge, max_turns=1, resources=resources)
        trajectories = await agent.run(samples, group_size=2,
                                       sampling=af.Sampling(temperature=1.0, max_new_tokens=8, seed=3))
        pool = resources.stats()["judge"]
    answered = [t for t in trajectories if t.final_answer]
    assert answered, "no rollout produced an answer for the judge to grade"
    for traj in answered:
        assert traj.reward_error is not None and "judge's reply" in traj.reward_error
    assert pool["kind"] == "model_service" and pool["scope"] == "global"
    assert pool["service"]["parse_failures"] == len(answered) and pool["service"]["calls"] == len(answered)


def _policy(model_dir: str) -> HFEngine:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return HFEngine(model=AutoModelForCausalLM.from_pretrained(model_dir).eval(),
                    tokenizer=AutoTokenizer.from_pretrained(model_dir))


@pytest.fixture(scope="module")
def classifier_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Qwen2 sequence classifier with random weights and the tiny model's tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("reward-model")
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


async def test_a_reward_model_resource_scores_concurrent_texts_in_batches_as_one_forward_pass_each_would(
    classifier_dir: Path
) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    texts = ["The answer is 4.", "I do not know", "2+2 equals four, as anyone can check.", "no"]
    resources = ResourceEngine([reward_model_spec(model_dir=str(classifier_dir))])
    async with resources:
        lease = await resources.acquire("reward_model")
        rm = lease.instance
        assert isinstance(rm, RewardModel)
        scores = await asyncio.gather(*(rm.score(t) for t in texts))
        stats = resources.stats()["reward_model"]["service"]
        await resources.release(lease)
    assert stats["calls"] == 4 and stats["batches"] == 1 and stats["max_batch"] == 4
    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier_dir)
    with torch.inference_mode():
        alone = [float(model(**tokenizer(t, return_tensors="pt")).logits[0, 0]) for t in texts]
    assert scores == pytest.approx(alone, abs=1e-4)
    assert len(set(scores)) == 4
