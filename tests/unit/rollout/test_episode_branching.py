"""Forks in the rollout layer: a GRPO group's rollouts hold forks of one workspace prepared once for their task,
and an episode branched mid-way continues as copies whose conversations and workspaces diverge."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import agentfly as af
from agentfly.engines import Generation, ReplayEngine, Sampling
from agentfly.tools.builtin.workspace import WORKSPACE, bash, read_file, write_file

REPO = {"README": "a project\n"}


def call(name: str, **arguments: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class SeededPolicy(ReplayEngine):
    """Scripted turns that depend on the sampler seed, as a sampling model's do: the rollout layer must give
    each branch a seed of its own for the branches to diverge."""

    def __init__(self, tokenizer: Any, script: Any) -> None:
        self.seed: int | None = None
        super().__init__(tokenizer, lambda prompt: script(prompt, self.seed))

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        self.seed = sampling.seed  # read by the script before the first await below
        return await super().generate(prompt_ids, sampling)


async def test_a_groups_rollouts_hold_forks_of_one_workspace_prepared_once(tiny_tokenizer: Any) -> None:
    def script(prompt: str) -> str:
        if "<tool_response>" not in prompt:
            return call("bash", command="echo $RANDOM >> log.txt; wc -l < log.txt; git log --oneline | wc -l")
        return "done"

    spec = WORKSPACE.replace(pool=af.Pool(min=0, max=2))
    async with af.ResourceEngine([spec]) as resources:
        agent = af.Agent(model=ReplayEngine(tiny_tokenizer, script), tools=[bash], resources=resources)
        samples = [{"id": f"task{i}", "question": f"task {i}", "files": REPO} for i in range(2)]
        trajectories = await agent.run(samples, group_size=4)
        # Each rollout appended to log.txt in a copy of its own: every one counts one line, on one commit.
        assert [t.tool_calls[0].observation for t in trajectories] == ["1\n1"] * 8, trajectories[0].error
        await resources.settle()
        stats = resources.stats()["workspace"]
        assert stats["acquires"] == 2 and stats["created"] <= 2 and stats["in_use"] == 0  # one per group
        pool = resources.pools["workspace"]
        assert all(not any(slot.resource.folder.glob("u*/*")) for slot in pool.instances)  # type: ignore[union-attr]


async def test_more_groups_than_the_workspace_pool_holds_take_turns_and_none_times_out(tiny_tokenizer: Any) -> None:
    # One workspace for three groups, and a queue that gives up after 2 s, less than a group's episodes take:
    # a group's prepared workspace goes back when its last rollout ends, and the next group starts then.
    def script(prompt: str) -> str:
        if "<tool_response>" not in prompt:
            return call("bash", command="sleep 1; echo $RANDOM >> log.txt; wc -l < log.txt")
        return "done"

    spec = WORKSPACE.replace(pool=af.Pool(min=0, max=1), acquire_timeout=2)
    async with af.ResourceEngine([spec]) as resources:
        agent = af.Agent(model=ReplayEngine(tiny_tokenizer, script), tools=[bash], resources=resources)
        samples = [{"id": f"task{i}", "question": f"task {i}", "files": REPO} for i in range(3)]
        trajectories = await agent.run(samples, group_size=2)
        assert [t.failure for t in trajectories] == [None] * 6, {t.failure_reason for t in trajectories}
        assert [t.tool_calls[0].observation for t in trajectories] == ["1"] * 6
        await resources.settle()
        stats = resources.stats()["workspace"]
        assert stats["acquires"] == 3 and stats["created"] == 1 and stats["in_use"] == 0


async def test_a_branched_episode_continues_two_ways_that_diverge_in_conversation_and_files(
        tiny_tokenizer: Any) -> None:
    def script(prompt: str, seed: int | None) -> str:
        seen = prompt.count("<tool_response>")
        if seen == 0:
            return call("write_file", path="plan.txt", content="shared start\n")
        if seen == 1:  # the branch point: each continuation picks by its own seed
            return call("bash", command=f"echo choice-{(seed or 0) % 2} >> plan.txt")
        if seen == 2:
            return call("read_file", path="plan.txt")
        return "done"

    async with af.ResourceEngine([WORKSPACE.replace(pool=af.Pool(min=0, max=1))]) as resources:
        agent = af.Agent(model=SeededPolicy(tiny_tokenizer, script), tools=[bash, read_file, write_file],
                         resources=resources, max_turns=6)
        runner = agent.runner
        sampling = Sampling(temperature=1.0, seed=7)
        episode = runner.episode({"id": "b", "question": "plan", "files": REPO}, sampling)
        assert not await episode.advance(1)  # one turn: the shared start is written
        prefix = list(episode.trajectory.token_ids)
        kids = await episode.branch(2)
        # Seeds differ by branch; pick two branches whose first choices differ (seeds are deterministic).
        more = await episode.branch(6)
        branches = [*kids, *more]
        finished = await asyncio.gather(*(k.finish() for k in branches))
        notes = [t.tool_calls[-1].observation for t in finished]
        assert set(notes) == {"shared start\nchoice-0\n", "shared start\nchoice-1\n"}, notes
        a = next(t for t in finished if t.tool_calls[-1].observation.endswith("choice-0\n"))
        b = next(t for t in finished if t.tool_calls[-1].observation.endswith("choice-1\n"))
        assert a.token_ids[:len(prefix)] == b.token_ids[:len(prefix)] == prefix
        assert a.token_ids[len(prefix):] != b.token_ids[len(prefix):]
        assert a.rollout_id != b.rollout_id and a.finish_reason == b.finish_reason == "answer"
        # The parent's own workspace still holds the state it was branched from.
        parent = await episode.context.resource("workspace")
        assert await parent.read_file("plan.txt") == "shared start\n"
        await episode.finish()
        await resources.settle()
        assert resources.stats()["workspace"]["in_use"] == 0


async def test_branching_an_episode_that_holds_a_resource_which_cannot_fork_is_refused(tiny_tokenizer: Any) -> None:
    from agentfly.tools.builtin.python_code import PYTHON_SANDBOX, python_code

    def script(prompt: str) -> str:
        return call("python_code", code="x = 1") if "<tool_response>" not in prompt else "done"

    async with af.ResourceEngine([PYTHON_SANDBOX.replace(pool=af.Pool(min=0, max=1))]) as resources:
        agent = af.Agent(model=ReplayEngine(tiny_tokenizer, script), tools=[python_code], resources=resources)
        episode = agent.runner.episode({"question": "q"}, Sampling(seed=1))
        await episode.advance(1)
        try:
            await episode.branch(2)
        except TypeError as exc:
            assert "python cannot be forked" in str(exc)
        else:
            raise AssertionError("a branch was made over an interpreter that cannot be copied")
        assert (await episode.finish()).finish_reason == "answer"
        await resources.settle()
        assert resources.stats()["python"]["in_use"] == 0
