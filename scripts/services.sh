#!/usr/bin/env bash
# Start the services the tests use when they are not already answering: PostgreSQL and Redis on 127.0.0.1.
set -uo pipefail

if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
    echo "services: starting redis-server"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /tmp --logfile /tmp/agentfly-redis.log
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
    if command -v pg_ctlcluster >/dev/null; then
        echo "services: starting PostgreSQL"
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    else
        echo "services: PostgreSQL is not running and not installed; the web app tests need it" >&2
    fi
fi
for i in $(seq 1 30); do
    (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null && exit 0
    sleep 1
done
echo "services: Redis or PostgreSQL did not come up" >&2
exit 1
