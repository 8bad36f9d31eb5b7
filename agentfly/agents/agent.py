"""``Agent``: a model with its chat template, tools, tool-call parser, reward and limits.

    agent = af.Agent(model="runs/tiny", tools=[calculator], reward=math_equal, parser="hermes", max_turns=4)
    trajectories = agent.run_sync(samples, group_size=4, sampling=af.Sampling(temperature=1.0))
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentfly.context import ResourceProvider
from agentfly.engines.base import Engine, Sampling
from agentfly.rewards.reward import Reward, make_reward
from agentfly.rollout.loop import RolloutRunner
from agentfly.rollout.parsers import Parser, get_parser
from agentfly.rollout.trajectory import Trajectory
from agentfly.tools.tool import Tool, make_tool

if TYPE_CHECKING:
    from agentfly.resources.engine import ResourceEngine

ENGINES = ("hf", "vllm", "remote")


def build_engine(model: str | os.PathLike[str] | Any, engine: str, **kwargs: Any) -> Engine:
    """The named engine on ``model``, a local directory; the keyword arguments go to the engine.

    ``hf`` also takes a loaded module with its ``tokenizer=`` (the engine then shares the module: the
    trainer's weights are the engine's). ``remote`` samples from running servers of ``model``, given as
    ``servers=`` (base URLs, or the ``ServerProcess``es ``agentfly.engines.remote.start_servers`` started)."""
    if engine == "hf":
        from agentfly.engines.hf import HFEngine

        return HFEngine(model, **kwargs)
    if engine == "vllm":
        from agentfly.engines.vllm import VLLMEngine

        return VLLMEngine(model, **kwargs)
    if engine == "remote":
        from agentfly.engines.remote import RemoteEngine

        return RemoteEngine(kwargs.pop("servers", ()), model, **kwargs)
    raise ValueError(f"unknown engine {engine!r}; choose one of {ENGINES}")


_ORPHANED: list[asyncio.Runner] = []  # loops of agents that were garbage-collected unclosed


def _close_orphans() -> None:
    while _ORPHANED:
        try:
            runner = _ORPHANED.pop()
        except IndexError:
            return
        _close_runner(runner)


atexit.register(_close_orphans)


def _close_runner(runner: asyncio.Runner) -> None:
    """Close ``run_sync``'s loop, cancelling what is left on it. That needs the loop to run, which cannot
    happen in a thread where another loop runs (an agent closed or dropped inside async code): then it
    closes from a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        runner.close()
        return
    closer = threading.Thread(target=runner.close, name="agent-loop-close")
    closer.start()
    closer.join()


class Agent:
    """model: a local model directory, or an ``Engine`` already built (e.g. the trainer's).
    tools: ``@tool`` objects (plain functions are wrapped). reward: a ``@reward`` (or plain function).
    parser: ``"hermes"``, ``"react"`` or a ``Parser``. max_turns: assistant turns per rollout.
    max_length: the most tokens in a trajectory (defaults to the engine's context length).
    resources: the job's ``ResourceEngine`` for tools that declare ``resource=``.
    owns_resources: whether ``close`` (and leaving ``async with agent``) also closes ``resources``: True for
    pools made for this agent, False (the default) for pools the caller shares with other agents and closes.
    max_concurrency: rollouts in flight at once (with the pool limits, this bounds memory).
    chat_template_kwargs: extra chat template variables, e.g. ``{"enable_thinking": False}`` (Qwen3).

    ``run_sync`` keeps one event loop for all its calls, so resource instances stay in their pools between
    calls (a trainer's steps, an evaluation's batches); ``close`` stops the pools it owns, then ends that loop.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | Engine,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        reward: Reward | Callable[..., Any] | None = None,
        parser: str | Parser = "hermes",
        max_turns: int = 4,
        engine: str = "hf",
        system_prompt: str | None = None,
        max_length: int | None = None,
        resources: ResourceEngine | ResourceProvider | None = None,
        max_concurrency: int | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        owns_resources: bool = False,
    ) -> None:
        if isinstance(model, Engine):
            self.engine = model
            self.model_name = getattr(model, "model_name", None)
        else:
            self.engine = build_engine(model, engine, **dict(engine_kwargs or {}))
            self.model_name = os.fspath(model)
        self.tools: dict[str, Tool] = {}
        for t in tools:
            t = t if isinstance(t, Tool) else make_tool(t)
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}; give one a different name with @tool(name=...)")
            self.tools[t.name] = t
        self.reward = make_reward(reward) if reward is not None else None
        self.parser = get_parser(parser)
        self.max_concurrency = max_concurrency
        self.runner = RolloutRunner(
            engine=self.engine, tools=self.tools, parser=self.parser, reward=self.reward, max_turns=max_turns,
            max_length=max_length, system_prompt=system_prompt, resources=resources, model_name=self.model_name,
            chat_template_kwargs=chat_template_kwargs,
        )
        self.owns_resources = owns_resources
        self._loop: asyncio.Runner | None = None  # run_sync's event loop, made on first use
        self._loop_owner: Agent = self  # share_loop: the agent whose loop this is (it closes it)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def resources(self) -> ResourceEngine | ResourceProvider | None:
        """The resource pools this agent's tools draw from (None when it has none)."""
        return self.runner.resources

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """``close`` for async code: the owned pools are stopped on the running loop (where ``await
        agent.run`` filled them), then ``run_sync``'s loop, if one was made, ends."""
        aclose = getattr(self.resources, "aclose", None) if self.owns_resources else None
        if callable(aclose):
            await aclose()
        self.close()

    async def run(self, samples: Sequence[Mapping[str, Any]], group_size: int = 1,
                  sampling: Sampling | None = None, first_index: int = 0) -> list[Trajectory]:
        """Roll out ``group_size`` trajectories per sample, concurrently; ordered sample by sample.

        first_index: the rollout index of the first trajectory (sampler seeds derive from it), so that a
        data-parallel rank rolling out prompts ``i..j`` of a step samples them as one process doing all would.
        """
        return await self.runner.run(samples, group_size, sampling or Sampling(), self.max_concurrency,
                                     first_index=first_index)

    def run_sync(self, samples: Sequence[Mapping[str, Any]], group_size: int = 1,
                 sampling: Sampling | None = None, first_index: int = 0) -> list[Trajectory]:
        """``run`` for code that is not async. Every call of this agent runs on the same event loop, kept
        between calls: the resource pools belong to the loop that filled them (``ResourceEngine``), so a
        simulator or sandbox made in one call serves the next instead of being stopped and started again
        (asyncio.run per call would do that at every training step)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("Agent.run_sync was called inside a running event loop; use `await agent.run(...)` "
                               "there")
        runner = self._runner()
        if runner.get_loop().is_running():
            raise RuntimeError("this Agent's run_sync (or that of an agent sharing its loop) is already running in "
                               "another thread; give each thread an Agent of its own (they may share the engine)")
        return runner.run(self.run(samples, group_size, sampling, first_index))

    def _runner(self) -> asyncio.Runner:
        owner = self._loop_owner
        if owner._loop is None:
            owner._loop = asyncio.Runner()
            # At the latest when the agent goes, or at exit. Not closed inside the finalizer: the garbage
            # collector may run it anywhere, even inside threading's own bookkeeping while a new thread starts
            # (where joining the loop's executor threads deadlocks); the next run_sync or close of any agent
            # closes it, in ordinary code.
            weakref.finalize(owner, _ORPHANED.append, owner._loop)
        _close_orphans()
        return owner._loop

    def share_loop(self, other: Agent) -> None:
        """Run ``run_sync`` on ``other``'s event loop, so that this agent can use the resource pools that
        live there (an evaluation beside a rollout producer). The two must not run at the same time (the
        caller serializes them; a second one refuses); ``other`` closes the loop."""
        self.close()
        self._loop_owner = other._loop_owner

    def close(self) -> None:
        """Stop the pools this agent owns (``owns_resources``) on the loop their instances belong to, then end
        ``run_sync``'s event loop (its pending tasks are cancelled). Pools it does not own are the caller's to
        close. An agent without owned pools may run again after ``close``, on a new loop."""
        close = getattr(self.resources, "close", None) if self.owns_resources else None
        if callable(close):
            close()
        if self._loop_owner is not self:  # a shared loop is its owner's to close
            self._loop_owner = self
            return
        loop, self._loop = self._loop, None
        if loop is not None:
            _close_runner(loop)
        _close_orphans()
