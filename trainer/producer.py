"""Asynchronous rollouts: a producer thread samples the batches of steps s+1 ... s+k while the trainer updates
step s (``rollout.mode: async``, k = ``rollout.max_staleness``).

How it stays correct:

- **Versions.** The trainer's policy version is its step (the updates applied). The producer generates with
  its own copy of the weights (its own HF engine and module); after each update the trainer publishes a
  detached copy of its weights with the new version (one copy, on the trainer's side), and the producer
  swaps them in between two batches: the only pause it sees is that copy. Every trajectory records the
  version that sampled it (``Trajectory.policy_version``), and the loss weighs its tokens by
  pi_trainer / pi_behaviour (``algorithm.off_policy_correction``, TIS by default in this mode).
- **Bounded staleness.** The producer starts the batch of step t only once it holds a version >= t - k, so
  no batch lags its update by more than k versions; one that does anyway (``too_stale``) is dropped and
  counted, never trained on.
- **Data.** Each batch carries the data cursor after its prompts were drawn; the trainer adopts it when it
  trains that batch, so a checkpoint's cursor is the one after the last *trained* batch. A resumed run
  regenerates the batches that were sampled ahead but not trained (same prompts, same seeds), and trains
  none twice nor skips one.
- **Ranks.** Under N ranks every rank runs its own producer; their cross-rank counts go through a side gloo
  group (``distributed.side_group``), never the default group of the gradient all-reduce. Every producer
  passes the same gates (versions are published at the same points of every rank's loop) and stops before
  ``last_step``, so all ranks' producers issue the same collectives, and a stop never strands one of them.
- **Threads.** ``torch.set_num_threads`` is process-wide; with one intra-op thread an op runs in the thread
  that calls it and releases the GIL, so the producer's generation and the trainer's update use two cores.

``AsyncRollouts`` is the producer's lifecycle inside a run: what it samples with (its engine, agent, resource
pools and data cursor), the agent the trainer evaluates on while it runs, its metrics, and its shutdown.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer import distributed as dist
from trainer.builders import DataCursor, build_agent, pools_of
from trainer.collect import Collected, collect
from trainer.config import Config
from trainer.metrics import StageTimer

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.engines.base import Engine
    from agentfly.resources import ResourceEngine
    from agentfly.rollout.trajectory import Trajectory


@dataclass
class ProducedBatch:
    """One step's rollouts, as the producer hands them to the trainer."""

    step: int  # the training step it was drawn for (its sampling seeds follow it)
    version: int  # the policy version that sampled it
    collected: Collected
    cursor: dict[str, int]  # the data cursor after its prompts were drawn
    times: dict[str, float] = field(default_factory=dict)  # the producer's stage seconds (rollout, reward)


def too_stale(batch_version: int, version: int, max_staleness: int) -> bool:
    """Whether a batch sampled at ``batch_version`` may not train the update that starts from ``version``."""
    return version - batch_version > max_staleness


class WeightBox:
    """One slot of versioned weights: the trainer publishes after each update, the producer takes the newest
    between batches (an older unread copy is simply replaced: only the newest matters)."""

    def __init__(self, version: int) -> None:
        self._cond = threading.Condition()
        self.version = version
        self._state: Mapping[str, Any] | None = None

    def publish(self, state: Mapping[str, Any], version: int) -> None:
        with self._cond:
            self._state, self.version = state, version
            self._cond.notify_all()

    def wait_for(self, version: int, stop: threading.Event) -> bool:
        """Block until ``version`` (or newer) is published (True) or ``stop`` is set first (False). A version
        already published passes even when stopping: every rank's producer passes the same gates."""
        with self._cond:
            while self.version < version:
                if stop.is_set():
                    return False
                self._cond.wait(timeout=0.5)
            return True

    def take_newer(self, have: int) -> tuple[int, Mapping[str, Any]] | None:
        with self._cond:
            if self._state is None or self.version <= have:
                return None
            state, self._state = self._state, None
            return self.version, state

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class RolloutProducer:
    """Runs ``collect(step, cursor)`` for steps ``step``, ``step + 1``, ... ``last_step - 1`` in a thread, each
    once the weights it needs are published; ``get`` hands the trainer the next batch fresh enough to train.

    collect: the trainer's rollout and reward stages on the producer's own agent (engine copy).
    load_weights: copies a published state dict into the producer's engine.
    cursor: the producer's own data cursor, at the position after the last trained batch.
    version: the version of the weights the producer's engine holds now.
    """

    def __init__(
        self,
        collect: Callable[[int, DataCursor], tuple[Collected, dict[str, float]]],
        load_weights: Callable[[Mapping[str, Any]], None],
        cursor: DataCursor,
        *,
        step: int,
        version: int,
        last_step: int,
        max_staleness: int,
    ) -> None:
        self._collect, self._load = collect, load_weights
        self.cursor = cursor
        self.next_step, self.version, self.last_step = step, version, last_step
        self.max_staleness = max_staleness
        self.weights = WeightBox(version)
        self.idle_seconds = 0.0  # waiting for weights: the producer was ahead by max_staleness
        self.dropped = 0
        self._state_lock = threading.Lock()
        self._generated = cursor.state_dict()  # the cursor after the last batch produced (next_step - 1)
        self._queue: queue.Queue[ProducedBatch | BaseException | None] = queue.Queue()
        self._stop = threading.Event()
        self._batch = threading.Lock()  # held while a batch is sampled; ``paused`` takes it
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self) -> RolloutProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while self.next_step < self.last_step:
                step = self.next_step
                waited = time.perf_counter()
                if not self.weights.wait_for(step - self.max_staleness, self._stop):
                    return
                self.idle_seconds += time.perf_counter() - waited
                newer = self.weights.take_newer(self.version)
                if newer is not None:
                    self._load(newer[1])
                    self.version = newer[0]
                with self._batch:
                    collected, times = self._collect(step, self.cursor)
                for t in collected.everything:
                    t.policy_version = self.version
                after = self.cursor.state_dict()
                with self._state_lock:  # read together by state_dict
                    self._generated, self.next_step = after, step + 1
                self._queue.put(ProducedBatch(step, self.version, collected, after, times))
        except BaseException as exc:  # handed to the trainer, which raises it in its own thread
            self._queue.put(exc)
        finally:
            self._queue.put(None)  # the end: a trainer still waiting learns there is nothing more

    def get(self, version: int) -> tuple[ProducedBatch, int]:
        """The next batch that may train the update from ``version``, and how many older ones were dropped
        on the way (counted in ``dropped`` too)."""
        dropped = 0
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise RuntimeError(f"the rollout producer failed: {type(item).__name__}: {item}") from item
            if item is None:
                raise RuntimeError(
                    "the rollout producer ended before the trainer's last step "
                    f"(it had reached step {self.next_step} of {self.last_step})"
                )
            if too_stale(item.version, version, self.max_staleness):
                dropped += 1
                self.dropped += 1
                continue
            return item, dropped

    def publish(self, state: Mapping[str, Any], version: int) -> None:
        """New weights for the producer (it takes them before its next batch)."""
        self.weights.publish(state, version)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records of the producer: the version it holds, the next step it would sample,
        the data cursor after the batches produced so far (ahead of the trained one by the batches not yet
        trained; a batch in progress is not counted) and the batches dropped."""
        with self._state_lock:
            generated, next_step = self._generated, self.next_step
        return {
            "version": self.version,
            "next_step": next_step,
            "cursor": dict(generated),
            "dropped": self.dropped,
        }

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No batch is sampled inside this block: it waits for the batch in progress to end, and the next
        one starts after it. The trainer evaluates in it, on the producer's event loop and resource pools, so
        that a pool never holds more than its ``max`` (``AsyncRollouts.evaluating``)."""
        with self._batch:
            yield

    @property
    def running(self) -> bool:
        """Whether the producer's thread is still alive."""
        return self._thread.is_alive()

    def close(self, timeout: float = 600.0) -> None:
        """Stop after the batch in progress (and any whose weights are already published, which the other
        ranks' producers sample too) and wait for the thread."""
        self._stop.set()
        self.weights.wake()
        self._thread.join(timeout)


class AsyncRollouts:
    """``rollout.mode: async`` for the length of ``Trainer.train``: a producer thread with its own engine,
    agent (and resource pools) and data cursor, starting at ``step`` with the weights of that version.

    engine: the trainer's engine. An HF engine shares the trainer's module, so the producer gets a new HF
    engine on a copy of the policy; a ``separate`` engine (vLLM) already holds its own copy of the weights, so
    the producer takes it over: from here on only the producer's thread drives it and loads new weights into
    it (``load_weights`` between two batches), and the trainer evaluates on an HF engine over its own module.
    """

    def __init__(self, config: Config, model: Any, tokenizer: Any, engine: Engine, *, separate: bool,
                 cursor: DataCursor, step: int) -> None:
        from agentfly.engines.hf import HFEngine

        group = dist.side_group()  # every rank makes it here, at the same point
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.trainer_engine, self.separate = engine, separate
        if not separate:
            engine = HFEngine(model=copy.deepcopy(model).eval().requires_grad_(False), tokenizer=tokenizer)
        self.engine: Engine = engine
        self.agent: Agent = build_agent(config, engine)
        self._eval_agent: Agent | None = None
        self._idle_reported = 0.0  # the producer's idle seconds already reported
        at = DataCursor(cursor.samples, config.data.seed, config.data.shuffle)
        at.load_state_dict(cursor.state_dict())

        def collect_batch(batch_step: int, cursor: DataCursor) -> tuple[Collected, dict[str, float]]:
            timer = StageTimer()
            return collect(config, self.agent, cursor, timer, step=batch_step, group=group), timer.times

        self.producer = RolloutProducer(collect_batch, engine.update_weights, at, step=step, version=step,
                                        last_step=config.steps, max_staleness=config.rollout.max_staleness)

    def start(self) -> AsyncRollouts:
        self.producer.start()
        return self

    @property
    def pools(self) -> ResourceEngine | None:
        """The producer's resource pools: the ones the rollouts run on (and evaluations share)."""
        return pools_of(self.agent)

    def get(self, version: int) -> tuple[ProducedBatch, int]:
        return self.producer.get(version)

    def publish(self, state: Mapping[str, Any], version: int) -> None:
        self.producer.publish(state, version)

    def state_dict(self) -> dict[str, Any]:
        return self.producer.state_dict()

    @contextlib.contextmanager
    def evaluating(self, own: Agent) -> Iterator[Agent]:
        """The agent an evaluation runs on, given the trainer's ``own``. With resource pools, it is an agent on
        the producer's pools and event loop, and the producer is paused meanwhile, so that a pool never holds
        more than its ``max`` instances. Its engine holds the weights just trained: the trainer's own HF
        engine, or, when the producer drives a separate engine (vLLM) that no other thread may step, a new HF
        engine over the trainer's module. Built once; without pools and a separate engine, ``own``."""
        shares = self.pools is not None
        with self.producer.paused() if shares else contextlib.nullcontext():
            if not (self.separate or shares):
                yield own
                return
            if self._eval_agent is None:
                from agentfly.engines.hf import HFEngine

                engine = HFEngine(model=self.model, tokenizer=self.tokenizer) if self.separate else self.trainer_engine
                if shares:
                    self._eval_agent = build_agent(self.config, engine, resources=self.pools)
                    self._eval_agent.share_loop(self.agent)
                else:
                    self._eval_agent = build_agent(self.config, engine)
            yield self._eval_agent

    def metrics(self, produced: ProducedBatch, dropped: int, trained: Sequence[Trajectory], version: int
                ) -> dict[str, float]:
        """Staleness of the trained rows (versions behind ``version``, the one this update started from),
        dropped batches, the producer's stage seconds for this batch (it ran them while earlier updates did)
        and its idle seconds since the last step; over ranks: sums for means and counts, maxima for maxima
        and times."""
        lags = [version - (t.policy_version if t.policy_version is not None else version) for t in trained]
        idle, self._idle_reported = self.producer.idle_seconds - self._idle_reported, self.producer.idle_seconds
        summed = dist.all_reduce_sum(torch.tensor([float(sum(lags)), float(len(lags)), float(dropped)],
                                                  dtype=torch.float64)).tolist()
        names = sorted(produced.times)
        top = dist.all_reduce_max(torch.tensor([float(max(lags, default=0)), idle] +
                                               [produced.times[k] for k in names], dtype=torch.float64)).tolist()
        out = {"rollout/staleness_mean": summed[0] / max(summed[1], 1.0), "rollout/staleness_max": top[0],
               "rollout/dropped_stale": summed[2], "time/producer_idle": top[1],
               "rollout/policy_version": float(produced.version)}
        return out | {f"time/{k}": v for k, v in zip(names, top[2:], strict=True)}

    def close(self) -> None:
        """Stop the producer, then close its agent's and the evaluation agent's pools and event loops (each
        on the loop its instances belong to, idle once the producer's thread has ended)."""
        self.producer.close()
        if self.producer.running:  # still in a batch past close's timeout: its loop is not ours to close
            return
        for agent in (self.agent, self._eval_agent):
            if agent is not None:
                agent.close()
