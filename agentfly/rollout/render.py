"""Token-exact rendering of a conversation with the tokenizer's own chat template.

The prompt is rendered once. After that, tokens are only ever appended: the tokens the engine sampled, then
the *glue* the template puts between the assistant turn and the next one (the end-of-turn marker the model
did not sample, the tool messages, the next generation prompt), tokenised on its own.

The glue is what the template writes *after* an assistant message's content: the new messages are rendered
after a stand-in context (the rollout's system and first user message, then an assistant message whose
content is a sentinel) and the text after the sentinel is taken. The history itself is never re-rendered,
so templates that render a past turn differently from the last one work: Qwen3's empty ``<think></think>``
on the last assistant turn only, reasoning dropped from turns before the last user query, consecutive tool
messages grouped under one header, Llama 3.1's ``ipython`` role, ChatML without a tool role (SmolLM2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A name no template writes, with what escaping would change (quotes, a backslash, a newline, markup) inside and
# invisible separators at the ends (not whitespace, so a template's `| trim` leaves it whole).
_SENTINEL = "\u2063AGENTFLY \"SENTINEL\" \\ \n<&>\u2063"


class TemplateError(ValueError):
    """A chat template that cannot be used token-exactly (the message says why and what to change)."""


class ChatRenderer:
    """tokenizer: has ``chat_template``. tools: JSON schemas passed to the template as ``tools``.
    template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}`` for Qwen3's non-thinking mode.
    """

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat_template; save one with the model (tokenizer.chat_template = ...) "
                "or use agentfly.models.chat_template()"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        self.turn_suffix = self._assistant_suffix()

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        from jinja2 import TemplateError as JinjaError

        try:
            text: str = self.tokenizer.apply_chat_template(
                list(messages), tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False,
                **self.template_kwargs,
            )
        except JinjaError as exc:
            roles = list(dict.fromkeys(str(m.get("role")) for m in messages))
            hint = ("; a template without a 'tool' role cannot show tool results to the model: give the tokenizer "
                    "a template that renders tool messages (agentfly.models.chat_template() is one)"
                    if "tool" in roles else "")
            raise TemplateError(f"the chat template refuses a conversation with the roles {', '.join(roles)} "
                                f"({type(exc).__name__}: {exc}){hint}") from exc
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def _after_assistant(self, context: Sequence[dict[str, Any]], new_messages: Sequence[dict[str, Any]],
                         add_generation_prompt: bool) -> str:
        """What the template writes after an assistant message's content, followed by ``new_messages``."""
        stand_in = [*context, {"role": "assistant", "content": _SENTINEL}, *new_messages]
        text = self.render(stand_in, add_generation_prompt)
        if text.count(_SENTINEL) != 1:
            # The sampled tokens stand in the sequence as sampled; a template that rewrites, escapes or repeats
            # assistant content would have written other text there, so no glue can follow them token-exactly.
            raise TemplateError(
                "the chat template does not write an assistant message's content verbatim, once (it escapes, "
                "rewrites or repeats it), so the tokens a model samples cannot be continued token-exactly; give "
                "the tokenizer a template that writes `message['content']` as it is"
            )
        return text.split(_SENTINEL, 1)[1]

    def _assistant_suffix(self) -> str:
        """What the template writes after the last assistant message's content (e.g. ``<|im_end|>\\n``)."""
        return self._after_assistant([{"role": "user", "content": "hi"}], [], False)

    def assistant_content(self, token_ids: Sequence[int], stop_token_ids: Sequence[int]) -> str:
        """The text of a sampled turn as the assistant message content (without the final stop token)."""
        ids = list(token_ids)
        if ids and ids[-1] in stop_token_ids:
            ids = ids[:-1]
        text: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    def glue_ids(
        self,
        history: Sequence[dict[str, Any]],
        new_messages: Sequence[dict[str, Any]],
        sampled_ids: Sequence[int],
        stop_token_ids: Sequence[int],
    ) -> list[int]:
        """Tokens to append after a sampled assistant turn so the sequence continues with ``new_messages``
        and a fresh generation prompt.

        history: the conversation up to and including the assistant message of ``sampled_ids``. Only its
        opening (system messages and the first user message) is rendered again, as the stand-in context that
        templates look at (Llama 3.1 writes the tool list into the first user message and needs one).
        """
        glue = self._after_assistant(stand_in_context(history), new_messages, True)
        # The end-of-turn text the model sampled itself is in the sequence already; the rest is forced.
        if sampled_ids and sampled_ids[-1] in stop_token_ids:
            stop_text = self.tokenizer.decode([sampled_ids[-1]], skip_special_tokens=False)
            if glue.startswith(stop_text):
                glue = glue[len(stop_text):]
        return self.encode(glue)


def stand_in_context(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages and the first user message of ``history`` (the rest is not needed)."""
    context: list[dict[str, Any]] = []
    for message in history:
        if message.get("role") == "assistant":
            break
        context.append(message)
        if message.get("role") == "user":
            break
    return context
