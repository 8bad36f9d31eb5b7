"""Supervised warm start on generated demonstrations (``agentfly sft CONFIG.yaml``).

Demonstrations are written conversations (``agentfly.tasks.arithmetic.demonstration``,
``agentfly.tasks.key_chain.demonstration`` for ``data.task: key_chain`` or
``agentfly.tasks.wiki_qa.demonstration`` for ``data.task: wiki_qa``) replayed through the
real rollout path with ``agentfly.ReplayEngine``: the assistant turns are tokenised exactly as a sampled turn
would be, the tool really runs, and its observation and the template glue are appended with mask 0. So the
SFT loss mask (assistant tokens only) is built by the same code, token for token, as the RL loss mask.

A share ``sft.wrong_fraction`` of the demonstrations ends with a deliberately wrong answer (and, for
arithmetic and key_chain, ``sft.habit`` gives the demonstrator a bad habit on some phrasings), and only ``sft.num_demos``
are used: the warm start is meant to be imperfect, leaving RL something to fix.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer import algorithms as algos
from trainer.batch import collate, forward
from trainer.builders import build_agent, load_policy, load_samples, setup_torch
from trainer.config import Config, ConfigError, SFTConfig, save_config
from trainer.evaluation import evaluate, sampled_eval
from trainer.events import EventStream, JSONLSink, Sink
from trainer.optim import lr_schedule
from trainer.trackers import tracker_sinks

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
REPLAY_CHUNK = 256  # demonstrations replayed at once


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
    if s.demos_path:
        return _written_conversations(s.demos_path, s.num_demos)
    if config.data.task == "wiki_qa":
        return _wiki_qa_conversations(config)
    if config.data.task == "key_chain":
        return _key_chain_conversations(config)
    if config.data.task != "arithmetic":
        raise ConfigError(f"data.task={config.data.task!r}: SFT demonstrations are generated for 'arithmetic', "
                          "'key_chain' and 'wiki_qa' only; give a JSONL file of written ones in sft.demos_path",
                          key="sft.demos_path")
    if s.habit == "early_answer":
        raise ConfigError("sft.habit=early_answer is key_chain's habit; arithmetic has no_tool and truncate",
                          key="sft.habit")
    from agentfly.tasks import arithmetic

    samples = arithmetic.generate(s.num_demos, seed=config.data.seed, split="sft")
    rng = random.Random(f"sft-wrong:{config.seed}")
    habitual, wrong = _flawed(samples, s, rng)
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


def _written_conversations(path: str, limit: int) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The first ``limit`` demonstrations of the JSONL file ``path``, as written: each line a sample with its
    ``messages`` (or ``{"sample": ..., "messages": ...}``), a conversation with a user and an assistant turn."""
    from agentfly.tasks.io import load_jsonl

    pairs = []
    for lineno, line in enumerate(load_jsonl(path)[:limit], 1):
        messages = line.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            messages = []
        sample = line["sample"] if isinstance(line.get("sample"), dict) else {k: v for k, v in line.items()
                                                                              if k != "messages"}
        roles = [m.get("role") for m in messages]
        if "assistant" not in roles or "user" not in roles or not ({"question", "prompt"} & sample.keys()):
            raise ConfigError(f"sft.demos_path={path}: demonstration {lineno} needs a 'question' (or 'prompt') and "
                              "'messages', a list of {role, content} turns with a user and an assistant turn",
                              key="sft.demos_path")
        pairs.append((sample, messages))
    if not pairs:
        raise ConfigError(f"sft.demos_path={path} holds no demonstrations", key="sft.demos_path")
    return pairs


def _flawed(samples: list[dict[str, Any]], s: SFTConfig, rng: random.Random) -> tuple[set[int], set[int]]:
    """Which demonstrations the flawed demonstrator gets wrong: a share ``habit_fraction`` of the questions
    opening with one of ``habit_phrasings`` follow its habit, a share ``wrong_fraction`` of the others end
    with a wrong answer (indices into ``samples``, drawn from ``rng``)."""
    habit = [i for i, x in enumerate(samples) if x["question"].startswith(tuple(s.habit_phrasings))]
    habitual = set(rng.sample(habit, round(s.habit_fraction * len(habit))))
    rest = [i for i in range(len(samples)) if i not in habitual]
    return habitual, set(rng.sample(rest, round(s.wrong_fraction * len(rest))))


def _key_chain_conversations(config: Config) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """key_chain's demonstrations from its 'sft' stream: every one follows the chain key by key, except a share
    ``sft.habit_fraction`` of the questions opening with one of ``sft.habit_phrasings``, where the impatient
    demonstrator answers after ``sft.habit_lookups`` lookups (``sft.habit: early_answer``) with the number of
    the last key it was given, and a share ``sft.wrong_fraction`` of the others, whose answer has one wrong digit."""
    from agentfly.tasks import key_chain

    s = config.sft
    if s.habit_phrasings and s.habit != "early_answer":
        raise ConfigError(f"sft.habit={s.habit!r} is an arithmetic habit; key_chain's is early_answer",
                          key="sft.habit")
    if s.habit_lookups >= key_chain.MIN_HOPS:
        raise ConfigError(f"sft.habit_lookups={s.habit_lookups} must be below the shortest chain "
                          f"({key_chain.MIN_HOPS} hops), or the impatient answer would be right",
                          key="sft.habit_lookups")
    samples = key_chain.generate(s.num_demos, seed=config.data.seed, split="sft")
    rng = random.Random(f"sft-wrong:{config.seed}")
    habitual, wrong = _flawed(samples, s, rng)
    pairs = []
    for i, sample in enumerate(samples):
        messages = key_chain.demonstration(sample, stop_after=s.habit_lookups if i in habitual else None)
        if i in wrong:
            messages[-1] = {"role": "assistant", "content": f"The answer is {wrong_answer(sample['answer'], rng)}."}
        pairs.append((sample, messages))
    return pairs


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
    # The script knows a rollout by its prompt (its question and the assistant turns so far), so
    # demonstrations that share a question (key chains from one start key, ScienceWorld variations of one task
    # description) are replayed in separate rounds, each question once a round.
    rounds: list[list[int]] = []  # indices into pairs
    asked: list[set[str]] = []  # the questions of each round
    for index, (_, messages) in enumerate(pairs):
        question = _question(messages)
        free = next((i for i, questions in enumerate(asked) if question not in questions), None)
        if free is None:
            rounds.append([])
            asked.append(set())
            free = len(rounds) - 1
        rounds[free].append(index)
        asked[free].add(question)
    turns: dict[str, list[str]] = {}

    def script(prompt_text: str) -> str:
        question = _USER.search(prompt_text)
        if question is None or question.group(1) not in turns:
            raise ValueError("replay script: the prompt does not contain a known demonstration question")
        index = prompt_text.count("<|im_start|>assistant") - 1  # assistant turns already in the prompt
        return turns[question.group(1)][index]

    engine = af.ReplayEngine(tokenizer, script)
    agent = build_agent(config, engine)
    replayed: dict[int, Any] = {}
    try:
        for indices in rounds:
            turns.clear()
            for i in indices:
                turns[_question(pairs[i][1])] = [m["content"] for m in pairs[i][1] if m["role"] == "assistant"]
            # In chunks: all at once, tens of thousands of rollouts would queue for a bounded resource pool (the
            # key-value store's) longer than its acquire timeout.
            for start in range(0, len(indices), REPLAY_CHUNK):
                chunk = indices[start:start + REPLAY_CHUNK]
                done = agent.run_sync([pairs[i][0] for i in chunk], group_size=1,
                                      sampling=af.Sampling(temperature=1.0, max_new_tokens=512))
                replayed.update(zip(chunk, done, strict=True))
    finally:
        agent.close()
    trajectories = [replayed[i] for i in range(len(pairs))]  # in the demonstrations' order
    # A tool error means the written call does not fit the sample (a wrong key): never train on it.
    broken = [t for t in trajectories if t.error is not None or t.finish_reason != "answer"
              or any(c.error for c in t.tool_calls)]
    if broken:
        calls = [c.error for c in broken[0].tool_calls if c.error]
        raise RuntimeError(f"{len(broken)} demonstrations did not replay cleanly, e.g. {broken[0].error or calls!r} "
                           f"(finish_reason={broken[0].finish_reason}); check rollout.max_turns and the template")
    return trajectories


def _question(messages: list[dict[str, Any]]) -> str:
    return str(next(m["content"] for m in messages if m["role"] == "user"))


def sft_loss(model: Any, trajectories: Sequence[Any], pad_id: int, device: torch.device) -> torch.Tensor:
    """Token-mean negative log-likelihood of the mask-1 (assistant) tokens."""
    batch = collate(trajectories, [0.0] * len(trajectories), list(range(len(trajectories))), pad_id, device)
    logp, _, _ = forward(model, batch, temperature=1.0)
    return -algos.masked_mean(logp, batch.mask)


def run_sft(config: Config, sinks: Sequence[Sink] = (), should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train on the demonstrations, save the model, evaluate it greedily; returns the run's ``state``
    (``succeeded``, or ``cancelled``), its ``step``, ``metrics`` and the saved model's ``path``.

    should_stop: checked between optimizer steps (the web app's cancel flag). A stopped warm start saves
    nothing: it has no resume, and half of one is not the model the run was asked for.
    """
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
                if should_stop is not None and should_stop():
                    events.status(step, "cancelled", f"SFT stopped after {step} of {total_steps} steps; nothing saved")
                    return {"state": "cancelled", "step": step, "metrics": {}, "path": None}
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
        try:
            metrics, _ = evaluate(agent, held_out[: config.eval.size or config.data.eval_size],
                                  config.eval.max_new_tokens, config.eval.batch_size, sampled_eval(config))
        finally:
            agent.close()
        metrics |= {"sft/train_seconds": train_seconds, "sft/demonstrations": float(len(trajectories))}
        events.metrics(step, metrics)
        events.checkpoint(step, out, metrics.get("eval/accuracy"))
        events.status(step, "succeeded", f"saved {out}")
        return {"state": "succeeded", "step": step, "metrics": metrics, "path": str(out)}
    except BaseException as exc:
        events.status(0, "failed", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        events.close()
