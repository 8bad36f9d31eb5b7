"""``engine: remote`` for the trainer: the job's fleet of vLLM servers, found or started.

With ``engine_servers`` the job samples from servers an operator runs (and syncs their weights, which the
operator allowed by giving them to the job); with ``engine_replicas: N`` it starts N servers on
``model.path`` (``agentfly.engines.remote.start_servers``), logs them under ``<output_dir>/servers/`` and
stops them when the run ends or fails (the engine owns them: ``Trainer.train`` closes it in its ``finally``).
A cancelled job's worker ends the training process; a killed one takes its servers with it, since each
server dies with the process that started it (``PR_SET_PDEATHSIG``) and ``stop`` ends its process group.

Data-parallel ranks share one fleet: rank 0 finds or starts the servers and tells the others their
addresses; every rank samples from all of them, and a weight sync is a collective (``RankPeers``) in which
rank 0 alone pushes the weights while every rank holds its requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentfly.engines.base import Engine
    from trainer.config import Config


def build_remote_engine(config: Config) -> Engine:
    from agentfly.agents.agent import build_engine
    from agentfly.engines.remote import start_servers
    from trainer import distributed as dist

    out = Path(config.output_dir)
    sync_dir = config.engine_sync_dir or str(out / "weight-sync")
    peers = RankPeers() if dist.world_size() > 1 else None
    servers: list[Any] = []
    if peers is None or peers.leader:
        servers = list(config.engine_servers) or start_servers(config.model.path, config.engine_replicas,
                                                               seed=config.seed, log_dir=str(out / "servers"))
    if peers is not None:  # the other ranks sample from rank 0's fleet; rank 0 alone owns what it started
        urls = peers.share([s if isinstance(s, str) else s.url for s in servers] if peers.leader else None)
        servers = servers if peers.leader else urls
    return build_engine(config.model.path, "remote", servers=servers, max_concurrency=config.engine_max_concurrency,
                        sync_dir=sync_dir, peers=peers)


class RankPeers:
    """``SyncPeers`` over the job's ranks: rank 0 leads. Its collectives run on a gloo group of their own,
    from whichever thread syncs the weights (the trainer's, or the async producer's), never beside the
    gradient all-reduce on the default group. Every rank makes it at the same point (a group is a collective)."""

    def __init__(self) -> None:
        from trainer import distributed as dist

        self.group = dist.side_group()
        self.leader = dist.rank() == 0

    def barrier(self) -> None:
        import torch.distributed

        torch.distributed.barrier(group=self.group)

    def share(self, value: Any) -> Any:
        import torch.distributed

        box = [value]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
