"""``exact_match`` and ``f1``: the SQuAD answer metrics (Rajpurkar et al., 2016) as rewards.

Both normalise the same way: lower case, no punctuation, no articles (a, an, the), single spaces. The
reference ``answer`` may be a string or a list of accepted answers; the best match counts. The final
answer is taken from an ``<answer>`` tag when there is one, else the whole final message.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from agentfly.rewards.reward import reward

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_final(text: str | None) -> str:
    if not text:
        return ""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else text.strip()


def _references(answer: str | int | float | Sequence[str]) -> list[str]:
    if isinstance(answer, (str, int, float)):
        return [str(answer)]
    return [str(a) for a in answer]


def f1_score(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = Counter(pred) & Counter(ref)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


@reward
def exact_match(final_answer: str | None, answer: str | list[str]) -> float:
    """1.0 when the normalised final answer equals a normalised reference answer, else 0.0."""
    prediction = normalize_answer(extract_final(final_answer))
    return float(any(prediction == normalize_answer(r) for r in _references(answer)))


@reward
def f1(final_answer: str | None, answer: str | list[str]) -> float:
    """Token-overlap F1 between the final answer and the best reference answer, in [0, 1]."""
    prediction = extract_final(final_answer)
    return max(f1_score(prediction, r) for r in _references(answer))
