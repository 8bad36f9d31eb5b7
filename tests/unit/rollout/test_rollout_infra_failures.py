"""Failures of the infrastructure end a rollout with a typed ``failure``; the agent's own errors stay
observations it reads. Real sandboxes (the local backend) under the real rollout loop, with scripted turns."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import agentfly as af
from agentfly.resources import InfrastructureFailure
from agentfly.tools.builtin.python_code import python_code

PY = af.ResourceSpec(name="python", factory=af.resources.PythonSandbox, pool=af.Pool(min=0, max=2),
                     acquire_timeout=30)


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def once(text: str) -> Any:
    """A script: ``text`` on the first turn, then an answer."""
    return lambda prompt: text if "<tool_response>" not in prompt else "done"


@af.tool(resource="python", timeout=30)
async def killed_mid_call(context: Any) -> str:
    """Run code in the rollout's sandbox while something outside SIGKILLs the sandbox's process."""
    sandbox = await context.resource("python")
    asyncio.get_running_loop().call_later(0.3, os.kill, sandbox.pid, signal.SIGKILL)
    return str(await sandbox.run("import time; time.sleep(10)"))


@af.tool
def server_down() -> str:
    """A tool whose service stopped answering."""
    raise InfrastructureFailure("the store at 127.0.0.1:9 stopped answering", "server_down")


async def test_a_sandbox_killed_from_outside_ends_the_rollout_as_an_infrastructure_failure(tiny_tokenizer: Any) -> None:
    async with af.ResourceEngine([PY]) as engine:
        agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, once(call("killed_mid_call"))),
                         tools=[killed_mid_call], resources=engine, max_turns=3)
        [traj] = await agent.run([{"question": "go"}])
        assert traj.failure == "killed" and traj.infra_failed
        assert "killed from outside" in (traj.failure_reason or "")
        # The model never read an error it did not cause, and the rollout stopped there.
        assert traj.tool_calls == [] and traj.num_turns == 1
        await engine.settle()
        assert engine.stats()["python"]["in_use"] == 0  # the lease was returned


async def test_code_that_kills_or_exhausts_its_own_sandbox_stays_an_observation_for_the_model(
        tiny_tokenizer: Any) -> None:
    # The agent's own doing (its process ends itself, or spends its CPU limit) is not the infrastructure's, and
    # none of the ways code has to make its death look like an outside SIGKILL (which keeps a rollout out of
    # the loss: a policy could learn to hide its failures so) is taken for one.
    spec = af.ResourceSpec(name="python", factory=af.resources.PythonSandbox, pool=af.Pool(min=0, max=2),
                           acquire_timeout=30, options={"limits": af.resources.Limits(cpu_seconds=1)})
    ends_itself = {
        "exits": "import os; os._exit(3)",
        "spends its CPU limit": "while True: pass",
        "exits with a SIGKILL's status": "import os; os._exit(137)",
        "ignores SIGXCPU until the hard CPU limit's SIGKILL":
            "import signal; signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass",
    }
    survives = {  # the kernel drops these: the interpreter is PID 1 of its process namespace
        "SIGKILLs itself": "import os, signal; os.kill(os.getpid(), signal.SIGKILL); print('still here')",
        "has a child SIGKILL it": "import os, subprocess; subprocess.run(['kill', '-9', str(os.getpid())]); "
                                  "print('still here')",
        "SIGKILLs its process group": "import os, signal; os.killpg(0, signal.SIGKILL); print('still here')",
    }
    async with af.ResourceEngine([spec]) as engine:
        for how, code in {**ends_itself, **survives}.items():
            agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, once(call("python_code", code=code))),
                             tools=[python_code], resources=engine, max_turns=3)
            [traj] = await agent.run([{"question": "go"}])
            assert traj.failure is None and traj.finish_reason == "answer", (how, traj.error, traj.failure_reason)
            observation = traj.tool_calls[0].observation
            if how in survives:
                assert observation == "still here\n", (how, observation)
                continue
            assert observation.startswith("Error:") and "sandbox was restarted" in observation, (how, observation)
            if how == "exits with a SIGKILL's status":
                assert "exit code 137" in observation, observation  # told apart from a signal exactly


async def test_a_service_that_stopped_answering_ends_the_rollout_with_its_kind_and_reason(tiny_tokenizer: Any) -> None:
    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, once(call("server_down"))), tools=[server_down],
                     max_turns=3)
    [traj] = await agent.run([{"question": "go"}])
    assert (traj.failure, traj.failure_reason) == ("server_down", "the store at 127.0.0.1:9 stopped answering")
    assert af.Trajectory.from_dict(traj.to_dict()).failure == "server_down"  # stored and read back with it


async def test_an_acquire_timeout_is_an_infrastructure_failure_and_bad_arguments_stay_observations(
        tiny_tokenizer: Any) -> None:
    spec = af.ResourceSpec(name="python", factory=af.resources.PythonSandbox, pool=af.Pool(min=0, max=1),
                           acquire_timeout=0.5)
    slow = call("python_code", code="import time; time.sleep(3)")
    async with af.ResourceEngine([spec]) as engine:
        agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, once(slow)), tools=[python_code], resources=engine,
                         max_turns=3)
        # Two runs at once on one pool (each admits no more rollouts than the pool holds, but not the two
        # together): one rollout waits in the pool's queue past its timeout.
        [first], [second] = await asyncio.gather(agent.run([{"question": "a"}]), agent.run([{"question": "b"}]))
        failed = [t for t in (first, second) if t.failure]
        assert [t.failure for t in failed] == ["acquire_timeout"]
        bad = af.Agent(model=af.ReplayEngine(tiny_tokenizer, once(call("python_code", source="1"))),
                       tools=[python_code], resources=engine, max_turns=3)
        [traj] = await bad.run([{"question": "c"}])
        assert traj.failure is None and traj.tool_calls[0].error is not None
