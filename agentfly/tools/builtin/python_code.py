"""``python_code``: run Python in the rollout's sandbox; variables persist across the rollout's turns.

Declare the sandbox pool once per job and pass it to the agent::

    PY = af.ResourceSpec(name="python", factory=af.resources.PythonSandbox, kind="sandbox",
                         pool=af.Pool(min=2, max=8), acquire_timeout=30)
    agent = af.Agent(model, tools=[python_code], resources=af.ResourceEngine([PY]))
"""

from __future__ import annotations

from typing import Any

from agentfly.tools.tool import tool

RESOURCE = "python"


@tool(resource=RESOURCE, timeout=60)
async def python_code(code: str, context: Any) -> str:
    """Run Python code and return what it prints. Variables and files persist across this conversation's calls.

    Args:
        code: Python statements; the value of a final expression is printed, as in a notebook.
    """
    box = await context.resource(RESOURCE)
    output = await box.run(code)
    return output if output else "(no output)"
