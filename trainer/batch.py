"""Trajectories as padded tensors (``Batch``, ``collate``) and the policy's forward pass over them
(``forward``: token logprobs, entropy and hidden states, computing a prompt prefix shared by every row once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainer import algorithms as algos

if TYPE_CHECKING:
    from agentfly.rollout.trajectory import Trajectory


@dataclass
class Batch:
    """Trajectories as right-padded tensors. Per-token tensors are shifted to *predicted* tokens:
    position t is about token t + 1 (see ``trainer.algorithms.core``)."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1]  loss_mask[:, 1:]
    rollout_logprobs: torch.Tensor  # [B, L-1]
    rewards: torch.Tensor  # [B]  (after shaping)
    group_ids: torch.Tensor  # [B]

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: torch.Tensor) -> Batch:
        return Batch(*(t.index_select(0, index) for t in (self.input_ids, self.attention_mask, self.mask,
                                                          self.rollout_logprobs, self.rewards, self.group_ids)))


def collate(trajectories: Sequence[Trajectory], rewards: Sequence[float], group_ids: Sequence[int], pad_id: int,
            device: torch.device) -> Batch:
    """Pad trajectories on the right into one batch; token ids and masks are taken as the rollout made them."""
    B = len(trajectories)
    L = max(len(t.token_ids) for t in trajectories)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    loss_mask = torch.zeros((B, L), dtype=torch.long)
    logps = torch.zeros((B, L), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        ids[i, :n] = torch.tensor(t.token_ids)
        attn[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(t.loss_mask)
        logps[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    return Batch(ids.to(device), attn.to(device), loss_mask[:, 1:].to(device), logps[:, 1:].to(device),
                 torch.tensor(list(rewards), dtype=torch.float32, device=device),
                 torch.tensor(list(group_ids), dtype=torch.long, device=device))


def trim(batch: Batch, width: int) -> Batch:
    """The batch cut to ``width`` token positions (its longest row), dropping padding columns."""
    return Batch(batch.input_ids[:, :width], batch.attention_mask[:, :width], batch.mask[:, : width - 1],
                 batch.rollout_logprobs[:, : width - 1], batch.rewards, batch.group_ids)


def agg_denominator(mask: torch.Tensor, mode: str, minimum: float = 1.0) -> float:
    """What ``aggregate_loss`` divides by for ``mode``: trained tokens, sequences with trained tokens, or
    rows (``seq-mean-token-sum-norm``'s constant length cancels between micro-batch and minibatch).
    ``minimum=0`` gives the raw count, for summing over ranks before the floor is applied."""
    if mode == "token-mean":
        return max(float(mask.sum()), minimum)
    if mode == "seq-mean-token-sum-norm":
        return max(float(mask.shape[0]), minimum)
    return max(float((mask.sum(-1) > 0).sum()), minimum)


def shared_prefix_length(batch: Batch, loss_mask_start: int, minimum: int = 16) -> int:
    """Length of the token prefix every row shares, capped before the first trained token (0 if short).

    Every trajectory of a batch starts with the same system prompt and tool schemas (most of its tokens on
    the tiny model); computing that prefix once and broadcasting its KV cache to all rows gives the same
    logprobs and the same gradients (``batch_repeat_interleave`` is differentiable) at a fraction of the cost.
    """
    ids = batch.input_ids
    if ids.shape[0] < 2:
        return 0
    same = (ids == ids[:1]).all(0) & (batch.attention_mask == 1).all(0)
    differs = (~same).nonzero()
    length = int(differs[0].item()) if differs.numel() else ids.shape[1]
    # Each row keeps at least one token of its own, and the prefix holds no trained token.
    length = min(length, loss_mask_start, ids.shape[1] - 1)
    return length if length >= minimum else 0


def forward(model: Any, batch: Batch, temperature: float, *, entropy: bool = False, hidden: bool = False,
            share_prefix: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logprobs of the batch's tokens [B, L-1], and optionally the entropy [B, L-1] and last hidden states
    [B, L-1, H] at the predicting positions. Positions inside a shared prompt prefix (all mask 0) hold 0."""
    B, L = batch.input_ids.shape
    trained = batch.mask.any(0).nonzero()
    first_trained = int(trained[0].item()) + 1 if trained.numel() else L - 1
    P = shared_prefix_length(batch, first_trained) if share_prefix else 0
    if P:
        pre = model(input_ids=batch.input_ids[:1, :P], use_cache=True, output_hidden_states=hidden)
        cache = pre.past_key_values
        cache.batch_repeat_interleave(B)
        positions = torch.arange(P, L, device=batch.input_ids.device).expand(B, L - P)
        out = model(input_ids=batch.input_ids[:, P:], attention_mask=batch.attention_mask,
                    past_key_values=cache, position_ids=positions, use_cache=True, output_hidden_states=hidden)
        # Predicting positions P-1 .. L-2: the prefix's last position, then all but the last suffix position.
        logits = torch.cat([pre.logits[:, -1:].expand(B, 1, -1), out.logits[:, :-1]], dim=1)
        h = (torch.cat([pre.hidden_states[-1][:, -1:].expand(B, 1, -1), out.hidden_states[-1][:, :-1]], dim=1)
             if hidden else None)
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=hidden,
                    use_cache=False)
        logits = out.logits[:, :-1]
        h = out.hidden_states[-1][:, :-1] if hidden else None
    start = max(P - 1, 0)
    logp_part = algos.token_logprobs(logits, batch.input_ids[:, start + 1:], temperature)
    logp = torch.nn.functional.pad(logp_part, (start, 0))
    ent = None
    if entropy:
        scaled = logits.float() / temperature if temperature != 1.0 else logits
        ent = torch.nn.functional.pad(algos.entropy_from_logits(scaled), (start, 0))
    if h is not None:
        h = torch.nn.functional.pad(h, (0, 0, start, 0))
    return logp, ent, h
