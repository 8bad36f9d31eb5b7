#!/usr/bin/env bash
# The tests (what CI runs): lint, types, then pytest in three timed steps:
#   1. the default suite: everything not marked slow or vllm (kept under 15 minutes on 2 cores);
#   2. the vLLM tests, in a process of their own, because vLLM changes process-wide state (torch's thread
#      count, its multiprocessing switch) for every test after it;
#   3. the slow tests (whole demo and CLI runs, the docs guides, schemathesis, one cancel at each moment,
#      browsers), in two shards at once (browsers, docs and the web app but its jobs; the rest).
# Extra arguments go to every pytest run, e.g. `bash scripts/test.sh -x`. `AGENTFLY_TEST_STEPS=default`
# runs only the first step (a quick check before a commit), `AGENTFLY_TEST_STEPS=slow` only the third.
# The tests marked `stress` (50 cancels at random moments on PostgreSQL and 20 more on SQLite, a thousand
# chaotic rollouts on a Ray cluster, SmolLM2's learning bar: about an hour and a half on 2 cores) are outside
# these steps, to keep CI well under its 90 minutes: `AGENTFLY_TEST_STEPS=stress bash scripts/test.sh` runs
# them alone, before a release and whenever the code they stress changes.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
.venv/bin/ruff check .
# The layer contracts (Engine, Trajectory, the typed events, the built-in specs) are checked by type:
# agentfly, trainer and webapp all strict (webapp but for the untyped decorators and base classes of Celery
# and Channels), the web app through the Django and DRF stubs' plugins ([tool.mypy] in pyproject.toml).
.venv/bin/python -m mypy agentfly trainer webapp

# Each step has a wall-clock limit (seconds, several times its usual time) so that a hang fails that step
# with pytest's report of where it was (SIGINT), instead of running into CI's own limit with no report.
run() {  # pytest exits 5 when a selection is empty (e.g. vLLM not installed): that is not a failure
    local name=$1 limit=$2 rc=0 start
    shift 2
    start=$(date +%s)
    echo "test.sh: step '$name' (limit $limit s)"
    timeout -s INT -k 60 "$limit" .venv/bin/python -m pytest -q -p no:cacheprovider "$@" || rc=$?
    echo "test.sh: step '$name' took $(( $(date +%s) - start )) s"
    [ "$rc" != 124 ] || echo "test.sh: step '$name' ran past its limit of $limit s" >&2
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || return "$rc"
}
steps=${AGENTFLY_TEST_STEPS:-all}  # all, default, slow or stress
if [ "$steps" = stress ]; then
    run stress "${AGENTFLY_STRESS_LIMIT:-9000}" -m "stress and not vllm" "$@"
    exit 0
fi
if [ "$steps" != slow ]; then
    run default "${AGENTFLY_DEFAULT_LIMIT:-1200}" -m "not vllm and not slow and not stress" "$@"
    [ "$steps" = default ] && exit 0
    run vllm "${AGENTFLY_VLLM_LIMIT:-900}" -m "vllm" "$@"
fi
# The slow tests in two shards at once, each a pytest process with its own test database (and, from
# tests/webapp/fixtures.py, its own Redis prefix, so its Celery queues and channel groups are its own): the
# browser, docs and web app tests wait on servers, pages and workers much of the time, so the other shard's
# training runs fill the cores. The web app's jobs (tests/webapp/jobs) run in the second shard, which
# balances the two (about 28 and 31 minutes here). Each shard's output is shown when both have ended.
shard() {  # shard NAME LOG ARGS...: one shard of the slow step, its exit status in LOG.rc
    local name=$1 log=$2 rc=0
    shift 2
    DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/agentfly}_$name" \
        run "slow-$name" "${AGENTFLY_SLOW_LIMIT:-3300}" -m "slow and not vllm and not stress" --durations=20 "$@" > "$log" 2>&1 || rc=$?
    echo "$rc" > "$log.rc"
}
logs=$(mktemp -d)
shard browser "$logs/browser" tests/e2e tests/docs tests/webapp --ignore=tests/webapp/jobs "$@" &
shard rest "$logs/rest" --ignore=tests/e2e --ignore=tests/docs --ignore-glob='tests/webapp/[!j]*' "$@" &
wait
status=0
for name in rest browser; do
    cat "$logs/$name"
    [ "$(cat "$logs/$name.rc")" = 0 ] || status=1
done
rm -rf "$logs"
exit "$status"
