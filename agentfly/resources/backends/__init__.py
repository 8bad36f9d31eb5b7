"""Where resource instances run: ``local`` child processes (default) and ``docker`` containers."""

from agentfly.resources.backends.local import Isolation, Limits, LocalWorker

__all__ = ["Isolation", "Limits", "LocalWorker"]
