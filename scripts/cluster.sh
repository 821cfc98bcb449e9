#!/usr/bin/env bash
# A local six-node Redis Cluster (three primaries, one replica each) for trying the service
# or measuring it by hand: `scripts/cluster.sh up` starts it on 127.0.0.1:7000-7005 in
# /tmp/flashsale-cluster and prints FLASHSALE_REDIS_URL; `scripts/cluster.sh down` stops it and
# removes its files. The tests start clusters of their own (flashsale_testkit::redis_cluster).
#
#   PORT0=7000 NODE_TIMEOUT_MS=3000 scripts/cluster.sh up
set -euo pipefail

PORT0=${PORT0:-7000}
NODE_TIMEOUT_MS=${NODE_TIMEOUT_MS:-3000}
DIR=${CLUSTER_DIR:-/tmp/flashsale-cluster}
ports() { for i in 0 1 2 3 4 5; do echo $((PORT0 + i)); done; }

up() {
    mkdir -p "$DIR"
    for p in $(ports); do
        mkdir -p "$DIR/$p"
        redis-server --port "$p" --bind 127.0.0.1 --dir "$DIR/$p" --daemonize yes \
            --logfile "$DIR/$p/redis.log" --pidfile "$DIR/$p/redis.pid" --save "" \
            --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-require-full-coverage no \
            --cluster-replica-validity-factor 0
    done
    for p in $(ports); do
        for _ in $(seq 1 50); do
            redis-cli -p "$p" ping >/dev/null 2>&1 && break
            sleep 0.1
        done
    done
    redis-cli --cluster create $(ports | sed 's/^/127.0.0.1:/') --cluster-replicas 1 \
        --cluster-yes >/dev/null
    for _ in $(seq 1 100); do
        redis-cli -p "$PORT0" cluster info | grep -q cluster_state:ok && break
        sleep 0.1
    done
    echo "FLASHSALE_REDIS_URL=$(ports | sed 's|^|redis://127.0.0.1:|' | paste -sd, -)"
}

down() {
    for p in $(ports); do
        redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true
    done
    rm -rf "$DIR"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
