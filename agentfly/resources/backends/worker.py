"""The sandbox worker protocol, for a process that serves it in place of the stock worker: the web app's
"try it" child and ScienceWorld's worker. Such a process makes its ``Channel`` (the protocol's JSON lines,
moved off fds 0/1/2 first), takes its identity under bubblewrap (``receive_identity``), isolates itself
(``harden``: limits, network, private uid, Landlock, as ``local.sandbox_view`` and the config ask), and then
answers requests with its own handlers (``serve``). See ``_worker`` for the protocol and each step.

``_worker.py`` stays private: it is run as a script (by its path, and as source inside docker containers),
so it imports only the standard library and is not itself an API.
"""

from agentfly.resources.backends._worker import Channel, die_with_parent, harden, receive_identity, serve

__all__ = ["Channel", "die_with_parent", "harden", "receive_identity", "serve"]
