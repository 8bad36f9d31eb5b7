"""An OpenAI-compatible gateway: agents written elsewhere (the ``openai`` SDK, the OpenAI Agents SDK, pydantic-ai,
LangGraph) drive the job's policy through OpenAI's API, and their conversations are recorded as token-exact
``Trajectory`` objects, a rollout source beside the in-process rollout loop.

- ``conversation``: one rollout's ids, continued with only the newly rendered messages (never a re-render).
- ``gateway``: rollouts, keys, groups, limits, rewards, idle rollouts ending as ``client_lost``.
- ``server``: the HTTP endpoints (Starlette + uvicorn on a thread of its own).
"""

from agentfly.gateway.conversation import Conversation, Mismatch, RequestError
from agentfly.gateway.gateway import Gateway, GatewayLimits, Rollout

__all__ = ["Conversation", "Gateway", "GatewayLimits", "GatewayServer", "Mismatch", "RequestError", "Rollout"]


def __getattr__(name: str) -> object:
    # The HTTP server needs starlette and uvicorn (the `gateway` extra); the core does not.
    if name == "GatewayServer":
        from agentfly.gateway.server import GatewayServer

        return GatewayServer
    raise AttributeError(name)
