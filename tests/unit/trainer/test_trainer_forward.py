"""The trainer's batched forward: shared-prefix computation is exact, and batches are built as rolled out."""

from __future__ import annotations

import pytest
import torch

from agentfly.rollout.trajectory import Trajectory
from trainer.batch import collate, forward, group_prefixes, length_buckets, shared_prefix_length
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


def _grouped_batch(system: int):
    """Three GRPO groups of four rows after a ``system``-token prompt every row shares: two groups whose rows
    share their question (30 and 25 tokens), and one whose rows were given different questions and answer at
    length (so that the rows' own tokens fall in two length buckets)."""
    shared = list(range(3, 3 + system))
    trajectories, group_ids = [], []
    for g, question in enumerate((list(range(100, 130)), list(range(200, 225)), None)):
        for r in range(4):
            own = question if question is not None else list(range(300 + 7 * r, 305 + 7 * r))
            response = [400 + 3 * g + r + k for k in range(2 + r)]
            trajectories.append(_trajectory([*shared, *own], response, [500 + r, 501], [510 + g] * (1, 2, 60)[g]))
            group_ids.append(g)
    return collate(trajectories, [float(i % 3) for i in range(12)], group_ids, pad_id=0,
                   device=torch.device("cpu"))


def test_each_group_shares_its_question_up_to_its_first_sampled_token():
    batch = _grouped_batch(system=20)
    groups = group_prefixes(batch, start=20)
    assert groups is not None
    assert groups.lengths.tolist() == [30, 25, 0] and groups.leaders.tolist() == [0, 4, 8]
    assert groups.row_group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    # Groups of one row, or too little to save, are computed row by row.
    assert group_prefixes(batch.rows(torch.tensor([0, 4, 8])), start=20) is None
    assert group_prefixes(batch, start=20, minimum_saved=1000) is None


def test_rows_are_padded_only_to_their_buckets_longest_where_a_bucket_saves_more_than_a_pass_costs():
    assert length_buckets([40] * 6 + [30] * 4, pass_cost=64) == [list(range(10))]  # 40 padded < a pass
    assert length_buckets([10, 40, 11, 41, 12, 42], pass_cost=4) == [[5, 3, 1], [4, 2, 0]]
    assert length_buckets([40] * 6 + [10] * 4, pass_cost=64) == [list(range(6)), list(range(6, 10))]
    assert length_buckets([7] * 5) == [[0, 1, 2, 3, 4]]
    batch = _grouped_batch(system=20)
    groups = group_prefixes(batch, start=20)
    assert groups is not None
    own = batch.attention_mask.sum(1) - 20 - groups.lengths[groups.row_group]
    assert [sorted(b) for b in length_buckets(own.tolist())] == [[8, 9, 10, 11], list(range(8))]


@pytest.mark.parametrize("system", [20, 0])
def test_computing_each_groups_question_once_gives_the_same_logprobs_values_and_gradients(tiny_model_dir, system):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    head = torch.nn.Linear(model.config.hidden_size, 1)
    batch = _grouped_batch(system)
    assert group_prefixes(batch, start=system) is not None
    results = []
    for share_prefix in (True, False):
        model.zero_grad()
        logp, ent, h = forward(model, batch, temperature=0.7, entropy=True, hidden=True, share_prefix=share_prefix)
        mask = batch.mask.bool()
        values = head(h).squeeze(-1)  # type: ignore[arg-type]
        (logp[mask].sum() + ent[mask].sum() + values[mask].sum()).backward()  # type: ignore[index]
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((logp[mask].detach(), ent[mask].detach(), values[mask].detach(), grads))  # type: ignore[index]
    for shared, plain in zip(*results, strict=True):
        assert shared.shape == plain.shape  # float32 sums in another order: equal to 1e-6 of the largest
        assert torch.allclose(shared, plain, rtol=1e-4, atol=1e-6 * float(plain.abs().max()))


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


def test_with_the_common_prefix_only_a_batch_takes_two_forward_calls_whatever_its_groups_and_lengths(
        tiny_model_dir):
    # The layout under N DeepSpeed ranks, where every rank makes the same forward calls.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    batch = _grouped_batch(system=20)
    results = []
    for per_group, share_prefix in ((True, True), (False, True), (True, False)):
        calls.clear()
        model.zero_grad()
        logp, _, _ = forward(model, batch, temperature=0.7, share_prefix=share_prefix, per_group=per_group)
        logp[batch.mask.bool()].sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((len(calls), logp[batch.mask.bool()].detach(), grads))
    (grouped_calls, *_), (common_calls, c_logp, c_grads), (_, p_logp, p_grads) = results
    assert grouped_calls > 2 and common_calls == 2
    assert torch.allclose(c_logp, p_logp, rtol=1e-4, atol=1e-6 * float(p_logp.abs().max()))
    assert torch.allclose(c_grads, p_grads, rtol=1e-4, atol=1e-6 * float(p_grads.abs().max()))


def test_a_token_bound_cuts_length_sorted_rows_so_no_pass_holds_more_padded_tokens_than_it():
    from trainer.batch import micro_batches

    lengths = torch.tensor([300, 40, 900, 120, 2500, 60, 700])
    rows = torch.argsort(lengths, stable=True)
    parts = micro_batches(rows, lengths, max_rows=32, max_tokens=1000)
    assert torch.cat(parts).tolist() == rows.tolist()  # every row once, in order
    for part in parts:
        assert len(part) * int(lengths[part].max()) <= 1000 or len(part) == 1
    assert [p.tolist() for p in parts][-1] == [4]  # the 2500-token row goes alone
    assert [len(p) for p in micro_batches(rows, lengths, max_rows=2)] == [2, 2, 2, 1]


def test_bounded_passes_give_the_batchs_logprobs_and_hidden_states(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from trainer.batch import bounded_forward

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    _, batch = _batch()
    with torch.no_grad():
        whole, whole_states = bounded_forward(model, batch, 1.0, 32, None, hidden=True)
        cut, cut_states = bounded_forward(model, batch, 1.0, 32, 1, hidden=True)
    assert whole_states is not None and cut_states is not None
    mask = batch.mask.bool()
    assert torch.allclose(whole[mask], cut[mask], atol=1e-5)
    assert torch.allclose(whole_states[mask], cut_states[mask], atol=1e-5)
