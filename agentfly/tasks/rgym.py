"""``reasoning_gym:<dataset>``: any of reasoning-gym's procedural datasets as a task, scored by the dataset's
own scorer (the ``rg_score`` reward).

    data: {task: "reasoning_gym:basic_arithmetic", options: {max_terms: 4, max_digits: 3}}
    rollout: {tools: [agentfly.tools.builtin.calculator:calculator],
              reward: agentfly.rewards.builtin.reasoning_gym:rg_score}

The options are the dataset's config fields (``seed`` and ``size`` are the run's: ``data.seed``,
``data.train_size``/``eval_size``). Each split draws from its own seed, derived from the run's seed and the
split's name, and the test split leaves out any question the train split of the same size asks, so held-out
questions are unseen. Each sample keeps the dataset's entry (``rg_entry``) for the scorer.

The SFT warm start answers directly ("The answer is X."), a share of the answers wrong on purpose
(``sft.wrong_fraction``); for datasets whose entries carry an arithmetic ``expression`` it calls the
calculator first, with the ``no_tool`` habit (answering without it, with a guess) on ``sft.habit_phrasings``.
reasoning-gym is an optional extra: ``pip install 'agentfly[envs]'``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import zlib
from typing import Any

from agentfly.tasks.base import (
    FlawError,
    Flaws,
    Messages,
    Sample,
    Task,
    TaskOptionError,
    UnknownTask,
    check_options,
    wrong_answer,
)

RUN_FIELDS = ("seed", "size")  # the run's, not the user's: data.seed and the split's size
HABITS = ("no_tool",)


def _datasets() -> dict[str, Any]:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise ImportError(f"reasoning_gym:<dataset> needs the reasoning-gym package ({exc}); install it with "
                          "pip install 'agentfly[envs]'") from None
    return dict(DATASETS)


def dataset_options(dataset: str) -> dict[str, Any]:
    """The options ``dataset`` takes (its config fields, less the run's seed and size) with their defaults."""
    datasets = _datasets()
    if dataset not in datasets:
        raise UnknownTask(f"reasoning-gym has no dataset {dataset!r}; it has {', '.join(sorted(datasets))}")
    config_cls = datasets[dataset][1]
    known = {}
    for f in dataclasses.fields(config_cls):
        if f.name in RUN_FIELDS:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        known[f.name] = list(default) if isinstance(default, tuple) else default
    return known


def _split_seed(seed: int, split: str) -> int:
    return zlib.crc32(f"reasoning_gym:{split}:{seed}".encode())


def _entries(dataset: str, options: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(dataset, seed=seed, size=max(1, n), **options)
    except (TypeError, ValueError, AssertionError) as exc:
        option = next((o for o in options if o in str(exc)), "")
        raise TaskOptionError(option, f"reasoning_gym:{dataset} refused data.options {options}: {exc}") from None
    # JSON-safe (tuples become lists), as the entry travels in samples, events and checkpoints.
    return [json.loads(json.dumps(ds[i], default=str)) for i in range(n)]


def samples(dataset: str, options: dict[str, Any], split: str, n: int, seed: int) -> list[Sample]:
    """``n`` samples of ``split``; the test split leaves out questions the train split of the same size asks."""
    entries = _entries(dataset, options, n, _split_seed(seed, split))
    if split == "test":
        seen = {e["question"] for e in _entries(dataset, options, n, _split_seed(seed, "train"))}
        unseen = [e for e in entries if e["question"] not in seen]
        extra = 0
        while len(unseen) < n and extra < 4:  # draw more until n unseen ones, a few rounds at most
            extra += 1
            more = _entries(dataset, options, n, _split_seed(seed + 7919 * extra, split))
            unseen += [e for e in more if e["question"] not in seen]
        entries = unseen[:n]
    return [{"id": f"{dataset}/{split}-{seed}-{i}", "question": e["question"], "answer": str(e["answer"]),
             "rg_dataset": dataset, "rg_options": options, "rg_entry": e,
             **({"expression": e["metadata"]["expression"]} if "expression" in e.get("metadata", {}) else {})}
            for i, e in enumerate(entries)]


def demonstrations(dataset: str, options: dict[str, Any], n: int, seed: int, flaws: Flaws) -> list[tuple[Sample, Messages]]:
    """``n`` written conversations: call the calculator on the entry's expression when it has one, then
    answer; a share ``flaws.wrong_fraction`` end with a wrong answer, and the ``no_tool`` habit answers
    without the tool on ``flaws.habit_phrasings``."""
    if (flaws.habit or flaws.habit_phrasings) and flaws.habit not in HABITS:
        raise FlawError("habit", f"habit={flaws.habit} is not a reasoning_gym habit; it has {' and '.join(HABITS)}")
    from agentfly.tasks.arithmetic import demonstration

    chosen = samples(dataset, options, "sft", n, seed)
    rng = flaws.rng()
    habitual, wrong = flaws.pick(chosen, rng)
    pairs = []
    for i, sample in enumerate(chosen):
        answer = sample["answer"]
        final = wrong_answer(answer, rng) if i in wrong and any(c.isdigit() for c in answer) else answer
        if "expression" in sample and i not in habitual:
            messages = demonstration(sample, answer=final)
        else:
            guess = wrong_answer(answer, random.Random(i)) if i in habitual and any(c.isdigit() for c in answer) else final
            messages = demonstration(sample, answer=guess, use_tool=False)
        pairs.append((sample, messages))
    return pairs


def make_task(dataset: str, options: dict[str, Any]) -> Task:
    """The task of ``dataset`` with ``options`` (checked against the dataset's config now, not at the first
    sample)."""
    known = dataset_options(dataset)
    for run_field in RUN_FIELDS:
        if run_field in options:
            raise TaskOptionError(run_field, f"data.options.{run_field} is the run's: set data."
                                  f"{'seed' if run_field == 'seed' else 'train_size and data.eval_size'} instead")
    check_options(options, known, f"reasoning_gym:{dataset}")
    _entries(dataset, options, 1, 0)  # the dataset's own checks (min <= max, ...) say what is wrong now
    frozen = dict(options)
    return Task(
        name=f"reasoning_gym:{dataset}", title=f"reasoning-gym: {dataset}",
        samples=lambda split, n, seed: samples(dataset, frozen, split, n, seed),
        tools=("agentfly.tools.builtin.calculator:calculator",),
        reward="agentfly.rewards.builtin.reasoning_gym:rg_score",
        demonstrations=lambda n, seed, flaws: demonstrations(dataset, frozen, n, seed, flaws),
        habits=HABITS)
