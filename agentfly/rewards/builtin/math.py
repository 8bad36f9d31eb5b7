"""``math_equal``: numeric and symbolic equality of a final answer with the reference."""

from __future__ import annotations

import re
import threading
from fractions import Fraction

from agentfly.rewards.reward import reward

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, with nested braces (``\\boxed{\\frac{1}{2}}``) kept whole."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
    return None


def extract_answer(text: str | None) -> str | None:
    """The final answer in ``text``: an ``<answer>`` tag, else ``\\boxed{}``, else the last number."""
    if not text:
        return None
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return str(tagged[-1]).strip()
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else text.strip()


def _as_fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _symbolic_equal(pred: str, gold: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:  # pragma: no cover - math-verify is a base dependency
        return False
    # math-verify times out with signal.alarm, which only works in the main thread; sync rewards run in
    # worker threads (asyncio.to_thread), where it would raise and every symbolic answer would score 0.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        return bool(verify(parse(f"${gold}$", parsing_timeout=timeout), parse(f"${pred}$", parsing_timeout=timeout),
                           timeout_seconds=timeout))
    except Exception:
        return False


def answers_equal(pred: str | None, gold: str | int | float) -> bool:
    if pred is None:
        return False
    gold_text = str(gold).strip()
    pred_text = pred.strip().rstrip(".")
    a, b = _as_fraction(pred_text), _as_fraction(gold_text)
    if a is not None and b is not None:
        return a == b or abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
    return pred_text == gold_text or _symbolic_equal(pred_text, gold_text)


@reward
def math_equal(final_answer: str | None, answer: str) -> float:
    """1.0 when the final answer equals the reference numerically or symbolically, else 0.0."""
    return 1.0 if answers_equal(extract_answer(final_answer), answer) else 0.0
