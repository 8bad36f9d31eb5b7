"""The TRL side of ``benchmarks/trl_compare.py``: GRPO with TRL's ``GRPOTrainer`` and its tool calling, on
the same model, problems, calculator and reward as AgentFly's side. Runs in its own virtual environment
(``benchmarks/trl_side/requirements.txt``), started by ``trl_compare.py``; it writes one JSON result.

    runs/trl-venv/bin/python benchmarks/trl_side/run_trl.py --model DIR --data problems.jsonl --out trl.json

Only ``agentfly``'s pure-Python calculator and answer checker are imported (from the repository, not
installed here), so both sides call the same tool code and score with the same reward; the tool is handed to
TRL as a plain function with the same name, signature and docstring, as TRL's API asks for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# Imported here, not on first use: the profile showed importing agentfly inside the first tool call billed
# ~0.4 s of start-up to TRL's first training step.
from agentfly.rewards.builtin.math import answers_equal, extract_answer  # noqa: E402
from agentfly.tools.builtin.calculator import evaluate_arithmetic  # noqa: E402


# No return annotation on purpose: transformers would add '"return": {"type": "string"}' to the schema, and
# the rendered prompt would differ from AgentFly's by those tokens.
def calculator(expression: str):  # type: ignore[no-untyped-def]
    """Evaluate an arithmetic expression.

    Args:
        expression: Arithmetic with + - * / ( ) and integers, e.g. "37*48".
    """
    return evaluate_arithmetic(expression)


def math_equal(completions: list[list[dict[str, Any]]], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the last assistant message's final answer equals the reference (AgentFly's ``math_equal``)."""
    scores = []
    for messages, gold in zip(completions, answer, strict=True):
        final = next((m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), None)
        scores.append(1.0 if answers_equal(extract_answer(final), gold) else 0.0)
    return scores


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="local model directory")
    ap.add_argument("--data", required=True, help="JSONL of {question, answer} problems, in training order")
    ap.add_argument("--out", required=True, help="where to write the JSON result")
    ap.add_argument("--prompts", type=int, required=True, help="problems per step")
    ap.add_argument("--group", type=int, required=True, help="completions per problem (num_generations)")
    ap.add_argument("--max-completion-length", type=int, required=True, help="tokens per trajectory after the prompt")
    ap.add_argument("--max-turns", type=int, required=True, help="assistant turns (tool iterations + 1)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chat-template", default=None,
                    help="a Jinja file to use as the tokenizer's chat template (SmolLM2's own renders no tool calls, "
                         "which TRL refuses: benchmarks/trl_side/smollm2_tools.jinja adds them)")
    ap.add_argument("--temperature", type=float, default=1.0)
    # The learning comparison: train for a wall-clock budget, saving the weights every N steps with the
    # training seconds spent so far (saving excluded), for AgentFly's evaluator to score afterwards.
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this many training seconds")
    ap.add_argument("--save-every", type=int, default=0, help="save the weights every N steps (0: never)")
    ap.add_argument("--save-dir", default=None, help="where the saved weights go (one folder per save)")
    args = ap.parse_args(argv)

    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "answer": str(r["answer"])} for r in rows])

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.chat_template:
        tokenizer.chat_template = Path(args.chat_template).read_text()
    # The tiny model's template is the Qwen2.5/Hermes convention (ChatML, <tool_call>{json}</tool_call>) but not
    # byte-identical to a template TRL recognises, so name the parser TRL uses for Qwen's tool calls.
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    config = GRPOConfig(
        output_dir=str(Path(args.out).with_suffix("")) + "-work",
        per_device_train_batch_size=args.prompts * args.group,  # completions per optimizer step
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,  # one update per batch: strictly on-policy, as AgentFly with epochs=1
        num_generations=args.group,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns - 1,
        temperature=args.temperature, top_p=1.0, top_k=0,
        beta=0.0,  # no reference model (AgentFly: algorithm.kl_coef=0)
        epsilon=0.2,
        # Mean over every trained token of the batch (AgentFly: loss_agg=token-mean, as the calculator example);
        # with one process and no gradient accumulation TRL's "dapo" normaliser is exactly that count.
        loss_type="dapo",
        scale_rewards="group",  # divide by the group std (AgentFly: std_normalize=true)
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch",
        bf16=False, fp16=False,  # TRL defaults bf16 on; AgentFly's side trains in float32
        gradient_checkpointing=False,  # TRL defaults it on; AgentFly's side does not recompute activations
        use_cpu=True,
        shuffle_dataset=False,  # the same problems, in the same order, as AgentFly's side
        max_steps=args.steps, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        log_completions=False, seed=args.seed, dataloader_num_workers=0,
    )

    step_times: list[float] = []
    saves: list[dict[str, Any]] = []
    saving = [0.0]  # seconds spent saving, not training
    started = [0.0]
    step_logs: list[dict[str, float]] = []
    cpu_times: list[float] = []
    trained_tokens: list[int] = []

    class Clock(TrainerCallback):
        """Wall time of each optimizer step: generation with tool calls, scoring and the update."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            started[0] = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, control: Any, **__: Any) -> None:
            step_times.append(time.perf_counter() - self.start)
            cpu_times.append(time.process_time() - self.cpu)
            trained = time.perf_counter() - started[0] - saving[0]
            if args.save_every and args.save_dir and state.global_step % args.save_every == 0:
                t0 = time.perf_counter()
                folder = Path(args.save_dir) / f"step-{state.global_step:06d}"
                model.save_pretrained(folder, safe_serialization=True)
                saves.append({"step": state.global_step, "seconds": trained, "path": str(folder),
                              "trained_tokens": sum(trained_tokens)})
                saving[0] += time.perf_counter() - t0
            if args.max_seconds is not None and trained >= args.max_seconds:
                control.should_training_stop = True

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict[str, Any] | None = None, **__: Any
                   ) -> None:
            if logs and "reward" in logs:
                step_logs.append({k: _number(v) for k, v in logs.items()})

    class CountingGRPOTrainer(GRPOTrainer):
        """Counts the tokens that reach the loss (completion mask x tool mask), as AgentFly's mask-1 tokens."""

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            trained_tokens.append(int(mask.sum()))
            return super()._compute_loss(model, inputs)

    trainer = CountingGRPOTrainer(model=model, reward_funcs=[math_equal], args=config, train_dataset=dataset,
                                  processing_class=tokenizer, tools=[calculator], callbacks=[Clock()])
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    result = {
        "framework": f"trl {trl.__version__}", "transformers": transformers.__version__, "torch": torch.__version__,
        "step_times": step_times, "cpu_times": cpu_times, "train_seconds": total, "trained_tokens": trained_tokens,
        "rewards": [entry.get("reward", float("nan")) for entry in step_logs],
        "tool_calls": [entry.get("tools/call_frequency", float("nan")) for entry in step_logs],
        "trajectories_per_step": args.prompts * args.group, "logs": step_logs, "saves": saves,
        "train_seconds_without_saves": total - saving[0],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
