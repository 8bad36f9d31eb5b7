"""Trajectories as padded tensors (``Batch``, ``collate``) and the policy's forward pass over them
(``forward``: token logprobs, entropy and hidden states, computing a prompt prefix shared by every row once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
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


@dataclass
class TurnLayout:
    """A batch's turns as tensors (see ``trainer.algorithms.turns``): K = the most turns of any row."""

    rewards: torch.Tensor  # [B, K]  turn rewards, the row's outcome (shaped) reward added on its last turn
    mask: torch.Tensor  # [B, K]  1 for the turns a row has
    states: torch.Tensor  # [B, K]  an integer per distinct ``Turn.state`` (-1 past a row's turns)
    turn_of: torch.Tensor  # [B, L-1]  the turn of each predicted position, -1 on prompt, observations, padding


def turn_layout(trajectories: Sequence[Trajectory], outcome: torch.Tensor, width: int,
                kl_reward: torch.Tensor | None = None, kl_coef: float = 0.0) -> TurnLayout:
    """The turns of ``trajectories`` laid out for turn-level credit; positions are shifted as ``Batch.mask``
    is (position t predicts token t + 1). ``kl_reward`` ([B, L-1]), when KL is applied in the reward, is taken
    off each turn as the sum over the turn's tokens, times ``kl_coef``."""
    B, K = len(trajectories), max((t.num_turns for t in trajectories), default=0)
    device = outcome.device
    rewards = torch.zeros(B, K, dtype=torch.float32)
    mask = torch.zeros(B, K, dtype=torch.float32)
    states = torch.full((B, K), -1, dtype=torch.long)
    turn_of = torch.full((B, width), -1, dtype=torch.long)
    codes: dict[str, int] = {}
    for i, t in enumerate(trajectories):
        if not t.turns:
            continue
        per_turn = t.rewards_per_turn()
        for k, turn in enumerate(t.turns):
            rewards[i, k] = per_turn[k]
            mask[i, k] = 1.0
            states[i, k] = codes.setdefault(turn.state, len(codes))
            turn_of[i, max(turn.start - 1, 0):max(turn.end - 1, 0)] = k
        rewards[i, t.num_turns - 1] += float(outcome[i])
    turn_of, rewards = turn_of.to(device), rewards.to(device)
    if kl_reward is not None and kl_coef and K:
        on = turn_of >= 0
        penalty = torch.zeros(B, K, dtype=torch.float32, device=device)
        penalty.scatter_add_(1, turn_of.clamp(min=0), torch.where(on, kl_reward.float(), torch.zeros_like(kl_reward)))
        rewards = rewards - kl_coef * penalty
    return TurnLayout(rewards, mask.to(device), states.to(device), turn_of)


def trim(batch: Batch, width: int) -> Batch:
    """The batch cut to ``width`` token positions (its longest row), dropping padding columns."""
    return Batch(batch.input_ids[:, :width], batch.attention_mask[:, :width], batch.mask[:, : width - 1],
                 batch.rollout_logprobs[:, : width - 1], batch.rewards, batch.group_ids)


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, max_rows: int,
                  max_tokens: int | None = None) -> list[torch.Tensor]:
    """``rows`` (indices sorted by ``lengths``, shortest first) cut into micro-batches of at most ``max_rows``
    rows and, with ``max_tokens``, at most that many padded tokens each (its rows x its longest row): what one
    forward pass holds, logits included (tokens x vocabulary). A row longer than ``max_tokens`` goes alone."""
    if max_tokens is None:
        return list(rows.split(max_rows))
    out: list[list[int]] = []
    chunk: list[int] = []
    for row in rows.tolist():
        width = int(lengths[row])
        if chunk and (len(chunk) == max_rows or (len(chunk) + 1) * width > max_tokens):
            out.append(chunk)
            chunk = []
        chunk.append(row)
    if chunk:
        out.append(chunk)
    return [torch.tensor(c, dtype=rows.dtype) for c in out]


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


@dataclass
class GroupPrefixes:
    """Rows grouped by the prompt they share after the prefix every row shares: a GRPO group's question."""

    row_group: torch.Tensor  # [B]  the group of each row, 0 .. G-1
    leaders: torch.Tensor  # [G]  one row of each group, whose tokens the group's pass reads
    lengths: torch.Tensor  # [G]  tokens every row of the group shares after the common prefix

    @property
    def width(self) -> int:
        return int(self.lengths.max())


def group_prefixes(batch: Batch, start: int, minimum_saved: int = 64) -> GroupPrefixes | None:
    """The prompt each group's rows share after the first ``start`` tokens, or None when computing it once per
    group would save fewer than ``minimum_saved`` token positions.

    Rows of a group (``group_ids``) sampled from one prompt share its tokens up to their first sampled one; a
    group's shared run stops at the first token any of its rows differs on or trains, and each row keeps at
    least its last token to itself. Saved: each row's share, less the group pass's width for every group.
    """
    ids, attn = batch.input_ids, batch.attention_mask
    B, L = ids.shape
    if B < 2:
        return None
    _, row_group = torch.unique(batch.group_ids, return_inverse=True)
    G = int(row_group.max()) + 1
    if G >= B:
        return None
    rows = torch.arange(B, device=ids.device)
    leaders = torch.full((G,), B, dtype=torch.long, device=ids.device).scatter_reduce(0, row_group, rows, "amin")
    cols = torch.arange(L, device=ids.device)
    trained = torch.nn.functional.pad(batch.mask.bool(), (1, 0))  # column k: token k is trained
    stops = (ids != ids[leaders[row_group]]) | (attn == 0) | trained
    end = torch.minimum(torch.where(stops, cols, L).amin(1), attn.sum(1) - 1)
    group_end = torch.full((G,), L, dtype=torch.long, device=ids.device).scatter_reduce(0, row_group, end, "amin")
    lengths = (group_end - start).clamp(min=0)
    saved = int(lengths[row_group].sum()) - G * int(lengths.max())
    return GroupPrefixes(row_group, leaders, lengths) if saved >= minimum_saved else None


def length_buckets(lengths: Sequence[int], pass_cost: int = 64) -> list[list[int]]:
    """Rows cut into buckets, each padded only to its own longest row: the partition of the rows sorted by
    length that computes the fewest padded token positions, each pass counted as ``pass_cost`` more
    (its fixed cost, in positions). One bucket when the rows are about as long as each other."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    n = np.asarray([lengths[r] for r in order], dtype=np.int64)
    best = np.zeros(len(n) + 1, dtype=np.int64)  # best[i]: the cost of the first i rows
    cut = np.zeros(len(n) + 1, dtype=np.int64)
    for i in range(1, len(n) + 1):
        j = np.arange(i)
        cost = best[:i] + (i - j) * n[:i] + pass_cost  # rows j..i-1 in one bucket, padded to row j's length
        cut[i] = int(cost.argmin())
        best[i] = cost[cut[i]]
    buckets, i = [], len(n)
    while i:
        buckets.append(order[cut[i]:i])
        i = int(cut[i])
    return buckets[::-1]


def forward(model: Any, batch: Batch, temperature: float, *, entropy: bool = False, hidden: bool = False,
            share_prefix: bool = True, per_group: bool = True,
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logprobs of the batch's tokens [B, L-1], and optionally the entropy [B, L-1] and last hidden states
    [B, L-1, H] at the predicting positions. Positions inside a shared prompt prefix (all mask 0) hold 0.

    With ``share_prefix`` the same figures and gradients cost fewer token positions: the prefix every row
    shares (the system prompt) is computed once, each group's question once per group (``group_prefixes``),
    their KV caches broadcast to the rows, and the rows' own tokens in buckets of similar length
    (``length_buckets``) rather than all padded to the longest. Without it: one pass over every row.

    per_group=False keeps only the common prefix: two passes (one when nothing is shared), whatever the
    batch's groups and lengths: the layout for N DeepSpeed ranks, where every rank makes the same calls (the
    common prefix is the system prompt and template on every rank). Plain-torch ranks make no collective in
    forward and keep the group and bucket passes (``trainer.optim.DataParallelUpdate``).
    """
    if not share_prefix:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=hidden,
                    use_cache=False)
        logp, ent = _token_stats(out.logits[:, :-1], batch.input_ids[:, 1:], temperature, entropy)
        return logp, ent, out.hidden_states[-1][:, :-1] if hidden else None
    L = batch.input_ids.shape[1]
    trained = batch.mask.any(0).nonzero()
    first_trained = int(trained[0].item()) + 1 if trained.numel() else L - 1
    P = shared_prefix_length(batch, first_trained)
    return _shared_forward(model, batch, temperature, P, group_prefixes(batch, P) if per_group else None,
                           entropy=entropy, hidden=hidden, buckets=per_group)


def bounded_forward(model: Any, batch: Batch, temperature: float, max_rows: int, max_tokens: int | None, *,
                    hidden: bool = False, share_prefix: bool = True,
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``forward``'s logprobs [B, L-1] (and last hidden states) without a gradient, in passes of at most
    ``max_rows`` rows and ``max_tokens`` padded tokens (``micro_batches``), each cut to its longest row:
    the batch's logits never exist at once. Positions past a row's end hold 0 (their mask is 0)."""
    B, L = batch.input_ids.shape
    lengths = batch.attention_mask.sum(-1).cpu()
    order = torch.argsort(lengths, stable=True)
    parts = micro_batches(order, lengths, max_rows, max_tokens)
    if len(parts) == 1:
        logp, _, states = forward(model, batch, temperature, hidden=hidden, share_prefix=share_prefix)
        return logp, states
    logp = batch.rollout_logprobs.new_zeros(B, L - 1)
    states_all: torch.Tensor | None = None
    for cpu_idx in parts:
        idx = cpu_idx.to(batch.input_ids.device)
        width = int(lengths[cpu_idx].max())
        part_logp, _, states = forward(model, trim(batch.rows(idx), width), temperature, hidden=hidden,
                                       share_prefix=share_prefix)
        logp[idx, : width - 1] = part_logp.to(logp.dtype)
        if states is not None:
            if states_all is None:
                states_all = states.new_zeros(B, L - 1, states.shape[-1])
            states_all[idx, : width - 1] = states
    return logp, states_all


def _token_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                 entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each position's logprob of its target, and its entropy when asked, at the sampling temperature."""
    logp = algos.token_logprobs(logits, targets, temperature)
    if not entropy:
        return logp, None
    scaled = logits.float() / temperature if temperature != 1.0 else logits
    return logp, algos.entropy_from_logits(scaled)


def _shared_forward(model: Any, batch: Batch, temperature: float, P: int, groups: GroupPrefixes | None, *,
                    entropy: bool, hidden: bool, buckets: bool = True,
                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``forward`` in passes: the common prefix (one row, when ``P``), each group's shared prompt (one row per
    group, right-padded to the widest and masked, when ``groups``), then each bucket of rows' own tokens over
    their group's cache. Every predicting position from ``max(P - 1, 0)`` on is exact; each pass's figures are
    laid back in place (padding positions repeat a row's last figure; their mask is 0)."""
    ids, attn = batch.input_ids, batch.attention_mask
    B, L = ids.shape
    dev = ids.device
    Q = groups.width if groups is not None else 0
    # Each pass's figures: logprobs [B, n], entropy [B, n] or None, last hidden states [B, n, H] or None.
    figures: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []

    def take(logits: torch.Tensor, targets: torch.Tensor, states: torch.Tensor | None) -> None:
        figures.append((*_token_stats(logits, targets, temperature, entropy), states if hidden else None))

    cache, cache_row = None, torch.zeros(B, dtype=torch.long, device=dev)  # the cache row each row continues
    if P:
        pre = model(input_ids=ids[:1, :P], use_cache=True, output_hidden_states=hidden)
        cache = pre.past_key_values
        take(pre.logits[:, -1:].expand(B, 1, -1), ids[:, P:P + 1],
             pre.hidden_states[-1][:, -1:].expand(B, 1, -1) if hidden else None)
    own = torch.full((B,), P, dtype=torch.long, device=dev)  # each row's first token of its own
    shared = torch.zeros(B, 0, dtype=attn.dtype, device=dev)  # [B, Q]: the group's run, then padding
    if groups is not None:
        G, rg = groups.leaders.numel(), groups.row_group
        cols = torch.arange(Q, device=dev)
        group_mask = (cols < groups.lengths[:, None]).to(attn.dtype)
        if cache is not None:
            cache.batch_repeat_interleave(G)
        out = model(input_ids=ids[groups.leaders, P:P + Q],
                    attention_mask=torch.cat([torch.ones(G, P, dtype=attn.dtype, device=dev), group_mask], 1),
                    past_key_values=cache, position_ids=(P + cols).expand(G, Q), use_cache=True,
                    output_hidden_states=hidden)
        cache, cache_row, own, shared = out.past_key_values, rg, P + groups.lengths[rg], group_mask[rg]
        # A group's last shared position predicts each row's own first token: the targets are the rows' own.
        take(out.logits[rg], ids[:, P + 1:P + Q + 1], out.hidden_states[-1][rg] if hidden else None)
    # Each bucket of rows: its own tokens, padded to its longest, over its rows' cache rows.
    lengths = attn.sum(1) - own
    layers = [dict(vars(layer)) for layer in cache.layers] if cache is not None else []
    S = int(lengths.max())
    parts: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
    order: list[int] = []
    for rows in length_buckets(lengths.tolist()) if buckets else [list(range(B))]:
        r = torch.tensor(rows, dtype=torch.long, device=dev)
        width = int(lengths[r].max())
        pos = own[r, None] + torch.arange(width, device=dev)
        at = pos.clamp(max=L - 1)
        if cache is not None:
            for layer, state in zip(cache.layers, layers, strict=True):
                layer.__dict__.update(state)  # the cache as the shared passes left it
            cache.batch_select_indices(cache_row[r])
        mask = torch.cat([torch.ones(len(rows), P, dtype=attn.dtype, device=dev), shared[r],
                          attn[r].gather(1, at) * (pos < L).to(attn.dtype)], 1)
        out = model(input_ids=ids[r].gather(1, at), attention_mask=mask, past_key_values=cache,
                    position_ids=pos, use_cache=cache is not None, output_hidden_states=hidden)
        logp, ent = _token_stats(out.logits, ids[r].gather(1, (pos + 1).clamp(max=L - 1)), temperature, entropy)
        h = out.hidden_states[-1] if hidden else None
        pad = S - width
        parts.append((torch.nn.functional.pad(logp, (0, pad)),
                      torch.nn.functional.pad(ent, (0, pad)) if ent is not None else None,
                      torch.nn.functional.pad(h, (0, 0, 0, pad)) if h is not None else None))
        order.extend(rows)
    back = torch.empty(B, dtype=torch.long, device=dev)
    back[torch.tensor(order, dtype=torch.long, device=dev)] = torch.arange(B, device=dev)

    def rows_back(i: int) -> torch.Tensor | None:
        if parts[0][i] is None:
            return None
        return torch.cat([p[i] for p in parts], 0)[back]  # type: ignore[misc]

    suffix_logp = rows_back(0)
    assert suffix_logp is not None
    figures.append((suffix_logp, rows_back(1), rows_back(2)))
    # Where predicting position t of each row lies among the passes' figures laid side by side.
    start = max(P - 1, 0)
    t = torch.arange(start, L - 1, device=dev)[None, :]
    first = 1 if P else 0
    last = first + Q + lengths[:, None] - 1  # a row's last own position: padding repeats its figure
    index = torch.where(t < own[:, None], first + t - P, torch.minimum(first + Q + t - own[:, None], last))
    if P:
        index = torch.where(t == P - 1, 0, index)

    def lay(i: int) -> torch.Tensor | None:
        if figures[-1][i] is None:
            return None
        x = torch.cat([f[i] for f in figures], 1)  # type: ignore[misc]
        at = index if x.dim() == 2 else index[..., None].expand(-1, -1, x.shape[-1])
        return torch.nn.functional.pad(x.gather(1, at), (0, 0, start, 0) if x.dim() == 3 else (start, 0))

    logp_all, ent_all, h_all = lay(0), lay(1), lay(2)
    assert logp_all is not None
    return logp_all, ent_all, h_all
