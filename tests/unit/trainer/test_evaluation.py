"""The evaluation's figures on hand-built numbers and trajectories: the pass@k estimator, pass@1, mean turns,
tool-error rate, the split a problem belongs to, and the table."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from agentfly.rollout.trajectory import ToolCallRecord, Trajectory, Turn
from trainer.config import ConfigError, load_config
from trainer.evaluation import EvalRun, Sampled, pass_at_k, report, sampled_eval, split_field, table


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 1, 1, 1 / 4),  # pass@1 is the share of correct samples
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (10, 0, 5, 0.0),  # nothing correct
    (3, 2, 2, 1.0),  # only one wrong sample: every pair holds a correct one
    (8, 8, 8, 1.0),
])
def test_pass_at_k_is_one_minus_the_chance_that_k_draws_are_all_wrong(n: int, c: int, k: int,
                                                                       expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_share_of_k_subsets_that_hold_a_correct_sample() -> None:
    for n in range(1, 8):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets)), (n, c, k)


def test_pass_at_k_does_not_overflow_for_many_samples() -> None:
    assert pass_at_k(200, 10, 100) == pytest.approx(1 - math.comb(190, 100) / math.comb(200, 100))


def test_pass_at_k_refuses_more_draws_than_samples_and_impossible_counts() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="between 0 and n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="at least 4 samples"):
        Sampled([1, 4], n=2, temperature=1.0)


def traj(reward: float, turns: int, calls: list[str | None], sample: dict[str, object] | None = None) -> Trajectory:
    """A trajectory with ``turns`` turns and one tool call per entry of ``calls`` (its error, None for success)."""
    t = Trajectory(sample=sample or {}, rollout_id="r", group_id="g", reward=reward)
    t.turns = [Turn(i, 0, 0, "", "stop") for i in range(turns)]
    t.tool_calls = [ToolCallRecord(0, "calculator", {}, "", error) for error in calls]
    return t


SAMPLES = [{"question": "a", "split": "easy"}, {"question": "b", "split": "hard"}, {"question": "c", "split": "hard"}]


def test_the_figures_of_hand_built_trajectories_for_all_problems_and_per_split() -> None:
    greedy = [traj(1.0, 2, [None]), traj(0.0, 3, [None, "unknown tool 'calc'"]), traj(1.0, 1, [])]
    # Two samples per problem: easy 2 correct, hard problems 1 and 0 correct.
    sampled = [traj(1.0, 1, []), traj(1.0, 1, []), traj(0.0, 1, []), traj(1.0, 1, []), traj(0.0, 1, []),
               traj(0.5, 1, [])]
    run = EvalRun(SAMPLES, greedy, Sampled([1, 2], n=2, temperature=0.7), sampled)
    m = run.metrics()
    assert m["eval/pass_at_1"] == pytest.approx(2 / 3)
    assert m["eval/mean_turns"] == pytest.approx(2.0)
    assert m["eval/tool_error_rate"] == pytest.approx(1 / 3)  # one of three calls failed
    assert m["eval/sampled/pass_at_1"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert m["eval/sampled/pass_at_2"] == pytest.approx((1.0 + 1.0 + 0.0) / 3)  # a reward of 0.5 is not a pass
    assert m["eval/sampled/n"] == 2 and m["eval/sampled/temperature"] == 0.7

    rep = report(run, split_field(SAMPLES), "unused")
    assert rep["group_by"] == "field 'split'"
    assert list(rep["splits"]) == ["easy", "hard"]
    hard = rep["splits"]["hard"]
    assert (hard["eval/problems"], hard["eval/pass_at_1"], hard["eval/mean_turns"]) == (2, 0.5, 2.0)
    assert hard["eval/tool_error_rate"] == pytest.approx(1 / 2)
    assert hard["eval/sampled/pass_at_2"] == pytest.approx(0.5)
    assert rep["splits"]["easy"]["eval/tool_error_rate"] == 0.0

    text = table(rep)
    header, _, *rows, footer = text.splitlines()
    assert header.split()[:4] == ["split", "problems", "pass@1", "(greedy)"]
    assert "pass@2 (n=2, T=0.7)" in header and "mean turns" in header and "tool-error rate" in header
    assert rows[0].split() == ["all", "3", "0.667", "0.500", "0.667", "2.00", "0.333"]
    assert rows[2].split() == ["hard", "2", "0.500", "0.250", "0.500", "2.00", "0.500"]
    assert footer == "splits by field 'split'"


def test_without_a_split_field_the_data_source_is_the_one_split_and_the_report_says_so() -> None:
    samples = [{"question": "a", "id": "x"}, {"question": "b", "id": "y"}]
    assert split_field(samples) is None
    rep = report(EvalRun(samples, [traj(1.0, 1, []), traj(0.0, 1, [])]), None, "held_out.jsonl")
    assert list(rep["splits"]) == ["held_out.jsonl"]
    assert "data source" in rep["group_by"]
    assert "eval/sampled/n" not in rep["all"]  # no pass@k unless asked for


def test_a_split_field_with_several_values_is_preferred_to_one_that_is_the_same_everywhere() -> None:
    # ScienceWorld's held-out samples all have split="test"; their task names are the split that tells.
    samples = [{"split": "test", "task": "boil"}, {"split": "test", "task": "melt"}]
    assert split_field(samples) == "task"
    assert split_field([{"split": "test"}, {"split": "test"}]) == "split"


def test_pass_at_k_at_periodic_eval_is_off_by_default_and_checked_when_configured() -> None:
    assert sampled_eval(load_config(None)) is None
    sampled = sampled_eval(load_config(None, ["eval.pass_k=[1, 4]", "eval.temperature=0.8"]))
    assert sampled is not None and (sampled.ks, sampled.n, sampled.temperature) == ([1, 4], 4, 0.8)
    with pytest.raises(ConfigError, match=r"eval\.samples >= 4"):
        load_config(None, ["eval.pass_k=[4]", "eval.samples=2"])
    with pytest.raises(ConfigError, match="temperature > 0"):
        load_config(None, ["eval.pass_k=[2]", "eval.temperature=0"])


def test_a_problem_the_infrastructure_failed_on_is_counted_and_left_out_of_pass_at_1() -> None:
    lost = traj(0.0, 1, [])
    lost.failure, lost.failure_reason = "node_lost", "the node running its sandbox went away"
    m = EvalRun(SAMPLES, [traj(1.0, 2, [None]), lost, traj(0.0, 1, [])]).metrics()
    assert m["eval/rollout/infra_failed"] == m["eval/rollout/infra_failure/node_lost"] == 1
    assert m["eval/problems"] == 2 and m["eval/pass_at_1"] == pytest.approx(1 / 2)
    assert m["eval/reward/mean"] == pytest.approx(1 / 2)


def test_a_split_whose_every_problem_failed_for_the_infrastructure_is_a_row_of_dashes_in_the_table() -> None:
    failed = traj(0.0, 1, [], {"question": "b", "split": "hard"})
    failed.failure, failed.failure_reason = "acquire_timeout", "no kv session within 60 s"
    run = EvalRun(SAMPLES[:2], [traj(1.0, 1, []), failed])
    rep = report(run, "split", "unused")
    assert rep["splits"]["hard"]["eval/rollout/infra_failed"] == 1.0
    rows = table(rep).splitlines()[2:-1]
    assert rows[0].split()[:3] == ["all", "1", "1.000"]  # the problem the agent got is still counted
    assert rows[2].split() == ["hard", "-", "-", "-", "-"]


def test_an_evaluation_larger_than_its_pool_runs_every_problem_instead_of_timing_the_rest_out(
        tiny_tokenizer: Any) -> None:
    import agentfly as af
    from tests.unit.rollout.test_concurrent_rollouts import NOTE, notes_pool, slow_note
    from trainer.evaluation import run_eval

    engine = af.ResourceEngine([notes_pool()])
    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, lambda p: NOTE if "<tool_response>" not in p else "done"),
                     tools=[slow_note], resources=engine, max_turns=3)
    try:
        run = run_eval(agent, [{"question": f"q{i}"} for i in range(6)], max_new_tokens=64, batch_size=500)
    finally:
        agent.close()
        engine.close()
    assert [t.failure for t in run.greedy] == [None] * 6
    assert all(t.tool_calls and t.tool_calls[0].observation == "noted" for t in run.greedy)
