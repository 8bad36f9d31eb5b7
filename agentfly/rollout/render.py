"""Token-exact rendering of a conversation with the tokenizer's own chat template.

The prompt is rendered once. After that, tokens are only ever appended: the tokens the engine sampled, then
the *glue* the template puts between the assistant turn and the next one (the end-of-turn marker the model
did not sample, the tool messages, the next generation prompt), tokenised on its own. The glue is found by
rendering the conversation with and without the new messages and taking the difference, so any template that
renders a conversation as a prefix of its continuation works (ChatML/Qwen/Hermes, Llama 3, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_SENTINEL = "\u2063AGENTFLY_SENTINEL\u2063"


class TemplateError(ValueError):
    """A chat template that cannot be used token-exactly (the message says why and what to change)."""


class ChatRenderer:
    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                "the tokenizer has no chat_template; save one with the model (tokenizer.chat_template = ...) "
                "or use agentfly.models.chat_template()"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.turn_suffix = self._assistant_suffix()

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        text: str = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def _assistant_suffix(self) -> str:
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        text = self.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}], False)
        if _SENTINEL not in text:
            raise TemplateError("the chat template does not render assistant message content verbatim")
        return text.split(_SENTINEL, 1)[1]

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

        history: the conversation up to and including the assistant message of ``sampled_ids``.
        """
        before = self.render(history, add_generation_prompt=False)
        after = self.render([*history, *new_messages], add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError(
                "the chat template re-renders earlier turns when a message is added (for example it drops "
                "reasoning from past assistant turns); token-exact multi-turn rollouts need a prefix-stable template"
            )
        # The end-of-turn text the model did not sample itself is forced, like the observation.
        missing = self.turn_suffix
        if sampled_ids and sampled_ids[-1] in stop_token_ids:
            stop_text = self.tokenizer.decode([sampled_ids[-1]], skip_special_tokens=False)
            if missing.startswith(stop_text):
                missing = missing[len(stop_text):]
        if not before.endswith(self.turn_suffix):
            raise TemplateError("the chat template does not end an assistant turn the same way every time")
        return self.encode(missing + after[len(before):])
