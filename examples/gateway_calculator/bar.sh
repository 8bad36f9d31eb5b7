#!/usr/bin/env bash
# The gateway's calculator bar: the calculator task driven by examples/gateway_calculator/agent.py (a plain
# `openai` SDK tool loop, no AgentFly import), trained through the gateway for 10 minutes from the calculator
# warm start (examples/calculator/warm_start, 55.5% held out); target 85% held out, like the in-process agent.
# The job's final evaluation goes through the same agent (500 unseen problems, temperature 0).
#   bash examples/gateway_calculator/bar.sh              # 3 seeds; results in runs/gateway_calculator/bar.jsonl
#   SEEDS="0" MINUTES=4 bash examples/gateway_calculator/bar.sh
#   STEPS=2 SEEDS=0 PROMPTS=4 GROUP=4 EVAL=16 bash examples/gateway_calculator/bar.sh   # a smoke run (~1 min)
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTFLY=${AGENTFLY:-.venv/bin/agentfly}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-"0 1 2"}
MINUTES=${MINUTES:-10}
STEPS=${STEPS:-1000}
PROMPTS=${PROMPTS:-16}
GROUP=${GROUP:-8}
EVAL=${EVAL:-500}
WORKERS=${WORKERS:-64}   # agent threads: enough to keep a step's 128 rollouts in flight
OUT=runs/gateway_calculator
RESULTS=$OUT/bar.jsonl
mkdir -p "$OUT"
: > "$RESULTS"

for seed in $SEEDS; do
    run=$OUT/seed$seed
    rm -rf "$run"
    start=$(date +%s)
    "$AGENTFLY" train examples/gateway_calculator/grpo.yaml --set output_dir="$run" --set seed="$seed" \
        --set max_minutes="$MINUTES" --set steps="$STEPS" --set rollout.prompts_per_step="$PROMPTS" \
        --set rollout.group_size="$GROUP" --set data.eval_size="$EVAL" --set progress=false > "$run.log" 2>&1 &
    job=$!
    "$PY" examples/gateway_calculator/agent.py "$run/gateway.json" "$WORKERS" 2> "$run.agent.log" &
    agent=$!
    status=0
    wait "$job" || status=$?
    sleep 2  # the agent stops on its own once the job's key is revoked; a job that failed early leaves it waiting
    kill "$agent" 2>/dev/null || true
    wait "$agent" 2>/dev/null || true
    if [ "$status" -ne 0 ]; then echo "seed $seed: the job failed ($run.log)" >&2; tail -n 20 "$run.log" >&2; exit "$status"; fi
    "$PY" - "$run/events.jsonl" "$seed" $(( $(date +%s) - start )) <<'PYEOF' | tee -a "$RESULTS"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
evals = [e["data"] for e in events if e["type"] == "metrics" and "eval/accuracy" in e["data"]]
steps = [e for e in events if e["type"] == "metrics" and "time/rollout" in e["data"]]
print(json.dumps({"run": f"gateway-seed{sys.argv[2]}", "accuracy": evals[-1]["eval/accuracy"] if evals else None,
                  "steps": len(steps), "seconds": float(sys.argv[3])}))
PYEOF
done
