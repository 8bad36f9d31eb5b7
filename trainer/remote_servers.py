"""``engine: remote`` for the trainer: the job's fleet of vLLM servers, found or started.

With ``engine_servers`` the job samples from servers an operator runs (and syncs their weights, which the
operator allowed by giving them to the job); with ``engine_replicas: N`` it starts N servers on
``model.path`` (``agentfly.engines.remote.start_servers``), logs them under ``<output_dir>/servers/`` and
stops them when the run ends or fails (the engine owns them: ``Trainer.train`` closes it in its ``finally``).
A cancelled job's worker ends the training process; a killed one takes its servers with it, since each
server dies with the process that started it (``PR_SET_PDEATHSIG``) and ``stop`` ends its process group.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentfly.engines.base import Engine
    from trainer.config import Config


def build_remote_engine(config: Config) -> Engine:
    import os

    from agentfly.agents.agent import build_engine
    from agentfly.engines.remote import start_servers
    from trainer.config import ConfigError

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        # Every rank would save and push the same weights into the same servers, with no barrier between one
        # rank's sync and another rank's next rollout; one rank drives the fleet until that is in place.
        raise ConfigError(f"engine=remote runs on one training rank (this job has {world}); drop ranks/torchrun, "
                          "or use engine=vllm on each rank", key="engine")

    out = Path(config.output_dir)
    sync_dir = config.engine_sync_dir or str(out / "weight-sync")
    servers = list(config.engine_servers) or start_servers(config.model.path, config.engine_replicas,
                                                           seed=config.seed, log_dir=str(out / "servers"))
    return build_engine(config.model.path, "remote", servers=servers, max_concurrency=config.engine_max_concurrency,
                        sync_dir=sync_dir)
