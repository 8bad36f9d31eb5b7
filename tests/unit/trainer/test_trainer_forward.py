"""The trainer's batched forward: shared-prefix computation is exact, and batches are built as rolled out."""

from __future__ import annotations

import pytest
import torch

from agentfly.rollout.trajectory import Trajectory
from trainer.batch import collate, forward, shared_prefix_length
from trainer.builders import DataCursor

torch.set_num_threads(1)


def _trajectory(prompt: list[int], response: list[int], observation: list[int], tail: list[int]) -> Trajectory:
    t = Trajectory(sample={}, rollout_id="r", group_id="g")
    t.extend_prompt(prompt)
    t.prompt_length = len(prompt)
    t.extend_sampled(response, [-0.5] * len(response))
    t.extend_observation(observation)
    t.extend_sampled(tail, [-0.25] * len(tail))
    return t


def _batch():
    shared = list(range(3, 23))  # 20 tokens every row starts with (the system prompt)
    trajectories = [
        _trajectory([*shared, 40, 41], [50, 51, 52], [60, 61], [70]),
        _trajectory([*shared, 42], [53, 54], [62], [71, 72, 73]),
        _trajectory([*shared, 43, 44, 45], [55], [63, 64, 65], [74, 75]),
    ]
    return trajectories, collate(trajectories, [1.0, 0.0, 0.5], [0, 0, 1], pad_id=0, device=torch.device("cpu"))


def test_collate_shifts_mask_and_logprobs_to_predicted_tokens():
    trajectories, batch = _batch()
    t = trajectories[0]
    n = len(t.token_ids)
    assert batch.input_ids[0, :n].tolist() == t.token_ids
    assert batch.mask[0, : n - 1].tolist() == t.loss_mask[1:]
    assert batch.rollout_logprobs[0, : n - 1].tolist() == t.logprobs[1:]
    assert batch.mask[0, n - 1:].sum() == 0  # padding is never trained
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5] and batch.group_ids.tolist() == [0, 0, 1]


def test_the_shared_prefix_stops_before_the_first_difference_and_the_first_trained_token():
    _, batch = _batch()
    assert shared_prefix_length(batch, loss_mask_start=100) == 20
    assert shared_prefix_length(batch, loss_mask_start=18) == 18
    assert shared_prefix_length(batch, loss_mask_start=10) == 0  # too short to be worth it


def test_shared_prefix_forward_gives_the_same_logprobs_and_gradients_as_a_plain_forward(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    _, batch = _batch()
    results = []
    for share_prefix in (True, False):
        model.zero_grad()
        logp, ent, _ = forward(model, batch, temperature=0.7, entropy=True, share_prefix=share_prefix)
        mask = batch.mask.bool()
        (logp[mask].sum() + ent[mask].sum()).backward()  # type: ignore[index]
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((logp[mask].detach(), ent[mask].detach(), grads))  # type: ignore[index]
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5)
    assert torch.allclose(ent_a, ent_b, atol=1e-5)
    assert torch.allclose(g_a, g_b, rtol=1e-4, atol=1e-6)


def test_the_data_cursor_resumes_mid_epoch_in_the_same_order():
    samples = [{"id": i} for i in range(5)]
    a = DataCursor(samples, seed=1)
    first = a.take(3)
    b = DataCursor(samples, seed=1)
    b.load_state_dict(a.state_dict())
    assert [s["id"] for s in a.take(4)] == [s["id"] for s in b.take(4)]
    assert sorted(s["id"] for s in first + DataCursor(samples, seed=1).take(5)[3:]) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_trainer_logprobs_match_the_hf_engine_on_its_own_samples(tiny_model_dir, temperature):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import agentfly as af
    from agentfly.engines.hf import HFEngine
    from agentfly.rewards.builtin.math import math_equal
    from agentfly.tasks import arithmetic
    from agentfly.tools.builtin.calculator import calculator

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    agent = af.Agent(HFEngine(model=model, tokenizer=tok), tools=[calculator], reward=math_equal, max_turns=2)
    trajectories = agent.run_sync(arithmetic.generate(2, seed=0), group_size=2,
                                  sampling=af.Sampling(temperature=temperature, max_new_tokens=12, seed=0))
    batch = collate(trajectories, [0.0] * 4, [0, 0, 1, 1], tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        logp, _, _ = forward(model, batch, temperature)
    gap = (logp - batch.rollout_logprobs)[batch.mask.bool()].abs()
    assert gap.numel() > 0 and gap.max() < 1e-3
