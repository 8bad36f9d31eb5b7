"""The gateway's core, without HTTP: rollouts, their keys, groups, limits, rewards and the end of each rollout.

A job hands out task samples (``hand_out``), ``group_size`` rollouts each; every rollout gets its own API key.
An agent takes a rollout (``GET /v1/samples`` or ``take``), drives it with OpenAI requests under that key
(``chat`` / ``complete``), and ends it with a reward (``reward``) or without one (``finish``: the job's reward
function scores the recorded trajectory). The job waits for its batch (``wait``) and trains on the
trajectories as the rollout loop's own. A rollout whose agent stops calling it for ``idle_timeout`` seconds
ends as an infrastructure failure (``client_lost``); when no agent takes any rollout for ``take_timeout``
seconds, the rollouts waiting in the queue end as ``no_client`` (agents that are slow but there keep taking).
Neither says anything of the policy, so the trainer keeps them out of their group's statistics and out of the
loss, and a job no agent serves stops after ``rollout.max_infra_failed_steps`` steps saying so instead of
waiting forever.

Thread model: the HTTP server awaits ``chat``/``complete`` on its own event loop (the engine batches concurrent
requests there); the trainer calls ``hand_out``/``wait`` from its thread. Every shared field is read and written
under ``_lock``; generation is awaited outside it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentfly.engines.base import Engine, Generation, Sampling
from agentfly.gateway.conversation import Conversation, Mismatch, RequestError
from agentfly.rollout.loop import initial_messages, turn_seed
from agentfly.rollout.parsers import Parser, get_parser
from agentfly.rollout.render import ChatRenderer
from agentfly.rollout.trajectory import Trajectory, TurnReward

if TYPE_CHECKING:
    from agentfly.rewards.reward import Reward

RolloutState = Literal["queued", "active", "done", "failed"]


@dataclass
class GatewayLimits:
    """What one key (one rollout) and the whole gateway may use.

    max_inflight: generation requests in flight at once across all keys; one more is answered 429 with
        ``Retry-After`` (the engine is saturated: the client should wait, not queue unboundedly).
    max_requests: requests one rollout may make (its turns); beyond it, 429 ``rollout_quota_exceeded``.
    max_tokens: tokens one rollout's sequence may hold (prompt, observations and sampled turns).
    idle_timeout: seconds an active rollout may go without a request before it ends as ``client_lost``.
    take_timeout: seconds without any rollout taken (``GET /v1/samples``, or a first request with its key) after
        which the rollouts still queued end as ``no_client`` (a queued rollout waits at least this long from its
        handout); None waits for ever.
    on_mismatch: ``split`` starts a new segment from the client's changed conversation (the earlier segment is
        counted and kept out of training); ``reject`` answers 409 and the rollout keeps its conversation.
    """

    max_inflight: int = 256
    max_requests: int = 64
    max_tokens: int | None = None
    idle_timeout: float = 300.0
    take_timeout: float | None = 600.0
    on_mismatch: Literal["split", "reject"] = "split"

    def __post_init__(self) -> None:
        if self.max_inflight < 1 or self.max_requests < 1:
            raise ValueError("GatewayLimits.max_inflight and max_requests must be >= 1")
        if self.idle_timeout <= 0:
            raise ValueError(f"GatewayLimits.idle_timeout must be > 0 seconds, got {self.idle_timeout}")
        if self.take_timeout is not None and self.take_timeout <= 0:
            raise ValueError(f"GatewayLimits.take_timeout must be > 0 seconds or None, got {self.take_timeout}")
        if self.on_mismatch not in ("split", "reject"):
            raise ValueError(f"GatewayLimits.on_mismatch={self.on_mismatch!r}: use 'split' or 'reject'")

    @property
    def reap_every(self) -> float:
        """Seconds between two looks for rollouts past ``idle_timeout`` or ``take_timeout``: a quarter of the
        shorter, at most 1."""
        return min(1.0, *(t / 4 for t in (self.idle_timeout, self.take_timeout) if t is not None))


@dataclass
class Rollout:
    """One rollout: a task sample, its key, the engine and sampling it is served with, and its segments."""

    rollout_id: str
    group_id: str
    sample: dict[str, Any]
    key: str
    engine: Engine
    sampling: Sampling
    index: int = 0
    state: RolloutState = "queued"
    segments: list[Conversation] = field(default_factory=list)  # the last one is the live one
    requests: int = 0
    mismatches: int = 0
    last_seen: float = field(default_factory=time.monotonic)  # handed out, then its last request
    busy: bool = False
    reward: float | None = None
    turn_rewards: list[TurnReward] = field(default_factory=list)
    failure: tuple[str, str] | None = None

    @property
    def trajectory(self) -> Trajectory:
        """What the trainer trains on: the last segment (the conversation the agent finished with)."""
        if self.segments:
            return self.segments[-1].trajectory
        return Trajectory(sample=self.sample, rollout_id=self.rollout_id, group_id=self.group_id,
                          temperature=self.sampling.temperature)

    def handout(self, system_prompt: str | None) -> dict[str, Any]:
        """What an agent gets for this rollout: ids, its key, the sample and the conversation to start from."""
        return {"rollout_id": self.rollout_id, "group_id": self.group_id, "api_key": self.key,
                "sample": self.sample, "messages": initial_messages(self.sample, system_prompt)}


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Gateway:
    """Serves rollouts of one job to agents written elsewhere and records them as token-exact trajectories.

    engine: the default engine of handed-out rollouts (``hand_out`` may name another, e.g. the async producer's).
    parser: the job's tool-call format (``hermes``/``react``); tool calls come back in OpenAI's format.
    reward: the job's reward function, scored on the recorded trajectory when a rollout ends without an API
        reward. system_prompt: put before the sample's messages in what ``GET /v1/samples`` hands out.
    chat_template_kwargs: extra template variables (as ``rollout.chat_template_kwargs``).
    """

    def __init__(self, engine: Engine, *, parser: str | Parser = "hermes", reward: Reward | None = None,
                 system_prompt: str | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                 limits: GatewayLimits | None = None, model_name: str = "policy") -> None:
        self.engine = engine
        self.parser = get_parser(parser)
        self.reward = reward
        self.system_prompt = system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.limits = limits or GatewayLimits()
        self.model_name = model_name
        self.job_key = "afj-" + secrets.token_urlsafe(24)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rollouts: dict[str, Rollout] = {}
        self._by_key: dict[str, str] = {}  # sha256(key) -> rollout id
        self._queue: deque[str] = deque()  # handed out by the job, not yet taken by an agent
        self._last_take = time.monotonic()  # when an agent last took a rollout
        self._inflight = 0
        self._renderers: dict[tuple[int, str], ChatRenderer] = {}
        self.closed = False
        self.counters: dict[str, float] = {"requests": 0, "rejected_busy": 0, "mismatches": 0, "client_lost": 0,
                                           "no_client": 0,
                                           "prompt_tokens": 0, "completion_tokens": 0}

    # ------------------------------------------------------------------ the job's side
    def hand_out(self, samples: Sequence[Mapping[str, Any]], group_size: int, sampling: Sampling, *,
                 engine: Engine | None = None, first_index: int = 0, prefix: str = "") -> list[str]:
        """Make ``group_size`` rollouts of every sample (ids ``<prefix><group>/<k>``, consecutive per sample)
        and queue them for agents; returns their ids in order."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        ids: list[str] = []
        with self._lock:
            if self.closed:
                raise RuntimeError("the gateway is closed; build a new one")
            for i, sample in enumerate(samples):
                group = f"{prefix}{sample.get('id', first_index // group_size + i)}"
                for k in range(group_size):
                    rid = f"{group}/{k}"
                    while rid in self._rollouts:  # the same sample drawn again (a later epoch or step)
                        rid = f"{group}/{k}.{secrets.token_hex(2)}"
                    key = "afr-" + secrets.token_urlsafe(24)
                    self._rollouts[rid] = Rollout(rid, group, dict(sample), key, engine or self.engine, sampling,
                                                  index=first_index + i * group_size + k)
                    self._by_key[_digest(key)] = rid
                    self._queue.append(rid)
                    ids.append(rid)
            self._changed.notify_all()
        return ids

    def wait(self, ids: Sequence[str], poll: float = 1.0, stop: threading.Event | None = None) -> list[Trajectory]:
        """Block until every rollout of ``ids`` has ended (done or failed); their trajectories, in order.
        Ended rollouts are forgotten, and their keys revoked."""
        deadline_check = time.monotonic()
        with self._lock:
            while not all(self._rollouts[r].state in ("done", "failed") for r in ids):
                if stop is not None and stop.is_set():
                    raise RuntimeError("stopped while waiting for the gateway's rollouts")
                self._changed.wait(timeout=poll)
                if time.monotonic() - deadline_check >= poll:
                    self._reap_locked()
                    deadline_check = time.monotonic()
            out = [self._finalise(self._rollouts[r]) for r in ids]
            for r in ids:
                rollout = self._rollouts.pop(r)
                self._by_key.pop(_digest(rollout.key), None)
        return out

    def _finalise(self, rollout: Rollout) -> Trajectory:
        traj = rollout.trajectory
        traj.sample, traj.rollout_id, traj.group_id = rollout.sample, rollout.rollout_id, rollout.group_id
        traj.temperature, traj.model = rollout.sampling.temperature, traj.model or rollout.engine.model_name
        if rollout.failure is not None:
            traj.finish_reason = "error"
            traj.failure, traj.failure_reason = rollout.failure
            traj.error = f"InfrastructureFailure: {rollout.failure[1]}"
        if rollout.reward is not None:
            traj.reward = rollout.reward
        traj.turn_rewards = [r for r in rollout.turn_rewards if r.turn < traj.num_turns]
        traj.reward_metrics = {**traj.reward_metrics, "gateway/mismatches": float(rollout.mismatches),
                               "gateway/segments": float(len(rollout.segments))}
        return traj

    def _reap_locked(self) -> None:
        now, untaken = time.monotonic(), self.limits.take_timeout
        for rollout in self._rollouts.values():
            if rollout.state == "active" and not rollout.busy and now - rollout.last_seen > self.limits.idle_timeout:
                self._fail_locked(rollout, "client_lost", f"the agent made no request for {self.limits.idle_timeout:g}"
                                  " s (gateway idle_timeout); the rollout ended without it")
            elif (rollout.state == "queued" and untaken is not None
                  and now - max(rollout.last_seen, self._last_take) > untaken):
                self._queue.remove(rollout.rollout_id)
                self._fail_locked(rollout, "no_client", f"no agent took a rollout of this job for {untaken:g} s "
                                  "(gateway take_timeout): point the team's agent at the job's gateway URL (the job "
                                  "page, or <output_dir>/gateway.json) and take samples from GET /v1/samples")
        self._changed.notify_all()

    def _fail_locked(self, rollout: Rollout, kind: str, reason: str) -> None:
        rollout.state, rollout.failure = "failed", (kind, reason)
        self.counters[kind] += 1
        self._by_key.pop(_digest(rollout.key), None)

    def reap(self) -> None:
        """End every active rollout idle past ``idle_timeout``, and every queued one past ``take_timeout``
        (the server calls it periodically, as ``wait`` does)."""
        with self._lock:
            self._reap_locked()

    def close(self) -> None:
        """Revoke every key and fail the rollouts still open (the job ended)."""
        with self._lock:
            self.closed = True
            for rollout in self._rollouts.values():
                if rollout.state in ("queued", "active"):
                    rollout.state, rollout.failure = "failed", ("killed", "the job ended before the rollout did")
            self._by_key.clear()
            self._queue.clear()
            self.job_key = ""
            self._changed.notify_all()

    def stats(self) -> dict[str, float]:
        with self._lock:
            states = [r.state for r in self._rollouts.values()]
            return {**self.counters, "queued": float(states.count("queued")), "active": float(states.count("active")),
                    "inflight": float(self._inflight)}

    # ------------------------------------------------------------------ the agent's side: keys and samples
    def check_job_key(self, key: str) -> None:
        if not self.job_key or not secrets.compare_digest(key.encode(), self.job_key.encode()):
            raise RequestError("this endpoint needs the job's key (Authorization: Bearer afj-...); a rollout's "
                               "key only drives its own rollout", 401, "invalid_api_key")

    def rollout_for(self, key: str, rollout_header: str | None = None) -> Rollout:
        """The rollout a request drives: the one of its rollout key, or with the job key the one named by
        the ``X-Rollout-Id`` header."""
        with self._lock:
            if rollout_header and self.job_key and secrets.compare_digest(key.encode(), self.job_key.encode()):
                rid: str | None = rollout_header
            else:
                rid = self._by_key.get(_digest(key))
            rollout = self._rollouts.get(rid) if rid else None
            if rollout is None:
                raise RequestError("unknown or revoked key: each rollout has its own key (from GET /v1/samples), "
                                   "valid until the rollout ends or the job stops", 401, "invalid_api_key")
            if rollout.state in ("done", "failed"):
                raise RequestError(f"rollout {rollout.rollout_id} has ended ({rollout.state}); take a new sample "
                                   "from GET /v1/samples", 409, "rollout_ended")
            if rollout.state == "queued":  # used directly by key: taken
                self._queue.remove(rollout.rollout_id)
                rollout.state, self._last_take = "active", time.monotonic()
            rollout.last_seen = time.monotonic()
            return rollout

    def take(self, n: int = 1) -> list[dict[str, Any]]:
        """Up to ``n`` queued rollouts, now active (their idle clock starts): what ``GET /v1/samples`` hands out."""
        out: list[dict[str, Any]] = []
        with self._lock:
            while self._queue and len(out) < n:
                rollout = self._rollouts[self._queue.popleft()]
                rollout.state, rollout.last_seen = "active", time.monotonic()
                self._last_take = rollout.last_seen
                out.append(rollout.handout(self.system_prompt))
        return out

    def samples(self, timeout: float | None = None, stop: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """The rollouts the job hands out, one at a time as they come (what ``GET /v1/samples`` gives, for agents
        in the job's own process); ends after ``timeout`` seconds without one, when ``stop`` is set, or at close."""
        while True:
            with self._lock:
                waited = time.monotonic()
                while not self._queue and not self.closed and not (stop is not None and stop.is_set()):
                    if timeout is not None and time.monotonic() - waited > timeout:
                        return
                    self._changed.wait(timeout=0.2)
                if not self._queue:
                    return
            taken = self.take(1)
            if taken:
                yield taken[0]

    def set_reward(self, rollout_id: str, value: float, *, turn: int | None = None, reason: str = "",
                   done: bool = True) -> None:
        """A reward from the agent's side: the outcome (``turn`` None; ends the rollout unless ``done`` is
        False) or a turn's reward (added beside the outcome)."""
        import math

        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise RequestError(f"reward must be a finite number, got {value!r}")
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or rollout.state in ("done", "failed"):
                raise RequestError(f"no open rollout {rollout_id!r} (it never existed, or it has ended)", 404,
                                   "rollout_not_found")
            if turn is not None:
                if turn < 0:
                    raise RequestError(f"turn must be >= 0, got {turn}")
                rollout.turn_rewards.append(TurnReward(turn, float(value), reason or "api"))
                return
            rollout.reward = float(value)
            if done:
                self._end_locked(rollout)

    async def finish(self, rollout_id: str) -> Trajectory:
        """End a rollout; without an API reward the job's reward function scores its trajectory."""
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or rollout.state in ("done", "failed"):
                raise RequestError(f"no open rollout {rollout_id!r} (it never existed, or it has ended)", 404,
                                   "rollout_not_found")
            if rollout.busy:
                raise RequestError("a request of this rollout is still being answered; end it after", 409,
                                   "rollout_busy")
            rollout.busy = True
        try:
            traj = rollout.trajectory
            if rollout.reward is None and self.reward is not None:
                await self._score(rollout, traj)
        finally:
            with self._lock:
                rollout.busy = False
                self._end_locked(rollout)
        return traj

    async def _score(self, rollout: Rollout, traj: Trajectory) -> None:
        from agentfly.context import RolloutContext

        assert self.reward is not None
        ctx = RolloutContext(sample=rollout.sample, rollout_id=rollout.rollout_id, group_id=rollout.group_id)
        try:
            result = await self.reward.score(traj.final_answer, traj, ctx, rollout.sample)
        finally:
            await ctx.aclose()
        rollout.reward = traj.reward = result.reward
        traj.reward_metrics, traj.reward_error = dict(result.metrics), result.error
        if result.turn_rewards is not None:
            rollout.turn_rewards += [TurnReward(k, v, getattr(self.reward, "name", "reward"))
                                     for k, v in enumerate(result.turn_rewards)]

    def _end_locked(self, rollout: Rollout) -> None:
        rollout.state = "done"
        self._by_key.pop(_digest(rollout.key), None)  # revoked: the rollout is over
        self._changed.notify_all()

    # ------------------------------------------------------------------ the agent's side: generation
    def _renderer(self, engine: Engine, tools: Sequence[dict[str, Any]] | None) -> tuple[ChatRenderer, str]:
        tools_key = json.dumps(tools or [], sort_keys=True)
        key = (id(engine.tokenizer), tools_key)
        renderer = self._renderers.get(key)
        if renderer is None:
            renderer = ChatRenderer(engine.tokenizer, tools or None, self.chat_template_kwargs)
            if len(self._renderers) > 64:
                self._renderers.clear()
            self._renderers[key] = renderer
        return renderer, tools_key

    def _conversation(self, rollout: Rollout, tools: Sequence[dict[str, Any]] | None, fresh: bool) -> Conversation:
        renderer, tools_key = self._renderer(rollout.engine, tools)
        if rollout.segments and not fresh and rollout.segments[-1].tools_key == tools_key:
            return rollout.segments[-1]
        if rollout.segments:  # a new segment: the earlier one is kept, counted, and not trained on
            with self._lock:
                rollout.mismatches += 1
                self.counters["mismatches"] += 1
        suffix = f"#{len(rollout.segments)}" if rollout.segments else ""
        traj = Trajectory(sample=rollout.sample, rollout_id=rollout.rollout_id + suffix, group_id=rollout.group_id,
                          temperature=rollout.sampling.temperature, model=rollout.engine.model_name)
        conv = Conversation(renderer, self.parser, rollout.engine.stop_token_ids, traj, tools_key)
        rollout.segments.append(conv)
        return conv

    async def _generate(self, rollout: Rollout, prompt: list[int], max_tokens: int | None,
                        stop: Sequence[str]) -> Generation:
        limit = rollout.engine.max_model_len
        if self.limits.max_tokens is not None:
            limit = min(limit, self.limits.max_tokens)
        room = limit - len(prompt)
        if room <= 0:
            raise RequestError(f"the conversation holds {len(prompt)} tokens, the rollout's limit is {limit}; end "
                               "the rollout (POST /v1/rollouts/<id>/reward)", 400, "context_length_exceeded")
        sampling = rollout.sampling
        want = min(sampling.max_new_tokens, max_tokens or sampling.max_new_tokens, room)
        # A seed per (rollout, turn), as the rollout loop draws them: a group's rollouts differ, reproducibly.
        turn = sum(len(c.trajectory.turns) for c in rollout.segments)
        turn_sampling = sampling.replace(max_new_tokens=want, seed=turn_seed(sampling.seed, rollout.index, turn),
                                         stop=tuple(dict.fromkeys((*sampling.stop, *self.parser.stop, *stop))))
        generation = await rollout.engine.generate(prompt, turn_sampling)
        with self._lock:
            self.counters["prompt_tokens"] += len(prompt)
            self.counters["completion_tokens"] += len(generation.token_ids)
        return generation

    def _begin(self, rollout: Rollout) -> None:
        with self._lock:
            if rollout.busy:
                raise RequestError("this rollout is already answering a request: a rollout is one conversation, "
                                   "send its requests one at a time", 409, "rollout_busy")
            if rollout.requests >= self.limits.max_requests:
                raise RequestError(f"this rollout made its {self.limits.max_requests} requests (the key's limit); "
                                   "end it and take a new sample", 429, "rollout_quota_exceeded")
            if self._inflight >= self.limits.max_inflight:
                self.counters["rejected_busy"] += 1
                raise RequestError(f"the engine is saturated ({self._inflight} requests in flight); retry after "
                                   "the Retry-After seconds", 429, "engine_saturated", retry_after=1.0)
            self._inflight += 1
            rollout.busy = True
            rollout.requests += 1
            self.counters["requests"] += 1

    def _end_request(self, rollout: Rollout) -> None:
        with self._lock:
            self._inflight -= 1
            rollout.busy = False
            rollout.last_seen = time.monotonic()

    async def chat(self, rollout: Rollout, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[dict[str, Any]] | None = None, *, max_tokens: int | None = None,
                   stop: Sequence[str] = ()) -> tuple[Generation, str, list[dict[str, Any]], int]:
        """One chat turn of ``rollout``: the generation, the content and OpenAI tool calls the client gets, and
        the prompt's length in tokens."""
        self._begin(rollout)
        try:
            conv = self._conversation(rollout, tools, fresh=False)
            saved = conv.snapshot()
            try:
                prompt = conv.prompt(messages)
            except Mismatch:
                if self.limits.on_mismatch == "reject":
                    raise
                conv = self._conversation(rollout, tools, fresh=True)
                saved = conv.snapshot()
                prompt = conv.prompt(messages)
            try:
                generation = await self._generate(rollout, prompt, max_tokens, stop)
            except BaseException:
                # The request left no trace: the client may send it again (after a 400 or a cancelled call).
                conv.restore(saved)
                if conv.last is None and conv in rollout.segments:
                    rollout.segments.remove(conv)
                raise
            if "weights_version" in generation.extra:
                conv.trajectory.policy_version = int(generation.extra["weights_version"])
            _, content, tool_calls = conv.add_turn(generation)
            return generation, content, tool_calls, len(prompt)
        finally:
            self._end_request(rollout)

    async def complete(self, rollout: Rollout, prompt: str | list[int], *, max_tokens: int | None = None,
                       stop: Sequence[str] = ()) -> tuple[Generation, str, int]:
        """One raw completion of ``rollout`` (``/v1/completions``): the prompt extends the rollout's text."""
        self._begin(rollout)
        try:
            conv = self._conversation(rollout, None, fresh=False)
            saved = conv.snapshot()
            prompt_ids = conv.completion_prompt(prompt)
            try:
                generation = await self._generate(rollout, prompt_ids, max_tokens, stop)
            except BaseException:
                conv.restore(saved)
                raise
            text = conv.add_completion(generation)
            return generation, text, len(prompt_ids)
        finally:
            self._end_request(rollout)
