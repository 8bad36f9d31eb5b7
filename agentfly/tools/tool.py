"""``@tool``: turn a Python function into something a model can call.

The decorator records metadata (name, description, JSON schema, timeout, resource) and returns a ``Tool``
that is still callable like the function. ``Tool.invoke`` is what the rollout layer uses: it validates the
arguments, runs the function (sync functions in a worker thread), enforces the timeout and turns every
failure into an error observation, so a bad call never crashes a rollout.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, overload

import pydantic

from agentfly.resources.spec import InfrastructureFailure
from agentfly.tools.schema import ArgumentError, signature_schema, validate_arguments

DEFAULT_TIMEOUT = 30.0


@dataclass
class ToolResult:
    """What one tool call produced: the observation text the model will see, and whether it failed."""

    observation: str
    error: str | None = None
    latency: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def to_observation(value: Any) -> str:
    """Render a tool's return value as text for the model."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


@dataclass
class Tool:
    """A callable tool with its JSON schema. Create it with ``@tool``."""

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, object]  # a JSON schema, passed on to the chat template and the validator
    timeout: float | None = DEFAULT_TIMEOUT
    resource: str | None = None
    takes_context: bool = False
    validator: type[pydantic.BaseModel] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn, updated=())

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def schema(self) -> dict[str, object]:
        """The OpenAI-style function schema, as chat templates take it (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def validate(self, arguments: Any) -> dict[str, Any]:
        assert self.validator is not None
        return validate_arguments(self.name, self.validator, arguments)

    async def invoke(self, arguments: Any, context: Any = None) -> ToolResult:
        """Validate ``arguments`` and run the tool; never raises except for cancellation."""
        start = time.perf_counter()
        try:
            kwargs = self.validate(arguments)
            if self.takes_context:
                kwargs["context"] = context
            if self.resource is not None and callable(getattr(context, "resource", None)):
                # Acquire before the timeout clock starts: a wait for a busy pool is bounded by the pool's
                # acquire_timeout and reported as such (ResourceTimeout), not as a slow tool.
                await context.resource(self.resource)
            if self.is_async:
                call: Awaitable[Any] = self.fn(**kwargs)
            else:
                # A sync tool runs in a worker thread so slow tools overlap; on timeout the thread is
                # abandoned (Python cannot kill it), which is why long-running tools should be async or
                # use a sandbox resource that can be killed.
                call = asyncio.to_thread(self.fn, **kwargs)
            value = await asyncio.wait_for(call, self.timeout) if self.timeout else await call
            if inspect.isawaitable(value):  # a sync function that returned a coroutine
                value = await value
            return ToolResult(to_observation(value), None, time.perf_counter() - start)
        except ArgumentError as exc:
            return _failure(str(exc), start)
        except TimeoutError:
            return _failure(f"tool '{self.name}' timed out after {self.timeout:g} s", start)
        except (asyncio.CancelledError, InfrastructureFailure):
            # The infrastructure's failure is not an observation for the model: the rollout ends with it
            # (``Trajectory.failure``) and the trainer leaves it out of the loss.
            raise
        except Exception as exc:
            return _failure(f"tool '{self.name}' raised {type(exc).__name__}: {exc}", start)


def _failure(message: str, start: float) -> ToolResult:
    return ToolResult(f"Error: {message}", message, time.perf_counter() - start)


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    resource: str | None = None,
) -> Tool:
    if isinstance(fn, Tool):
        fn = fn.fn
    doc_description, parameters, validator, takes_context = signature_schema(fn)
    if resource is not None and not takes_context:
        raise TypeError(
            f"tool '{name or fn.__name__}' declares resource={resource!r} but has no 'context' parameter; "
            "add `context` to its signature to reach the resource with `await context.resource(...)`"
        )
    return Tool(
        fn=fn,
        name=name or fn.__name__,
        description=description if description is not None else doc_description,
        parameters=parameters,
        timeout=timeout,
        resource=resource,
        takes_context=takes_context,
        validator=validator,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    resource: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    resource: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool. Use as ``@tool`` or ``@tool(name=..., description=..., timeout=..., resource=...)``.

    The JSON schema comes from the type hints; descriptions from the docstring's summary and ``Args:``.
    A parameter named ``context`` receives the rollout's ``RolloutContext`` and is hidden from the schema.
    """
    if fn is not None:
        return make_tool(fn)

    def decorate(f: Callable[..., Any]) -> Tool:
        return make_tool(f, name=name, description=description, timeout=timeout, resource=resource)

    return decorate
