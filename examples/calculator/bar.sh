#!/usr/bin/env bash
# The calculator bar, end to end: SFT warm start, its held-out accuracy, then 10 minutes of GRPO for each of
# three seeds and the held-out accuracy of each (500 unseen problems, greedy, `agentfly eval`).
#   bash examples/calculator/bar.sh            # ~45 minutes on 2 CPU cores; results in runs/calculator/bar.jsonl
#   SEEDS="0" bash examples/calculator/bar.sh  # one seed
#   SKIP_SFT=1 bash examples/calculator/bar.sh # reuse the SFT model already in runs/calculator/sft
#   MODE=async bash examples/calculator/bar.sh # GRPO with rollout.mode=async, max_staleness=1 (bar-async.jsonl)
#   MINUTES=4 bash examples/calculator/bar.sh  # a shorter GRPO budget per seed (default 10)
# Each seed saves every SAVE_EVERY steps (default 10); its saves are scored in order afterwards for the
# training time to TARGET held-out accuracy (default 0.85; benchmarks/time_to_accuracy.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
SEEDS=${SEEDS:-"0 1 2"}
MODE=${MODE:-sync}  # sync or async (rollouts of the next step run during the update)
MINUTES=${MINUTES:-10}
SAVE_EVERY=${SAVE_EVERY:-10}
TARGET=${TARGET:-0.85}
PY=${PY:-.venv/bin/python}
case "$MODE" in
    sync) RUN=grpo; SUFFIX=""; MODE_SET=() ;;
    async) RUN=grpo-async; SUFFIX=-async; MODE_SET=(--set rollout.mode=async --set rollout.max_staleness=1) ;;
    *) echo "MODE=$MODE: use sync or async" >&2; exit 2 ;;
esac
OUT=runs/calculator
RESULTS=$OUT/bar$SUFFIX.jsonl  # bar.jsonl, or bar-async.jsonl
mkdir -p "$OUT"
: > "$RESULTS"

record() {  # record NAME JSON_LINE_FROM_EVAL [SECONDS] [JSON_LINE_FROM_TIME_TO_ACCURACY]
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); t=json.loads(sys.argv[4]); print(json.dumps({"run": sys.argv[1], "accuracy": r["eval/accuracy"], "n": r["n"], "seconds": float(sys.argv[3]), **({"target": t["target"], "reached_seconds": t["reached_seconds"], "reached_step": t["reached_step"], "steps": t["steps"]} if t else {})}))' \
        "$1" "$2" "${3:-0}" "${4:-null}" | tee -a "$RESULTS"
}

start=$(date +%s)
if [ -z "${SKIP_SFT:-}" ]; then "$AGENTFLY" sft examples/calculator/sft.yaml; fi  # SKIP_SFT=1: reuse runs/calculator/sft
record sft "$("$AGENTFLY" eval $OUT/sft --split test | tail -n 1)" $(( $(date +%s) - start ))

for seed in $SEEDS; do
    start=$(date +%s)
    "$AGENTFLY" train examples/calculator/grpo.yaml --set seed="$seed" --set output_dir=$OUT/$RUN-seed$seed \
        --set max_minutes="$MINUTES" --set save_every="$SAVE_EVERY" --set keep_last=100000 "${MODE_SET[@]}"
    final=$("$AGENTFLY" eval $OUT/$RUN-seed$seed --split test | tail -n 1)
    took=$(( $(date +%s) - start ))
    record "$RUN-seed$seed" "$final" "$took" \
        "$("$PY" benchmarks/time_to_accuracy.py $OUT/$RUN-seed$seed --target "$TARGET" | tail -n 1)"
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
sft = next(r for r in rows if r["run"] == "sft")
grpo = [r["accuracy"] for r in rows if r["run"].startswith("grpo")]
print(f"SFT start: {sft['accuracy']:.3f}")
for r in rows[1:]:
    when = ""
    if "target" in r:
        when = (f"; {r['target']:.0%} after {r['reached_seconds']:.0f} s of training (step {r['reached_step']})"
                if r["reached_seconds"] is not None else f"; {r['target']:.0%} not reached")
    print(f"{r['run']}: {r['accuracy']:.3f}  ({r['seconds'] / 60:.1f} min incl. load and final eval{when})")
if grpo:
    spread = statistics.pstdev(grpo) if len(grpo) > 1 else 0.0
    print(f"GRPO: mean {statistics.mean(grpo):.3f}, std {spread:.3f}, min {min(grpo):.3f}, max {max(grpo):.3f}")
PY
