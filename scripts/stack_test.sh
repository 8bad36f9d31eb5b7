#!/usr/bin/env bash
# The stack step of CI: the docker-compose stack and the docker sandbox backend against a real engine.
#
#   bash scripts/stack_test.sh            # after scripts/setup.sh; takes several minutes (see docs/deployment.md)
#
# 1. Installs docker.io, docker-compose and debootstrap when missing (Debian's packages; nothing else here
#    needs them). 2. Starts dockerd when none answers, on its socket and, TLS-verified, on 127.0.0.1:2376 (the
#    "second host" of the multi-engine tests); stops it at the end. 3. Makes the base image from Debian's
#    packages with debootstrap of this machine's release (no registry), once, cached in $STACK_CACHE.
#    4. Builds the app image from the Dockerfile on it, and the Redis, PostgreSQL, sandbox and workspace images
#    from deploy/. 5. Runs the tests marked `stack` (compose up, a job through the REST API and its websocket,
#    compose down -v) and the docker sandbox and workspace tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STACK_CACHE=${STACK_CACHE:-/var/cache/agentfly-stack}
STATE=$(mktemp -d /tmp/agentfly-stack.XXXXXX)
started_dockerd=""
t0=$(date +%s)
say() { echo "stack: [$(( $(date +%s) - t0 ))s] $*"; }

cleanup() {
    if [ -n "$started_dockerd" ] && kill -0 "$started_dockerd" 2>/dev/null; then
        say "stopping the dockerd this script started (pid $started_dockerd)"
        kill "$started_dockerd"
        for _ in $(seq 1 30); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 1; done
    fi
    rm -rf "$STATE"
}
trap cleanup EXIT

# ---------------------------------------------------------------- 1. the tools, from Debian's packages
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# ---------------------------------------------------------------- 2. an engine
TLS=$STATE/tls
make_tls() {  # a CA, the engine's certificate (for 127.0.0.1) and a client certificate, all throwaway
    mkdir -p "$TLS" && cd "$TLS"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca.pem -days 1 -subj /CN=agentfly-test-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr -subj /CN=127.0.0.1 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out server-cert.pem -days 1 -extfile server.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout key.pem -out client.csr -subj /CN=agentfly-test-client 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' > client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out cert.pem -days 1 -extfile client.ext 2>/dev/null
    chmod 644 ./*.pem
    cd "$ROOT"
}
if docker info >/dev/null 2>&1; then
    say "a docker engine answers already; using it (it is left running)"
else
    make_tls
    say "starting dockerd (unix socket, and TLS-verified tcp://127.0.0.1:2376)"
    dockerd --host unix:///var/run/docker.sock --host tcp://127.0.0.1:2376 --tlsverify \
        --tlscacert "$TLS/ca.pem" --tlscert "$TLS/server-cert.pem" --tlskey "$TLS/server-key.pem" \
        --pidfile "$STATE/dockerd.pid" >"$STATE/dockerd.log" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -20 "$STATE/dockerd.log"; echo "stack: dockerd did not answer" >&2; exit 1; }
    export AGENTFLY_TEST_DOCKER_TCP=tcp://127.0.0.1:2376 AGENTFLY_TEST_DOCKER_CERTS=$TLS
fi

# ---------------------------------------------------------------- 3. the base image, from Debian's packages
. /etc/os-release
BASE=agentfly-base:$VERSION_CODENAME
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
    mirror=${mirror:-http://deb.debian.org/debian}
    if [ ! -f "$STACK_CACHE/rootfs.done" ]; then
        say "debootstrap $VERSION_CODENAME from $mirror (once; cached in $STACK_CACHE)"
        rm -rf "$STACK_CACHE/rootfs" && mkdir -p "$STACK_CACHE"
        debootstrap --variant=minbase "$VERSION_CODENAME" "$STACK_CACHE/rootfs" "$mirror" >"$STACK_CACHE/debootstrap.log"
        rm -rf "$STACK_CACHE"/rootfs/var/cache/apt/archives/*.deb "$STACK_CACHE"/rootfs/var/lib/apt/lists/*
        touch "$STACK_CACHE/rootfs.done"
    fi
    say "docker import $BASE"
    tar --numeric-owner -C "$STACK_CACHE/rootfs" -c . | docker import -c 'CMD ["bash"]' - "$BASE" >/dev/null
fi

# ---------------------------------------------------------------- 4. the images (layers are reused)
# This machine's CPU torch wheel (where pip finds it) and the CAs its egress re-signs TLS with: for the
# build stage only (deploy/local/README.md). TORCH_INDEX= : PyTorch's own index is not reachable here.
for dir in $(pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p") ${PIP_FIND_LINKS:-}; do
    cp -n "$dir"/torch-2.13.0+cpu-*.whl deploy/local/wheels/ 2>/dev/null || true
done
cp -n /usr/local/share/ca-certificates/*.crt deploy/local/ca-certificates/ 2>/dev/null || true
build() {  # tag, dockerfile, context, extra args...
    local tag=$1 file=$2 context=$3; shift 3
    say "docker build $tag"
    docker build -q --network host --build-arg BASE_IMAGE="$BASE" -t "$tag" -f "$file" "$@" "$context" >/dev/null
}
build agentfly:latest Dockerfile . --build-arg TORCH_INDEX=
build agentfly-redis:local deploy/redis.Dockerfile deploy
build agentfly-postgres:local deploy/postgres.Dockerfile deploy
build agentfly-sandbox:local deploy/sandbox.Dockerfile deploy
build agentfly-workspace:local deploy/workspace.Dockerfile deploy
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^agentfly' | sed 's/^/stack:   /'

# ---------------------------------------------------------------- 5. the tests
export AGENTFLY_STACK=1 AGENTFLY_REDIS_IMAGE=agentfly-redis:local AGENTFLY_POSTGRES_IMAGE=agentfly-postgres:local \
    AGENTFLY_SANDBOX_IMAGE=agentfly-sandbox:local AGENTFLY_WORKSPACE_IMAGE=agentfly-workspace:local PYTHONUNBUFFERED=1
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider -rs -m "stack or docker" tests/stack tests/integration/resources/test_docker_sandbox.py \
    tests/integration/resources/test_docker_workspace.py || rc=$?
say "done (pytest exit $rc)"
exit "$rc"
