"""One rollout's conversation, token-exact: OpenAI messages in, the ids the engine samples from out.

An OpenAI client sends the whole conversation back as text on every request. Re-rendering that text with the
chat template would not give back the ids the model sampled (whitespace, tool-call JSON, special tokens), so
the conversation keeps the ids itself: the first request's messages are rendered once (``ChatRenderer``); after
each sampled turn, the next request must repeat the conversation so far, and only the messages it adds (tool
results, a user's next message) are rendered, as the template's glue after the sampled tokens
(``ChatRenderer.glue_ids``, the same glue the in-process rollout loop appends). The sampled text is never
rendered again.

Whether a request repeats the conversation is decided on the messages' meaning, not their bytes: role and text
of each message, and for an assistant turn its tool calls as (name, parsed arguments), because SDKs rebuild
the assistant message they got back (``content: null`` for ``""``, arguments re-serialised). A request that
changed an earlier message (an edited history, a summarised context, a retried turn) cannot continue the
sampled ids: it is a ``Mismatch``, which the gateway turns into a new segment (the changed conversation is
rendered afresh, mask 0) or a refusal, never a trajectory that trains on text the model did not sample.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentfly.engines.base import Generation
from agentfly.rollout.parsers import Parser, ParseResult
from agentfly.rollout.render import ChatRenderer
from agentfly.rollout.trajectory import ToolCallRecord, Trajectory, Turn


class RequestError(ValueError):
    """A request the gateway refuses; ``status`` and ``code`` are the HTTP status and OpenAI's error code."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error",
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.retry_after = status, code, retry_after


class Mismatch(RequestError):
    """The request's messages do not repeat the conversation the gateway sampled (``index``: the first one
    that differs, or the length of the stored conversation when the request adds nothing after it)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message, 409, "conversation_mismatch")
        self.index = index


def text_of(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, None, or a list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RequestError(f"message content part of type {kind!r} is not supported; this gateway serves a "
                                   "text model: send text parts only", code="unsupported_content")
        return "".join(parts)
    raise RequestError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as data: OpenAI sends them as a JSON string, which SDKs may re-serialise."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw


def message_key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What two messages must share to be the same message of a conversation (see the module docstring)."""
    role = message.get("role")
    if role == "developer":  # the newer name of the system role
        role = "system"
    if role == "assistant":
        calls = tuple(
            (str(c.get("function", {}).get("name")), json.dumps(_arguments(c.get("function", {}).get("arguments")),
                                                                sort_keys=True))
            for c in message.get("tool_calls") or ())
        return ("assistant", text_of(message.get("content")).strip(), calls)
    return (role, text_of(message.get("content")).strip())


@dataclass
class Conversation:
    """The token-exact state of one segment of a rollout: its trajectory and the conversation it holds.

    renderer: the chat template with the request's tools (fixed for the segment: other tools would change the
    rendered prompt). parser: finds the tool calls in a sampled turn.
    """

    renderer: ChatRenderer
    parser: Parser
    stop_token_ids: Sequence[int]
    trajectory: Trajectory
    tools_key: str = ""
    keys: list[tuple[Any, ...]] = field(default_factory=list)  # message_key of every message so far
    history: list[dict[str, Any]] = field(default_factory=list)  # the same, as the template's messages
    call_names: dict[str, str] = field(default_factory=dict)  # tool_call_id -> tool name (our turns' calls)
    calls: dict[str, tuple[int, str, Any]] = field(default_factory=dict)  # tool_call_id -> (turn, name, arguments)
    last: Generation | None = None

    # ------------------------------------------------------------------ undo a request that got no answer
    def snapshot(self) -> tuple[int, int, int, int, int, int]:
        t = self.trajectory
        return (len(t.token_ids), t.prompt_length, len(self.keys), len(self.history), len(t.messages),
                len(t.tool_calls))

    def restore(self, saved: tuple[int, int, int, int, int, int]) -> None:
        """Back to ``snapshot()``'s state (only appends happen between the two)."""
        n, prompt_length, keys, history, messages, calls = saved
        t = self.trajectory
        del t.token_ids[n:], t.loss_mask[n:], t.logprobs[n:], self.keys[keys:], self.history[history:]
        del t.messages[messages:], t.tool_calls[calls:]
        t.prompt_length = prompt_length

    # ------------------------------------------------------------------ the prompt of the next turn
    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Extend the trajectory with what the client sent since the last sampled turn and return the whole
        sequence, the engine's prompt. Raises ``Mismatch`` when ``messages`` do not repeat the conversation."""
        if not messages:
            raise RequestError("messages is empty; send at least one user message")
        keys = [message_key(m) for m in messages]
        traj = self.trajectory
        if self.last is None:  # the segment's first request: rendered once, all mask 0
            self.history = [self._template_message(m) for m in messages]
            traj.extend_prompt(self.renderer.prompt_ids(self.history))
            traj.prompt_length = len(traj.token_ids)
            traj.messages = [dict(m) for m in messages]
            self.keys = keys
            return list(traj.token_ids)
        n = len(self.keys)
        for i, (have, got) in enumerate(zip(self.keys, keys, strict=False)):
            if have != got:
                raise Mismatch(f"message {i} ({have[0]}) differs from the one this rollout already holds; the "
                               "tokens sampled after it cannot be continued token-exactly", i)
        if len(keys) <= n:
            raise Mismatch(f"the request repeats {len(keys)} of the conversation's {n} messages and adds none "
                           "after the last sampled turn (a retried or truncated conversation)", len(keys))
        new = [self._template_message(m) for m in messages[n:]]
        glue = self.renderer.glue_ids(self.history, new, self.last.token_ids, self.stop_token_ids)
        for m in messages[n:]:
            if m.get("role") == "tool":
                self._record_tool_result(m)
        self.history += new
        self.keys = keys
        traj.messages += [dict(m) for m in messages[n:]]
        traj.extend_observation(glue)
        return list(traj.token_ids)

    def _template_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """An OpenAI message as the chat template takes it."""
        role = message.get("role")
        text = text_of(message.get("content"))
        if role in ("system", "developer"):
            return {"role": "system", "content": text}
        if role == "user":
            return {"role": "user", "content": text}
        if role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            return {"role": "tool", "name": self.call_names.get(call_id, str(message.get("name", ""))), "content": text}
        if role == "assistant":  # a turn the client wrote (few-shot history): the parser's format, mask 0
            calls = [self.parser.format_call(str(c["function"]["name"]), _arguments(c["function"].get("arguments")))
                     for c in message.get("tool_calls") or ()]
            for c in message.get("tool_calls") or ():
                self.call_names[str(c.get("id", ""))] = str(c["function"]["name"])
            return {"role": "assistant", "content": "\n".join(part for part in [text, *calls] if part)}
        raise RequestError(f"message role {role!r} is not supported; use system, developer, user, assistant or tool")

    def _record_tool_result(self, message: Mapping[str, Any]) -> None:
        call = self.calls.get(str(message.get("tool_call_id", "")))
        if call is not None:
            turn, name, arguments = call
            self.trajectory.tool_calls.append(ToolCallRecord(turn, name, arguments, text_of(message.get("content"))))

    # ------------------------------------------------------------------ the sampled turn
    def add_turn(self, generation: Generation) -> tuple[ParseResult, str, list[dict[str, Any]]]:
        """Append a sampled turn (mask 1) and return its parse, the content the client gets and its tool calls
        in OpenAI's format. The client's copy of this turn is what the next request must send back."""
        traj = self.trajectory
        start, end = traj.extend_sampled(generation.token_ids, generation.logprobs)
        text = self.renderer.assistant_content(generation.token_ids, self.stop_token_ids)
        parsed = self.parser.parse(text)
        index = len(traj.turns)
        # A turn whose calls did not parse goes back as its raw text, so the agent sees what the model wrote.
        content = parsed.content if parsed.tool_calls and not parsed.errors else text
        tool_calls: list[dict[str, Any]] = []
        for call in parsed.tool_calls if not parsed.errors else []:
            call_id = f"call_{uuid.uuid4().hex[:24]}"
            self.call_names[call_id] = call.name
            self.calls[call_id] = (index, call.name, call.arguments)
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": call.name, "arguments": json.dumps(call.arguments)}})
        traj.turns.append(Turn(index=index, start=start, end=end, text=text, finish_reason=generation.finish_reason,
                               tool_calls=[c["function"]["name"] for c in tool_calls],
                               parse_errors=list(parsed.errors)))
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        self.keys.append(message_key(message))
        self.history.append({"role": "assistant", "content": text})
        traj.messages.append(message)
        if not tool_calls:
            traj.final_answer = parsed.final_answer if parsed.final_answer is not None else parsed.content
        traj.finish_reason = "length" if generation.finish_reason == "length" else "answer"
        self.last = generation
        return parsed, content, tool_calls

    # ------------------------------------------------------------------ raw completions (/v1/completions)
    def completion_prompt(self, prompt: str | list[int]) -> list[int]:
        """The ids of a raw-text (or token) prompt: the stored ids plus only the text after them when the
        prompt starts with the text so far, else a ``Mismatch``."""
        traj = self.trajectory
        if not traj.token_ids:
            ids = list(prompt) if isinstance(prompt, list) else self.renderer.encode(prompt)
            if not ids:
                raise RequestError("prompt is empty")
            traj.extend_prompt(ids)
            traj.prompt_length = len(ids)
            return list(traj.token_ids)
        if isinstance(prompt, list):
            if prompt[: len(traj.token_ids)] != traj.token_ids or len(prompt) == len(traj.token_ids):
                raise Mismatch("the token prompt does not extend this rollout's tokens", 0)
            traj.extend_observation(prompt[len(traj.token_ids):])
            return list(traj.token_ids)
        so_far = self.renderer.tokenizer.decode(traj.token_ids, skip_special_tokens=False)
        if not prompt.startswith(so_far) or len(prompt) == len(so_far):
            raise Mismatch("the prompt does not extend this rollout's text so far (prompt + completions)", 0)
        traj.extend_observation(self.renderer.encode(prompt[len(so_far):]))
        return list(traj.token_ids)

    def add_completion(self, generation: Generation) -> str:
        traj = self.trajectory
        start, end = traj.extend_sampled(generation.token_ids, generation.logprobs)
        text: str = self.renderer.tokenizer.decode(generation.token_ids, skip_special_tokens=False)
        traj.turns.append(Turn(index=len(traj.turns), start=start, end=end, text=text,
                               finish_reason=generation.finish_reason))
        traj.final_answer = text
        traj.finish_reason = "length" if generation.finish_reason == "length" else "answer"
        self.last = generation
        return text
