"""The resource layer: pools of sandboxes, environments and services that rollouts hold while they run.

See ``engine.py`` for the lifecycle and ``pool.py`` for the invariants. ``agentfly.resources`` knows
nothing of agents: the rollout layer reaches it through ``RolloutContext``.
"""

from agentfly.resources.backends.local import Isolation, Limits, sandbox_root, sweep_sandboxes
from agentfly.resources.engine import ResourceEngine
from agentfly.resources.judge import Judge, JudgeParseError, RewardModel, judge_spec, reward_model_spec
from agentfly.resources.pool import Lease
from agentfly.resources.ratelimit import RateLimiter, SharedRateLimiter
from agentfly.resources.sandbox import PythonSandbox
from agentfly.resources.scratchpad import Scratchpad
from agentfly.resources.spec import (
    FAILURE_KINDS,
    InfrastructureFailure,
    Pool,
    Resource,
    ResourceClosed,
    ResourceError,
    ResourceSpec,
    ResourceTimeout,
    UnknownResource,
)
from agentfly.resources.workspace import Shell, Workspace

__all__ = [
    "FAILURE_KINDS",
    "InfrastructureFailure",
    "Isolation",
    "Judge",
    "JudgeParseError",
    "Lease",
    "Limits",
    "Pool",
    "PythonSandbox",
    "RateLimiter",
    "Resource",
    "ResourceClosed",
    "ResourceEngine",
    "ResourceError",
    "ResourceSpec",
    "ResourceTimeout",
    "RewardModel",
    "Scratchpad",
    "SharedRateLimiter",
    "Shell",
    "UnknownResource",
    "Workspace",
    "judge_spec",
    "reward_model_spec",
    "sandbox_root",
    "sweep_sandboxes",
]
