"""Token-exact masking, checked as a property over random conversations driven through the real rollout loop.

A ``ReplayEngine`` plays random assistant turns (tool calls to sync, async, raising, slow and unknown tools,
malformed calls, plain text) with the tiny model's tokenizer and chat template, and teacher-forced logprobs
from the tiny model. Whatever happens, every trajectory must hold exactly the rendered prompt, then the
engine's tokens (mask 1, with their logprobs) and the template's observation tokens (mask 0).
"""

from __future__ import annotations

import asyncio
import json
import time
import unicodedata
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import agentfly as af
from agentfly.rollout import Trajectory

# ---------------------------------------------------------------------------------------------- tools


@af.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@af.tool
async def echo(text: str, times: int = 1) -> str:
    """Repeat text."""
    await asyncio.sleep(0)
    return text * times


@af.tool
def fail(reason: str = "broken") -> str:
    """Always raises."""
    raise RuntimeError(reason)


@af.tool(timeout=0.02)
async def stall() -> str:
    """Never answers in time."""
    await asyncio.sleep(5)
    return "late"


@af.tool(timeout=0.02)
def stall_sync() -> str:
    """A blocking tool that overruns its timeout."""
    time.sleep(0.05)
    return "late"


@af.tool
async def whoami(context: Any) -> str:
    """The rollout's id, from the injected context."""
    return context.rollout_id


TOOLS = [add, echo, fail, stall, stall_sync, whoami]
CALLABLE_NAMES = [t.name for t in TOOLS] + ["no_such_tool"]

# ---------------------------------------------------------------------------------------------- turns
# '|' would spell special tokens such as <|im_end|> (a real engine stops there, so text never holds one);
# '#' would spell the #rollout=K# marker the scripted engine routes by.
# NFC-normalised, as the tokenizer normalises text (a model's sampled tokens always decode to normal form).
free_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="|#"),
                    max_size=24).map(lambda s: unicodedata.normalize("NFC", s))
json_scalar = st.one_of(st.integers(-10**6, 10**6), free_text, st.booleans(), st.none())
arguments = st.one_of(
    st.fixed_dictionaries({"a": st.integers(-999, 999), "b": st.integers(-999, 999)}),
    st.fixed_dictionaries({"text": free_text}, optional={"times": st.integers(0, 3)}),
    st.dictionaries(st.sampled_from(["a", "b", "text", "reason", "context", "x"]), json_scalar, max_size=3),
)
good_call = st.builds(
    lambda name, args: "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    + "\n</tool_call>",
    st.sampled_from(CALLABLE_NAMES), arguments,
)
bad_call = st.sampled_from([
    '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>',  # bad JSON
    '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
    "<tool_call>[1, 2]</tool_call>",  # not an object
    '<tool_call>{"name": "echo", "arguments": {"text": "x"}}',  # unterminated
    "stray </tool_call>",
])
turn = st.builds(
    lambda before, calls, after: before + "".join(calls) + after,
    free_text, st.lists(st.one_of(good_call, good_call, bad_call), min_size=1, max_size=3), free_text,
)
# Turns that call tools, then (unless the turn limit comes first) one that answers in plain text.
script = st.builds(lambda calls, answer: [*calls, answer], st.lists(turn, max_size=4), free_text)

react_call = st.builds(
    lambda name, args: f"Action: {name}\nAction Input: {json.dumps(args, ensure_ascii=False)}\n",
    st.sampled_from(CALLABLE_NAMES), arguments,
)
react_bad_call = st.sampled_from([
    'Action: add\nAction Input: {"a": 1\n',  # bad JSON
    "Action: echo\n",  # no Action Input
    "Action: \nAction Input: {}\n",  # no tool name
])
react_turn = st.builds(
    lambda thought, calls, observation: f"Thought: {thought}\n" + "".join(calls) + observation,
    free_text, st.lists(st.one_of(react_call, react_call, react_bad_call), min_size=1, max_size=2),
    st.sampled_from(["", "Observation:", "Observation: made up"]),
)
react_script = st.builds(lambda calls, answer: [*calls, f"Final Answer: {answer}"], st.lists(react_turn, max_size=4),
                         free_text)
conversations = st.one_of(
    st.tuples(st.just("hermes"), st.lists(script, min_size=1, max_size=3)),
    st.tuples(st.just("react"), st.lists(react_script, min_size=1, max_size=3)),
)


def rendered_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=[t.schema for t in TOOLS], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_trajectory(t: Trajectory, k: int, engine: Any, tokenizer: Any, max_turns: int,
                     system_prompt: str | None) -> None:
    eot = engine.stop_token_ids[0]
    eot_text = tokenizer.decode([eot])
    decode: Callable[[list[int]], str] = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731

    # A rollout never crashes, whatever the model wrote or the tools did.
    assert t.error is None, t.error
    assert t.finish_reason in ("answer", "max_turns", "length")
    assert 1 <= t.num_turns <= max_turns
    if t.finish_reason == "max_turns":
        assert t.num_turns == max_turns

    # One token, one mask bit, one logprob.
    assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
    assert set(t.loss_mask) <= {0, 1}

    # The prompt is exactly the chat template's rendering of the opening conversation.
    opening = [{"role": "user", "content": t.sample["question"]}]
    if system_prompt:
        opening.insert(0, {"role": "system", "content": system_prompt})
    prompt = rendered_prompt_ids(tokenizer, opening)
    assert t.prompt_length == len(prompt)
    assert t.token_ids[: t.prompt_length] == prompt

    # The trained spans are exactly the turns, each one exactly what the engine returned (never re-encoded).
    generations = engine.generations[k]
    assert len(generations) == t.num_turns
    assert [(s, e) for s, e, m in t.mask_spans() if m == 1] == [(turn.start, turn.end) for turn in t.turns]
    for turn, gen, text in zip(t.turns, generations, engine.texts[k], strict=True):
        assert t.token_ids[turn.start: turn.end] == gen.token_ids
        assert t.logprobs[turn.start: turn.end] == gen.logprobs
        assert all(lp < 0 for lp in gen.logprobs)  # real teacher-forced logprobs, not placeholders
        assert turn.finish_reason == gen.finish_reason
        span_text = decode(t.token_ids[turn.start: turn.end])
        if gen.finish_reason == "stop":
            assert gen.token_ids[-1] == eot
            assert span_text == text + eot_text  # the assistant turn verbatim, plus the end-of-turn token
            assert turn.text == text
        else:  # cut by max_new_tokens or the context length
            assert turn.text == span_text
    # Forced tokens (prompt, observations, template glue) are never trained and carry no logprob.
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)

    # The whole sequence is the chat template's rendering of the conversation, as far as it got.
    last_is_assistant = t.messages[-1]["role"] == "assistant"
    rendering = tokenizer.apply_chat_template(t.messages, tools=[tl.schema for tl in TOOLS], tokenize=False,
                                              add_generation_prompt=not last_is_assistant)
    decoded = decode(t.token_ids)
    assert rendering.startswith(decoded), (decoded[-200:], rendering[len(decoded) - 200:])
    if t.finish_reason == "answer" and t.turns[-1].finish_reason == "stop":
        assert rendering == decoded + "\n"  # everything but the template's newline after the final turn

    # Every call and every malformed call of a turn that another turn followed was answered in that turn
    # (the last turn's calls are answered too unless the turn limit or the context length ended the rollout).
    for i, turn in enumerate(t.turns):
        answered = [c for c in t.tool_calls if c.turn == i]
        if i == t.num_turns - 1 and not answered:
            continue
        assert [c.name for c in answered if c.name != "<parse error>"] == turn.tool_calls
        assert sum(c.name == "<parse error>" for c in answered) == len(turn.parse_errors)
    for call in t.tool_calls:
        if call.name in ("fail", "stall", "no_such_tool", "<parse error>"):
            assert call.error is not None and call.observation.startswith("Error: ") and call.error in call.observation
        if call.name == "stall_sync" and call.error is None:
            # The thread may finish before a busy event loop runs the timeout; then its value stands.
            assert call.observation == "late"
        if call.name == "whoami" and call.error is None:
            assert call.observation == t.rollout_id


@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    conversation=conversations,
    max_turns=st.sampled_from([4, 4, 3, 2, 1]),
    max_new_tokens=st.sampled_from([256, 256, 256, 40, 4]),
    tight_context=st.sampled_from([False, False, True]),
    system_prompt=st.one_of(st.none(), free_text.filter(bool)),
    temperature=st.sampled_from([1.0, 0.7]),
    char_level=st.booleans(),
)
def test_it_keeps_tokens_mask_and_logprobs_exact_over_random_conversations(
    tiny_tokenizer: Any, tiny_model: Any, scripted_engine: Callable[..., Any],
    conversation: tuple[str, list[list[str]]], max_turns: int, max_new_tokens: int, tight_context: bool,
    system_prompt: str | None, temperature: float, char_level: bool,
) -> None:
    parser, scripts = conversation
    engine = scripted_engine(scripts, model=tiny_model, char_level=char_level)
    samples = [{"id": f"s{k}", "question": f"Task #rollout={k}# compute things."} for k in range(len(scripts))]
    prompt_len = len(rendered_prompt_ids(tiny_tokenizer, [{"role": "user", "content": samples[0]["question"]}]))
    agent = af.Agent(model=engine, tools=TOOLS, parser=parser, max_turns=max_turns, system_prompt=system_prompt,
                     max_length=prompt_len + 200 if tight_context else None)
    trajectories = agent.run_sync(samples, sampling=af.Sampling(temperature=temperature,
                                                                max_new_tokens=max_new_tokens))
    assert [t.sample["id"] for t in trajectories] == [s["id"] for s in samples]
    for k, t in enumerate(trajectories):
        event(f"parser={parser}, finish={t.finish_reason}")
        event(f"turns={t.num_turns}")
        event(f"tool errors: {min(t.tool_errors, 2)}, parse errors: {min(t.parse_errors, 1)}")
        check_trajectory(t, k, engine, tiny_tokenizer, max_turns, system_prompt)
