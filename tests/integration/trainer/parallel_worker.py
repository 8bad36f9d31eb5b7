"""Runs of the data-parallel equivalence tests (``test_data_parallel.py``), one process per rank.

Rollouts are scripted: ``SeededEngine`` answers each turn with words drawn from the turn's sampler seed, and
seeds follow a rollout's index in the whole step (``Agent.run(first_index=...)``), so rank r's prompt i gets
exactly the trajectory one process doing all prompts gets for it. That makes the comparison one of the update
alone (denominators, whole-batch statistics, dynamic sampling's cut, gradient averaging), not of sampling
numerics; the real engine's per-row seeding is what makes the same hold for HF rollouts.

    torchrun --standalone --nproc_per_node 2 parallel_worker.py MODEL_DIR OUT_DIR CASES.json
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentfly.engines.base import Engine, Generation, Sampling
from agentfly.rewards import reward

WORDS = ("seven", "plus", "three", "is", "ten", "answer", "carry", "the", "one", "so", "we", "get")


class SeededEngine(Engine):
    """Each turn's text is a function of its sampler seed only (1 to ``words`` words), logprobs 0."""

    def __init__(self, tokenizer: Any, words: int = 10) -> None:
        self.tokenizer = tokenizer
        self.words = words
        self.stop_token_ids = [int(tokenizer.eos_token_id)]
        self.max_model_len = 4096
        self.model_name = "seeded"

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Generation:
        rng = random.Random(sampling.seed)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, self.words)))
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: sampling.max_new_tokens - 1]
        ids.append(self.stop_token_ids[0])
        return Generation(ids, [0.0] * len(ids), "stop")  # type: ignore[arg-type]

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}


@reward
def even_words(final_answer: str | None) -> float:
    """1 for an even number of words: a group of 2 is flat half the time, so dynamic sampling refills."""
    return float(len((final_answer or "").split()) % 2 == 0)


def overrides(model_dir: str, out: Path, *extra: str) -> list[str]:
    """One step of 4 prompts x 4 rollouts; Adam with a large eps so a step is lr * g / eps (linear in the
    gradient: Adam's usual first step is lr * sign(g), where float noise on a tiny gradient flips a whole lr)."""
    return [
        f"model.path={model_dir}", f"output_dir={out}", "steps=1", "threads=1", "progress=false",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.max_turns=1",
        "rollout.reward=rewards_for_tests:answer_length", "data.train_size=64", "data.eval_size=2",
        "eval.max_new_tokens=4", "log_samples=0", "optim.lr=0.5", "optim.eps=1.0", "optim.weight_decay=0.0",
        "algorithm.entropy_coef=0.01", "micro_batch_size=3", *extra,
    ]


def trainer(model_dir: str, out: Path, extra: Sequence[str], resume: str | None = None, words: int = 10) -> Any:
    from transformers import AutoTokenizer

    from trainer.config import load_config
    from trainer.loop import Trainer

    config = load_config(None, overrides(model_dir, out, *extra))
    return Trainer(config, resume=resume, engine=SeededEngine(AutoTokenizer.from_pretrained(model_dir), words))


def weights(t: Any) -> dict[str, torch.Tensor]:
    """Policy and value head, whole (gathered under ZeRO-3; every rank calls this)."""
    from trainer import distributed as dist

    return {k: v.float() for k, v in dist.full_state_dict(t.learner.update.module).items()}


def one_step(model_dir: str, out: Path, extra: Sequence[str], words: int = 10) -> dict[str, Any]:
    """Weights before and after one step, the step's metrics, and how many calls of the policy's forward
    each of the update's micro-batches made (``forwards``)."""
    t = trainer(model_dir, out, extra, words=words)
    forwards: list[int] = []
    calls = [0]
    hook = t.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    micro_step = t.learner.micro_step

    def counted(micro: Any) -> Any:
        before = calls[0]
        out = micro_step(micro)
        forwards.append(calls[0] - before)
        return out

    t.learner.micro_step = counted
    before = weights(t)
    metrics = t.train_step()
    after = weights(t)
    hook.remove()
    return {"delta": {k: after[k] - before[k] for k in before}, "metrics": metrics, "forwards": forwards}


def resumed(model_dir: str, out: Path, extra: Sequence[str]) -> dict[str, Any]:
    """Three steps in one go (checkpoints at 1 and 2), then the run again from the step-2 checkpoint."""
    whole = trainer(model_dir, out / "whole", [*extra, "steps=3", "save_every=2"])
    whole.train()
    a = weights(whole)
    again = trainer(model_dir, out / "again", [*extra, "steps=3"], resume=str(out / "whole" / "checkpoint-000002"))
    step = again.step
    again.train()
    b = weights(again)
    return {"step": step, "whole": a, "again": b}


def async_run(model_dir: str, out: Path, extra: Sequence[str]) -> dict[str, Any]:
    """A whole run in ``rollout.mode=async`` with the real HF engine (each rank's producer samples its share
    with its own copy of the weights); the run's end and its step metrics (rank 0's events)."""
    from trainer.config import load_config
    from trainer.events import read_events
    from trainer.loop import Trainer

    result = Trainer(load_config(None, overrides(model_dir, out, *extra))).train()
    events = read_events(out / "events.jsonl") if (out / "events.jsonl").is_file() else []
    steps = [e["data"] for e in events if e["type"] == "metrics" and "time/step" in e["data"]]
    return {"step": result["step"], "state": result["state"], "steps": steps}


def averaging(rank: int, port: int, out: str) -> None:
    """Rank ``rank`` of 2 (``torch.multiprocessing`` spawns it): gradients that some, all or no ranks have,
    in buckets of one parameter each, averaged; then a module whose weights differ by rank, broadcast."""
    import datetime

    from trainer import distributed as dist

    # A rank left waiting in a collective the other never makes fails after a minute rather than hanging.
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                         timeout=datetime.timedelta(seconds=60))
    params = {name: torch.zeros(3, dtype=dtype, requires_grad=True)
              for name, dtype in (("all", torch.float32), ("one", torch.float32), ("none", torch.float32),
                                  ("half", torch.bfloat16))}
    params["all"].grad = torch.full((3,), rank + 1.0)
    if rank == 1:
        params["one"].grad = torch.tensor([2.0, 4.0, 6.0])
    params["half"].grad = torch.full((3,), rank + 1.0, dtype=torch.bfloat16)
    dist.average_gradients(list(params.values()), bucket_bytes=12)
    torch.manual_seed(rank)
    module = torch.nn.Linear(2, 2)
    dist.broadcast_module(module)
    torch.save({"grads": {k: p.grad for k, p in params.items()}, "weights": module.state_dict()},
               Path(out) / f"averaging-{rank}.pt")
    torch.distributed.destroy_process_group()


def main(model_dir: str, out_dir: str, cases_path: str) -> None:
    from trainer import distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group()
    out = Path(out_dir)
    for case in json.loads(Path(cases_path).read_text()):
        run = resumed if case.get("resume") else async_run if case.get("async") else one_step
        kwargs = {"words": case["words"]} if "words" in case else {}
        result = run(model_dir, out / case["name"], case["overrides"], **kwargs)
        if dist.rank() == 0:
            torch.save(result, out / f"{case['name']}.pt")
        elif case.get("async") or case.get("every_rank"):  # every rank's result, to compare the ranks
            torch.save(result, out / f"{case['name']}-rank{dist.rank()}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
