"""AgentFly: agentic reinforcement learning for language-model agents.

    import agentfly as af

    @af.tool
    def calculator(expression: str) -> str: ...

    agent = af.Agent(model=af.models.build_tiny("runs/tiny"), tools=[calculator], reward=af.rewards.builtin.math_equal)
    trajectories = agent.run_sync(samples, group_size=4, sampling=af.Sampling(temperature=1.0))
"""

from agentfly import envs, mcp, models, resources, retrieval, rewards, tasks, tools
from agentfly.agents import Agent
from agentfly.context import RolloutContext
from agentfly.engines import Engine, Generation, ReplayEngine, Sampling
from agentfly.resources import Pool, ResourceEngine, ResourceSpec, ResourceTimeout
from agentfly.rewards import Reward, reward
from agentfly.rollout import Trajectory, mask_segments, visualize_mask
from agentfly.tools import Tool, tool

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "Engine",
    "Generation",
    "Pool",
    "ReplayEngine",
    "ResourceEngine",
    "ResourceSpec",
    "ResourceTimeout",
    "Reward",
    "RolloutContext",
    "Sampling",
    "Tool",
    "Trajectory",
    "envs",
    "mask_segments",
    "mcp",
    "models",
    "resources",
    "retrieval",
    "reward",
    "rewards",
    "tasks",
    "tool",
    "tools",
    "visualize_mask",
]
