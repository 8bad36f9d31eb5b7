"""AgentFly's trainer: masked RL for agents (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, PPO) on trajectories from
``agentfly``'s rollout layer, with checkpoints, an event stream and a CLI (``agentfly train CONFIG.yaml``).

    from trainer import load_config, train
    result = train(load_config("examples/calculator/grpo.yaml"), sinks=[CallbackSink(print)])
"""

import os
from collections.abc import Callable, Sequence
from typing import Any

from trainer.config import Config, ConfigError, load_config
from trainer.events import CallbackSink, EventStream, JSONLSink, Sink, TensorBoardSink


def train(config: Config, sinks: Sequence[Sink] = (), resume: str | os.PathLike[str] | None = None,
          should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train with ``config``; see ``trainer.loop.train`` (imported lazily: it pulls in torch)."""
    from trainer.loop import train as _train

    return _train(config, sinks=sinks, resume=resume, should_stop=should_stop)


__all__ = ["CallbackSink", "Config", "ConfigError", "EventStream", "JSONLSink", "Sink", "TensorBoardSink",
           "load_config", "train"]
