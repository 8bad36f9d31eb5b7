"""What a run is built from: torch and seeds, the policy (with LoRA), the task samples and their order, the
engine, the tools' resource pools and the agent. ``trainer.loop.Trainer`` calls these once, at start."""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainer.config import Config, ConfigError

if TYPE_CHECKING:
    from agentfly.agents.agent import Agent
    from agentfly.engines.base import Engine
    from agentfly.resources import ResourceEngine


def setup_torch(config: Config) -> torch.device:
    """Seed everything and size the thread pool: all cores but one (the event loop, tool subprocesses and
    reward functions need a core; on a shared 2-core box two spinning OpenMP threads ran 10x slower than one)."""
    threads = config.threads or max(1, (os.cpu_count() or 2) - 1)
    torch.set_num_threads(threads)
    seed_everything(config.seed)
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def import_object(spec: str, what: str) -> Any:
    """``"package.module:attribute"`` -> the attribute; errors say which config key to fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ValueError(f"{what} {spec!r} must be written 'module:attribute', e.g. "
                         "'agentfly.tools.builtin.calculator:calculator'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None


def load_policy(config: Config, device: torch.device, path: str | None = None) -> tuple[Any, Any]:
    """The policy module and tokenizer from ``model.path`` (building the tiny model there if asked to), or from
    the GGUF file ``model.gguf_file`` in it."""
    from agentfly.engines.hf import load_causal_lm

    path = path or config.model.path
    if (Path(path) / "adapter_config.json").is_file():
        return _load_lora_checkpoint(Path(path), config, device)
    if not Path(path).is_dir() and not config.model.build_tiny:
        raise FileNotFoundError(f"model.path {path!r} does not exist; point it at a local model directory "
                                "or set model.build_tiny=true to build the tiny CPU model there")
    if config.model.build_tiny:
        ensure_tiny(config, path)
    if config.model.gguf_file is not None and not (Path(path) / config.model.gguf_file).is_file():
        raise FileNotFoundError(f"model.gguf_file {config.model.gguf_file!r} is not in model.path {path!r}; "
                                f"name a .gguf file there (found: {sorted(p.name for p in Path(path).glob('*.gguf'))})")
    loaded, tokenizer = load_causal_lm(path, getattr(torch, config.model.dtype), config.model.gguf_file)
    model = loaded.to(device)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if config.model.lora.enabled:
        model = apply_lora(model, config)
    return model, tokenizer


def ensure_tiny(config: Config, path: str | None = None) -> None:
    """Build the tiny model at ``model.path`` (a build with other settings is rebuilt; one with the same
    settings is reused as it is). Under a launcher rank 0 builds it first and the others wait, so ranks never
    write the same files at once."""
    import dataclasses

    from agentfly.models.tiny import STAMP, build_tiny

    path = path or config.model.path
    if not Path(path).is_dir() or (Path(path) / STAMP).is_file():  # never over a model that is not a tiny build
        build_tiny(path, seed=config.model.tiny_seed, **dataclasses.asdict(config.model.tiny))


def _load_lora_checkpoint(path: Path, config: Config, device: torch.device) -> tuple[Any, Any]:
    """A LoRA checkpoint (adapter weights only) on top of the base model it names."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from peft import PeftModel
    except ImportError as exc:
        raise RuntimeError(f"{path} holds LoRA adapters; loading them needs peft: pip install 'agentfly[lora]'") from exc
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(f"{path}/adapter_config.json names base model {base!r}, which is not a local "
                                "directory; put the base model back there or edit base_model_name_or_path")
    loaded: Any = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, config.model.dtype))
    model = loaded.to(device)
    return PeftModel.from_pretrained(model, path, is_trainable=True), AutoTokenizer.from_pretrained(path)


def apply_lora(model: Any, config: Config) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise RuntimeError("model.lora.enabled=true needs peft: pip install 'agentfly[lora]'") from exc
    lora = config.model.lora
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))


def load_samples(config: Config) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out samples: the ``train`` and ``test`` splits of the task ``data.task`` names
    (``agentfly.tasks.find_task``, with ``data.options``: built in, a source such as ``reasoning_gym:<dataset>``,
    or a user's ``package.module:attribute``; the built-in ones are disjoint), or a JSONL file of samples with
    ``data.eval_path`` holding the held-out ones. ``data.eval_path`` overrides a task's test split."""
    from agentfly.tasks import TaskOptionError, find_task, task_names
    from agentfly.tasks.io import load_jsonl

    data = config.data
    try:
        task = find_task(data.task, data.options)
    except TaskOptionError as exc:
        raise ConfigError(f"data.task={data.task}: {exc}",
                          key=f"data.options.{exc.option}" if exc.option else "data.options") from None
    if task is None and not Path(data.task).is_file():
        raise FileNotFoundError(f"data.task={data.task!r} is neither a known task ({', '.join(task_names())}), a "
                                "task source (reasoning_gym:<dataset>, textworld:<theme>, package.module:attribute) "
                                "nor an existing JSONL file")
    train = task.samples("train", data.train_size, data.seed) if task else load_jsonl(data.task)
    if data.eval_path:
        held_out = load_jsonl(data.eval_path)[: data.eval_size]
    elif task:
        held_out = task.samples("test", data.eval_size, data.seed)[: data.eval_size]
    else:
        raise ValueError("data.eval_path is required when data.task is a JSONL file (held-out samples)")
    if not train:
        raise ValueError(f"data.task={data.task!r} has no samples")
    return train, held_out


def build_resources(config: Config, tools: Sequence[Any], reward: Any = None) -> ResourceEngine | None:
    """A ``ResourceEngine`` with a pool for every resource the tools or the reward (``@reward(resource=...)``,
    e.g. a judge) declare or the config names (None if there are none): ``resources.<name>.spec`` when the config gives one, else the built-in spec
    (``agentfly.resources.builtin``). Pool sizes and timeouts from ``config.resources`` override the specs' own."""
    needed = dict.fromkeys([*config.resources, *(t.resource for t in tools if getattr(t, "resource", None)),
                            *([reward.resource] if getattr(reward, "resource", None) else [])])
    if not needed:
        return None
    from agentfly.resources import ResourceEngine, UnknownResource
    from agentfly.resources.builtin import builtin_spec, with_pool

    specs = []
    servers = mcp_specs(config) | model_service_specs(config)
    for name in needed:
        res = config.resources.get(name)
        if name in servers:
            spec = servers[name]
        elif res is not None and res.api is not None:
            spec = api_spec(name, res.api.options(), import_object(res.spec, f"resources.{name}.spec") if res.spec else None)
        elif res is not None and res.spec:
            spec = import_object(res.spec, f"resources.{name}.spec")
        else:
            try:
                spec = builtin_spec(name)
            except UnknownResource:
                hint = {"judge": "judge.model_dir (and judge.backend)", "reward_model": "reward_model.model_dir"}
                raise ValueError(f"a tool or the reward needs resource {name!r}, which is not built in; add "
                                 + (f"{hint[name]} or " if name in hint else "")
                                 + f"resources.{name}.spec: 'module:attribute' (a ResourceSpec) to the config") from None
        if res is None:
            specs.append(with_pool(spec, name=name))
        else:
            specs.append(with_pool(spec, name=name, pool_min=res.min, pool_max=res.max,
                                   acquire_timeout=res.acquire_timeout, pool_starting=res.starting))
    rb = config.resource_backend
    if rb.backend == "ray" or (rb.backend is None and os.environ.get("AGENTFLY_RAY_ADDRESS")):
        from agentfly.resources.backends.ray import RaySettings, job_id_for, on_ray

        settings = RaySettings.from_env(
            address=rb.address, team=rb.team, team_budget=rb.team_budget or None, strategy=rb.strategy,
            resources=rb.placement or None, lease_check_interval=rb.lease_check_interval,
            orphan_timeout=rb.orphan_timeout)
        if rb.job is not None or settings.job is None:  # every rank and a resumed run agree on it
            settings = dataclasses.replace(settings, job=rb.job or job_id_for(config.output_dir))
        # A rate-limited API's budget is already one for the job (and its team) in Redis: its limiter stays in
        # each of the job's processes, which hold its Redis URL (AGENTFLY_RATELIMIT_REDIS), not the cluster's.
        return ResourceEngine([s if s.kind == "api" else on_ray(s) for s in specs], ray=settings)
    return ResourceEngine(specs)


def api_spec(name: str, options: dict[str, Any], spec: Any = None) -> Any:
    """A rate-limited API's spec: ``spec`` (a plugin's) with ``options`` over its own, or a ``SharedRateLimiter``
    of that name, one instance every rollout shares."""
    if spec is not None:
        return dataclasses.replace(spec, options={**spec.options, **options})
    from agentfly.resources import ResourceSpec, SharedRateLimiter

    return ResourceSpec(name=name, factory=SharedRateLimiter, kind="api", scope="global", backend="inprocess",
                        options={"key": name, **options})


def mcp_specs(config: Config) -> dict[str, Any]:
    """The ``agentfly.mcp.server`` spec of each server in ``config.mcp``, by name."""
    if not config.mcp:
        return {}
    from agentfly.mcp import server

    return {name: server(name, command=m.command, url=m.url, address=m.address, scope=m.scope,
                         reset_tool=m.reset_tool, seed_tool=m.seed_tool, network=m.network, read_paths=m.read_paths,
                         call_timeout=m.call_timeout, start_timeout=m.start_timeout)
            for name, m in config.mcp.items()}


def model_service_specs(config: Config) -> dict[str, Any]:
    """The ``judge`` and ``reward_model`` specs the config's ``judge`` and ``reward_model`` sections give, by
    name (none for a section without a model_dir)."""
    specs: dict[str, Any] = {}
    j, rm = config.judge, config.reward_model
    if j.model_dir is not None:
        from agentfly.engines.base import Sampling
        from agentfly.resources import judge_spec

        specs["judge"] = judge_spec(backend=j.backend, model_dir=j.model_dir, servers=j.servers, rubric=j.rubric,
                                    max_concurrency=j.max_concurrency, max_batch=j.max_batch,
                                    sampling=Sampling(temperature=0.0, max_new_tokens=j.max_new_tokens))
    if rm.model_dir is not None:
        from agentfly.resources import reward_model_spec

        specs["reward_model"] = reward_model_spec(model_dir=rm.model_dir, max_batch=rm.max_batch)
    return specs


def mcp_tools(config: Config) -> list[Any]:
    """The tools of the config's MCP servers (each server is started once to list them); a tool named in
    ``mcp.<name>.tools`` that the server no longer lists fails here, naming what it lists."""
    from agentfly.mcp import tools_from

    return [tool for name, spec in mcp_specs(config).items()
            for tool in tools_from(spec, include=config.mcp[name].tools)]


def build_agent(config: Config, engine: Engine, resources: ResourceEngine | None = None, *,
                in_process: bool = False) -> Agent:
    """The config's agent on ``engine``, with the resource pools ``build_resources`` makes for its tools, or
    with ``resources`` when given (an evaluation that shares the rollout producer's pools).

    With ``gateway.enabled`` the training run's rollouts come from agents elsewhere, through the job's gateway
    (``trainer.gateway.GatewayAgent``); ``in_process`` asks for the in-process agent on ``rollout.tools`` anyway
    (SFT's replayed demonstrations, ``agentfly eval`` of a checkpoint)."""
    import agentfly as af

    if config.gateway.enabled and not in_process:
        from trainer.gateway import GatewayAgent

        return GatewayAgent(config, engine, reward=import_object(config.rollout.reward, "rollout.reward"))
    r = config.rollout
    tools = [import_object(spec, "rollout.tools entry") for spec in r.tools] + mcp_tools(config)
    reward = import_object(r.reward, "rollout.reward")
    # The agent owns the pools made for it (``agent.close()`` stops them), not those it is given to share.
    return af.Agent(engine, tools=tools, reward=reward, parser=r.parser, max_turns=r.max_turns,
                    system_prompt=r.system_prompt,
                    resources=resources if resources is not None else build_resources(config, tools, reward),
                    owns_resources=resources is None, chat_template_kwargs=r.chat_template_kwargs)


def pools_of(agent: Agent) -> ResourceEngine | None:
    """The agent's ``ResourceEngine`` (what the trainer reports and shares), or None when it has no pools."""
    from agentfly.resources.engine import ResourceEngine

    return agent.resources if isinstance(agent.resources, ResourceEngine) else None


def engine_from_config(config: Config, model: Any, tokenizer: Any) -> Engine:
    """The engine ``config.engine`` names, made by ``agentfly.agents.build_engine``: HF shares the trainer's
    module (weight sync is free); vLLM gets its own copy of the weights; remote samples from the job's fleet
    of servers (``trainer.remote_servers`` finds or starts them)."""
    from agentfly.agents.agent import build_engine

    if config.engine == "hf":
        return build_engine(model, "hf", tokenizer=tokenizer)
    if config.engine == "vllm":
        return build_engine(config.model.path, "vllm", seed=config.seed)
    if config.engine == "remote":
        from trainer.remote_servers import build_remote_engine

        return build_remote_engine(config)
    raise ValueError(f"engine={config.engine!r}: use hf, vllm or remote")


class DataCursor:
    """Walks the training samples in a seeded order, epoch after epoch; its state is part of a checkpoint."""

    def __init__(self, samples: Sequence[dict[str, Any]], seed: int, shuffle: bool = True) -> None:
        self.samples = list(samples)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            out.append(self.samples[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()
