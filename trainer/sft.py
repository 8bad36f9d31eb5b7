"""Supervised warm start on generated demonstrations (``agentfly sft CONFIG.yaml``).

Demonstrations are written conversations (``agentfly.tasks.arithmetic.demonstration``, or
``agentfly.tasks.wiki_qa.demonstration`` for ``data.task: wiki_qa``) replayed through the
real rollout path with ``agentfly.ReplayEngine``: the assistant turns are tokenised exactly as a sampled turn
would be, the tool really runs, and its observation and the template glue are appended with mask 0. So the
SFT loss mask (assistant tokens only) is built by the same code, token for token, as the RL loss mask.

A share ``sft.wrong_fraction`` of the demonstrations ends with a deliberately wrong answer (and, for
arithmetic, ``sft.habit`` gives the demonstrator a bad habit on some phrasings), and only ``sft.num_demos``
are used: the warm start is meant to be imperfect, leaving RL something to fix.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainer import algorithms as algos
from trainer.batch import collate, forward
from trainer.builders import build_agent, load_policy, load_samples, setup_torch
from trainer.config import Config, ConfigError, save_config
from trainer.events import EventStream, JSONLSink, Sink
from trainer.loop import evaluate
from trainer.optim import lr_schedule
from trainer.trackers import tracker_sinks

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: one digit of the right one changed (never the right answer)."""
    digits = list(answer)
    positions = [i for i, c in enumerate(digits) if c.isdigit()]
    i = rng.choice(positions)
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0")] or ["1"])
    wrong = "".join(digits)
    return wrong if wrong != answer else answer + "1"


def truncated(answer: str) -> str:
    """The answer with its last digit dropped (a careless copy; never the right answer)."""
    return answer[:-1] if len(answer.lstrip("-")) > 1 else answer + "0"


def guess(sample: dict[str, Any]) -> str:
    """The lazy demonstrator's answer without the tool: the first number of the question (never right)."""
    first = re.search(r"\d+", sample["expression"]).group(0)  # type: ignore[union-attr]
    return first if first != sample["answer"] else str(int(first) + 1)


def demonstration_conversations(config: Config) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(sample, conversation) pairs for ``data.task``, some of them flawed on purpose.

    'arithmetic' draws from its 'sft' stream of problems: a share ``sft.habit_fraction`` of the questions
    opening with one of ``sft.habit_phrasings`` shows the demonstrator's habit (``sft.habit``: answering
    without the tool, with the question's first number, or dropping the last digit of the tool's result),
    and a share ``sft.wrong_fraction`` of the others ends with one wrong digit. 'wiki_qa' takes the first
    ``sft.num_demos`` training questions; its wrong answers are other questions' answers.
    """
    s = config.sft
    if s.demos:
        return _written_conversations(config)
    if config.data.task == "wiki_qa":
        return _wiki_qa_conversations(config)
    if config.data.task != "arithmetic":
        raise ConfigError(f"data.task={config.data.task!r}: SFT demonstrations are generated for 'arithmetic' and "
                          "'wiki_qa' only")
    from agentfly.tasks import arithmetic

    samples = arithmetic.generate(s.num_demos, seed=config.data.seed, split="sft")
    rng = random.Random(f"sft-wrong:{config.seed}")
    habit = [i for i, x in enumerate(samples) if x["question"].startswith(tuple(s.habit_phrasings))]
    habitual = set(rng.sample(habit, round(s.habit_fraction * len(habit))))
    rest = [i for i in range(len(samples)) if i not in habitual]
    wrong = set(rng.sample(rest, round(s.wrong_fraction * len(rest))))
    pairs = []
    for i, sample in enumerate(samples):
        if i in habitual and s.habit == "no_tool":
            messages = arithmetic.demonstration(sample, answer=guess(sample), use_tool=False)
        elif i in habitual:
            messages = arithmetic.demonstration(sample, answer=truncated(sample["answer"]))
        elif i in wrong:
            messages = arithmetic.demonstration(sample, answer=wrong_answer(sample["answer"], rng))
        else:
            messages = arithmetic.demonstration(sample)
        pairs.append((sample, messages))
    return pairs


def _written_conversations(config: Config) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The first ``sft.num_demos`` lines of ``sft.demos``, as written (no deliberate flaws are added)."""
    from agentfly.tasks.io import load_jsonl

    s = config.sft
    if s.habit_phrasings or s.wrong_fraction:
        raise ConfigError("sft.demos: written demonstrations are used as they are; set sft.wrong_fraction: 0 and "
                          "leave sft.habit_phrasings empty")
    rows = load_jsonl(str(s.demos))[: s.num_demos]
    bad = [i for i, row in enumerate(rows) if not isinstance(row.get("sample"), dict) or not row.get("messages")]
    if bad:
        raise ConfigError(f"sft.demos={s.demos!r}: line {bad[0] + 1} is not {{'sample': {{...}}, 'messages': [...]}}")
    return [(row["sample"], row["messages"]) for row in rows]


def _wiki_qa_conversations(config: Config) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    from agentfly.tasks import wiki_qa

    s = config.sft
    if s.habit_phrasings:
        raise ConfigError("sft.habit_phrasings: the demonstrator habits are defined for data.task=arithmetic only")
    samples = wiki_qa.load("train")[: s.num_demos]
    rng = random.Random(f"sft-wrong:{config.seed}")
    wrong = set(rng.sample(range(len(samples)), round(s.wrong_fraction * len(samples))))
    pairs = []
    for i, sample in enumerate(samples):
        answer = None
        if i in wrong:
            others = [o["answer"] for o in rng.sample(samples, min(len(samples), 20)) if o["answer"] != sample["answer"]]
            answer = others[0] if others else "unknown"
        pairs.append((sample, wiki_qa.demonstration(sample, answer=answer)))
    return pairs


def demonstration_trajectories(config: Config, tokenizer: Any) -> list[Any]:
    """Replay each demonstration through the rollout loop; returns token-exact trajectories."""
    import agentfly as af

    pairs = demonstration_conversations(config)
    # The script knows a rollout only by its prompt, so demonstrations that share a question (ScienceWorld
    # variations with one task description) are replayed in separate rounds, each question once a round.
    rounds: list[list[tuple[dict[str, Any], list[dict[str, Any]]]]] = []
    for pair in pairs:
        question = _question(pair[1])
        free = next((r for r in rounds if all(_question(m) != question for _, m in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(pair)
    turns: dict[str, list[str]] = {}

    def script(prompt_text: str) -> str:
        question = _USER.search(prompt_text)
        if question is None or question.group(1) not in turns:
            raise ValueError("replay script: the prompt does not contain a known demonstration question")
        index = prompt_text.count("<|im_start|>assistant") - 1  # assistant turns already in the prompt
        return turns[question.group(1)][index]

    engine = af.ReplayEngine(tokenizer, script)
    agent = build_agent(config, engine)
    trajectories = []
    for round_pairs in rounds:
        turns.clear()
        for _, messages in round_pairs:
            turns[_question(messages)] = [m["content"] for m in messages if m["role"] == "assistant"]
        trajectories += agent.run_sync([sample for sample, _ in round_pairs], group_size=1,
                                       sampling=af.Sampling(temperature=1.0, max_new_tokens=512))
    broken = [t for t in trajectories if t.error is not None or t.finish_reason != "answer"]
    if broken:
        raise RuntimeError(f"{len(broken)} demonstrations did not replay cleanly, e.g. {broken[0].error!r} "
                           f"(finish_reason={broken[0].finish_reason}); check rollout.max_turns and the template")
    return trajectories


def _question(messages: list[dict[str, Any]]) -> str:
    return str(next(m["content"] for m in messages if m["role"] == "user"))


def sft_loss(model: Any, trajectories: Sequence[Any], pad_id: int, device: torch.device) -> torch.Tensor:
    """Token-mean negative log-likelihood of the mask-1 (assistant) tokens."""
    batch = collate(trajectories, [0.0] * len(trajectories), list(range(len(trajectories))), pad_id, device)
    logp, _, _ = forward(model, batch, temperature=1.0)
    return -algos.masked_mean(logp, batch.mask)


def run_sft(config: Config, sinks: Sequence[Sink] = ()) -> dict[str, Any]:
    """Train on the demonstrations, save the model, evaluate it greedily; returns metrics and the path."""
    s = config.sft
    out = Path(s.output_dir or Path(config.output_dir) / "sft")
    out.mkdir(parents=True, exist_ok=True)
    save_config(config, out / "config.yaml")
    events = EventStream([JSONLSink(out / "events.jsonl"), *sinks, *tracker_sinks(config, out)], run=out.name)
    try:
        device = setup_torch(config)
        events.status(0, "running", f"SFT on {s.num_demos} demonstrations")
        model, tokenizer = load_policy(config, device)
        pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        trajectories = demonstration_trajectories(config, tokenizer)
        optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr)
        total_steps = s.epochs * -(-len(trajectories) // s.batch_size)
        scheduler = lr_schedule(optimizer, s.warmup_steps, total_steps, s.schedule)
        order_rng = torch.Generator().manual_seed(config.seed)
        start = time.perf_counter()
        step = 0
        model.train()
        for epoch in range(s.epochs):
            order = torch.randperm(len(trajectories), generator=order_rng).tolist()
            for i in range(0, len(order), s.batch_size):
                chunk = [trajectories[j] for j in order[i:i + s.batch_size]]
                loss = sft_loss(model, chunk, pad_id, device)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip or 1e9))
                lr = optimizer.param_groups[0]["lr"]
                optimizer.step()
                scheduler.step()
                step += 1
                events.metrics(step, {"sft/loss": loss.item(), "grad_norm": grad_norm, "sft/epoch": float(epoch),
                                      "lr": lr})
        model.eval()
        train_seconds = time.perf_counter() - start
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        from agentfly.engines.hf import HFEngine

        _, held_out = load_samples(config)
        agent = build_agent(config, HFEngine(model=model, tokenizer=tokenizer))
        metrics, _ = evaluate(agent, held_out[: config.eval.size or config.data.eval_size],
                              config.eval.max_new_tokens, config.eval.batch_size)
        metrics |= {"sft/train_seconds": train_seconds, "sft/demonstrations": float(len(trajectories))}
        events.metrics(step, metrics)
        events.checkpoint(step, out, metrics.get("eval/accuracy"))
        events.status(step, "succeeded", f"saved {out}")
        return {"metrics": metrics, "path": str(out)}
    except BaseException as exc:
        events.status(0, "failed", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        events.close()
