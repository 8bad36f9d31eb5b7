"""The async multi-turn agent loop.

Each rollout is an explicit state machine, one handler per state:

    GENERATE (sample a turn, parse its tool calls) -> no tool call ...................... DONE
                                                    -> turn limit / context length ....... DONE
                                                    -> TOOLS (run the calls concurrently, append their
                                                       observations with mask 0) -> GENERATE ...

At DONE the rollout's reward is computed at once, while other rollouts still generate. An infrastructure
failure (``InfrastructureFailure``) from a tool, a reward or the engine ends the rollout with ``failure`` set.

Many rollouts run as asyncio tasks against one engine, which batches their generation requests. Token ids
are appended, never re-derived from text; the loss mask is written as each token is appended (1 for
sampled tokens, 0 for prompt, observations and template glue). Every exit path releases the rollout's
resources (``finally``), including cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentfly.context import ResourceProvider, RolloutContext
from agentfly.engines.base import Engine, Generation, Sampling
from agentfly.resources.spec import InfrastructureFailure
from agentfly.rewards.reward import Reward
from agentfly.rollout.parsers import Parser, ParseResult, ToolCall
from agentfly.rollout.render import ChatRenderer
from agentfly.rollout.trajectory import ToolCallRecord, Trajectory, Turn, TurnReward
from agentfly.tools.tool import Tool, ToolResult


class State(enum.Enum):
    GENERATE = "generate"
    TOOLS = "tools"
    DONE = "done"


def initial_messages(sample: Mapping[str, Any], system_prompt: str | None) -> list[dict[str, Any]]:
    """The conversation a rollout starts from: ``messages``, or a user turn from ``question``/``prompt``."""
    if "messages" in sample:
        messages = [dict(m) for m in sample["messages"]]
    else:
        text = sample.get("question", sample.get("prompt"))
        if not isinstance(text, str):
            raise ValueError(
                f"a task sample needs 'messages' (a chat) or 'question'/'prompt' (a string); got keys {sorted(sample)}"
            )
        messages = [{"role": "user", "content": text}]
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def turn_seed(base: int | None, rollout_index: int, turn: int) -> int | None:
    """A distinct, reproducible sampler seed per (rollout, turn)."""
    if base is None:
        return None
    return (base * 1_000_003 + rollout_index * 7919 + turn * 104_729) % (2**63 - 1)


@dataclass
class _Rollout:
    """The mutable state of one rollout while it runs."""

    traj: Trajectory
    ctx: RolloutContext
    messages: list[dict[str, Any]]
    index: int
    turn: int = 0
    last: Generation | None = None
    parsed: ParseResult | None = None
    state: str = ""  # digest of the observations that lead into the next turn ("" before the first)


@dataclass
class RolloutRunner:
    """Runs rollouts of one agent configuration. Built by ``Agent``; usable on its own."""

    engine: Engine
    tools: Mapping[str, Tool]
    parser: Parser
    reward: Reward | None = None
    max_turns: int = 4
    max_length: int | None = None
    system_prompt: str | None = None
    resources: ResourceProvider | None = None
    model_name: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.parser.bind(self.tools)
        shown = [t.schema for t in self.tools.values()] if self.parser.shows_tools else []
        self.renderer = ChatRenderer(self.engine.tokenizer, shown or None, self.chat_template_kwargs)
        limit = self.engine.max_model_len
        self.token_limit: int = min(self.max_length or limit, limit)  # what the rollout may hold
        self.max_length = self.token_limit

    # ------------------------------------------------------------------ one rollout
    def episode(
        self, sample: Mapping[str, Any], sampling: Sampling, *, index: int = 0, group_id: str | None = None,
        rollout_id: str | None = None, info: Mapping[str, Any] | None = None,
        held: Callable[[], Awaitable[Mapping[str, Any]]] | None = None,
    ) -> Episode:
        """One rollout, to be driven step by step (``Episode.advance``, ``branch``, ``finish``).

        ``held``: called once when the episode begins, it returns instances the rollout holds as its own
        (``RolloutContext.adopt``): a group's forks of one prepared workspace. Its failure is the rollout's.
        """
        rollout_id = rollout_id or uuid.uuid4().hex[:12]
        group_id = group_id or rollout_id
        traj = Trajectory(sample=dict(sample), rollout_id=rollout_id, group_id=group_id,
                          temperature=sampling.temperature, model=self.model_name)
        ctx = RolloutContext(sample=dict(sample), rollout_id=rollout_id, group_id=group_id,
                             resources=self.resources, info=dict(info or {}))
        return Episode(self, _Rollout(traj, ctx, [], index), sampling, held)

    async def run_one(
        self, sample: Mapping[str, Any], sampling: Sampling, *, index: int = 0, group_id: str | None = None,
        rollout_id: str | None = None, info: Mapping[str, Any] | None = None,
        held: Callable[[], Awaitable[Mapping[str, Any]]] | None = None,
    ) -> Trajectory:
        episode = self.episode(sample, sampling, index=index, group_id=group_id, rollout_id=rollout_id, info=info,
                               held=held)
        return await episode.finish()

    # ------------------------------------------------------------------ state handlers
    async def _generate(self, r: _Rollout, sampling: Sampling) -> State:
        traj = r.traj
        room = self.token_limit - len(traj.token_ids)
        if room <= 0:
            traj.finish_reason = "length"
            return State.DONE
        turn_sampling = sampling.replace(
            max_new_tokens=min(sampling.max_new_tokens, room),
            stop=tuple(dict.fromkeys((*sampling.stop, *self.parser.stop))),
            seed=turn_seed(sampling.seed, r.index, r.turn),
        )
        t0 = time.perf_counter()
        gen = await self.engine.generate(traj.token_ids, turn_sampling)
        traj.timings["generate"] = traj.timings.get("generate", 0.0) + time.perf_counter() - t0
        if "weights_version" in gen.extra:  # a remote engine says which weights sampled the turn
            traj.policy_version = int(gen.extra["weights_version"])
        start, end = traj.extend_sampled(gen.token_ids, gen.logprobs)
        content = self.renderer.assistant_content(gen.token_ids, self.engine.stop_token_ids)
        parsed = self.parser.parse(content)
        r.messages.append({"role": "assistant", "content": content})
        traj.turns.append(Turn(index=r.turn, start=start, end=end, text=content, finish_reason=gen.finish_reason,
                               tool_calls=[c.name for c in parsed.tool_calls], parse_errors=list(parsed.errors),
                               state=r.state))
        r.turn += 1
        r.last, r.parsed = gen, parsed
        if not parsed.tool_calls and not parsed.errors:
            traj.final_answer = parsed.final_answer if parsed.final_answer is not None else parsed.content
            traj.finish_reason = "length" if gen.finish_reason == "length" else "answer"
            return State.DONE
        if gen.finish_reason == "length" and not parsed.tool_calls:
            traj.final_answer = parsed.content
            traj.finish_reason = "length"
            return State.DONE
        if r.turn >= self.max_turns:
            traj.finish_reason = "max_turns"
            return State.DONE
        return State.TOOLS

    async def _tools(self, r: _Rollout) -> State:
        """Run this turn's tool calls concurrently, then append their observations (mask 0)."""
        assert r.parsed is not None and r.last is not None
        traj = r.traj
        t0 = time.perf_counter()
        r.ctx.turn = r.turn - 1  # what context.reward_turn credits
        # Every call runs to its end even when another fails, so none is left running while the rollout
        # releases its resources; an infrastructure failure among them then ends the rollout.
        outcomes = await asyncio.gather(*(self._call(c, r.ctx) for c in r.parsed.tool_calls), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        results = [o for o in outcomes if isinstance(o, ToolResult)]
        traj.timings["tools"] = traj.timings.get("tools", 0.0) + time.perf_counter() - t0
        new_messages: list[dict[str, Any]] = []
        for error in r.parsed.errors:
            message = f"Error: could not parse the tool call: {error}"
            traj.tool_calls.append(ToolCallRecord(r.turn - 1, "<parse error>", None, message, error))
            new_messages.append({"role": "tool", "name": "error", "content": message})
        for call, result in zip(r.parsed.tool_calls, results, strict=True):
            traj.tool_calls.append(ToolCallRecord(r.turn - 1, call.name, call.arguments, result.observation,
                                                  result.error, result.latency))
            new_messages.append({"role": "tool", "name": call.name, "content": result.observation})
        glue = self.renderer.glue_ids(r.messages, new_messages, r.last.token_ids, self.engine.stop_token_ids)
        r.messages.extend(new_messages)
        r.state = hashlib.sha1(json.dumps([m["content"] for m in new_messages]).encode()).hexdigest()[:16]
        if len(traj.token_ids) + len(glue) >= self.token_limit:
            traj.finish_reason = "length"
            return State.DONE
        traj.extend_observation(glue)
        if r.ctx.ended is not None:  # the environment is over (context.end_episode): no turn after it
            traj.final_answer = r.ctx.ended
            traj.finish_reason = "answer"
            return State.DONE
        return State.GENERATE

    async def _call(self, call: ToolCall, ctx: RolloutContext) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            message = f"unknown tool '{call.name}'; available tools: {', '.join(sorted(self.tools)) or 'none'}"
            return ToolResult(f"Error: {message}", message)
        return await tool.invoke(call.arguments, context=ctx)

    async def _score(self, traj: Trajectory, ctx: RolloutContext) -> None:
        if self.reward is None:
            return
        t0 = time.perf_counter()
        result = await self.reward.score(traj.final_answer, traj, ctx, traj.sample)
        traj.reward, traj.reward_metrics, traj.reward_error = result.reward, result.metrics, result.error
        traj.reward_traceback = result.traceback
        if result.turn_rewards is not None:
            name = getattr(self.reward, "name", "reward")
            traj.turn_rewards += [TurnReward(k, v, name) for k, v in enumerate(result.turn_rewards[:traj.num_turns])]
        traj.timings["reward"] = time.perf_counter() - t0

    # ------------------------------------------------------------------ many rollouts
    async def run(
        self, samples: Sequence[Mapping[str, Any]], group_size: int, sampling: Sampling,
        max_concurrency: int | None = None, first_index: int = 0,
    ) -> list[Trajectory]:
        """``group_size`` rollouts of every sample, all concurrent (up to ``max_concurrency``).

        Returns trajectories ordered sample by sample, ``group_size`` consecutive ones per sample. Rollout
        ``k`` of sample ``i`` has index ``first_index + i * group_size + k`` (its sampler seeds come from it).
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if self.reward is not None:
            for sample in samples:
                self.reward.check_sample(sample)
        groups = _GroupForks(self.resources, self.tools.values(), group_size)
        # Admitted no faster than the rollout-scoped pools hold instances (``ResourceEngine.rollout_pools``): a
        # rollout that queued for one behind whole episodes would time out there, lost rather than slow. A
        # pool the groups fork holds one instance a group, from its first rollout's start to its last one's end;
        # any other holds one a rollout.
        pools: dict[str, int] = getattr(self.resources, "rollout_pools", dict)()
        bounds = [m for name, m in pools.items() if name not in groups.names]
        limit = asyncio.Semaphore(min([max_concurrency or len(samples) * group_size or 1, *bounds]))
        groups.admit(min((m for name, m in pools.items() if name in groups.names), default=None))

        async def one(i: int, sample: Mapping[str, Any], k: int) -> Trajectory:
            async with groups.admitted(i), limit:
                group = str(sample.get("id", i))
                held = groups.held(i, sample, k, owner=group) if groups.names else None
                return await self.run_one(sample, sampling, index=first_index + i * group_size + k, group_id=group,
                                          rollout_id=f"{group}/{k}", held=held)

        tasks = [asyncio.ensure_future(one(i, s, k)) for i, s in enumerate(samples) for k in range(group_size)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.shield(groups.aclose())


class Episode:
    """One rollout as a handle an algorithm can drive: ``advance`` it a turn at a time, ``branch`` it into
    copies that continue from the same point (its conversation, and a fork of every resource it holds), and
    ``finish`` it (run to the end, score, release). ``RolloutRunner.run_one`` is ``episode(...).finish()``.

        ep = runner.episode(sample, sampling)
        await ep.advance(2)                       # two assistant turns and their tool calls
        kids = await ep.branch(4)                 # e.g. a Monte-Carlo estimate of the state's value
        values = [t.reward for t in await asyncio.gather(*(k.finish() for k in kids))]
        await ep.finish()

    A branch continues with a sampler seed of its own, so branches at temperature > 0 diverge. Only resources
    that fork (``fork(n)``: the workspace) can be held when branching; ``branch`` refuses the others.
    """

    def __init__(self, runner: RolloutRunner, r: _Rollout, sampling: Sampling,
                 held: Callable[[], Awaitable[Mapping[str, Any]]] | None = None) -> None:
        self.runner, self.r, self.sampling, self._held = runner, r, sampling, held
        self.step: State | None = None  # None until it begins
        self.scored = False
        self.closed = False
        self._started = time.perf_counter()
        self._branches = 0  # branches made so far: each gets seeds no earlier branch had

    @property
    def trajectory(self) -> Trajectory:
        return self.r.traj

    @property
    def context(self) -> RolloutContext:
        return self.r.ctx

    @property
    def done(self) -> bool:
        return self.step is State.DONE

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work``; an error ends the episode as the rollout loop always ended one (typed when it is the
        infrastructure's)."""
        traj = self.r.traj
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except InfrastructureFailure as exc:  # not the agent's doing: typed, so the trainer can leave it out
            traj.finish_reason = "error"
            traj.error = f"{type(exc).__name__}: {exc}"
            traj.failure, traj.failure_reason = exc.kind, str(exc)
            self.step, self.scored = State.DONE, True
        except Exception as exc:  # a broken rollout is reported, never a crashed batch
            traj.finish_reason = "error"
            traj.error = f"{type(exc).__name__}: {exc}"
            self.step, self.scored = State.DONE, True

    async def _begin(self) -> None:
        r, runner = self.r, self.runner
        if self._held is not None:
            for name, instance in (await self._held()).items():
                r.ctx.adopt(name, instance)
        r.messages = initial_messages(r.traj.sample, runner.system_prompt)
        r.traj.extend_prompt(runner.renderer.prompt_ids(r.messages))
        r.traj.prompt_length = len(r.traj.token_ids)
        self.step = State.GENERATE
        if r.traj.prompt_length >= runner.token_limit:
            r.traj.finish_reason = "length"
            self.step = State.DONE

    async def advance(self, turns: int = 1) -> bool:
        """Run up to ``turns`` more assistant turns (each with its tool calls); returns whether it is done."""
        if self.closed:
            raise RuntimeError("this episode was finished or closed; branch it before finishing to go on from it")

        async def work() -> None:
            if self.step is None:
                await self._begin()
            target = self.r.turn + turns
            while self.step is not State.DONE and (self.step is State.TOOLS or self.r.turn < target):
                if self.step is State.GENERATE:
                    self.step = await self.runner._generate(self.r, self.sampling)
                else:
                    self.step = await self.runner._tools(self.r)

        await self._guarded(work)
        return self.done

    async def branch(self, n: int) -> list[Episode]:
        """``n`` copies of this episode at its current point, each holding forks of its resources and
        continuing with sampler seeds of its own; this episode stays as it is (finish or close it too)."""
        if self.step is None:
            await self.advance(0)
        r = self.r
        forks = await r.ctx.fork_held(n)
        kids = []
        for held in forks:
            rollout_id = f"{r.traj.rollout_id}/b{self._branches}"
            traj = copy.deepcopy(r.traj)
            traj.rollout_id = rollout_id
            ctx = RolloutContext(sample=dict(r.ctx.sample), rollout_id=rollout_id, group_id=r.ctx.group_id,
                                 resources=r.ctx.resources, info=dict(r.ctx.info), turn=r.ctx.turn,
                                 turn_rewards=list(r.ctx.turn_rewards))
            for name, instance in held.items():
                ctx.adopt(name, instance)
            # A seed stream of its own per branch (turn_seed mixes in the index).
            self._branches += 1
            state = _Rollout(traj, ctx, copy.deepcopy(r.messages), r.index * 1_000_003 + self._branches, r.turn,
                             r.last, r.parsed, r.state)
            kid = Episode(self.runner, state, self.sampling)
            kid.step, kid.scored, kid._started = self.step, self.scored, self._started
            kids.append(kid)
        return kids

    async def finish(self) -> Trajectory:
        """Run to the end, score the trajectory and release what the rollout holds (also when it fails)."""
        r, traj = self.r, self.r.traj
        try:
            await self.advance(self.runner.max_turns + 1)
            if not self.scored:
                traj.timings["rollout"] = time.perf_counter() - self._started
                traj.turn_rewards += [TurnReward(turn, value, reason) for turn, value, reason in r.ctx.turn_rewards]
                self.scored = True
                await self._guarded(lambda: self.runner._score(traj, r.ctx))
        finally:
            traj.messages = r.messages
            await self.aclose()
        return traj

    async def aclose(self) -> None:
        """Release (or close, for forks) every resource the episode holds; idempotent."""
        if self.closed:
            return
        self.closed = True
        # Shielded so a cancelled rollout still returns its resources to the pools.
        await asyncio.shield(self.r.ctx.aclose())

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _GroupForks:
    """The resources whose instances a group shares by forking (``ResourceEngine.group_forks``): per sample,
    one instance is prepared for it and forked once per rollout; released when the group's last rollout ends
    (or when ``run`` does)."""

    def __init__(self, resources: ResourceProvider | None, tools: Iterable[Tool], group_size: int) -> None:
        wants = getattr(resources, "group_forks", None)
        used = sorted({t.resource for t in tools if t.resource is not None})
        self.names = [name for name in used if callable(wants) and wants(name)] if group_size > 1 else []
        self.resources = resources
        self.group_size = group_size
        self.groups: dict[int, asyncio.Task[dict[str, list[Any]]]] = {}
        self.leases: dict[int, list[Any]] = {}
        self.handed: set[tuple[int, int]] = set()
        self.gate: asyncio.Semaphore | None = None
        self.entries: dict[int, asyncio.Future[Any]] = {}
        self.left: dict[int, int] = {}

    def admit(self, slots: int | None) -> None:
        """Let no more than ``slots`` groups hold their prepared instances at once (None: no bound)."""
        self.gate = asyncio.Semaphore(slots) if slots is not None and self.names else None

    @contextlib.asynccontextmanager
    async def admitted(self, i: int) -> AsyncIterator[None]:
        """Rollout ``i``'s group holds a slot from its first rollout's entry to its last one's exit, when the
        group's prepared instances go back to their pools."""
        if self.gate is not None:
            if i not in self.entries:
                self.entries[i] = asyncio.ensure_future(self.gate.acquire())
            await asyncio.shield(self.entries[i])
        try:
            yield
        finally:
            self.left[i] = self.left.get(i, 0) + 1
            if self.left[i] == self.group_size:
                await asyncio.shield(self._end(i))

    async def _end(self, i: int) -> None:
        task = self.groups.get(i)
        if task is not None and task.done():
            await self._close_group(i, task)
        entry = self.entries.get(i)
        if self.gate is not None and entry is not None and entry.done() and not entry.cancelled():
            self.gate.release()

    async def _close_group(self, i: int, task: asyncio.Task[dict[str, list[Any]]]) -> None:
        """Close the forks of group ``i`` no rollout took (it was cancelled first) and release its instances."""
        del self.groups[i]
        if not task.cancelled() and task.exception() is None:
            for forks in task.result().values():
                for k, fork in enumerate(forks):
                    if (i, k) not in self.handed:
                        await fork.close()
        for lease in self.leases.pop(i, []):
            assert self.resources is not None
            await self.resources.release(lease)

    def held(self, i: int, sample: Mapping[str, Any], k: int,
             owner: str) -> Callable[[], Awaitable[Mapping[str, Any]]]:
        async def take() -> Mapping[str, Any]:
            if i not in self.groups:
                self.groups[i] = asyncio.ensure_future(self._prepare(i, sample, owner))
            copies = await asyncio.shield(self.groups[i])
            self.handed.add((i, k))
            return {name: forks[k] for name, forks in copies.items()}

        return take

    async def _prepare(self, i: int, sample: Mapping[str, Any], owner: str) -> dict[str, list[Any]]:
        copies: dict[str, list[Any]] = {}
        for name in self.names:
            lease, forks = await self.resources.fork_group(name, self.group_size, sample=sample,  # type: ignore[union-attr]
                                                           owner=owner)
            self.leases.setdefault(i, []).append(lease)
            copies[name] = forks
        return copies

    async def aclose(self) -> None:
        """End the groups still open when ``run`` ends: a preparation still running is cancelled (its
        instance goes back unhealthy), the rest closed as their last rollout would have."""
        for i, task in list(self.groups.items()):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await self._close_group(i, task)
        for entry in self.entries.values():
            entry.cancel()
