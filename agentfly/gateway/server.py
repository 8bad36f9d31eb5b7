"""The gateway's HTTP face: OpenAI's API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``) and the
rollout endpoints (``/v1/samples``, ``/v1/rollouts/<id>/reward``, ``/v1/rollouts/<id>/finish``).

A Starlette app served by uvicorn on a thread of its own (``GatewayServer``), so a trainer's thread stays free.
Responses speak OpenAI's schema: errors are ``{"error": {"message", "type", "param", "code"}}``; a stream is
server-sent events of ``chat.completion.chunk`` objects ending with ``data: [DONE]``. The engine does not hand
out tokens one by one, so a streamed turn's chunks are sent when its generation ends: the same chunks an
OpenAI stream carries, in the same order.

    server = GatewayServer(gateway, port=0).start()      # server.url == "http://127.0.0.1:<port>/v1"
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentfly.engines.base import Generation
from agentfly.gateway.conversation import RequestError
from agentfly.gateway.gateway import Gateway, Rollout
from agentfly.rollout.render import TemplateError

ROLLOUT_HEADER = "x-rollout-id"


def _error(exc: RequestError) -> JSONResponse:
    headers = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None
    kind = "rate_limit_error" if exc.status == 429 else ("authentication_error" if exc.status == 401
                                                          else "invalid_request_error")
    return JSONResponse({"error": {"message": str(exc), "type": kind, "param": None, "code": exc.code}},
                        status_code=exc.status, headers=headers)


def _key(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer ") or not auth[7:].strip():
        raise RequestError("no API key: send Authorization: Bearer <key> (a rollout's key from GET /v1/samples, or "
                           "the job's key with an X-Rollout-Id header)", 401, "invalid_api_key")
    return auth[7:].strip()


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(f"max_tokens must be a positive integer, got {value!r}")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise RequestError("stop must be a string or a list of strings")


def _single_choice(body: Mapping[str, Any]) -> None:
    if body.get("n", 1) != 1:
        raise RequestError("n must be 1: a rollout is one conversation (take more samples for more rollouts)")


def _logprobs(rollout: Rollout, generation: Generation) -> dict[str, Any]:
    tokenizer = rollout.engine.tokenizer
    content = []
    for token_id, logprob in zip(generation.token_ids, generation.logprobs, strict=True):
        token = str(tokenizer.decode([token_id], skip_special_tokens=False))
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content, "refusal": None}


def build_app(gateway: Gateway) -> Starlette:
    """The Starlette app of ``gateway`` (``GatewayServer`` serves it; any ASGI server can)."""

    async def guarded(handler: Any, request: Request) -> Response:
        try:
            response: Response = await handler(request)
            return response
        except RequestError as exc:
            return _error(exc)
        except TemplateError as exc:
            return _error(RequestError(str(exc), 400, "unsupported_conversation"))

    def route(path: str, handler: Any, methods: list[str]) -> Route:
        async def endpoint(request: Request) -> Response:
            return await guarded(handler, request)

        return Route(path, endpoint, methods=methods)

    async def models(request: Request) -> Response:
        _key(request)
        return JSONResponse({"object": "list", "data": [
            {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "agentfly"}]})

    async def chat_completions(request: Request) -> Response:
        rollout = gateway.rollout_for(_key(request), request.headers.get(ROLLOUT_HEADER))
        body = await _body(request)
        _single_choice(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a list of message objects")
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise RequestError("tools must be a list of {type: function, function: {...}} objects")
        generation, content, tool_calls, prompt_tokens = await gateway.chat(
            rollout, messages, tools, max_tokens=_max_tokens(body), stop=_stop(body))
        finish = "tool_calls" if tool_calls else ("length" if generation.finish_reason == "length" else "stop")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(generation.token_ids),
                 "total_tokens": prompt_tokens + len(generation.token_ids)}
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        logprobs = _logprobs(rollout, generation) if body.get("logprobs") else None
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content or None, "refusal": None}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return JSONResponse({"id": ident, "object": "chat.completion", "created": created,
                                 "model": gateway.model_name, "system_fingerprint": None,
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                              "logprobs": logprobs}],
                                 "usage": usage}, headers={"X-Rollout-Id": rollout.rollout_id})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
            payload = {"id": ident, "object": "chat.completion.chunk", "created": created,
                       "model": gateway.model_name, "system_fingerprint": None,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, **extra}]}
            return f"data: {json.dumps(payload)}\n\n"

        async def events() -> AsyncIterator[str]:
            yield chunk({"role": "assistant", "content": ""}, logprobs=None)
            if content:
                yield chunk({"content": content}, logprobs=logprobs)
            if tool_calls:
                yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls)]})
            yield chunk({}, finish)
            if include_usage:
                payload = {"id": ident, "object": "chat.completion.chunk", "created": created,
                           "model": gateway.model_name, "choices": [], "usage": usage}
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"X-Rollout-Id": rollout.rollout_id, "Cache-Control": "no-cache"})

    async def completions(request: Request) -> Response:
        rollout = gateway.rollout_for(_key(request), request.headers.get(ROLLOUT_HEADER))
        body = await _body(request)
        _single_choice(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise RequestError("prompt must be a string or a list of token ids (one prompt: n = 1 rollout)")
        if body.get("stream"):
            raise RequestError("stream is not supported on /v1/completions; use /v1/chat/completions to stream")
        generation, text, prompt_tokens = await gateway.complete(rollout, prompt, max_tokens=_max_tokens(body),
                                                                 stop=_stop(body))
        finish = "length" if generation.finish_reason == "length" else "stop"
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": gateway.model_name,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(generation.token_ids),
                      "total_tokens": prompt_tokens + len(generation.token_ids)}}, headers={"X-Rollout-Id": rollout.rollout_id})

    async def samples(request: Request) -> Response:
        gateway.check_job_key(_key(request))
        try:
            n = int(request.query_params.get("n", "1"))
        except ValueError:
            raise RequestError("n must be an integer (samples to take)") from None
        if not 1 <= n <= 1024:
            raise RequestError(f"n must be in 1..1024, got {n}")
        taken = gateway.take(n)
        if not taken:  # none handed out yet: the job is between batches (training on the last one)
            raise RequestError("no sample is waiting: the job hands out its next batch after its update; retry "
                               "after the Retry-After seconds", 429, "no_samples", retry_after=1.0)
        return JSONResponse({"object": "list", "data": taken})

    def _rollout_owner(request: Request) -> str:
        """The rollout a reward or finish names, by the job's key or that rollout's own key."""
        rid = str(request.path_params["rollout_id"])
        key = _key(request)
        try:
            gateway.check_job_key(key)
        except RequestError:
            if gateway.rollout_for(key).rollout_id != rid:
                raise RequestError("a rollout's key may only reward or end its own rollout", 403,
                                   "permission_denied") from None
        return rid

    async def reward(request: Request) -> Response:
        rid = _rollout_owner(request)
        body = await _body(request)
        value = body.get("reward")
        turn = body.get("turn")
        if turn is not None and (not isinstance(turn, int) or isinstance(turn, bool)):
            raise RequestError(f"turn must be an integer (the 0-based assistant turn), got {turn!r}")
        gateway.set_reward(rid, value, turn=turn, reason=str(body.get("reason", "")),  # type: ignore[arg-type]
                           done=bool(body.get("done", True)))
        return JSONResponse({"rollout_id": rid, "ok": True})

    async def finish(request: Request) -> Response:
        rid = _rollout_owner(request)
        traj = await gateway.finish(rid)
        return JSONResponse({"rollout_id": rid, "reward": traj.reward, "turns": traj.num_turns})

    async def reaper() -> None:
        while True:
            await asyncio.sleep(gateway.limits.reap_every)
            gateway.reap()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()

    return Starlette(routes=[
        route("/v1/models", models, ["GET"]),
        route("/v1/chat/completions", chat_completions, ["POST"]),
        route("/v1/completions", completions, ["POST"]),
        route("/v1/samples", samples, ["GET"]),
        route("/v1/rollouts/{rollout_id:path}/reward", reward, ["POST"]),
        route("/v1/rollouts/{rollout_id:path}/finish", finish, ["POST"]),
    ], lifespan=lifespan)


class GatewayServer:
    """Serves ``gateway`` over HTTP with uvicorn on a daemon thread (its own event loop, where the engine's
    generations are batched). ``port=0`` takes a free port; ``url`` is the OpenAI ``base_url``."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.gateway = gateway
        self.host = host
        config = uvicorn.Config(build_app(gateway), host=host, port=port, log_level="warning", loop="asyncio",
                                lifespan="on", timeout_keep_alive=30, backlog=2048)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="agentfly-gateway", daemon=True)
        self.port = port

    def start(self, timeout: float = 30.0) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port} (is the port taken? "
                                   "choose another gateway.port, or 0 for any free port)")
            time.sleep(0.02)
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def close(self) -> None:
        """Revoke every key, then stop serving."""
        self.gateway.close()
        self._server.should_exit = True
        self._thread.join(timeout=10)
