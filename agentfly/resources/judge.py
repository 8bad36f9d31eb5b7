"""Model services that rewards call: an LLM ``Judge`` and a sequence-classification ``RewardModel``.

Both are ``model_service`` resources shared by every rollout (``scope="global"``), declared with
``judge_spec(...)`` / ``reward_model_spec(...)`` and reached from a reward through its context::

    @af.reward(resource="judge")
    async def helpful(final_answer: str, question: str, context) -> float:
        judge = await context.resource("judge")
        return await judge.score(question=question, answer=final_answer, rubric=RUBRIC)

A judge runs on any ``Engine`` (in-process HF or vLLM, or a ``RemoteEngine`` on servers) with its own
sampling settings; judges are never trained, so nothing syncs weights into them. Calls arriving together are
gathered into batches (up to ``max_batch``, within ``batch_window`` seconds) and at most ``max_concurrency``
generations are in flight at once. ``score`` and ``compare`` build the judge's prompt and parse its verdict;
a verdict that cannot be parsed raises ``JudgeParseError`` and is counted (``parse_failures``): the reward
layer records the error on the trajectory, so a broken judge is seen, never read as a silent 0.
``stats()`` (calls, batches, batch sizes, latency percentiles, parse failures) goes into the trainer's
``resources`` event through the pool's stats.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agentfly.engines.base import Engine, Sampling
from agentfly.resources.spec import Pool, ResourceSpec

JUDGE_SYSTEM = ("You are a strict grader. Read the question, the answer and the rubric, then grade the answer. "
                "End your reply with one line of the form 'Score: N' where N is an integer from {lo} to {hi}.")
JUDGE_USER = "Question:\n{question}\n\nAnswer:\n{answer}\n\nRubric:\n{rubric}{reference}\n\nScore ({lo}-{hi}):"
COMPARE_SYSTEM = ("You compare two answers to one question. Reply with one line 'Winner: A', 'Winner: B' or "
                  "'Winner: tie'.")
COMPARE_USER = "Question:\n{question}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}\n\n{rubric}Which answer is better?"
DEFAULT_RUBRIC = "Is the answer correct, complete and helpful for the question? Grade higher for better answers."
SCORE_RE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
WINNER_RE = re.compile(r"winner\s*[:=]?\s*(a|b|tie)\b", re.IGNORECASE)


class JudgeParseError(ValueError):
    """The judge's reply held no verdict in the expected form; the message quotes the reply."""


class Window:
    """The last ``n`` values of a measurement, for percentiles."""

    def __init__(self, n: int = 10_000) -> None:
        self.values: deque[float] = deque(maxlen=n)

    def add(self, value: float) -> None:
        self.values.append(value)

    def percentile(self, q: float) -> float:
        if not self.values:
            return 0.0
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@dataclass
class _Call:
    prompt: list[int]
    future: asyncio.Future[str]
    queued_at: float = field(default_factory=time.perf_counter)


class Judge:
    """An LLM that grades answers: ``score`` (a rubric, 0..1) and ``compare`` (pairwise, 1 / 0.5 / 0).

    engine: the model it runs on, or a function that builds it when the resource starts (so a spec builds
        it in the pool's process, once).
    sampling: the judge's own settings; greedy by default, so a verdict is reproducible.
    scale: the integer range the judge is asked for; ``score`` maps it onto 0..1.
    max_concurrency: generations in flight at once (a bound on what the judge asks of its engine).
    max_batch, batch_window: calls that arrive within ``batch_window`` seconds go out together, up to
        ``max_batch`` of them.
    rubric: what ``score`` grades on (and ``compare`` weighs) when the caller gives no rubric of its own, e.g.
        a job's rubric; None: ``DEFAULT_RUBRIC`` for ``score``, no criteria for ``compare``.
    """

    kind = "model_service"

    def __init__(self, engine: Engine | Callable[[], Engine], *, sampling: Sampling | None = None,
                 scale: tuple[int, int] = (1, 10), max_concurrency: int = 8, max_batch: int = 16,
                 batch_window: float = 0.005, owns_engine: bool | None = None, rubric: str | None = None) -> None:
        if max_concurrency < 1 or max_batch < 1:
            raise ValueError(f"Judge(max_concurrency={max_concurrency}, max_batch={max_batch}): both must be >= 1")
        if scale[0] >= scale[1]:
            raise ValueError(f"Judge(scale={scale}): give (lowest, highest) with lowest < highest")
        self._engine_factory = engine if not isinstance(engine, Engine) else None
        self.engine: Engine | None = engine if isinstance(engine, Engine) else None
        self.owns_engine = self._engine_factory is not None if owns_engine is None else owns_engine
        self.sampling = sampling or Sampling(temperature=0.0, max_new_tokens=48)
        self.scale = scale
        self.rubric = rubric
        self.max_concurrency, self.max_batch, self.batch_window = max_concurrency, max_batch, batch_window
        self._pending: list[_Call] = []
        self._drainer: asyncio.Task[None] | None = None
        self._in_flight = 0
        self.counters: dict[str, float] = {"calls": 0, "batches": 0, "max_batch": 0, "parse_failures": 0,
                                           "errors": 0, "max_in_flight": 0, "generated_tokens": 0}
        self.latency = Window()
        self.batch_sizes = Window()
        self.last_parse_failure: str | None = None

    @classmethod
    def from_spec(cls, spec: ResourceSpec) -> Judge:
        """The factory of ``judge_spec``: ``spec.options`` name the engine and the judge's settings."""
        options = dict(spec.options)
        engine_options = options.pop("engine")
        sampling = options.pop("sampling", None)
        if isinstance(sampling, Mapping):
            sampling = Sampling(**sampling)
        return cls(lambda: build_judge_engine(**engine_options), sampling=sampling, **options)

    # ------------------------------------------------------------------ the Resource protocol
    async def start(self) -> None:
        if self.engine is None:
            assert self._engine_factory is not None
            self.engine = await asyncio.to_thread(self._engine_factory)

    async def reset(self) -> None:
        return None

    async def health(self) -> bool:
        if self.engine is None:
            return False
        live = self.engine.stats().get("replicas_live")
        return live is None or live > 0

    async def close(self) -> None:
        if self.engine is not None and self.owns_engine:
            self.engine.close()
        self.engine = None

    def kill(self) -> None:
        if self.engine is not None and self.owns_engine:
            self.engine.close()
        self.engine = None

    # ------------------------------------------------------------------ what rewards call
    async def score(self, *, question: str, answer: str, rubric: str | None = None,
                    reference: str | None = None) -> float:
        """The judge's grade of ``answer`` on ``rubric`` (None: the judge's own, else ``DEFAULT_RUBRIC``),
        mapped from ``scale`` onto 0..1."""
        lo, hi = self.scale
        rubric = rubric if rubric is not None else self.rubric or DEFAULT_RUBRIC
        extra = f"\n\nReference answer:\n{reference}" if reference else ""
        reply = await self.ask(JUDGE_SYSTEM.format(lo=lo, hi=hi),
                               JUDGE_USER.format(question=question, answer=answer, rubric=rubric, reference=extra,
                                                 lo=lo, hi=hi), prefix="Score:")
        matches = SCORE_RE.findall(reply)
        value = float(matches[-1]) if matches else None
        if value is None or not lo <= value <= hi:
            self._parse_failure(reply, f"no 'Score: N' with N in {lo}..{hi}")
        assert value is not None
        return (value - lo) / (hi - lo)

    async def compare(self, *, question: str, answer: str, reference: str, rubric: str | None = None,
                      both_orders: bool = True) -> float:
        """1 if ``answer`` beats ``reference``, 0.5 for a tie, 0 if it loses; with ``both_orders`` the judge
        sees the pair both ways round and the two verdicts are averaged (judges favour a position).
        ``rubric`` (None: the judge's own, if any) is the criteria it weighs them by."""
        rubric = rubric if rubric is not None else self.rubric or ""
        rubric_line = f"Criteria: {rubric}\n\n" if rubric else ""
        orders = [(answer, reference), (reference, answer)] if both_orders else [(answer, reference)]
        replies = await asyncio.gather(*(self.ask(COMPARE_SYSTEM, COMPARE_USER.format(
            question=question, a=a, b=b, rubric=rubric_line), prefix="Winner:") for a, b in orders))
        points = []
        for i, reply in enumerate(replies):
            found = WINNER_RE.findall(reply)
            if not found:
                self._parse_failure(reply, "no 'Winner: A', 'Winner: B' or 'Winner: tie'")
            verdict = found[-1].lower()
            ours = "a" if i == 0 else "b"
            points.append(0.5 if verdict == "tie" else float(verdict == ours))
        return sum(points) / len(points)

    def _parse_failure(self, reply: str, expected: str) -> None:
        self.counters["parse_failures"] += 1
        self.last_parse_failure = reply[-300:]
        raise JudgeParseError(f"the judge's reply has {expected}: {reply[-300:]!r}")

    async def ask(self, system: str, user: str, prefix: str = "") -> str:
        """The judge's reply to one chat (system + user message), through the batcher. ``prefix`` starts the
        judge's reply for it (e.g. "Score:"), so a small model answers in the form asked; it is part of the
        returned reply."""
        if self.engine is None:
            await self.start()
        assert self.engine is not None
        tok = self.engine.tokenizer
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompt = list(tok(text, add_special_tokens=False)["input_ids"])
        else:
            prompt = list(tok(f"{system}\n\n{user}\n")["input_ids"])
        if prefix:
            prompt += list(tok(prefix, add_special_tokens=False)["input_ids"])
        room = self.engine.max_model_len - self.sampling.max_new_tokens
        if len(prompt) > room:  # keep the end, where the answer and the instruction to grade it are
            prompt = prompt[-room:]
        loop = asyncio.get_running_loop()
        call = _Call(prompt, loop.create_future())
        self._pending.append(call)
        self.counters["calls"] += 1
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        return prefix + await call.future

    async def _drain(self) -> None:
        """Send pending calls out in batches, never more than ``max_concurrency`` generations at once."""
        running: set[asyncio.Task[None]] = set()
        while self._pending or running:
            if self._pending and self._in_flight < self.max_concurrency:
                await asyncio.sleep(self.batch_window)  # let the calls of this moment join the batch
                room = min(self.max_batch, self.max_concurrency - self._in_flight)
                batch, self._pending = self._pending[:room], self._pending[room:]
                self.counters["batches"] += 1
                self.counters["max_batch"] = max(self.counters["max_batch"], len(batch))
                self.batch_sizes.add(len(batch))
                self._in_flight += len(batch)
                self.counters["max_in_flight"] = max(self.counters["max_in_flight"], self._in_flight)
                for call in batch:
                    task = asyncio.get_running_loop().create_task(self._one(call))
                    running.add(task)
                    task.add_done_callback(running.discard)
            else:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)

    async def _one(self, call: _Call) -> None:
        assert self.engine is not None
        try:
            gen = await self.engine.generate(call.prompt, self.sampling)
            # One flat list of ids decodes to one string (transformers types decode for batches too).
            text = cast(str, self.engine.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
            self.counters["generated_tokens"] += len(gen.token_ids)
            if not call.future.done():
                call.future.set_result(text)
        except Exception as exc:
            self.counters["errors"] += 1
            if not call.future.done():
                call.future.set_exception(exc)
        finally:
            self._in_flight -= 1
            self.latency.add(time.perf_counter() - call.queued_at)

    def stats(self) -> dict[str, float]:
        """Calls, batches and their sizes, latency (queue + generation) percentiles, parse failures."""
        out = dict(self.counters)
        out["in_flight"] = float(self._in_flight)
        out["batch_mean"] = (sum(self.batch_sizes.values) / len(self.batch_sizes.values)
                             if self.batch_sizes.values else 0.0)
        out["latency_p50_ms"] = round(self.latency.percentile(50) * 1000, 3)
        out["latency_p99_ms"] = round(self.latency.percentile(99) * 1000, 3)
        return out


def build_judge_engine(backend: str = "hf", model_dir: str | None = None, servers: Sequence[str] = (),
                       gguf_file: str | None = None, **options: Any) -> Engine:
    """The engine a judge runs on: ``hf`` or ``vllm`` on ``model_dir``, or ``remote`` on ``servers``."""
    if backend == "remote":
        from agentfly.engines.remote import RemoteEngine

        if model_dir is None:
            raise ValueError("a remote judge needs model_dir: a local copy of the served model's tokenizer")
        # Judges are never trained: their servers are not ours to change.
        return RemoteEngine(list(servers), model_dir, allow_weight_sync=False, **options)
    if model_dir is None:
        raise ValueError(f"a {backend} judge needs model_dir (a local model folder)")
    if backend == "vllm":
        from agentfly.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, **options)
    if backend == "hf":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentfly.engines.hf import HFEngine

        kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(model_dir, **kwargs)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return HFEngine(model=model, tokenizer=tokenizer, **options)
    raise ValueError(f"judge backend={backend!r}: use hf, vllm or remote")


def judge_spec(name: str = "judge", *, backend: str = "hf", model_dir: str | None = None,
               servers: Sequence[str] = (), gguf_file: str | None = None, sampling: Sampling | None = None,
               scale: tuple[int, int] = (1, 10), max_concurrency: int = 8, max_batch: int = 16,
               batch_window: float = 0.005, acquire_timeout: float = 600.0,
               engine_options: Mapping[str, Any] | None = None, rubric: str | None = None) -> ResourceSpec:
    """A ``judge`` resource: one shared ``Judge`` on its own engine, started on first use; ``rubric`` is the
    one it grades on when a reward gives none."""
    engine = {"backend": backend, "model_dir": model_dir, "servers": list(servers), "gguf_file": gguf_file,
              **(engine_options or {})}
    options: dict[str, Any] = {"engine": engine, "scale": scale, "max_concurrency": max_concurrency,
                               "max_batch": max_batch, "batch_window": batch_window}
    if rubric is not None:
        options["rubric"] = rubric
    if sampling is not None:
        options["sampling"] = sampling
    return ResourceSpec(name=name, factory=Judge.from_spec, kind="model_service", backend="inprocess",
                        scope="global", pool=Pool(min=0, max=1), acquire_timeout=acquire_timeout, reset=False,
                        options=options)


class RewardModel:
    """A sequence-classification model (``AutoModelForSequenceClassification``) that scores texts.

    ``score(text)`` returns the model's first logit for the text (or a chat, rendered with the tokenizer's
    template). Concurrent calls are gathered into padded batches of up to ``max_batch`` and run in a worker
    thread. Never trained.
    """

    kind = "model_service"

    def __init__(self, model_dir: str, *, max_batch: int = 16, batch_window: float = 0.005,
                 max_length: int = 1024) -> None:
        self.model_dir, self.max_batch, self.batch_window, self.max_length = model_dir, max_batch, batch_window, max_length
        self.model: Any = None
        self.tokenizer: Any = None
        self._pending: list[tuple[str, asyncio.Future[float]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.counters: dict[str, float] = {"calls": 0, "batches": 0, "max_batch": 0, "errors": 0}
        self.latency = Window()

    @classmethod
    def from_spec(cls, spec: ResourceSpec) -> RewardModel:
        return cls(**spec.options)

    async def start(self) -> None:
        if self.model is None:
            await asyncio.to_thread(self._load)

    def _load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model: Any = AutoModelForSequenceClassification.from_pretrained(self.model_dir)
        self.model = model.eval()
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        for p in self.model.parameters():
            p.requires_grad_(False)

    async def reset(self) -> None:
        return None

    async def health(self) -> bool:
        return self.model is not None

    async def close(self) -> None:
        self.model = None

    def kill(self) -> None:
        self.model = None

    async def score(self, text: str | Sequence[Mapping[str, str]]) -> float:
        """The reward model's score of ``text`` (a string, or chat messages)."""
        if self.model is None:
            await self.start()
        if not isinstance(text, str):
            text = str(self.tokenizer.apply_chat_template(list(text), tokenize=False))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self._pending.append((text, future))
        self.counters["calls"] += 1
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self.batch_window)
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            self.counters["batches"] += 1
            self.counters["max_batch"] = max(self.counters["max_batch"], len(batch))
            started = time.perf_counter()
            try:
                scores = await asyncio.to_thread(self._forward, [t for t, _ in batch])
            except Exception as exc:
                self.counters["errors"] += 1
                for _, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                continue
            self.latency.add(time.perf_counter() - started)
            for (_, f), s in zip(batch, scores, strict=True):
                if not f.done():
                    f.set_result(s)

    def _forward(self, texts: list[str]) -> list[float]:
        import torch

        enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length)
        with torch.inference_mode():
            logits = self.model(**enc).logits
        return [float(v) for v in logits[:, 0].float()]

    def stats(self) -> dict[str, float]:
        return {**self.counters, "latency_p50_ms": round(self.latency.percentile(50) * 1000, 3),
                "latency_p99_ms": round(self.latency.percentile(99) * 1000, 3)}


def reward_model_spec(name: str = "reward_model", *, model_dir: str, max_batch: int = 16,
                      acquire_timeout: float = 600.0) -> ResourceSpec:
    """A ``reward_model`` resource: one shared ``RewardModel`` loaded on first use."""
    return ResourceSpec(name=name, factory=RewardModel.from_spec, kind="model_service", backend="inprocess",
                        scope="global", pool=Pool(min=0, max=1), acquire_timeout=acquire_timeout, reset=False,
                        options={"model_dir": model_dir, "max_batch": max_batch})

