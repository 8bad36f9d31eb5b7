"""Config loading: YAML plus --set overrides, with errors that name the key and the fix."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ALGORITHMS, Config, ConfigError, describe, load_config, parse_override


def test_defaults_load_and_validate():
    config = load_config()
    assert isinstance(config, Config)
    assert config.algorithm.name == "grpo" and config.engine == "hf"


def test_yaml_is_read_and_overrides_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 7\nalgorithm:\n  name: dapo\n  clip_low: 0.1\nrollout:\n  group_size: 4\n")
    config = load_config(path, ["algorithm.name=rloo", "engine=vllm", "optim.lr=3e-3", "optim.betas=[0.9, 0.95]"])
    assert config.steps == 7 and config.rollout.group_size == 4
    assert config.algorithm.name == "rloo" and config.algorithm.clip_low == 0.1
    assert config.engine == "vllm" and config.optim.lr == pytest.approx(3e-3) and config.optim.betas == [0.9, 0.95]


def test_an_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm\.clip_lo'; did you mean 'algorithm\.clip_low'"):
        load_config(None, ["algorithm.clip_lo=0.3"])


def test_an_unknown_section_in_yaml_is_rejected(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rolout:\n  group_size: 4\n")
    with pytest.raises(ConfigError, match="unknown config key 'rolout'; did you mean 'rollout'"):
        load_config(path)


def test_a_bad_choice_lists_the_choices_and_suggests_one():
    with pytest.raises(ConfigError, match=r"algorithm\.name: 'grp' is not one of .*did you mean 'grpo'"):
        load_config(None, ["algorithm.name=grp"])


def test_a_value_of_the_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"rollout.group_size: expected an integer, got 'eight'"):
        load_config(None, ["rollout.group_size=eight"])
    with pytest.raises(ConfigError, match="tensorboard: expected true or false"):
        load_config(None, ["tensorboard=maybe"])


def test_group_algorithms_need_groups_of_two_or_more():
    with pytest.raises(ConfigError, match=r"rollout.group_size >= 2"):
        load_config(None, ["rollout.group_size=1"])
    assert load_config(None, ["rollout.group_size=1", "algorithm.name=ppo"]).rollout.group_size == 1


@pytest.mark.parametrize(("overrides", "key"), [
    (["rollout.group_size=1"], "rollout.group_size"),
    (["rollout.group_size=eight"], "rollout.group_size"),
    (["algorithm.clip_lo=0.1"], "algorithm.clip_lo"),
    (["resources={python: {min: 3, max: 2}}"], "resources.python.min"),
    (["resources={python: {max: 0}}"], "resources.python.max"),
    (["optim.lr=0"], "optim.lr"),
])
def test_a_config_error_names_its_key_for_callers_that_place_the_message(overrides, key):
    # The web app's launch form puts the message on the field of this key.
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert caught.value.key == key and key.rpartition(".")[0] in str(caught.value)


def test_minibatches_must_divide_the_batch():
    with pytest.raises(ConfigError, match=r"algorithm.minibatches=3 must divide"):
        load_config(None, ["algorithm.minibatches=3"])


def test_kl_in_reward_without_a_coefficient_says_what_to_set():
    with pytest.raises(ConfigError, match="set kl_coef > 0"):
        load_config(None, ["algorithm.kl_in_reward=true"])


def test_a_missing_deepspeed_config_is_named():
    with pytest.raises(ConfigError, match=r"deepspeed=.nope.json.: no such file"):
        load_config(None, ["deepspeed=nope.json"])


def test_a_malformed_override_shows_the_form():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("algorithm.name")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_paper_defaults_resolve_per_algorithm():
    dapo = load_config(None, ["algorithm.name=dapo"]).algorithm
    assert dapo.resolved_clip_high == 0.28 and dapo.resolved_loss_agg == "token-mean" and dapo.resolved_dynamic_sampling
    grpo = load_config().algorithm
    assert grpo.resolved_clip_high == 0.2 and grpo.resolved_loss_agg == "seq-mean-token-mean"
    assert not grpo.resolved_dynamic_sampling
    assert load_config(None, ["algorithm.name=dr_grpo"]).algorithm.resolved_loss_agg == "seq-mean-token-sum-norm"


def test_every_field_has_help_and_every_algorithm_is_listed():
    lines = describe()
    assert all(line.rstrip().split(": ", 1)[1] for line in lines if line.startswith("  "))
    assert len(ALGORITHMS) == 7


def test_resource_pools_are_a_mapping_checked_field_by_field():
    config = load_config(None, ["resources={python: {max: 4}, wiki: null}"])
    assert config.resources["python"].max == 4 and config.resources["wiki"].max is None
    with pytest.raises(ConfigError, match=r"unknown config key 'resources\.python\.size'; valid keys: spec, min, max"):
        load_config(None, ["resources={python: {size: 4}}"])
    with pytest.raises(ConfigError, match=r"resources\.python: min=3 is above max=2"):
        load_config(None, ["resources={python: {min: 3, max: 2}}"])


def test_the_train_command_takes_deepspeed_as_a_flag(tmp_path):
    from trainer.cli import _load, build_parser

    ds = tmp_path / "ds_config.json"
    ds.write_text('{"zero_optimization": {"stage": 2}}')
    args = build_parser().parse_args(["train", "--deepspeed", str(ds), "--set", "steps=3"])
    config = _load(args)
    assert config.deepspeed == str(ds) and config.steps == 3
    with pytest.raises(ConfigError, match="deepspeed="):
        _load(build_parser().parse_args(["train", "--deepspeed", str(tmp_path / "missing.json")]))


def test_a_checkpoint_config_from_another_version_loads_without_its_unknown_keys(tmp_path, capsys):
    import yaml

    from trainer.cli import _checkpoint_config
    from trainer.config import to_dict

    ckpt = tmp_path / "checkpoint-000010"
    ckpt.mkdir()
    saved = to_dict(load_config(None, ["rollout.group_size=4"]))
    saved["sft"]["retired_setting"] = 1
    saved["gone_section"] = {"x": 1}
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved))
    config = _checkpoint_config(ckpt, ["eval.max_new_tokens=7"])
    assert config.rollout.group_size == 4 and config.eval.max_new_tokens == 7
    assert config.model.path == str(ckpt) and config.model.build_tiny is False
    assert "sft.retired_setting" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="retired_setting"):
        load_config(None, ["sft.retired_setting=1"])


def test_the_tiny_model_settings_default_to_build_tinys_own_defaults():
    import dataclasses
    import inspect

    from agentfly.models.tiny import build_tiny
    from trainer.config import TinyModelConfig

    params = inspect.signature(build_tiny).parameters
    for name, value in dataclasses.asdict(TinyModelConfig()).items():
        assert params[name].default == value, name


def test_learning_rate_schedules_warm_up_then_decay():
    import torch

    from trainer.optim import lr_schedule

    def factors(kind: str) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = lr_schedule(opt, warmup=2, total=10, kind=kind)
        out = []
        for _ in range(10):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    # Warm-up 1/2, 2/2; then progress (s - 2) / 8: cosine 0.5 * (1 + cos(pi * p)), linear 1 - p.
    assert factors("cosine") == pytest.approx([0.5, 1.0, 1.0, 0.96194, 0.85355, 0.69134, 0.5, 0.30866, 0.14645,
                                               0.03806], abs=1e-5)
    assert factors("linear") == pytest.approx([0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125])
    assert factors("constant") == pytest.approx([0.5, 1.0] + [1.0] * 8)


def test_chat_template_variables_from_the_config_reach_the_rollouts_template(tiny_tokenizer):
    import copy

    from agentfly.engines import ReplayEngine
    from trainer.builders import build_agent

    config = load_config(None, ["rollout.chat_template_kwargs={enable_thinking: false}"])
    assert config.rollout.chat_template_kwargs == {"enable_thinking": False}
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
        "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think></think>' -}}{%- endif -%}"
        "{%- endif -%}"
    )
    agent = build_agent(config, ReplayEngine(tokenizer, lambda prompt: "4"))
    prompt = agent.runner.renderer.render([{"role": "user", "content": "2+2?"}], add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<think></think>")


def test_log_samples_takes_minus_one_for_every_trajectory_and_refuses_below_it():
    assert load_config(None, ["log_samples=-1"]).log_samples == -1
    with pytest.raises(ConfigError, match=r"log_samples=-2 must be -1 \(all\), 0 \(none\) or a count"):
        load_config(None, ["log_samples=-2"])


def test_a_gguf_model_needs_build_tiny_off_and_the_hf_engine_and_a_file_that_is_there(tmp_path):
    from trainer.builders import load_policy

    with pytest.raises(ConfigError, match=r"set model\.build_tiny=false") as exc:
        load_config(None, [f"model.path={tmp_path}", "model.gguf_file=m.gguf"])
    assert exc.value.key == "model.build_tiny"
    with pytest.raises(ConfigError, match="no GGUF loader") as exc:
        load_config(None, [f"model.path={tmp_path}", "model.gguf_file=m.gguf", "model.build_tiny=false",
                           "engine=vllm"])
    assert exc.value.key == "engine"
    (tmp_path / "other.gguf").write_bytes(b"")
    config = load_config(None, [f"model.path={tmp_path}", "model.gguf_file=m.gguf", "model.build_tiny=false"])
    with pytest.raises(FileNotFoundError, match=r"'m\.gguf' is not in model\.path .*found: \['other\.gguf'\]"):
        load_policy(config, torch.device("cpu"))


def test_resources_backend_ray_and_its_address_are_settings_not_a_resource_named_backend(tmp_path) -> None:
    from trainer.builders import build_resources
    from trainer.config import load_config

    config = load_config(overrides=["resources.backend=ray", "resources.address=auto",
                                    "resources.team_budget={sandbox: 8}", "resources.python.max=3",
                                    f"output_dir={tmp_path / 'run'}"])
    assert list(config.resources) == ["python"] and config.resources["python"].max == 3
    rb = config.resource_backend
    assert (rb.backend, rb.address, rb.team_budget) == ("ray", "auto", {"sandbox": 8})
    engine = build_resources(config, [])
    assert engine is not None and engine.specs["python"].backend == "ray"
    pool = engine.pools["python"]
    # Every rank of the job, and a resumed run of the same directory, name the same pool coordinator.
    again = build_resources(load_config(overrides=["resources.backend=ray", "resources.python.max=3",
                                                  f"output_dir={tmp_path / 'run'}"]), [])
    assert again is not None and pool.settings.job == again.pools["python"].settings.job  # type: ignore[union-attr]
    assert pool.settings.address == "auto" and pool.spec.pool.max == 3  # type: ignore[union-attr]


def test_a_config_is_checked_when_it_is_made_so_no_caller_can_forget_to_validate() -> None:
    import dataclasses

    from trainer.config import AlgorithmConfig, Config, ConfigError, RolloutConfig

    with pytest.raises(ConfigError, match=r"needs rollout\.group_size >= 2"):
        Config(rollout=RolloutConfig(group_size=1))
    ok = Config()
    with pytest.raises(ConfigError, match=r"algorithm\.credit=turn_gae needs a critic"):
        dataclasses.replace(ok, algorithm=AlgorithmConfig(name="grpo", credit="turn_gae"))


def test_a_resource_with_an_api_block_is_a_shared_rate_limiter_kept_in_the_jobs_processes_on_ray(tmp_path) -> None:
    from agentfly.resources import SharedRateLimiter
    from trainer.builders import build_resources
    from trainer.config import load_config

    config = load_config(overrides=["resources.search.api={key: team-7:search, rate: 2, burst: 3}",
                                    "resources.python.max=1", "resources.backend=ray", "resources.address=auto",
                                    f"output_dir={tmp_path / 'run'}"])
    engine = build_resources(config, [])
    assert engine is not None
    search = engine.specs["search"]
    assert (search.factory, search.kind, search.scope) == (SharedRateLimiter, "api", "global")
    assert search.options == {"key": "team-7:search", "rate": 2.0, "burst": 3}
    # Its budget is already shared through Redis: the limiter runs in each process, only the sandbox on Ray.
    assert search.backend == "inprocess" and engine.specs["python"].backend == "ray"
    with pytest.raises(ConfigError, match=r"resources\.search\.api\.rate=0\.0 must be > 0") as bad:
        load_config(overrides=["resources.search.api={rate: 0}"])
    assert bad.value.key == "resources.search.api.rate"


def test_set_strings_are_coerced_to_each_fields_type_by_the_library() -> None:
    # PyYAML reads 1e-5 (no dot) as a string; the loader, not each caller, turns it into the field's type.
    config = load_config(None, ["optim.lr=1e-5", "rollout.group_size=4.0", "tensorboard=true",
                                "optim.betas=[0.8, 0.9]", "resources.python.max=3", "eval.samples=null",
                                "algorithm.loss_agg=token-mean", "sft.output_dir=2024",
                                "resource_backend.team_budget={sandbox: 8}"])
    assert config.optim.lr == pytest.approx(1e-5) and isinstance(config.optim.lr, float)
    assert config.rollout.group_size == 4 and isinstance(config.rollout.group_size, int)
    assert config.tensorboard is True and config.optim.betas == [0.8, 0.9]
    assert config.resources["python"].max == 3 and config.eval.samples is None
    assert config.algorithm.loss_agg == "token-mean" and config.sft.output_dir == "2024"
    assert config.resource_backend.team_budget == {"sandbox": 8}


def test_a_mapping_from_json_is_coerced_as_yaml_would_be() -> None:
    from trainer.config import from_dict

    config = from_dict(Config, {"rollout": {"group_size": "4"}, "optim": {"lr": "3e-3"}})
    assert config.rollout.group_size == 4 and config.optim.lr == pytest.approx(3e-3)


@pytest.mark.parametrize(("override", "key", "message"), [
    ("eval.samples=many", "eval.samples", "eval.samples: expected an integer or null, got 'many'"),
    ("optim.lr=fast", "optim.lr", "optim.lr: expected a number, got 'fast'"),
    ("steps=true", "steps", "steps: expected an integer, got True"),  # not read as 1
    ("resources.python.max=false", "resources.python.max", "resources.python.max: expected an integer or null, got False"),
    ("progress=maybe", "progress", "progress: expected true or false, got 'maybe'"),
    ("optim.betas=0.9", "optim.betas", "optim.betas: expected a list of float, got 0.9 (write it as [a, b] in YAML)"),
    ("resources.python.max=lots", "resources.python.max",
     "resources.python.max: expected an integer or null, got 'lots'"),
    ("mcp.kv.command=python", "mcp.kv.command", "mcp.kv.command: expected a list of str or null, got 'python'"),
    ("resource_backend.team_budget={sandbox: x}", "resource_backend.team_budget.sandbox",
     "resource_backend.team_budget.sandbox: expected an integer, got 'x'"),
    ("algorithm.loss_agg=token-men", "algorithm.loss_agg",
     "algorithm.loss_agg: 'token-men' is not one of 'token-mean', 'seq-mean-token-sum'"),
    ("trackers=[tensorboard, wandbb]", "trackers[1]",
     "trackers[1]: 'wandbb' is not one of 'tensorboard', 'wandb', 'mlflow' (did you mean 'wandb'?)"),
    ("model=tiny", "model", "model: expected a mapping of ModelConfig fields, got 'tiny'"),
    ("resources.python.size=3", "resources.python.size",
     "unknown config key 'resources.python.size'; valid keys: spec, min, max"),
])
def test_a_value_that_does_not_fit_names_its_field_path_and_what_it_takes(override: str, key: str,
                                                                          message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert str(caught.value).startswith(message) and caught.value.key == key


def test_a_section_alone_is_checked_under_its_own_prefix() -> None:
    from trainer.config import SFTConfig, from_dict

    assert from_dict(SFTConfig, {"lr": "1e-3", "epochs": 2}, "sft.").lr == pytest.approx(1e-3)
    with pytest.raises(ConfigError, match=r"unknown config key 'sft\.lrr'; did you mean 'sft\.lr'") as caught:
        from_dict(SFTConfig, {"lrr": 1}, "sft.")
    assert caught.value.key == "sft.lrr"


def test_an_invalid_combination_is_refused_by_construction_with_validates_message_and_key() -> None:
    from trainer.config import OptimConfig, from_dict

    with pytest.raises(ConfigError, match=r"optim\.lr=0\.0 must be > 0") as caught:
        Config(optim=OptimConfig(lr=0.0))
    assert caught.value.key == "optim.lr"
    # Through the loader too: validate's own ConfigError, not a wrapped pydantic error.
    with pytest.raises(ConfigError, match=r"optim\.lr=0\.0 must be > 0") as caught:
        from_dict(Config, {"optim": {"lr": 0}})
    assert caught.value.key == "optim.lr"
    assert Config().validate().validate() == Config()  # still callable, and idempotent


@pytest.mark.parametrize(("override", "section", "message"), [
    ("rollout.group_size=65", "rollout", "rollout.group_size=65 must be between 1 and 64"),
    ("optim.lr=0.0", "optim", "optim.lr=0.0 must be > 0 and <= 1"),
    ("rollout.max_staleness=0", "rollout", "rollout.max_staleness=0 must be >= 1 (the producer runs at least one "
                                           "step ahead); for on-policy training use rollout.mode=sync"),
    ("sft.habit_fraction=1.5", "sft", "sft.habit_fraction=1.5 must be between 0 and 1"),
])
def test_a_bound_is_declared_once_and_the_loader_and_a_config_built_in_code_refuse_with_one_message(
        override: str, section: str, message: str) -> None:
    import dataclasses

    key, value = parse_override(override)
    with pytest.raises(ConfigError) as loaded:
        load_config(None, [override])
    ok = Config()
    built = dataclasses.replace(getattr(ok, section), **{key.split(".")[1]: value})
    with pytest.raises(ConfigError) as in_code:
        dataclasses.replace(ok, **{section: built})
    assert str(loaded.value) == str(in_code.value) == message
    assert loaded.value.key == in_code.value.key == key


def test_a_resource_pools_bounds_name_the_pool() -> None:
    with pytest.raises(ConfigError, match=r"^resources\.python\.starting=0 must be >= 1 \(or null: no bound\)$") as bad:
        load_config(None, ["resources={python: {starting: 0}}"])
    assert bad.value.key == "resources.python.starting"


def test_the_command_format_is_refused_for_an_agent_with_two_tools_and_behind_the_gateway() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.parser=command plays one tool.s commands") as refused:
        load_config(None, ["rollout.parser=command", "rollout.tools=[agentfly.tools.builtin.textworld:tw_act, "
                           "agentfly.tools.builtin.calculator:calculator]"])
    assert refused.value.key == "rollout.parser"
    with pytest.raises(ConfigError, match=r"gateway's agents send their own tools") as refused:
        load_config(None, ["rollout.parser=command", "gateway.enabled=true"])
    assert refused.value.key == "rollout.parser"
