"""The gateway as the trainer's rollout source (``gateway.enabled``): the rollout stage hands the step's samples
to agents through the job's OpenAI-compatible endpoint and waits for their rollouts, instead of running the
agent loop in process.

``GatewayAgent`` is the ``Agent`` the trainer's stages call (``collect``, ``evaluate``): its ``run_sync``
hands out ``group_size`` rollouts per sample and returns their trajectories in the order the rollout loop
would, so dynamic sampling, infrastructure-failure exclusion, rewards, advantages and the update run
unchanged. The trainer steps when the batch is complete; in ``rollout.mode: async`` the producer's agent is a
``GatewayAgent`` over the producer's engine, so its batches are handed out while the trainer updates, within
``rollout.max_staleness`` versions. One gateway (server, keys) serves every agent of a run; it closes, and
revokes every key, when the last of them closes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentfly.agents.agent import Agent

if TYPE_CHECKING:
    from agentfly.engines.base import Engine, Sampling
    from agentfly.gateway import Gateway
    from agentfly.gateway.server import GatewayServer
    from agentfly.rollout.trajectory import Trajectory
    from trainer.config import Config

_lock = threading.Lock()
_running: dict[str, tuple[GatewayServer, int]] = {}  # output_dir -> (server, agents using it)


def _acquire(config: Config, engine: Engine, reward: Any) -> GatewayServer:
    """The run's gateway server, started by its first agent."""
    from agentfly.gateway import Gateway, GatewayLimits
    from agentfly.gateway.server import GatewayServer
    from agentfly.rewards.reward import make_reward

    key = os.path.abspath(config.output_dir)
    with _lock:
        if key in _running:
            server, users = _running[key]
            _running[key] = (server, users + 1)
            return server
        g, r = config.gateway, config.rollout
        # Every limit is the config's setting of the same name (gateway.<name>).
        limits = GatewayLimits(**{f.name: getattr(g, f.name) for f in dataclasses.fields(GatewayLimits)})
        gateway = Gateway(engine, parser=r.parser, reward=make_reward(reward) if reward is not None else None,
                          system_prompt=r.system_prompt, chat_template_kwargs=r.chat_template_kwargs, limits=limits)
        server = GatewayServer(gateway, host=g.host, port=g.port).start()
        _running[key] = (server, 1)
        write_endpoint(Path(config.output_dir), server.url, gateway.job_key)
        return server


def write_endpoint(out: Path, url: str, job_key: str) -> None:
    """``<output_dir>/gateway.json``: where the team's agents connect, and the job's key (a secret, readable by
    the job's owner only: the file is made 0600)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gateway.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "job_key": job_key}, f)


def _release(config: Config) -> None:
    key = os.path.abspath(config.output_dir)
    with _lock:
        server, users = _running[key]
        if users > 1:
            _running[key] = (server, users - 1)
            return
        del _running[key]
    server.close()  # revokes every key: they are the job's, and the job is over
    path = Path(config.output_dir) / "gateway.json"
    path.unlink(missing_ok=True)


class GatewayAgent(Agent):
    """An ``Agent`` whose rollouts are driven by agents elsewhere through the job's gateway.

    reward: the job's reward function (``rollout.reward``), scoring rollouts that end without an API reward.
    """

    def __init__(self, config: Config, engine: Engine, reward: Any = None) -> None:
        super().__init__(engine, parser=config.rollout.parser, max_turns=config.rollout.max_turns,
                         system_prompt=config.rollout.system_prompt,
                         chat_template_kwargs=config.rollout.chat_template_kwargs)
        self.config = config
        self.server = _acquire(config, engine, reward)
        self.stop = threading.Event()  # set by close: a wait in progress ends
        self._closed = False

    @property
    def gateway(self) -> Gateway:
        return self.server.gateway

    @property
    def url(self) -> str:
        return self.server.url

    def run_sync(self, samples: Sequence[Mapping[str, Any]], group_size: int = 1,
                 sampling: Sampling | None = None, first_index: int = 0) -> list[Trajectory]:
        """Hand out ``group_size`` rollouts of every sample and wait until each has ended (rewarded, finished, or
        failed as ``client_lost``); trajectories ordered sample by sample, as ``Agent.run_sync`` orders them."""
        import agentfly as af

        ids = self.gateway.hand_out(samples, group_size, sampling or af.Sampling(), engine=self.engine,
                                    first_index=first_index)
        return self.gateway.wait(ids, stop=self.stop)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop.set()
        _release(self.config)
        super().close()
