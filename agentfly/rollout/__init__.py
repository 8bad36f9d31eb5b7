"""The rollout layer: the async multi-turn agent loop and token-exact trajectories."""

from agentfly.rollout.loop import Episode, RolloutRunner, initial_messages
from agentfly.rollout.mask import mask_segments, visualize_mask
from agentfly.rollout.render import ChatRenderer, TemplateError
from agentfly.rollout.trajectory import ToolCallRecord, Trajectory, Turn, TurnReward

__all__ = ["ChatRenderer", "Episode", "RolloutRunner", "TemplateError", "ToolCallRecord", "Trajectory", "Turn", "TurnReward",
           "initial_messages", "mask_segments", "visualize_mask"]
