"""``Trajectory`` serialisation and ``visualize_mask``: the trained spans are seen, not guessed."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

import agentfly as af
from agentfly.rollout.mask import DIM, GREEN, RESET
from agentfly.tools.builtin import calculator

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37*48"}}\n</tool_call>'


@pytest.fixture
def trajectory(scripted_engine: Callable[..., Any]) -> af.Trajectory:
    agent = af.Agent(model=scripted_engine([[CALL, "The answer is 1776."]]), tools=[calculator],
                     reward=af.rewards.builtin.math_equal)
    (t,) = agent.run_sync([{"id": "x", "question": "What is 37*48? #rollout=0#", "answer": "1776"}])
    assert t.num_turns == 2 and t.reward == 1.0
    return t


def test_it_marks_exactly_the_trained_spans(trajectory: af.Trajectory, tiny_tokenizer: Any) -> None:
    out = io.StringIO()
    text = af.visualize_mask(trajectory, tiny_tokenizer, file=out, color=False)
    assert out.getvalue() == text + "\n"
    assert text.count("[[") == text.count("]]") == 2
    assert f"[[{CALL}<|im_end|>]]" in text
    assert "[[The answer is 1776.<|im_end|>]]" in text
    assert text.replace("[[", "").replace("]]", "") == tiny_tokenizer.decode(trajectory.token_ids)
    assert "<tool_response>\n1776\n</tool_response>" in text.split("]]")[1]  # the observation is not trained


def test_it_colours_trained_tokens_green_and_forced_tokens_dim(trajectory: af.Trajectory,
                                                              tiny_tokenizer: Any) -> None:
    text = af.visualize_mask(trajectory, tiny_tokenizer, file=io.StringIO(), color=True)
    assert text.startswith(DIM) and text.endswith(RESET)
    assert f"{GREEN}{CALL}<|im_end|>{RESET}" in text
    assert text.count(GREEN) == 2  # the two assistant turns
    assert text.count(DIM) == 2  # the prompt, and the observation with its glue; the final turn ends the sequence
    assert text.endswith(f"{GREEN}The answer is 1776.<|im_end|>{RESET}")
    assert "[[" not in text


def test_it_gives_the_spans_the_dashboard_renders(trajectory: af.Trajectory, tiny_tokenizer: Any) -> None:
    segments = af.mask_segments(trajectory, tiny_tokenizer)
    assert segments[0]["start"] == 0 and segments[-1]["end"] == len(trajectory.token_ids)
    assert all(a["end"] == b["start"] and a["mask"] != b["mask"] for a, b in itertools.pairwise(segments))
    trained = [(s["start"], s["end"]) for s in segments if s["mask"] == 1]
    assert trained == [(turn.start, turn.end) for turn in trajectory.turns]
    assert "".join(s["text"] for s in segments) == tiny_tokenizer.decode(trajectory.token_ids)


def test_it_loads_the_tokenizer_from_the_trajectorys_model(trajectory: af.Trajectory, tiny_model_dir: Any,
                                                           tiny_tokenizer: Any) -> None:
    trajectory.model = str(tiny_model_dir)
    assert af.mask_segments(trajectory) == af.mask_segments(trajectory, tiny_tokenizer)
    trajectory.model = None
    with pytest.raises(ValueError, match="pass tokenizer="):
        af.mask_segments(trajectory)


def test_it_round_trips_through_a_dict_and_json(trajectory: af.Trajectory) -> None:
    data = trajectory.to_dict()
    assert (data["num_turns"], data["tool_errors"], data["parse_errors"]) == (2, 0, 0)
    assert af.Trajectory.from_dict(data) == trajectory
    assert af.Trajectory.from_dict(json.loads(json.dumps(data))) == trajectory
    assert isinstance(af.Trajectory.from_dict(data).turns[0], af.rollout.Turn)


def test_it_derives_counts_and_spans() -> None:
    t = af.Trajectory(sample={}, rollout_id="r", group_id="g")
    t.extend_prompt([1, 2, 3])
    t.prompt_length = 3
    t.extend_sampled([4, 5], [-0.5, -0.25])
    t.extend_observation([6])
    t.extend_sampled([7], [-1.0])
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert t.logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert t.mask_spans() == [(0, 3, 0), (3, 5, 1), (5, 6, 0), (6, 7, 1)]
    assert (t.response_length, t.num_trained_tokens) == (4, 3)
    with pytest.raises(ValueError, match="2 sampled tokens but 1 logprobs"):
        t.extend_sampled([8, 9], [-1.0])
