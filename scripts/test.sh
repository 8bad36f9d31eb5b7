#!/usr/bin/env bash
# The default test suite (what CI runs): lint, types, then pytest in two processes, because vLLM changes
# process-wide state (torch's thread count, its multiprocessing switch) for every test after it.
# Extra arguments go to both pytest runs, e.g. `bash scripts/test.sh -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/ruff check .
# The layer contracts (Engine, Trajectory, the typed events, the built-in specs) are checked by type:
# agentfly strict, trainer with mypy's defaults ([tool.mypy] in pyproject.toml).
.venv/bin/python -m mypy agentfly trainer

run() {  # pytest exits 5 when a selection is empty (e.g. vLLM not installed): that is not a failure
    local rc=0
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || return "$rc"
}
run -m "not vllm" "$@"
run -m "vllm" "$@"
