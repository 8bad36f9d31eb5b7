#!/usr/bin/env bash
# The reasoning-gym learning check: a tiny model warm-started on basic_arithmetic with the calculator, its held-out
# accuracy (200 unseen questions, the dataset's own scorer), 15 minutes of GRPO, and the held-out accuracy after.
#   bash examples/reasoning_gym/bar.sh            # results: runs/reasoning_gym/bar.jsonl
#   SKIP_SFT=1 bash examples/reasoning_gym/bar.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
OUT=runs/reasoning_gym
mkdir -p "$OUT"
: > "$OUT/bar.jsonl"
record() { python3 -c 'import json,sys; r=json.loads(sys.argv[2]); print(json.dumps({"run": sys.argv[1], "accuracy": r["eval/accuracy"], "tool_calls": r["eval/tool_calls/mean"], "n": r["n"]}))' "$1" "$2" | tee -a "$OUT/bar.jsonl"; }
[ -n "${SKIP_SFT:-}" ] || "$AGENTFLY" sft examples/reasoning_gym/sft.yaml
record sft "$("$AGENTFLY" eval $OUT/sft --split test | tail -n 1)"
"$AGENTFLY" train examples/reasoning_gym/grpo.yaml
record grpo "$("$AGENTFLY" eval $OUT/grpo --split test | tail -n 1)"
