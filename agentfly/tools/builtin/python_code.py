"""``python_code``: run Python in the rollout's sandbox; variables persist across the rollout's turns.

``PYTHON_SANDBOX`` is the sandbox pool this tool uses (the trainer and the web app take it from here;
``agentfly.resources.builtin.with_pool`` resizes it)::

    agent = af.Agent(model, tools=[python_code], resources=af.ResourceEngine([PYTHON_SANDBOX]))
"""

from __future__ import annotations

from typing import Any

from agentfly.resources.builtin import register_builtin
from agentfly.resources.sandbox import PythonSandbox
from agentfly.resources.spec import Pool, ResourceSpec
from agentfly.tools.tool import tool

RESOURCE = "python"

# Up to 8 sandboxes, created on demand; a rollout waits at most 60 s for one before its call fails.
PYTHON_SANDBOX = register_builtin(ResourceSpec(name=RESOURCE, factory=PythonSandbox, kind="sandbox",
                                               pool=Pool(min=0, max=8), acquire_timeout=60))


@tool(resource=RESOURCE, timeout=60)
async def python_code(code: str, context: Any) -> str:
    """Run Python code and return what it prints. Variables and files persist across this conversation's calls.

    Args:
        code: Python statements; the value of a final expression is printed, as in a notebook.
    """
    box = await context.resource(RESOURCE)
    output = await box.run(code)
    return output if output else "(no output)"
