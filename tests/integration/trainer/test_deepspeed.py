"""DeepSpeed on the CPU: config checks, and real engines (ZeRO 1/2/3, bf16) on the gloo backend.

Each engine runs in its own process group, started the way users start them: a plain ``python`` process (a
world of one) or ``torchrun`` with two ranks, so ZeRO-3 really partitions the parameters across processes.
What needs a GPU and is not covered here: the NCCL backend, CUDA kernels (fused Adam, CPU offload of
optimizer states to pinned memory), and speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer import distributed

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "deepspeed"
WORKER = Path(__file__).with_name("deepspeed_worker.py")


def write(tmp_path: Path, config: Any, name: str = "ds.json") -> Path:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("name,stage", [("zero1_bf16.json", 1), ("zero2_bf16.json", 2), ("zero3_bf16.json", 3)])
def test_the_example_configs_load_with_the_trainers_batch_sizes_filled_in(name: str, stage: int) -> None:
    cfg = distributed.read_deepspeed_config(EXAMPLES / name, micro_batch_size=8, gradient_accumulation_steps=2,
                                            gradient_clipping=1.0)
    assert distributed.zero_stage(cfg) == stage
    assert cfg["bf16"]["enabled"] is True
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (8, 2)
    assert cfg["gradient_clipping"] == 1.0
    assert "auto" not in json.dumps(cfg)


def test_auto_gradient_clipping_is_dropped_when_the_trainer_does_not_clip() -> None:
    cfg = distributed.read_deepspeed_config({"gradient_clipping": "auto", "train_batch_size": "auto"})
    assert "gradient_clipping" not in cfg and "train_batch_size" not in cfg
    assert cfg["train_micro_batch_size_per_gpu"] == 1


@pytest.mark.parametrize("config,message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "top level must be a JSON object"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage must be 0, 1, 2 or 3"),
    ({"zero_optimization": 2}, "zero_optimization must be an object"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "enable one of them"),
    ({"optimizer": {"type": "AdamW"}}, "remove the 'optimizer' section"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu must be a positive integer"),
    ({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}, r"zero_optimization.reduce_bucket_size is"),
])
def test_a_bad_config_fails_with_a_message_naming_the_key(tmp_path: Path, config: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        distributed.read_deepspeed_config(write(tmp_path, config))


def test_a_missing_config_file_is_named() -> None:
    with pytest.raises(FileNotFoundError, match=r"does-not-exist\.json"):
        distributed.read_deepspeed_config("does-not-exist.json")


def test_a_partial_launcher_environment_is_refused_rather_than_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="MASTER_ADDR, MASTER_PORT missing"):
        distributed.init_process_group()


def test_single_process_helpers_work_without_a_process_group() -> None:
    assert distributed.all_reduce_mean(3.5) == 3.5
    distributed.barrier()
    assert distributed.is_main_process() == (distributed.rank() == 0)


def test_the_trainer_imports_without_deepspeed() -> None:
    code = "import sys, trainer.distributed, agentfly; assert 'deepspeed' not in sys.modules, 'deepspeed imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


# ---------------------------------------------------------------------------------------------- real engines
@pytest.fixture
def tiny_dir(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


def run_worker(tiny_dir: Path, config: Path, out: Path, nproc: int) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    if nproc == 1:  # no launcher: the helper makes a world of one
        cmd = [sys.executable, str(WORKER)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(WORKER)]
    done = subprocess.run([*cmd, str(tiny_dir), str(config), str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name,nproc", [("zero1_bf16.json", 1), ("zero2_bf16.json", 2), ("zero3_bf16.json", 2)])
def test_a_deepspeed_engine_trains_the_tiny_model_on_gloo_and_gives_back_its_full_weights(
    tmp_path: Path, tiny_dir: Path, name: str, nproc: int
) -> None:
    config = json.loads((EXAMPLES / name).read_text())
    # The tiny model's tensors are all below the example's persistence threshold (kept whole on every rank,
    # as small tensors should be in a real model); 0 makes ZeRO-3 partition every one of them.
    if distributed.zero_stage(config) == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    reports = run_worker(tiny_dir, write(tmp_path, config), tmp_path / "out.json", nproc)
    stage = distributed.zero_stage(config)
    assert [r["rank"] for r in reports] == list(range(nproc))
    for r in reports:
        assert (r["world_size"], r["backend"], r["zero_stage"], r["bf16"]) == (nproc, "gloo", stage, True)
        assert r["param_dtype"] == "torch.bfloat16"
        assert r["losses"][-1] < r["losses"][0] - 0.5, r["losses"]  # the optimizer steps really happened
        assert all(g > 0 for g in r["grad_norms"])
        assert r["shapes_match"] and r["state_same_on_all_ranks"]
        # The gathered weights are the trained ones: a plain model loaded with them computes the same loss.
        assert abs(r["engine_loss"] - r["plain_loss"]) < 0.02
        if stage == 3:  # each rank keeps its slice only
            assert r["local_numel"] * nproc == pytest.approx(r["full_numel"], rel=0.01)
        else:
            assert r["local_numel"] == r["full_numel"]
    # Ranks train on different batches but step in lockstep on the averaged gradient.
    assert len({tuple(r["losses"]) for r in reports}) == 1


@pytest.mark.slow
def test_agentfly_train_with_deepspeed_runs_the_loop_and_fills_auto_values_from_the_config(
    tmp_path: Path, tiny_dir: Path, agentfly: Any, tiny_overrides: Any
) -> None:
    from trainer.events import read_events

    out = tmp_path / "run"
    sets = tiny_overrides(tiny_dir, out, "optim.grad_clip=0.5", "algorithm.minibatches=2",
                          "rollout.reward=rewards_for_tests:answer_length")
    proc = agentfly("train", "--deepspeed", str(EXAMPLES / "zero2_bf16.json"), *[a for s in sets for a in ("--set", s)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [e["data"] for e in read_events(out / "events.jsonl", "metrics") if "loss/total" in e["data"]]
    assert len(steps) == 2 and all(s["grad_norm"] > 0 for s in steps), steps
    # The example's "auto" values became the run's: 2 prompts x 2 samples in 2 minibatches, optim.grad_clip.
    used = json.loads((out / "deepspeed.json").read_text())
    assert (used["train_micro_batch_size_per_gpu"], used["gradient_clipping"]) == (2, 0.5)
    assert used["zero_optimization"]["stage"] == 2 and used["bf16"]["enabled"] is True
    assert (out / "checkpoint-latest" / "model.safetensors").exists()
