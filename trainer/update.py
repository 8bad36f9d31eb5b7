"""The update stage: epochs x minibatches of optimizer steps over a step's padded batch, each minibatch run as
length-sorted micro-batches whose gradients accumulate (``Learner.optimise``), and the masked loss of one
micro-batch (``Learner.micro_step``: the clipped policy loss with its off-policy weights, KL, entropy and
PPO's value loss). ``Learner.build`` makes what the update steps: AdamW over the policy and PPO's value head,
the learning-rate schedule, the frozen reference for KL, and the plain torch (one rank or N) or DeepSpeed
``Update`` (``trainer.optim``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import algorithms as algos
from trainer import distributed as dist
from trainer.batch import Batch, agg_denominator, bounded_forward, forward, micro_batches, trim
from trainer.config import Config
from trainer.metrics import reduce_metrics
from trainer.optim import Actor, Update, make_scheduler, make_update


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (0: leave the count alone)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class MicroBatch:
    """One micro-batch of a minibatch: its rows (cut to their longest), the per-token tensors cut alike, and
    its weights in the minibatch's loss (``weight``) and token means (``token_weight``)."""

    batch: Batch
    old_logp: torch.Tensor | None  # None: on-policy, the current logprobs (detached) are the old ones
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None
    values: torch.Tensor | None
    returns: torch.Tensor | None
    weight: float
    token_weight: float
    measure_mismatch: bool  # the first minibatch measures rollout-vs-trainer logprobs


@dataclass
class Learner:
    """What the update stage steps: the policy, PPO's value head, the optimizer and its schedule through the
    plain torch (one rank or N) or DeepSpeed ``update``, and the frozen reference the KL terms compare
    against."""

    config: Config
    model: Any  # the policy (a Hugging Face causal LM, with LoRA adapters when configured)
    value_head: algos.ValueHead | None  # PPO's critic
    ref_model: Any  # the frozen reference when algorithm.kl_coef > 0, else None
    optimizer: Any  # AdamW, or DeepSpeed's wrapper of it
    scheduler: torch.optim.lr_scheduler.LambdaLR
    update: Update
    zero3: bool  # DeepSpeed ZeRO-3: the weights are sharded over the ranks
    share_prefix: bool  # forward the rows' shared prompt prefix once (``trainer.batch.forward``)
    per_group: bool  # and each group's prompt once, the rows' own tokens in length buckets
    world: int
    device: torch.device

    @classmethod
    def build(cls, config: Config, model: Any, device: torch.device, out: Path, world: int) -> Learner:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False) if config.algorithm.kl_coef > 0 else None
        value_head = None
        params = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": config.optim.lr}]
        if config.algorithm.name == "ppo":
            value_head = algos.ValueHead(model.config.hidden_size).to(device)
            params.append({"params": list(value_head.parameters()), "lr": config.optim.critic_lr or config.optim.lr})
        o = config.optim
        optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.betas[0], o.betas[1]), eps=o.eps,
                                      weight_decay=o.weight_decay)
        scheduler = make_scheduler(optimizer, config)
        # Plain torch or DeepSpeed, chosen once: the update stage steps through `update` either way. The value
        # head is inside the same module, so the ranks average it and DeepSpeed shards and saves it too.
        update = make_update(config, Actor(model, value_head), optimizer, out, world)
        zero3 = config.deepspeed is not None and dist.zero_stage(dist.read_deepspeed_config(config.deepspeed)) == 3
        # ZeRO-3 gathers parameters in every forward, a collective: all ranks must make the same number of
        # forward calls, so the shared-prefix trick (one more call when a batch's rows share a long prompt) is off.
        # Plain torch makes no collective in forward (`DataParallelUpdate`), nor do ZeRO-1/2 (their collectives
        # are the gradient reductions in backward, one per parameter bucket whatever the passes that made the
        # gradient), so every rank makes the passes its own rows need: each group's prompt once, length buckets.
        # Gradient checkpointing: transformers turns the KV cache off in training, and the shared-prefix passes
        # continue each row from the prefix's cache, so the update makes one plain pass per micro-batch.
        checkpointed = config.model.gradient_checkpointing
        return cls(config, model, value_head, ref_model, update.optimizer, scheduler, update, zero3,
                   share_prefix=not zero3 and not checkpointed, per_group=not zero3, world=world, device=device)

    def logprobs(self, model: Any, batch: Batch, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``batch``'s logprobs (and last hidden states) under ``model`` (the policy or the KL reference), no
        gradient: one pass, or with ``micro_batch_tokens`` passes in the update's micro-batch bounds (not under
        ZeRO-3, where every rank must make the same forward calls)."""
        rows, tokens = self.config.micro_batch_size, self.config.micro_batch_tokens
        if tokens is None or self.zero3:
            rows, tokens = batch.size, None
        return bounded_forward(model, batch, self.config.rollout.temperature, rows, tokens, hidden=hidden,
                               share_prefix=self.share_prefix)

    def optimise(self, batch: Batch, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                 advantages: torch.Tensor, values: torch.Tensor | None, returns: torch.Tensor | None, *,
                 step: int, placeholder: bool = False) -> dict[str, float]:
        """Epochs x minibatches of optimizer steps. Each minibatch is run as length-sorted micro-batches
        whose gradients accumulate, each padded only to its own longest row; every loss term is weighted by
        its micro-batch's share of the minibatch's aggregation denominator, so the gradient is the one of
        the whole minibatch at once. Across ranks the denominators are the whole batch's (summed over ranks,
        divided by the world size, since the ranks' gradients are averaged): the N-rank
        gradient is the one-process gradient, whatever each rank's share of tokens or sequences.

        step: the step being trained (it seeds the minibatch order). placeholder: the batch is one mask-0
        row, so a rank without rows still meets the other ranks' collectives."""
        a = self.config.algorithm
        agg = a.resolved_loss_agg
        self.model.train()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        maxima: dict[str, float] = {}
        gen = torch.Generator().manual_seed(self.config.seed * 7_919 + step)
        lengths = batch.attention_mask.sum(-1).cpu()
        first = True
        for _ in range(a.epochs):
            order = torch.randperm(batch.size, generator=gen) if a.minibatches > 1 else torch.arange(batch.size)
            # tensor_split: always `minibatches` chunks, so every rank makes the same number of steps.
            for rows in torch.tensor_split(order, a.minibatches):
                empty = rows.numel() == 0  # fewer rows than minibatches here: a placeholder row, mask 0
                rows = order[:1] if empty else rows[torch.argsort(lengths[rows], stable=True)]
                mb_mask = batch.mask.index_select(0, rows.to(self.device))
                if empty:
                    mb_mask = torch.zeros_like(mb_mask)
                # A placeholder row counts in no denominator (not even as a row of seq-mean-token-sum-norm).
                rows_counted = 0.0 if empty or placeholder else agg_denominator(mb_mask, agg, minimum=0.0)
                local = torch.tensor([rows_counted, float(mb_mask.sum())], dtype=torch.float64)
                total = dist.all_reduce_sum(local).tolist()
                denominator = max(total[0], 1.0) / self.world
                tokens_total = max(total[1], 1.0) / self.world
                parts: dict[str, float] = {}
                self.update.zero_grad()
                if self.update.micro_batch_size is None:  # DeepSpeed: the minibatch is its micro-batch
                    micro = [rows]
                else:
                    micro = micro_batches(rows, lengths, self.update.micro_batch_size,
                                          self.config.micro_batch_tokens)
                for cpu_idx in micro:
                    idx = cpu_idx.to(self.device)
                    width = int(lengths[cpu_idx].max())
                    mb = trim(batch.rows(idx), width)
                    if empty:
                        mb = dataclasses.replace(mb, mask=torch.zeros_like(mb.mask))

                    def cut(t: torch.Tensor, idx: torch.Tensor = idx, width: int = width) -> torch.Tensor:
                        return t.index_select(0, idx)[:, : width - 1]

                    micro_batch = MicroBatch(
                        batch=mb, old_logp=None if old_logp is None else cut(old_logp), advantages=cut(advantages),
                        ref_logp=None if ref_logp is None else cut(ref_logp),
                        values=None if values is None else cut(values),
                        returns=None if returns is None else cut(returns),
                        weight=agg_denominator(mb.mask, agg) / denominator,  # its share of the minibatch's mean
                        token_weight=float(mb.mask.sum()) / tokens_total,  # its share of the tokens
                        measure_mismatch=first)
                    loss, terms = self.micro_step(micro_batch)
                    self.update.backward(loss)
                    for k, v in terms.items():  # "_max" terms are maxima, the rest weighted sums
                        parts[k] = max(parts.get(k, v), v) if k.endswith("_max") else parts.get(k, 0.0) + v
                first = False
                parts = reduce_metrics(parts)
                parts["grad_norm"] = self.update.step()
                for k, v in parts.items():
                    if k.endswith("_max"):
                        maxima[k] = max(maxima.get(k, v), v)
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        self.scheduler.step()
        self.model.eval()
        return {k: maxima[k] if k in maxima else sums[k] / counts[k] for k in sums}

    def micro_step(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The weighted loss of one micro-batch (policy, KL, entropy, value terms) and its weighted metrics;
        summed over a minibatch's micro-batches they are the minibatch's loss and metrics."""
        cfg, a = self.config, self.config.algorithm
        agg = a.resolved_loss_agg
        norm_length = cfg.rollout.max_new_tokens * cfg.rollout.max_turns
        mb, mask, w, w_tok = micro.batch, micro.batch.mask, micro.weight, micro.token_weight
        # Through the update's module: DeepSpeed's engine, when it wraps it, is what reduces the gradients.
        logp, entropy, hidden = forward(self.update.module, mb, cfg.rollout.temperature, entropy=True,
                                        hidden=self.value_head is not None, share_prefix=self.share_prefix,
                                        per_group=self.per_group)
        terms: dict[str, float] = {}
        if micro.measure_mismatch:
            # Same tokens, same weights: any gap is engine/trainer numerics (or a bug).
            gap = (logp.detach() - mb.rollout_logprobs).abs()
            terms["logprob_mismatch"] = w_tok * float(algos.masked_mean(gap, mask))
        old = logp.detach() if micro.old_logp is None else micro.old_logp
        # The engine's logprobs are the behaviour policy's; weigh each token by pi_old / pi_behaviour.
        correction = a.resolved_off_policy_correction(cfg.rollout.mode)
        is_w, im = algos.off_policy_weights(correction, old, mb.rollout_logprobs, mask,
                                            cap=a.tis_cap, band=(a.mis_band[0], a.mis_band[1]))
        loss, pm = algos.clipped_policy_loss(
            logp, old, micro.advantages, mask, clip_low=a.clip_low, clip_high=a.resolved_clip_high,
            dual_clip=a.dual_clip, agg=agg, norm_length=norm_length, is_weights=is_w)  # type: ignore[arg-type]
        total = w * loss
        terms |= {"loss/policy": w * loss.item(), **{k: w_tok * v.item() for k, v in pm.items()}}
        terms |= {k: v.item() if k.endswith("_max") else w_tok * v.item() for k, v in im.items()}
        if micro.ref_logp is not None:
            kl = algos.kl_estimate(logp, micro.ref_logp, a.kl_estimator)
            terms["kl"] = w_tok * algos.masked_mean(kl.detach(), mask).item()
            if not a.kl_in_reward:
                kl_loss = algos.aggregate_loss(kl, mask, agg, norm_length)  # type: ignore[arg-type]
                total = total + w * a.kl_coef * kl_loss
        if entropy is not None:
            ent = algos.masked_mean(entropy, mask)
            terms["entropy"] = w_tok * ent.item()
            if a.entropy_coef:
                total = total - w_tok * a.entropy_coef * ent
        if self.value_head is not None:
            assert micro.values is not None and micro.returns is not None and hidden is not None
            vloss, vm = algos.clipped_value_loss(self.value_head(hidden), micro.values, micro.returns, mask,
                                                 clip=a.value_clip)
            total = total + w_tok * a.vf_coef * vloss
            terms["loss/value"] = w_tok * vloss.item()
            terms |= {k: w_tok * v.item() for k, v in vm.items()}
        terms["loss/total"] = total.item()
        return total, terms
