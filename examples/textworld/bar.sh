#!/usr/bin/env bash
# The TextWorld bar, end to end: SFT warm start of SmolLM2-135M-Instruct on played walkthroughs, its held-out
# win rate on 100 unseen games, then GRPO for each seed and credit, and each run's held-out win rate.
#   bash examples/textworld/bar.sh                      # seed 0, outcome-only credit, 30 minutes
#   SEEDS="0 1 2" CREDITS="outcome turn step" bash examples/textworld/bar.sh   # the per-turn credit comparison
#   SKIP_SFT=1 MINUTES=10 bash examples/textworld/bar.sh
#   TRAIN_ARGS="--set eval.every=0" bash examples/textworld/bar.sh   # more overrides for GRPO (here: no evaluations
#                                                                     # inside the 30 minutes, only the final one)
# Results: runs/textworld/bar.jsonl (one line a run: win rate, turns, seconds, time to TARGET held-out win rate).
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-"0"}
CREDITS=${CREDITS:-"outcome"}
MINUTES=${MINUTES:-30}
MORE=()
if [ -n "${TRAIN_ARGS:-}" ]; then read -r -a MORE <<< "$TRAIN_ARGS"; fi
GGUF=$("$PY" -c 'from agentfly.models.smollm2 import MISSING, gguf_path; import sys; p = gguf_path(); print(p or sys.exit(MISSING))')
OUT=runs/textworld
RESULTS=$OUT/bar.jsonl
mkdir -p "$OUT"
: > "$RESULTS"

record() {  # record NAME JSON_LINE_FROM_EVAL SECONDS [JSON_LINE_FROM_TIME_TO_ACCURACY]
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); t=json.loads(sys.argv[4]); print(json.dumps({"run": sys.argv[1], "win_rate": r["eval/accuracy"], "turns": r["eval/mean_turns"], "n": r["n"], "seconds": float(sys.argv[3]), **({"target": t["target"], "reached_seconds": t["reached_seconds"], "reached_step": t["reached_step"]} if t else {})}))' \
        "$1" "$2" "$3" "${4:-null}" | tee -a "$RESULTS"
}

start=$(date +%s)
if [ -z "${SKIP_SFT:-}" ]; then "$AGENTFLY" sft examples/textworld/sft.yaml --set model.path="$(dirname "$GGUF")" --set model.gguf_file="$(basename "$GGUF")"; fi
warm=$("$AGENTFLY" eval $OUT/sft --split test | tail -n 1)
record sft "$warm" $(( $(date +%s) - start ))
TARGET=${TARGET:-$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["eval/accuracy"] + 0.2, 3))' "$warm")}

for credit in $CREDITS; do
    for seed in $SEEDS; do
        run=grpo-$credit-seed$seed
        start=$(date +%s)
        "$AGENTFLY" train examples/textworld/grpo.yaml --set seed="$seed" --set output_dir=$OUT/$run \
            --set algorithm.credit="$credit" --set max_minutes="$MINUTES" "${MORE[@]}"
        final=$("$AGENTFLY" eval $OUT/$run --split test | tail -n 1)
        record "$run" "$final" $(( $(date +%s) - start )) \
            "$("$PY" benchmarks/time_to_accuracy.py $OUT/$run --target "$TARGET" --from-events | tail -n 1)"
    done
done
