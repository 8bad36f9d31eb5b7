#!/usr/bin/env bash
# The calculator bar, end to end: SFT warm start, its held-out accuracy, then 10 minutes of GRPO for each of
# three seeds and the held-out accuracy of each (500 unseen problems, greedy, `agentfly eval`).
#   bash examples/calculator/bar.sh            # ~45 minutes on 2 CPU cores; results in runs/calculator/bar.jsonl
#   SEEDS="0" bash examples/calculator/bar.sh  # one seed
#   SKIP_SFT=1 bash examples/calculator/bar.sh # reuse the SFT model already in runs/calculator/sft
#   MODE=async bash examples/calculator/bar.sh # GRPO with rollout.mode=async, max_staleness=1 (bar-async.jsonl)
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
SEEDS=${SEEDS:-"0 1 2"}
MODE=${MODE:-sync}  # sync or async (rollouts of the next step run during the update)
case "$MODE" in
    sync) RUN=grpo; SUFFIX=""; MODE_SET=() ;;
    async) RUN=grpo-async; SUFFIX=-async; MODE_SET=(--set rollout.mode=async --set rollout.max_staleness=1) ;;
    *) echo "MODE=$MODE: use sync or async" >&2; exit 2 ;;
esac
OUT=runs/calculator
RESULTS=$OUT/bar$SUFFIX.jsonl  # bar.jsonl, or bar-async.jsonl
mkdir -p "$OUT"
: > "$RESULTS"

record() {  # record NAME JSON_LINE_FROM_EVAL [SECONDS]
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); print(json.dumps({"run": sys.argv[1], "accuracy": r["eval/accuracy"], "n": r["n"], "seconds": float(sys.argv[3])}))' \
        "$1" "$2" "${3:-0}" | tee -a "$RESULTS"
}

start=$(date +%s)
if [ -z "${SKIP_SFT:-}" ]; then "$AGENTFLY" sft examples/calculator/sft.yaml; fi  # SKIP_SFT=1: reuse runs/calculator/sft
record sft "$("$AGENTFLY" eval $OUT/sft --split test | tail -n 1)" $(( $(date +%s) - start ))

for seed in $SEEDS; do
    start=$(date +%s)
    "$AGENTFLY" train examples/calculator/grpo.yaml --set seed="$seed" --set output_dir=$OUT/$RUN-seed$seed \
        "${MODE_SET[@]}"
    record "$RUN-seed$seed" "$("$AGENTFLY" eval $OUT/$RUN-seed$seed --split test | tail -n 1)" $(( $(date +%s) - start ))
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
sft = next(r for r in rows if r["run"] == "sft")
grpo = [r["accuracy"] for r in rows if r["run"].startswith("grpo")]
print(f"SFT start: {sft['accuracy']:.3f}")
for r in rows[1:]:
    print(f"{r['run']}: {r['accuracy']:.3f}  ({r['seconds'] / 60:.1f} min incl. load and final eval)")
if grpo:
    spread = statistics.pstdev(grpo) if len(grpo) > 1 else 0.0
    print(f"GRPO: mean {statistics.mean(grpo):.3f}, std {spread:.3f}, min {min(grpo):.3f}, max {max(grpo):.3f}")
PY
