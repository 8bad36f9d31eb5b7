#!/usr/bin/env bash
# The key-chain bar, end to end: the warm start's held-out success, then 15 minutes of GRPO for each of three
# seeds and the held-out success of each (500 unseen problems, greedy, `agentfly eval`), with the mean number
# of tool calls per problem before and after.
#   bash examples/key_chain/bar.sh            # ~55 minutes on 2 CPU cores; results in runs/key_chain/bar.jsonl
#   SEEDS="0" bash examples/key_chain/bar.sh  # one seed
#   SFT=1 bash examples/key_chain/bar.sh      # remake the warm start first (agentfly sft) and start from it
#   MINUTES=5 bash examples/key_chain/bar.sh  # a shorter GRPO budget per seed (the bar is "within 15 minutes")
#   CONFIG=examples/key_chain/grpo_mcp.yaml OUT=runs/key_chain_mcp bash examples/key_chain/bar.sh
#                                             # the store served by the MCP server (stdio, one session per rollout)
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
SEEDS=${SEEDS:-"0 1 2"}
MINUTES=${MINUTES:-15}
OUT=${OUT:-runs/key_chain}
CONFIG=${CONFIG:-examples/key_chain/grpo.yaml}
RESULTS=$OUT/bar.jsonl
START=examples/key_chain/warm_start
mkdir -p "$OUT"
: > "$RESULTS"

record() {  # record NAME JSON_LINE_FROM_EVAL [SECONDS]
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); print(json.dumps({"run": sys.argv[1], "accuracy": r["eval/accuracy"], "tool_calls": r["eval/tool_calls/mean"], "n": r["n"], "seconds": float(sys.argv[3])}))' \
        "$1" "$2" "${3:-0}" | tee -a "$RESULTS"
}

start=$(date +%s)
if [ -n "${SFT:-}" ]; then "$AGENTFLY" sft examples/key_chain/sft.yaml; START=$OUT/sft; fi
record start "$("$AGENTFLY" eval $START --split test --n 500 | tail -n 1)" $(( $(date +%s) - start ))

for seed in $SEEDS; do
    start=$(date +%s)
    "$AGENTFLY" train "$CONFIG" --set seed="$seed" --set model.path=$START \
        --set output_dir=$OUT/grpo-seed$seed --set max_minutes="$MINUTES"
    record "grpo-seed$seed" "$("$AGENTFLY" eval $OUT/grpo-seed$seed --split test --n 500 | tail -n 1)" $(( $(date +%s) - start ))
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
first = rows[0]
print(f"warm start: {first['accuracy']:.3f} held-out success, {first['tool_calls']:.2f} tool calls per problem")
for r in rows[1:]:
    print(f"{r['run']}: {r['accuracy']:.3f}, {r['tool_calls']:.2f} tool calls  "
          f"({r['seconds'] / 60:.1f} min incl. load and final eval)")
grpo = [r["accuracy"] for r in rows[1:]]
if grpo:
    spread = statistics.pstdev(grpo) if len(grpo) > 1 else 0.0
    calls = statistics.mean(r["tool_calls"] for r in rows[1:])
    print(f"GRPO: mean {statistics.mean(grpo):.3f}, std {spread:.3f}, min {min(grpo):.3f}, max {max(grpo):.3f}; "
          f"+{(min(grpo) - first['accuracy']) * 100:.1f} points in the worst seed; {calls:.2f} tool calls per problem")
PY
