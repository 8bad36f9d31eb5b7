"""``@reward``: a function that scores a finished trajectory.

A reward receives, by parameter name, whatever it declares from: ``final_answer``, ``trajectory``,
``context`` and every field of the task sample (``answer``, ``tests``, ...). It returns a float, or a dict
with ``reward`` plus extra metrics. Sync rewards run in a worker thread so slow ones overlap.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from agentfly.resources.spec import InfrastructureFailure

if TYPE_CHECKING:  # the rollout layer calls rewards: only the type goes the other way
    from agentfly.rollout.trajectory import Trajectory

BUILTIN_INPUTS = ("final_answer", "trajectory", "context")


class RewardError(ValueError):
    """A reward that cannot be called with what a sample provides, or that returned something unusable."""


@dataclass
class RewardResult:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    turn_rewards: list[float] | None = None  # per-turn scores, when the reward returned ``turn_rewards``
    traceback: str | None = None  # where the reward raised ``error``: what a user needs to fix it


@dataclass
class Reward:
    fn: Callable[..., Any]
    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    takes_all: bool
    resource: str | None = None  # a model service the reward calls (``context.resource(name)``), e.g. "judge"

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def check_sample(self, sample: Mapping[str, Any]) -> None:
        """Raise RewardError naming any input this reward needs that neither the runtime nor the sample has."""
        missing = [n for n in self.required if n not in BUILTIN_INPUTS and n not in sample]
        if missing:
            raise RewardError(
                f"reward '{self.name}' needs {', '.join(repr(m) for m in missing)} but the task sample only has "
                f"{sorted(sample)}; add the field to the task data or give the parameter a default"
            )

    def bind(self, final_answer: str | None, trajectory: Trajectory, context: Any, sample: Mapping[str, Any]) -> dict[str, Any]:
        available: dict[str, Any] = {**sample, "final_answer": final_answer, "trajectory": trajectory, "context": context}
        if self.takes_all:
            return available
        self.check_sample(sample)
        return {n: available[n] for n in (*self.required, *self.optional) if n in available}

    async def score(self, final_answer: str | None, trajectory: Trajectory, context: Any, sample: Mapping[str, Any]) -> RewardResult:
        """Compute the reward; an exception becomes reward 0 with the error recorded, never a lost batch."""
        try:
            kwargs = self.bind(final_answer, trajectory, context, sample)
            value = await self.fn(**kwargs) if self.is_async else await asyncio.to_thread(self.fn, **kwargs)
            return normalise(self.name, value)
        except (asyncio.CancelledError, InfrastructureFailure):
            raise  # a judge or service that failed says nothing of the answer: the rollout ends as a failure
        except Exception as exc:
            return RewardResult(0.0, {}, f"reward '{self.name}' raised {type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc(limit=-8)[-4000:])


def normalise(name: str, value: Any) -> RewardResult:
    if isinstance(value, bool):
        return RewardResult(float(value))
    if isinstance(value, (int, float)):
        return RewardResult(float(value))
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise RewardError(f"reward '{name}' returned a dict without a 'reward' key: {sorted(value)}")
        metrics = {k: float(v) for k, v in value.items()
                   if k not in ("reward", "turn_rewards") and isinstance(v, (int, float))}
        turns = value.get("turn_rewards")
        if turns is not None and (not isinstance(turns, (list, tuple))
                                  or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in turns)):
            raise RewardError(f"reward '{name}' returned turn_rewards={turns!r}; give a list of numbers, one per turn")
        return RewardResult(float(value["reward"]), metrics, turn_rewards=None if turns is None else [float(v) for v in turns])
    raise RewardError(f"reward '{name}' returned {type(value).__name__}; return a float or a dict with 'reward'")


def make_reward(fn: Callable[..., Any], *, name: str | None = None, resource: str | None = None) -> Reward:
    if isinstance(fn, Reward):
        return fn
    sig = inspect.signature(fn)
    required, optional, takes_all = [], [], False
    for pname, param in sig.parameters.items():
        if param.kind == param.VAR_KEYWORD:
            takes_all = True
        elif param.kind == param.VAR_POSITIONAL:
            raise RewardError(f"reward '{fn.__name__}': *{pname} is not supported; name the inputs you need")
        elif param.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            optional.append(pname)
    if resource is not None and "context" not in (*required, *optional) and not takes_all:
        raise RewardError(f"reward '{fn.__name__}' declares resource={resource!r} but takes no 'context' "
                          "parameter; add one and call await context.resource(...)")
    return Reward(fn, name or fn.__name__, tuple(required), tuple(optional), takes_all, resource)


@overload
def reward(fn: Callable[..., Any], /) -> Reward: ...
@overload
def reward(*, name: str | None = None, resource: str | None = None) -> Callable[[Callable[..., Any]], Reward]: ...


def reward(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
           resource: str | None = None) -> Reward | Callable[[Callable[..., Any]], Reward]:
    """Declare a reward. Use as ``@reward`` or ``@reward(name=..., resource="judge")``; a reward with a
    ``resource`` reads it from its context (``judge = await context.resource("judge")``)."""
    if fn is not None:
        return make_reward(fn)
    return lambda f: make_reward(f, name=name, resource=resource)
