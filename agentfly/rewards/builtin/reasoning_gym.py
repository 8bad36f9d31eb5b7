"""``rg_score``: a reasoning-gym dataset's own scorer on the agent's final answer (``agentfly.tasks.rgym``).

The sample carries the dataset's name, the options it was made with and its entry; the dataset's
``score_answer`` decides (partial credit where the dataset gives it). The answer is the ``<answer>`` tag, else
``\\boxed{}``, else the text after "The answer is", else the whole final message.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from agentfly.rewards.reward import reward

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_THE_ANSWER = re.compile(r"answer is[:\s]*(.+?)\s*\.?\s*$", re.S | re.I)


def extract(final_answer: str | None) -> str:
    from agentfly.rewards.builtin.math import _last_boxed

    text = (final_answer or "").strip()
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return str(tagged[-1]).strip()
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    said = _THE_ANSWER.search(text)
    return said.group(1).strip() if said else text


@lru_cache(maxsize=64)
def _scorer(dataset: str, options_json: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(dataset, seed=0, size=1, **json.loads(options_json)).score_answer


@reward
def rg_score(final_answer: str | None, rg_dataset: str, rg_entry: dict[str, Any],
             rg_options: dict[str, Any] | None = None) -> float:
    """The dataset's score of the final answer, in [0, 1]."""
    score = _scorer(rg_dataset, json.dumps(rg_options or {}, sort_keys=True))
    return float(max(0.0, min(1.0, score(extract(final_answer), rg_entry))))
