"""TextWorld games on the ray backend: pooled players placed on a real two-node Ray cluster's environment nodes,
each rollout's game played there to a win, the pool's bound and reuse as on the local backend."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from agentfly.context import RolloutContext  # noqa: E402
from agentfly.envs import TEXTWORLD  # noqa: E402
from agentfly.envs.textgames import textworld_available  # noqa: E402
from agentfly.resources import Pool, ResourceEngine  # noqa: E402
from agentfly.resources.backends.ray import RaySettings, on_ray  # noqa: E402
from agentfly.rewards.builtin.env import env_score  # noqa: E402
from agentfly.tasks import get_task  # noqa: E402
from agentfly.tools.builtin.textworld import tw_act  # noqa: E402
from tests.ray_cluster import ray_cluster  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(textworld_available() is not None, reason=str(textworld_available()))]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    os.environ["AGENTFLY_TEXTWORLD_CACHE"] = str(tmp_path_factory.mktemp("textworld-ray-cache"))
    try:
        with ray_cluster({"environment": 2}, {"environment": 2}) as c:
            yield c
    finally:
        os.environ.pop("AGENTFLY_TEXTWORLD_CACHE", None)


@pytest.mark.timeout(600)
async def test_games_are_played_to_a_win_by_players_on_the_environment_nodes(cluster: Cluster, tmp_path: Path) -> None:
    games = [s["game"] for s in get_task("textworld:custom", {"rooms": 2, "objects": 3, "quest_length": 1})
             .samples("test", 3, 0)]
    spec = on_ray(TEXTWORLD.replace(pool=Pool(0, 2), acquire_timeout=180,
                                    options={"ray": {"resources": {"environment": 1}}}))
    head = ray.get_runtime_context().get_node_id()

    async def play(i: int, game: dict) -> tuple[float, float, str]:
        context = RolloutContext(sample={"game": game}, rollout_id=f"r{i}", group_id="g", resources=engine)
        try:
            first = await tw_act.invoke({"command": "look"}, context=context)
            assert first.ok, first.observation
            lease = await context.resource("textworld")
            state = await lease.state()
            for command in state["walkthrough"]:
                await tw_act.invoke({"command": command}, context=context)
            won = (await env_score.score(None, None, context, context.sample)).reward
            return won, sum(v for _, v, _ in context.turn_rewards), lease.node
        finally:
            await context.aclose()

    engine = ResourceEngine([spec], ray=RaySettings(job="textworld-ray", lease_check_interval=0.5,
                                                      orphan_timeout=30))
    async with engine:
        results = await asyncio.gather(*(play(i, g) for i, g in enumerate(games)))
        stats = engine.stats()["textworld"]
    assert [won for won, _, _ in results] == [1.0, 1.0, 1.0]
    assert all(points == pytest.approx(1.0) for _, points, _ in results)
    assert head not in {node for _, _, node in results}
    assert stats["created"] <= 2  # three rollouts, a pool of two: one player was reset and reused
