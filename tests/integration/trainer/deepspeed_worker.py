"""One rank of the DeepSpeed integration test (run by ``torchrun`` from ``test_deepspeed.py``).

Wraps the tiny model in a DeepSpeed engine through ``trainer.distributed.deepspeed_initialize``, trains a few
steps on a fixed batch (a different batch per rank), gathers the full weights with ``full_state_dict`` and
checks them against a plain model loaded with those weights. Rank 0 writes what it saw as JSON.

    torchrun --standalone --nproc_per_node 2 deepspeed_worker.py MODEL_DIR CONFIG.json OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

torch.set_num_threads(1)


def main(model_dir: str, config_path: str, out_path: str) -> None:
    from transformers import AutoModelForCausalLM

    from trainer import distributed as dist

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    full_shapes = {n: list(p.shape) for n, p in model.state_dict().items()}
    full_numel = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    engine, _ = dist.deepspeed_initialize(model, optimizer, config_path, micro_batch_size=4, gradient_clipping=1.0)
    rank, world = dist.rank(), dist.world_size()

    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, 500, (4, 24), generator=g)
    losses, grad_norms = [], []
    for _ in range(4):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(dist.all_reduce_mean(loss.detach().float()))
        grad_norms.append(float(engine.get_global_grad_norm() or 0.0))

    params = list(engine.module.parameters())
    # Under ZeRO-3 a parameter's local storage is this rank's slice (ds_tensor); otherwise the whole tensor.
    local_numel = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params)
    with torch.no_grad():
        engine.eval()
        engine_loss = float(engine(input_ids=ids, labels=ids).loss)
    state = dist.full_state_dict(engine, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain.load_state_dict(state)
    with torch.no_grad():
        plain_loss = float(plain(input_ids=ids, labels=ids).loss)
    checksum = dist.all_reduce_mean(sum(float(t.double().sum()) for t in state.values()))
    mine = sum(float(t.double().sum()) for t in state.values())
    report = {
        "rank": rank, "world_size": world, "backend": torch.distributed.get_backend(),
        "zero_stage": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled(),
        "param_dtype": str(params[0].dtype), "losses": losses, "grad_norms": grad_norms,
        "local_numel": local_numel, "full_numel": full_numel,
        "shapes_match": {n: list(t.shape) for n, t in state.items()} == full_shapes,
        "engine_loss": engine_loss, "plain_loss": plain_loss,
        "state_same_on_all_ranks": abs(checksum - mine) <= 1e-6 * max(1.0, abs(mine)),
    }
    reports = [None] * world
    torch.distributed.all_gather_object(reports, report)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(reports, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
