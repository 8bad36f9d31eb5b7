"""The training loop: one step is a sequence of named, timed stages (after verl's ``ray_trainer``)::

    rollout      sample `group_size` trajectories per prompt through ``agentfly.Agent`` (rewards are scored
                 by the rollout layer as each trajectory ends)
    reward       collect rewards, overlong shaping, DAPO dynamic sampling (drop and refill flat groups)
    logprobs     pad the batch; old logprobs (the engine's, or recomputed), reference logprobs, values
    advantages   the algorithm's estimator over mask-1 tokens (``trainer.algorithms``)
    update       epochs x minibatches of the masked clipped loss, gradient clipping, optimizer + scheduler
    weight_sync  the engine gets the new weights (in place for HF: it shares the module)
    eval         held-out pass@1 (greedy), turns, tool-error rate; pass@k if configured (``trainer.evaluation``)
    checkpoint   safetensors + optimizer/scheduler/RNG/data position (every `save_every` steps and at the end)

With ``rollout.mode: async`` the rollout and reward stages run on a producer thread ahead of the update
(``trainer.producer``); the step waits for its batch (``wait_for_batch``), and ``weight_sync`` publishes a
copy of the new weights to the producer.

Each stage's seconds are reported as ``time/<stage>`` in the step's metrics event (``trainer.metrics``). What
a run is built from (model, data, engine, agent, resource pools) is in ``trainer.builders``; the rollout and
reward stages in ``trainer.collect``; the padded batch and the forward pass in ``trainer.batch``; the update
(the optimizer steps over a batch) in ``trainer.update``, over the torch/DeepSpeed ``Update`` of
``trainer.optim``; checkpoint save and resume in ``trainer.checkpoint``; the async producer in
``trainer.producer``.

    python -m trainer.cli train examples/calculator/grpo.yaml
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer import algorithms as algos
from trainer import distributed as dist
from trainer.batch import collate, turn_layout
from trainer.builders import (
    DataCursor,
    build_agent,
    engine_from_config,
    ensure_tiny,
    load_policy,
    load_samples,
    pools_of,
    setup_torch,
)
from trainer.checkpoint import check_resume_world, resume_run, save_run
from trainer.collect import Collected, collect
from trainer.config import Config, ConfigError, save_config
from trainer.evaluation import evaluate, sampled_eval
from trainer.events import EventStream, JSONLSink, RunState, Sink, log_event
from trainer.metrics import Progress, StageTimer, stage_times, summary, summary_metrics, throughput
from trainer.producer import AsyncRollouts, ProducedBatch
from trainer.trackers import tracker_sinks
from trainer.update import Learner, MicroBatch, torch_threads

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.engines.base import Engine
    from agentfly.rollout.trajectory import Trajectory


class InfrastructureStop(RuntimeError):
    """The job stopped because the infrastructure failed every rollout of several steps in a row."""


class RewardErrorStop(RuntimeError):
    """The job stopped because its reward raised on every rollout of several steps in a row (or of an
    evaluation): the message carries the reward's error, its traceback and the fix."""


def first_reward_error(trajectories: Sequence[Trajectory]) -> tuple[str, str | None] | None:
    """``(error, traceback)`` of the first trajectory whose reward raised, or None."""
    t = next((t for t in trajectories if t.reward_error is not None), None)
    return None if t is None else (t.reward_error or "", t.reward_traceback)


def reward_error_stop(where: str, error: tuple[str, str | None] | None) -> RewardErrorStop:
    """The error a job fails with when its reward raised everywhere ``where`` says: the reward's own words,
    how to go on, and where it raised."""
    what, trace = error if error is not None else ("on another rank", None)
    # The fix first and the traceback last (its last frames, where it raised): a shown error may be cut short.
    return RewardErrorStop(
        f"the reward raised on every rollout of {where}, so every reward was 0 and nothing was learnt: {what}. "
        "Fix the reward (the traceback below shows where it raised; try it on a sample in the registry), then "
        "launch again or resume from the last checkpoint; rollout.max_reward_error_steps sets how many such steps "
        "a job may take (0 never stops)." + (f"\n{trace.rstrip()[-1200:]}" if trace else ""))


class Trainer:
    """Owns the policy module, the engine that shares it, the optimizer and the event stream of one run.

    Under a launcher (``torchrun``, ``deepspeed``) each of the N ranks builds one: every rank rolls out its
    own ``prompts_per_step / N`` prompts of the shared data order, the losses' denominators, whole-batch
    statistics and metrics are reduced across ranks, gradients are averaged (once per optimizer step in plain
    torch, by DeepSpeed under it), and rank 0 alone emits events, evaluates and writes the Hugging Face weights.

    engine: a rollout engine built by the caller (e.g. a ``ReplayEngine`` for scripted rollouts) instead of
    the one ``config.engine`` names.
    """

    def __init__(self, config: Config, sinks: Sequence[Sink] = (), resume: str | os.PathLike[str] | None = None,
                 engine: Engine | None = None) -> None:
        self.config = config
        self.world, self.rank = dist.world_size(), dist.rank()
        # Refused before anything is loaded: a launch that cannot compute the one-process step.
        dist.check_world(config, self.world, colocated_hf=engine is None and config.engine == "hf")
        if resume is not None:
            check_resume_world(resume, self.world, deepspeed=bool(config.deepspeed))
        if self.world > 1:
            dist.init_process_group()
        self.main = self.rank == 0
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        all_sinks: list[Sink] = []
        if self.main:  # one writer: the other ranks' events would be copies of rank 0's
            save_config(config, self.out / "config.yaml")
            all_sinks = [JSONLSink(self.out / "events.jsonl"), *sinks, *tracker_sinks(config, self.out)]
        self.events = EventStream(all_sinks, run=self.out.name)
        self.device = setup_torch(config)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", dist.local_rank())
        self.events.status(0, "running", f"loading {config.model.path}")
        if self.world > 1 and config.model.build_tiny:
            if self.main:
                ensure_tiny(config)
            dist.barrier()  # the other ranks load what rank 0 built (and reuse it: same settings)
        self.model, self.tokenizer = load_policy(config, self.device)
        # The policy's optimizer and schedule, PPO's value head, the KL reference and the torch/DeepSpeed update.
        self.learner = Learner.build(config, self.model, self.device, self.out, self.world)
        self.engine: Engine = engine if engine is not None else engine_from_config(config, self.model, self.tokenizer)
        self._owns_engine = engine is None  # closed when train() ends; a caller's engine is the caller's
        self.separate_engine = engine is not None or config.engine != "hf"  # holds its own copy of the weights
        if config.rollout.mode == "async" and (engine is not None or self.learner.zero3):
            why = "a caller-built engine" if engine is not None else "DeepSpeed ZeRO-3 (its weights are sharded)"
            raise ConfigError(f"rollout.mode=async gives the producer an engine of its own, which {why} does not "
                              "allow; use rollout.mode=sync" + ("" if engine is not None else
                                                                 ", or a ZeRO stage below 3"), key="rollout.mode")
        self.agent: Agent = build_agent(config, self.engine)
        gateway = getattr(self.agent, "gateway", None)
        if gateway is not None:  # a gateway job: where the team's agents connect (the job page shows it)
            url = getattr(self.agent, "url", "")
            self.events.send(log_event(0, f"gateway serving the policy at {url}; keys in {self.out / 'gateway.json'}",
                                       gateway={"url": url, "job_key": gateway.job_key}, run=self.events.run))
        # build_agent gives the agent build_resources' engine (or none): the trainer reports and closes it.
        self.resources = pools_of(self.agent)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                          else self.tokenizer.eos_token_id)
        train, held_out = load_samples(config)
        self.cursor = DataCursor(train, config.data.seed, config.data.shuffle)
        self.eval_samples = held_out[: config.eval.size or config.data.eval_size]
        self.step = 0
        self.best: float | None = None
        self.producer: AsyncRollouts | None = None  # rollout.mode=async, while train() runs
        self._infra_streak = 0  # steps in a row whose every rollout the infrastructure ended
        self._reward_streak = 0  # steps in a row whose every reward raised
        self._reward_warned = False  # the first raised reward's traceback is logged once per run
        if resume is not None:
            self._resume(resume)

    # -------------------------------------------------------------------------------------- resume / save
    def _resume(self, path: str | os.PathLike[str]) -> None:
        ckpt, state = resume_run(self.learner, path)
        self.cursor.load_state_dict(state["data"])
        self.best = state.get("best")
        self.step = int(state["step"])
        self._sync_weights()
        saved = int(state.get("world_size", 1))
        note = f" (saved by {saved} ranks)" if saved != self.world else ""
        ahead = state.get("producer")
        if ahead is not None and int(ahead["next_step"]) > self.step:
            # Sampled ahead but never trained: sampled again from the trained cursor, same prompts and seeds.
            note += (f"; the producer had sampled to step {ahead['next_step']}, those batches are sampled again "
                     f"from step {self.step}")
        self.events.log(self.step, f"resumed from {ckpt} at step {self.step} on {self.world} ranks{note}")

    def _sync_weights(self) -> None:
        """The rollout engine gets the current weights (whole: gathered first under ZeRO-3, on every rank)."""
        self.engine.update_weights(dist.full_state_dict(self.model) if self.learner.zero3 else self.model.state_dict())

    def save(self, score: float | None = None) -> Path:
        """A checkpoint; every rank calls it (it is a collective). Each rank writes its RNG states, and
        under DeepSpeed its share of DeepSpeed's checkpoint; rank 0 writes the whole weights and the rest."""
        if score is not None and (self.best is None or score > self.best):
            self.best = score
        # "data" is the cursor after the last trained batch; the producer's state, what it had sampled ahead.
        return save_run(self.learner, step=self.step, tokenizer=self.tokenizer, data=self.cursor.state_dict(),
                        producer=None if self.producer is None else self.producer.state_dict(), best=self.best,
                        score=score, events=self.events)

    # -------------------------------------------------------------------------------------- stages
    def collect(self, timer: StageTimer) -> Collected:
        """The rollout and reward stages of this step on the trainer's own agent and data (``trainer.collect``)."""
        return collect(self.config, self.agent, self.cursor, timer, step=self.step)

    def train_step(self) -> dict[str, float]:
        """One full step; returns its metrics (also emitted as an event)."""
        cfg = self.config
        timer = StageTimer()
        step_start, cpu_start = time.perf_counter(), time.process_time()
        self.model.eval()  # dropout off: rollout and training logprobs must be the same function
        produced: ProducedBatch | None = None
        dropped = 0
        if self.producer is None:
            collected = self.collect(timer)
        else:
            with timer("wait_for_batch"):  # the trainer's idle time: the producer is behind
                produced, dropped = self.producer.get(self.step)
            self.cursor.load_state_dict(produced.cursor)  # the trained position, what a checkpoint saves
            collected = produced.collected
        everything = collected.everything
        # Every rank's trajectories count in the metrics (gathered as a few numbers each).
        rows = [row for part in dist.all_gather_object([summary(t) for t in everything]) for row in part]
        metrics: dict[str, float] = summary_metrics(rows) | collected.metrics
        train_rows = int(dist.all_reduce_sum(torch.tensor(float(len(collected.trajectories)))))
        if train_rows:
            # A rank left without rows (dynamic sampling kept others' groups) still meets the gradient
            # all-reduce, with a placeholder row whose mask is all 0: it adds nothing to loss or metrics.
            placeholder = not collected.trajectories
            trajectories = collected.trajectories or everything[:1]
            metrics |= self._update(trajectories, collected.rewards or [0.0], collected.groups or [0], timer,
                                    placeholder=placeholder)
        else:
            metrics["update/skipped"] = 1.0
        with timer("weight_sync"):
            if self.producer is not None:
                if self.step + 1 < cfg.steps:
                    # A copy, so the producer can swap it in (between two of its batches, never while its
                    # engine decodes) while the next update changes the trainer's own.
                    self.producer.publish({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                                          self.step + 1)
            elif self.separate_engine:
                self._sync_weights()
        self.step += 1
        metrics |= {"lr": float(self.learner.scheduler.get_last_lr()[0]), "step": float(self.step)}
        metrics |= stage_times(timer.times, time.perf_counter() - step_start)
        if self.producer is not None and produced is not None:  # its rollout and reward seconds are the step's
            # Staleness against the version this update started from (self.step has counted it already).
            metrics |= self.producer.metrics(produced, dropped, collected.trajectories, version=self.step - 1)
        gateway = getattr(self.agent, "gateway", None)
        if gateway is not None:  # a gateway job's counters since it started: requests, mismatches, client_lost, 429s
            metrics |= {f"gateway/{k}": v for k, v in gateway.stats().items()}
        metrics |= throughput(sum(t.num_trained_tokens for t in everything), metrics.get("time/rollout", 0.0),
                              cpu_start)
        self.events.metrics(self.step, metrics)
        if cfg.log_samples and self.main:
            shown = everything if cfg.log_samples < 0 else everything[: cfg.log_samples]
            self.events.samples(self.step, [t.to_dict(self.tokenizer) for t in shown])
        # The engine and pools the rollouts ran on: the producer's in async mode.
        engine = self.engine if self.producer is None else self.producer.engine
        pools = self.resources if self.producer is None else self.producer.pools
        self.events.resources(self.step, engine.stats(), pools.stats() if pools else None)
        self._check_infrastructure(everything, metrics, len(rows))
        self._check_rewards(everything, metrics, "reward_errors/fraction", f"step {self.step}")
        return metrics

    def _check_rewards(self, trajectories: Sequence[Trajectory], metrics: dict[str, float], key: str,
                       where: str) -> None:
        """Make a raising reward impossible to miss. The first time any reward raises, a warning log event
        carries its error and traceback (the pages show it as a banner); after
        ``rollout.max_reward_error_steps`` steps in a row whose every reward raised the job fails with them.
        An evaluation (``where`` names it, ``key`` its metric) whose every reward raised fails at once: its
        accuracy would be a silent 0."""
        share = metrics.get(key, 0.0)
        evaluation = key.startswith("eval/")
        if share and not self._reward_warned and self.main:
            first = first_reward_error(trajectories)
            if first is not None:
                self._reward_warned = True
                self.events.log(self.step, f"the reward raised on {share:.0%} of the rollouts of {where} "
                                           f"(scored 0): {first[0]}", "warning", traceback=first[1])
        limit = self.config.rollout.max_reward_error_steps
        if evaluation:
            if limit and share >= 1.0:
                raise reward_error_stop(where, first_reward_error(trajectories))
            return
        self._reward_streak = self._reward_streak + 1 if share >= 1.0 else 0
        if limit and self._reward_streak >= limit:
            raise reward_error_stop(f"the last {self._reward_streak} steps", first_reward_error(trajectories))

    def _check_infrastructure(self, everything: Sequence[Trajectory], metrics: dict[str, float], rolled: int) -> None:
        """Stop a job that trains on nothing: every rollout of ``rollout.max_infra_failed_steps`` steps in a
        row ended in an infrastructure failure (a pool that cannot start, a cluster gone). Such steps would
        otherwise succeed with every update skipped."""
        limit = self.config.rollout.max_infra_failed_steps
        failed = metrics.get("rollout/infra_failed", 0.0)
        self._infra_streak = self._infra_streak + 1 if rolled and failed >= rolled else 0
        if not limit or self._infra_streak < limit:
            return
        first = next((t for t in everything if t.infra_failed), None)
        why = f"{first.failure}: {first.failure_reason}" if first is not None else "on another rank"
        raise InfrastructureStop(
            f"every rollout of the last {self._infra_streak} steps ended in an infrastructure failure ({why}), so "
            "nothing was trained; fix what the reason names and resume from the last checkpoint, or raise "
            "rollout.max_infra_failed_steps (0 never stops)")

    def _update(self, trajectories: Sequence[Trajectory], rewards: Sequence[float], groups: Sequence[int],
                timer: StageTimer, placeholder: bool = False) -> dict[str, float]:
        cfg, a = self.config, self.config.algorithm
        metrics: dict[str, float] = {}
        with timer("logprobs"):
            batch = collate(trajectories, rewards, groups, self.pad_id, self.device)
            if placeholder:
                batch = dataclasses.replace(batch, mask=torch.zeros_like(batch.mask))
            mask = batch.mask
            # Old logprobs for the ratio. One epoch of one minibatch is exactly on-policy: the current
            # logprobs (detached, in the update) are the old ones, so no extra forward is spent. Otherwise the
            # HF engine's own logprobs serve (same module, same weights; `logprob_mismatch` shows the gap),
            # and another engine's are recomputed by the trainer (verl's old_log_prob stage).
            # Asynchronous rollouts were sampled by older weights: the update's own start is recomputed too.
            on_policy = a.epochs == 1 and a.minibatches == 1
            recompute = not on_policy and (self.separate_engine or cfg.rollout.mode == "async")
            need_values = self.learner.value_head is not None
            old_logp: torch.Tensor | None = None if on_policy else batch.rollout_logprobs
            values = None
            ref_logp = None
            with torch.no_grad():
                if recompute or need_values:
                    logp_now, hidden = self.learner.logprobs(self.model, batch, hidden=need_values)
                    if recompute:
                        old_logp = logp_now
                    if need_values:
                        values = self.learner.value_head(hidden)  # type: ignore[misc]
                if self.learner.ref_model is not None:
                    ref_logp, _ = self.learner.logprobs(self.learner.ref_model, batch)
        with timer("advantages"):
            kl_reward = None
            if ref_logp is not None and a.kl_in_reward:
                behaviour = old_logp if old_logp is not None else batch.rollout_logprobs
                kl_reward = algos.kl_estimate(behaviour, ref_logp, a.kl_estimator)
            reduce = dist.all_reduce_sum if self.world > 1 else None
            if a.credit == "outcome":
                token_rewards = algos.outcome_token_rewards(batch.rewards, mask, kl_reward, a.kl_coef)
                advantages, returns = algos.compute_advantages(
                    a.name, token_rewards, mask, batch.group_ids, values=values, std_normalize=a.std_normalize,
                    gamma=a.gamma, lam=a.lam, whiten=a.whiten_advantages, reduce=reduce)
            else:
                turns = turn_layout(trajectories, batch.rewards, mask.shape[1], kl_reward, a.kl_coef)
                advantages, returns = algos.compute_turn_advantages(
                    a.credit, turns.rewards, turns.mask, turns.turn_of, mask, batch.group_ids, states=turns.states,
                    values=values, gamma=a.gamma, lam=a.lam, step_weight=a.step_weight,
                    whiten=a.whiten_advantages, reduce=reduce)
        # Thread counts are process-wide: in async mode the producer's core is not the update's to take.
        with timer("update"), torch_threads(cfg.update_threads if cfg.rollout.mode == "sync" else 0):
            metrics |= self.learner.optimise(batch, old_logp, ref_logp, advantages, values, returns, step=self.step,
                                             placeholder=placeholder)
        return metrics

    def micro_step(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The weighted loss of one micro-batch and its weighted metrics (``Learner.micro_step``)."""
        return self.learner.micro_step(micro)

    def evaluate(self) -> dict[str, float]:
        """Held-out pass@1 (greedy), mean turns, tool-error rate and, when ``eval.pass_k`` asks for it, sampled
        pass@k (``trainer.evaluation``); on rank 0 only (the other ranks get ``{}`` and go on to the next step).
        In async mode on the agent ``AsyncRollouts.evaluating`` gives (the producer's pools, paused)."""
        if not self.main:
            return {}
        agent_of = contextlib.nullcontext if self.producer is None else self.producer.evaluating
        with agent_of(self.agent) as agent:
            metrics, greedy = evaluate(agent, self.eval_samples, self.config.eval.max_new_tokens,
                                       self.config.eval.batch_size, sampled_eval(self.config))
        self._check_rewards(greedy, metrics, "eval/reward_errors/fraction", f"the evaluation at step {self.step}")
        return metrics

    # -------------------------------------------------------------------------------------- the run
    def train(self, should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Run to ``steps`` (or the time budget); returns the final metrics and the last checkpoint path.

        should_stop: an optional callable checked between steps (the web app's cancel flag).
        """
        cfg = self.config
        self.events.status(self.step, "running", f"training from step {self.step} to {cfg.steps}")
        start = time.perf_counter()
        progress = Progress(cfg.steps, self.step, enabled=cfg.progress)
        last: dict[str, float] = {}
        eval_metrics: dict[str, float] = {}
        state: RunState = "succeeded"
        try:
            if cfg.rollout.mode == "async":
                self.producer = AsyncRollouts(cfg, self.model, self.tokenizer, self.engine,
                                              separate=self.separate_engine, cursor=self.cursor, step=self.step)
                self.producer.start()
            if cfg.eval.every and self.step == 0:
                # The held-out curve starts where the weights do: a warm start's accuracy before any update,
                # so the first evaluation after training is read against it.
                timer = StageTimer()
                with timer("eval"):
                    eval_metrics = self.evaluate()
                if self.main:
                    self.events.metrics(0, eval_metrics | {"time/eval": timer.times["eval"]})
            while self.step < cfg.steps:
                # Decided together: a rank that stopped alone would leave the others waiting in a collective.
                stop, over = dist.all_reduce_max(torch.tensor([
                    float(should_stop is not None and should_stop()),
                    float(cfg.max_minutes is not None and time.perf_counter() - start > cfg.max_minutes * 60)],
                    dtype=torch.float64)).tolist()
                if stop:
                    state = "cancelled"
                    break
                if over:
                    self.events.log(self.step, f"time budget of {cfg.max_minutes} minutes reached")
                    break
                last = self.train_step()
                timer = StageTimer()
                due_eval = cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps
                if due_eval:
                    with timer("eval"):
                        eval_metrics = self.evaluate()
                    if self.main:
                        self.events.metrics(self.step, eval_metrics | {"time/eval": timer.times["eval"]})
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.steps:
                    with timer("checkpoint"):
                        self.save(eval_metrics.get("eval/accuracy") if due_eval else None)
                    self.events.metrics(self.step, {"time/checkpoint": timer.times["checkpoint"]})
                progress.update(self.step, last | eval_metrics if due_eval else last)
            timer = StageTimer()
            with timer("eval"):
                eval_metrics = self.evaluate()
            with timer("checkpoint"):
                path = self.save(eval_metrics.get("eval/accuracy"))
            final = eval_metrics | {"time/eval": timer.times["eval"], "time/checkpoint": timer.times["checkpoint"],
                                    "time/train": time.perf_counter() - start}
            self.events.metrics(self.step, final)
            progress.close(final)
            self.events.status(self.step, state, f"checkpoint {path}")
            return {"metrics": last | final, "checkpoint": str(path), "state": state, "step": self.step}
        except BaseException as exc:
            self.events.status(self.step, "failed", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if self.producer is not None:
                self.producer.close()
            # Sandboxes and environments (kept warm across steps on run_sync's loop), then that loop; the
            # rollouts have all ended.
            self.agent.close()
            if self._owns_engine:
                # Now, not whenever the garbage collector gets to it: vLLM's teardown resets process-wide
                # state, and run in the middle of the next engine's start it breaks that one.
                self.engine.close()
            self.events.close()


def train(config: Config, sinks: Sequence[Sink] = (), resume: str | os.PathLike[str] | None = None,
          should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train with ``config``, streaming events to ``sinks`` (plus ``<output_dir>/events.jsonl``); under a
    launcher this is one rank of the run, and the process group is left when it ends."""
    try:
        return Trainer(config, sinks=sinks, resume=resume).train(should_stop=should_stop)
    finally:
        if dist.world_size() > 1:
            dist.destroy_process_group()
