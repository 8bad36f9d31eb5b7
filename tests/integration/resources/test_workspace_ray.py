"""The coding workspace on the ray backend: a code-repair rollout's tools (bash with git and pytest, read_file,
write_file, run_tests) and its reward run on a workspace that lives on a sandbox node of a real two-node Ray
cluster, and a reset workspace serves the next rollout clean."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from agentfly.context import RolloutContext  # noqa: E402
from agentfly.resources import Pool, ResourceEngine  # noqa: E402
from agentfly.resources.backends.ray import RaySettings, on_ray  # noqa: E402
from agentfly.rewards.builtin.repair import repair_tests  # noqa: E402
from agentfly.rollout.trajectory import Trajectory  # noqa: E402
from agentfly.tasks import get_task  # noqa: E402
from agentfly.tools.builtin.workspace import WORKSPACE, bash, read_file, run_tests, write_file  # noqa: E402
from tests.ray_cluster import ray_cluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ray_cluster({"sandbox": 2}) as c:
        yield c


@pytest.mark.timeout(600)
async def test_a_repair_rollout_edits_and_tests_its_repository_on_a_workspace_on_a_sandbox_node(cluster: Cluster) -> None:
    first, second = get_task("code_repair").samples("test", 2, 0)
    spec = on_ray(WORKSPACE.replace(pool=Pool(0, 1), acquire_timeout=180,
                                    options={"ray": {"resources": {"sandbox": 1}}}))
    head = ray.get_runtime_context().get_node_id()
    engine = ResourceEngine([spec], ray=RaySettings(job="workspace-ray", lease_check_interval=0.5, orphan_timeout=30))
    async with engine:
        context = RolloutContext(sample=first, rollout_id="r0", group_id="g0", resources=engine)
        shown = await bash.invoke({"command": "git log --oneline | wc -l; python -m pytest -q 2>&1 | tail -n 1"},
                                  context=context)
        assert shown.ok and shown.observation.startswith("1\n") and " failed" in shown.observation, shown.observation
        (path, fixed), = first["fixed"].items()
        assert (await read_file.invoke({"path": path}, context=context)).observation.rstrip() \
            == first["files"][path].rstrip()
        assert (await write_file.invoke({"path": path, "content": fixed}, context=context)).ok
        report = await run_tests.invoke({}, context=context)
        assert f"{first['n_tests']} passed" in report.observation, report.observation
        workspace = await context.resource("workspace")
        assert workspace.node != head  # on the sandbox node, not the driver's
        trajectory = Trajectory(sample=first, rollout_id="r0", group_id="g0")
        scored = await repair_tests.score("done", trajectory, context, first)
        assert scored.reward == 1.0 and scored.metrics["edits"] == 1 and scored.metrics["test_runs"] == 1
        assert scored.metrics["commands"] == 1 and "+" in trajectory.artifacts["diff"]
        await context.aclose()
        await engine.settle()

        # The pool's one workspace, reset, serves the next rollout: its own project, nothing of the first.
        context = RolloutContext(sample=second, rollout_id="r1", group_id="g1", resources=engine)
        listed = await bash.invoke({"command": "git status --short | wc -l; ls"}, context=context)
        assert listed.observation.startswith("0\n") and second["project"] in listed.observation
        assert first["project"] == second["project"] or first["project"] not in listed.observation
        stats = engine.stats()["workspace"]
        await context.aclose()
    assert stats["created"] == 1
