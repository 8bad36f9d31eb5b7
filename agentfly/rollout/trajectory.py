"""``Trajectory``: one rollout, token-exact.

``token_ids`` is the prompt followed, turn by turn, by exactly the tokens the engine sampled and the tokens
of each observation with its template glue. ``loss_mask[i] == 1`` exactly where ``token_ids[i]`` was sampled
(mask is set where the token is born, never reconstructed); ``logprobs[i]`` is the sampling logprob there
and 0.0 elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["answer", "max_turns", "length", "error"]


@dataclass
class ToolCallRecord:
    """One tool call as it happened: what the model asked for and what it got back."""

    turn: int
    name: str
    arguments: Any
    observation: str
    error: str | None = None
    latency: float = 0.0


@dataclass
class Turn:
    """One assistant turn: the span of sampled tokens ``[start, end)`` in ``token_ids``.

    ``state`` names what the turn acted from: a digest of the observations that led into it (the prompt for
    the first turn). Turns of one group with equal ``state`` faced the same situation, which step-level
    credit (``algorithm.credit: step``) compares them by."""

    index: int
    start: int
    end: int
    text: str
    finish_reason: str
    tool_calls: list[str] = field(default_factory=list)  # names, in order
    parse_errors: list[str] = field(default_factory=list)
    state: str = ""


@dataclass
class TurnReward:
    """A reward credited to one turn (``context.reward_turn`` from a tool, or a reward's per-turn scores)."""

    turn: int
    value: float
    reason: str = ""


@dataclass
class Trajectory:
    sample: dict[str, Any]
    rollout_id: str
    group_id: str
    prompt_length: int = 0
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    final_answer: str | None = None
    reward: float = 0.0
    reward_metrics: dict[str, float] = field(default_factory=dict)
    reward_error: str | None = None
    reward_traceback: str | None = None  # where the reward raised ``reward_error`` (the last frames)
    turn_rewards: list[TurnReward] = field(default_factory=list)  # beside the outcome ``reward``
    finish_reason: FinishReason = "answer"
    error: str | None = None
    temperature: float = 1.0
    model: str | None = None  # the model path or name, so tokens can be decoded later
    timings: dict[str, float] = field(default_factory=dict)
    # The trainer's policy version (updates applied) of the weights that sampled it; None when no trainer
    # counts (asynchronous training measures staleness with it).
    policy_version: int | None = None
    # Set when the rollout ended because of the infrastructure, never because of the agent: one of
    # ``agentfly.resources.FAILURE_KINDS`` (a dead sandbox, a lost node, a server that stopped answering).
    # Such a trajectory says nothing of the policy, so the trainer leaves it out of its group's statistics
    # and out of the loss, and counts it (``rollout/infra_failed``).
    failure: str | None = None
    failure_reason: str | None = None
    # Text a reward attached for people to read, by name (the code-repair reward's ``diff`` of the agent's
    # edits and its ``tests`` report); the rollout viewer shows each under its name.
    artifacts: dict[str, str] = field(default_factory=dict)

    # ---------------------------------------------------------------- building (the mask is born here)
    def extend_prompt(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def extend_sampled(self, ids: list[int], logprobs: list[float]) -> tuple[int, int]:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled tokens but {len(logprobs)} logprobs")
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        return start, len(self.token_ids)

    extend_observation = extend_prompt  # forced tokens: tool results and template glue

    # ---------------------------------------------------------------- derived
    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def response_length(self) -> int:
        return len(self.token_ids) - self.prompt_length

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def infra_failed(self) -> bool:
        return self.failure is not None

    @property
    def tool_errors(self) -> int:
        return sum(1 for c in self.tool_calls if c.error is not None)

    @property
    def parse_errors(self) -> int:
        return sum(len(t.parse_errors) for t in self.turns)

    def rewards_per_turn(self) -> list[float]:
        """The turn rewards summed per turn, one entry per turn (the outcome ``reward`` is not in them)."""
        out = [0.0] * self.num_turns
        for r in self.turn_rewards:
            if 0 <= r.turn < len(out):
                out[r.turn] += r.value
        return out

    def mask_spans(self) -> list[tuple[int, int, int]]:
        """Runs of equal mask value as ``(start, end, mask)``, covering the whole sequence."""
        spans: list[tuple[int, int, int]] = []
        for i, m in enumerate(self.loss_mask):
            if spans and spans[-1][2] == m:
                spans[-1] = (spans[-1][0], i + 1, m)
            else:
                spans.append((i, i + 1, m))
        return spans

    def to_dict(self, tokenizer: PreTrainedTokenizerBase | None = None) -> dict[str, Any]:
        """The trajectory as JSON-able data: its fields and derived counts (``from_dict`` reads it back).

        With ``tokenizer`` it also carries the decoded views a viewer needs without a tokenizer of its own:
        ``text`` (the whole sequence) and ``segments`` (``mask_segments``: runs of one mask value, decoded).
        This is the one serialisation of a trajectory: the trainer's ``samples`` events carry it as it is.
        """
        d = asdict(self)
        d["num_turns"] = self.num_turns
        d["tool_errors"] = self.tool_errors
        d["parse_errors"] = self.parse_errors
        if tokenizer is not None:
            d["text"] = tokenizer.decode(self.token_ids, skip_special_tokens=False)
            d["segments"] = self.segments(tokenizer)
        return d

    def segments(self, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
        """``[{"start", "end", "mask", "text"}, ...]``: consecutive tokens with the same mask, decoded (what
        ``mask_segments`` and the dashboard's rollout viewer show)."""
        return [
            {"start": s, "end": e, "mask": m, "text": tokenizer.decode(self.token_ids[s:e], skip_special_tokens=False)}
            for s, e, m in self.mask_spans()
        ]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        d["tool_calls"] = [ToolCallRecord(**c) for c in d.get("tool_calls", [])]
        d["turn_rewards"] = [TurnReward(**r) for r in d.get("turn_rewards", [])]
        return cls(**d)
