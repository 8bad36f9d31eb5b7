"""A plugin that fails at import time, as a module with a missing dependency would."""

import a_package_that_is_not_installed  # noqa: F401

from agentfly.tools import tool


@tool
def anything() -> str:
    """Never reached: the import above fails first."""
    return ""
