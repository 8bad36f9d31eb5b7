"""The training loop end to end on the tiny model: resume equivalence and a short run that learns."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.events import CallbackSink, read_events
from trainer.loop import Trainer

pytestmark = pytest.mark.slow

REWARD = "rollout.reward=rewards_for_tests:answer_length"


def step_metrics(path: Path) -> dict[int, dict]:
    return {e["step"]: e["data"] for e in read_events(path, "metrics") if "time/rollout" in e["data"]}


def test_a_run_resumed_at_step_k_reproduces_step_k_plus_1(tiny_model_dir, tmp_path, tiny_overrides):
    common = [REWARD, "steps=3", "optim.lr=0.003", "algorithm.entropy_coef=0.01"]
    whole = tmp_path / "whole"
    Trainer(load_config(None, tiny_overrides(tiny_model_dir, whole, *common, "save_every=2"))).train()
    resumed = tmp_path / "resumed"
    trainer = Trainer(load_config(None, tiny_overrides(tiny_model_dir, resumed, *common)),
                      resume=whole / "checkpoint-000002")
    assert trainer.step == 2
    trainer.train()
    a, b = step_metrics(whole / "events.jsonl")[3], step_metrics(resumed / "events.jsonl")[3]
    assert step_metrics(resumed / "events.jsonl").keys() == {3}
    for key in ("reward/mean", "response_length/mean", "loss/policy", "grad_norm", "entropy", "lr"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    # The weights moved between steps, so equality above is not the trivial kind.
    assert step_metrics(whole / "events.jsonl")[2]["grad_norm"] > 0


def test_a_short_run_improves_the_mean_reward_on_a_fixed_seed(tiny_model_dir, tmp_path, tiny_overrides):
    events: list[dict] = []
    config = load_config(None, tiny_overrides(
        tiny_model_dir, tmp_path / "run", REWARD, "steps=8", "seed=3", "data.train_size=4",
        "rollout.prompts_per_step=4", "rollout.group_size=8", "rollout.max_new_tokens=12", "optim.lr=0.005",
        "algorithm.name=rloo"))
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    rewards = [e["data"]["reward/mean"] for e in events if e["type"] == "metrics" and "time/rollout" in e["data"]]
    assert len(rewards) == 8
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.05, rewards


def test_lora_trains_only_the_adapters_and_its_checkpoint_resumes_and_loads(tiny_model_dir, tmp_path, tiny_overrides):
    pytest.importorskip("peft")
    import torch

    from trainer.builders import load_policy

    overrides = tiny_overrides(tiny_model_dir, tmp_path / "lora", REWARD, "model.lora.enabled=true",
                               "model.lora.r=4", "optim.lr=0.01", "steps=1")
    trainer = Trainer(load_config(None, overrides))
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    result = trainer.train()
    ckpt = Path(result["checkpoint"])
    assert (ckpt / "adapter_model.safetensors").exists()
    assert all(torch.equal(p, base_before[n]) for n, p in trainer.model.named_parameters() if n in base_before)
    resumed = Trainer(load_config(None, [*overrides, "steps=2", f"output_dir={tmp_path / 'again'}"]), resume=ckpt)
    assert resumed.step == 1
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    model, _ = load_policy(load_config(None, overrides), torch.device("cpu"), path=str(ckpt))
    lora_a = {n: p for n, p in model.named_parameters() if "lora_A" in n}
    assert lora_a and all(torch.equal(p, dict(trainer.model.named_parameters())[n]) for n, p in lora_a.items())


def assert_same_step(tiny_model_dir, tmp_path, tiny_overrides, common: list[str], variants: list[list[str]],
                     keys: tuple[str, ...]) -> None:
    """One training step of the tiny model under ``common`` plus each of the two ``variants``: the same metrics
    at ``keys`` and the same gradients. (The gradients stay on the parameters after the step. Weights are not
    compared: Adam's first step is about lr * sign(g), so float noise on a near-zero gradient flips a whole lr.)"""
    import torch

    runs = []
    for i, variant in enumerate(variants):
        trainer = Trainer(load_config(None, tiny_overrides(
            tiny_model_dir, tmp_path / f"variant-{i}", REWARD, "steps=1", "rollout.prompts_per_step=2",
            "rollout.group_size=4", "optim.lr=0.003", *common, *variant)))
        metrics = trainer.train_step()
        runs.append((metrics, torch.cat([p.grad.flatten() for p in trainer.model.parameters()])))
    (a, wa), (b, wb) = runs
    for key in keys:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert torch.allclose(wa, wb, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_accumulate_to_the_same_update_as_one_batch(tiny_model_dir, tmp_path, agg, tiny_overrides):
    assert_same_step(tiny_model_dir, tmp_path, tiny_overrides,
                     [f"algorithm.loss_agg={agg}", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01"],
                     [["micro_batch_size=1"], ["micro_batch_size=64"]],
                     ("loss/policy", "grad_norm", "kl", "entropy", "logprob_mismatch"))


def test_a_token_bound_per_pass_gives_the_same_ppo_update_with_kl_as_one_batch(tiny_model_dir, tmp_path,
                                                                                tiny_overrides):
    # 1 token: every row alone, in the update and in the no-gradient passes (values, the KL reference).
    assert_same_step(tiny_model_dir, tmp_path, tiny_overrides, ["algorithm.name=ppo", "algorithm.kl_coef=0.05"],
                     [[], ["micro_batch_tokens=1"]], ("loss/policy", "grad_norm", "kl", "entropy", "logprob_mismatch"))


def test_gradient_checkpointing_trains_a_step_to_the_same_gradient_as_without(tiny_model_dir, tmp_path,
                                                                              tiny_overrides):
    assert_same_step(tiny_model_dir, tmp_path, tiny_overrides, [],
                     [["model.gradient_checkpointing=false"], ["model.gradient_checkpointing=true"]],
                     ("loss/policy", "grad_norm", "entropy"))


def test_tools_that_declare_a_resource_get_a_pool_whose_stats_are_events(tiny_model_dir, tmp_path, tiny_overrides):
    events: list[dict] = []
    config = load_config(None, tiny_overrides(
        tiny_model_dir, tmp_path / "run", "steps=1", "resources={python: {max: 2}}",
        "rollout.tools=[agentfly.tools.builtin.python_code:python_code, agentfly.tools.builtin.calculator:calculator]"))
    trainer = Trainer(config, sinks=[CallbackSink(events.append)])
    trainer.train()
    pools = [e["data"]["pools"] for e in events if e["type"] == "resources"]
    assert pools and pools[0]["python"]["max"] == 2 and pools[0]["python"]["kind"] == "sandbox"
    assert trainer.agent.resources.stats()["python"]["size"] == 0  # closed at the end: nothing left


def test_an_unknown_resource_names_the_config_key_to_add(tiny_model_dir, tmp_path):
    from trainer.builders import build_resources

    config = load_config(None, ["resources={gpu_judge: {max: 1}}"])
    with pytest.raises(ValueError, match=r"resources\.gpu_judge\.spec"):
        build_resources(config, [])
