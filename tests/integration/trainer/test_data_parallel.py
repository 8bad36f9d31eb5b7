"""Data parallelism on the CPU (gloo): 2 real ranks started by ``torchrun`` compute the one-process step.

One step of 2 ranks x 2 prompts must leave the same parameters (policy and value head) as 1 rank x 4 prompts,
for every algorithm, in plain torch ("ddp" in the names: the ranks average their gradients once per
optimizer step), also when the ranks' forwards take different numbers of passes, and with DeepSpeed
ZeRO-1/2/3; a 2-rank run resumed at step k reproduces step k+1; launches that cannot work are refused at
start with the fix named. Rollouts are scripted by their sampler seeds (``parallel_worker.SeededEngine``), so
both sides train on the same trajectories and the comparison is of the update alone. Each ``torchrun`` launch
runs all its cases in one process group (the launch, not the cases, is what costs time); torch runs one thread
per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import parallel_worker as pw  # this folder is on sys.path (pytest prepends a test file's folder)
import pytest
import torch

from trainer.config import ConfigError, load_config
from trainer.events import read_events

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

ALGORITHMS: dict[str, list[str]] = {
    "grpo": ["algorithm.name=grpo"],
    "rloo": ["algorithm.name=rloo"],
    "reinforce_pp": ["algorithm.name=reinforce_pp"],  # advantages whitened over the whole batch
    # Groups of 2 on a reward that is flat half the time: rounds are refilled and the batch is cut.
    "dapo": ["algorithm.name=dapo", "rollout.group_size=2", "rollout.reward=parallel_worker:even_words"],
    "ppo": ["algorithm.name=ppo"],  # value head trained in the same module; advantages whitened globally
}
# Answers of 1 to 60 words: rows far apart in length, so a micro-batch's forward splits them into buckets.
GROUPED = {"words": 60, "overrides": [*ALGORITHMS["grpo"], "rollout.max_new_tokens=96", "micro_batch_size=4"]}


def launch(tmp: Path, model_dir: Path, cases: list[dict[str, Any]]) -> Path:
    """Run ``cases`` on 2 ranks in one ``torchrun``; each case's result is ``OUT/<name>.pt``."""
    out = tmp / "ranks"
    out.mkdir()
    (tmp / "cases.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "parallel_worker.py"), str(model_dir), str(out), str(tmp / "cases.json")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    diff = sum(float((a[k] - b[k]).double().norm() ** 2) for k in a) ** 0.5
    return diff / sum(float(b[k].double().norm() ** 2) for k in b) ** 0.5


def assert_same_step(got: dict[str, Any], ref: dict[str, Any], rel: float) -> None:
    assert sum(float(v.norm()) for v in ref["delta"].values()) > 0.1  # the step moved the weights
    assert relative_difference(got["delta"], ref["delta"]) < rel
    # Every logged metric is the one-process value (times and throughput aside: they are measurements).
    for key, value in ref["metrics"].items():
        if key.startswith("time/") or key == "tokens_per_second":
            continue
        assert got["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """The 1-rank x 4-prompt step of an algorithm, in this process (plain torch, no process group)."""
    cache: dict[str, dict[str, Any]] = {}
    root = tmp_path_factory.mktemp("reference")

    def get(name: str) -> dict[str, Any]:
        if name not in cache:
            cache[name] = pw.one_step(str(tiny_model_dir), root / name, ALGORITHMS[name])
        return cache[name]

    return get


@pytest.fixture(scope="module")
def ddp_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = [{"name": n, "overrides": o} for n, o in ALGORITHMS.items()]
    cases.append({"name": "resume", "resume": True, "overrides": ALGORITHMS["grpo"]})
    cases.append({"name": "grouped", "every_rank": True, **GROUPED})
    return launch(tmp_path_factory.mktemp("ddp"), tiny_model_dir, cases)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_one_ddp_step_of_2_ranks_x_2_prompts_leaves_the_parameters_of_1_rank_x_4_prompts(
    ddp_runs: Path, reference: Callable[[str], dict[str, Any]], algorithm: str
) -> None:
    got = torch.load(ddp_runs / f"{algorithm}.pt", weights_only=False)
    assert_same_step(got, reference(algorithm), rel=1e-5)
    if algorithm == "dapo":  # the refill and the cut were exercised, not skipped
        assert got["metrics"]["rollout/rounds"] > 1 and got["metrics"]["rollout/kept_fraction"] < 1


def test_2_ranks_make_the_forward_passes_their_own_rows_need_and_still_take_the_one_process_step(
        ddp_runs: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    ranks = [torch.load(ddp_runs / "grouped.pt", weights_only=False),
             torch.load(ddp_runs / "grouped-rank1.pt", weights_only=False)]
    # Length buckets: more than the common-prefix layout's 2 calls a micro-batch, and not as many on each rank
    # (a collective in forward would have left the ranks waiting on each other for ever).
    assert max(max(r["forwards"]) for r in ranks) > 2
    assert ranks[0]["forwards"] != ranks[1]["forwards"]
    reference = pw.one_step(str(tiny_model_dir), tmp_path, GROUPED["overrides"], words=GROUPED["words"])
    assert_same_step(ranks[0], reference, rel=1e-5)
    for k, v in ranks[0]["delta"].items():  # the ranks took the very same step
        assert torch.equal(v, ranks[1]["delta"][k]), k


def test_2_ranks_average_the_gradients_they_have_and_start_from_rank_0s_weights(tmp_path: Path) -> None:
    from trainer.distributed import free_port

    torch.multiprocessing.start_processes(pw.averaging, (free_port(), str(tmp_path)), nprocs=2,
                                          start_method="spawn")
    ranks = [torch.load(tmp_path / f"averaging-{r}.pt", weights_only=False) for r in (0, 1)]
    for got in ranks:
        grads = got["grads"]
        assert torch.equal(grads["all"], torch.full((3,), 1.5))
        assert torch.equal(grads["one"], torch.tensor([1.0, 2.0, 3.0]))  # rank 0 had none: it counts as zeros
        assert grads["none"] is None  # no rank had one: the optimizer skips it, as one process would
        assert grads["half"].dtype == torch.bfloat16 and torch.equal(grads["half"].float(), torch.full((3,), 1.5))
    torch.manual_seed(0)
    rank_0 = torch.nn.Linear(2, 2).state_dict()
    for got in ranks:
        assert all(torch.equal(got["weights"][k], rank_0[k]) for k in rank_0)


def test_a_2_rank_ddp_run_resumed_at_step_k_reproduces_step_k_plus_1(ddp_runs: Path) -> None:
    got = torch.load(ddp_runs / "resume.pt", weights_only=False)
    assert got["step"] == 2
    assert relative_difference(got["again"], got["whole"]) < 1e-6


@pytest.mark.slow
def test_an_async_2_rank_run_trains_a_few_steps_and_every_rank_ends(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Real HF rollouts on each rank's producer thread; DAPO's refill rounds make the producers' cross-rank
    # counts (their side group) run while the trainers' gradient all-reduce does.
    extra = ["rollout.mode=async", "rollout.max_staleness=1", "steps=3", "algorithm.name=dapo",
             "rollout.group_size=2", "rollout.reward=parallel_worker:even_words", "rollout.max_new_tokens=8",
             "optim.lr=0.001"]
    out = launch(tmp_path, tiny_model_dir, [{"name": "async", "async": True, "overrides": extra}])
    main, other = torch.load(out / "async.pt", weights_only=False), torch.load(out / "async-rank1.pt",
                                                                              weights_only=False)
    assert (main["step"], main["state"]) == (other["step"], other["state"]) == (3, "succeeded")
    assert [s["step"] for s in main["steps"]] == [1.0, 2.0, 3.0]
    for s in main["steps"]:
        assert s["rollout/staleness_max"] <= 1.0 and s["rollout/dropped_stale"] == 0.0
        assert "off_policy/weight_mean" in s and s["rollout/rounds"] >= 1


def test_rank_0_alone_writes_events_and_each_rank_its_rng_state(ddp_runs: Path) -> None:
    run = ddp_runs / "resume" / "whole"
    steps = [e["step"] for e in read_events(run / "events.jsonl", "metrics") if "time/rollout" in e["data"]]
    assert steps == [1, 2, 3]  # once each: rank 1 wrote none
    ckpt = run / "checkpoint-latest"
    assert {p.name for p in ckpt.glob("rank-*.pt")} == {"rank-00000.pt", "rank-00001.pt"}
    assert torch.load(ckpt / "trainer_state.pt", weights_only=False)["world_size"] == 2


def test_a_ddp_checkpoint_of_2_ranks_resumes_on_1_rank(ddp_runs: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    # Plain torch keeps the whole optimizer state on every rank, so it reshards to any world size.
    trainer = pw.trainer(str(tiny_model_dir), tmp_path / "one", [*ALGORITHMS["grpo"], "steps=3"],
                         resume=str(ddp_runs / "resume" / "whole" / "checkpoint-000002"))
    assert trainer.step == 2


# Every algorithm under every ZeRO stage (one torchrun runs them all, one step each).
DEEPSPEED_CASES = [(f"zero{stage}", stage, algorithm) for stage in (1, 2, 3) for algorithm in ALGORITHMS]


@pytest.fixture(scope="module")
def deepspeed_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("deepspeed")
    tmp = tmp_path_factory.mktemp("deepspeed")
    cases = []
    for stage in (1, 2, 3):
        # fp32 (the bf16 examples would compare bf16 rounding, not the reductions); 0 makes ZeRO-3 partition
        # every tensor of the tiny model, all of which are below the default persistence threshold.
        (tmp / f"zero{stage}.json").write_text(json.dumps({
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1}))
    for label, _, algorithm in DEEPSPEED_CASES:
        cases.append({"name": f"{label}-{algorithm}",
                      "overrides": [*ALGORITHMS[algorithm], f"deepspeed={tmp / f'{label}.json'}"]})
    cases.append({"name": "resume", "resume": True, "overrides": [*ALGORITHMS["ppo"], f"deepspeed={tmp / 'zero2.json'}"]})
    for stage in (1, 2):  # rows far apart in length: each rank's forward makes the passes its own rows need
        cases.append({"name": f"zero{stage}-grouped", "every_rank": True, "words": GROUPED["words"],
                      "overrides": [*GROUPED["overrides"], f"deepspeed={tmp / f'zero{stage}.json'}"]})
    return launch(tmp, tiny_model_dir, cases)


@pytest.mark.slow
@pytest.mark.parametrize("label,stage,algorithm", DEEPSPEED_CASES)
def test_one_deepspeed_step_of_2_ranks_leaves_the_parameters_of_1_rank_x_4_prompts(
    deepspeed_runs: Path, reference: Callable[[str], dict[str, Any]], label: str, stage: int, algorithm: str
) -> None:
    got = torch.load(deepspeed_runs / f"{label}-{algorithm}.pt", weights_only=False)
    # Against plain torch on one rank; DeepSpeed's flattened fp32 partitions round a little differently.
    assert_same_step(got, reference(algorithm), rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_2_zero_1_or_2_ranks_make_the_forward_passes_their_own_rows_need_and_take_the_one_process_step(
        deepspeed_runs: Path, tiny_model_dir: Path, tmp_path: Path, stage: int) -> None:
    ranks = [torch.load(deepspeed_runs / f"zero{stage}-grouped.pt", weights_only=False),
             torch.load(deepspeed_runs / f"zero{stage}-grouped-rank1.pt", weights_only=False)]
    # ZeRO-1/2 make no collective in forward: the ranks' grouped passes differ and nothing waits on them.
    assert max(max(r["forwards"]) for r in ranks) > 2
    assert ranks[0]["forwards"] != ranks[1]["forwards"]
    reference = pw.one_step(str(tiny_model_dir), tmp_path, GROUPED["overrides"], words=GROUPED["words"])
    assert_same_step(ranks[0], reference, rel=1e-4)


@pytest.mark.slow
def test_a_2_rank_deepspeed_run_resumed_at_step_k_reproduces_step_k_plus_1(deepspeed_runs: Path) -> None:
    got = torch.load(deepspeed_runs / "resume.pt", weights_only=False)
    assert got["step"] == 2
    assert relative_difference(got["again"], got["whole"]) < 1e-6
    ckpt = deepspeed_runs / "resume" / "whole" / "checkpoint-000002"
    assert (ckpt / "deepspeed").is_dir() and (ckpt / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_deepspeed_checkpoint_of_2_ranks_is_refused_on_1_rank_with_the_fix_named(
    deepspeed_runs: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    ckpt = deepspeed_runs / "resume" / "whole" / "checkpoint-000002"
    ds = json.loads((ckpt.parent / "deepspeed.json").read_text())
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    with pytest.raises(ConfigError, match=r"saved by 2 DeepSpeed ranks .* resume with 2 ranks"):
        pw.trainer(str(tiny_model_dir), tmp_path / "one", [*ALGORITHMS["ppo"], f"deepspeed={tmp_path / 'ds.json'}"],
                   resume=str(ckpt))


# ---------------------------------------------------------------------------------------------- refusals
@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``ranks(n)``: this process is rank 0 of a launch of ``n`` (as torchrun would say; nothing joins)."""

    def set_world(n: int) -> None:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(n))

    return set_world


def test_a_world_size_that_does_not_divide_the_prompts_is_refused_with_the_fix_named(
    ranks: Callable[[int], None], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from trainer.loop import Trainer

    ranks(3)
    with pytest.raises(ConfigError, match=r"prompts_per_step=4 is not divisible by the 3 ranks.*multiple of 3"):
        Trainer(load_config(None, pw.overrides(str(tiny_model_dir), tmp_path)))
    assert not (tmp_path / "config.yaml").exists()  # refused before anything was written


def test_zero3_with_the_colocated_hf_engine_on_several_ranks_is_refused_with_the_fix_named(
    ranks: Callable[[int], None], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from trainer.loop import Trainer

    ranks(2)
    ds = ROOT / "examples" / "deepspeed" / "zero3_bf16.json"
    with pytest.raises(ConfigError, match=r"ZeRO-3.*engine=hf.*use ZeRO-2.*or engine=vllm"):
        Trainer(load_config(None, pw.overrides(str(tiny_model_dir), tmp_path, f"deepspeed={ds}")))


def test_a_deepspeed_resume_on_another_world_size_is_refused_before_loading(
    ranks: Callable[[int], None], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from trainer.loop import Trainer

    ckpt = tmp_path / "checkpoint-000004"
    ckpt.mkdir()
    torch.save({"world_size": 4, "step": 4}, ckpt / "trainer_state.pt")
    ranks(2)
    ds = ROOT / "examples" / "deepspeed" / "zero2_bf16.json"
    with pytest.raises(ConfigError, match=r"saved by 4 DeepSpeed ranks and this launch has 2.*--nproc_per_node 4"):
        Trainer(load_config(None, pw.overrides(str(tiny_model_dir), tmp_path / "run", f"deepspeed={ds}")),
                resume=ckpt)


@pytest.mark.slow
@pytest.mark.parametrize("deepspeed", [None, "zero1_bf16.json", "zero2_bf16.json"])
def test_2_ranks_whose_batches_group_and_bucket_differently_train_without_waiting_on_each_other(
        tiny_model_dir: Path, tmp_path: Path, deepspeed: str | None) -> None:
    # At 16 prompts x 4 rollouts a rank, the ranks' update forwards would take different numbers of passes
    # (group runs, length buckets); under DDP, which syncs buffers in every pass, the ranks waited on each other
    # for ever.
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    sets = [f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "steps=2", "threads=1", "progress=false",
            "rollout.prompts_per_step=32", "rollout.group_size=4", "rollout.max_new_tokens=24",
            "rollout.max_turns=2", "data.train_size=256", "data.eval_size=2", "eval.max_new_tokens=4",
            "log_samples=0", "save_every=0"]
    # Under ZeRO-1/2 too: their collectives are the gradient reductions in backward, whatever the passes.
    ds = ["--deepspeed", str(ROOT / "examples" / "deepspeed" / deepspeed)] if deepspeed else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "trainer.cli", "train", *ds, *[a for s in sets for a in ("--set", s)]]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["step"] == 2
