#!/usr/bin/env bash
# The purchase script's cost to Redis counted, not timed: a Redis server of the run's own (a
# free port, a temp dir, nothing saved) under valgrind's callgrind, and `flashsale bench script
# --callgrind-pid` against it: each stage's Redis main-thread instructions per purchase, and the
# seed's script counted the same way. A count repeats to within a fraction of a percent where
# `bench script`'s µs move by a µs or more on a shared machine, so it says which of two scripts
# does less; it is not the issue's measure of Redis CPU (`bench strategies`), which also pays the
# kernel's part of each call and the caches. The µs columns of a Redis under valgrind are
# meaningless.
#
# Usage: scripts/bench-script-instr.sh [bench script options...]   (e.g. --batch 12 --layout 1)
# Environment: FLASHSALE_BIN (default target/release/flashsale, built when missing).
# Defaults: --batch 80 --calls 60 (a call of 80 takes ~0.1 s under valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${FLASHSALE_BIN:-target/release/flashsale}
command -v valgrind >/dev/null || scripts/apt-install.sh bench-script-instr valgrind
command -v redis-server >/dev/null || scripts/apt-install.sh bench-script-instr redis-server
[ -x "$BIN" ] || cargo build --release --locked -p flashsale

WORK=$(mktemp -d)
VG_PID=""
cleanup() {
    [ -n "$VG_PID" ] && kill "$VG_PID" 2>/dev/null && wait "$VG_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" \
    redis-server --port "$PORT" --bind 127.0.0.1 --dir "$WORK" --save '' --appendonly no \
    >"$WORK/redis.log" 2>&1 &
VG_PID=$!
# valgrind runs redis-server in its own process: the pid callgrind_control talks to.
for _ in $(seq 1 600); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    kill -0 "$VG_PID" 2>/dev/null || { cat "$WORK/redis.log" >&2; exit 1; }
    sleep 0.1
done
redis-cli -p "$PORT" ping >/dev/null || { echo "bench-script-instr: Redis did not start" >&2; exit 1; }

ARGS=("$@")
[[ " ${ARGS[*]} " == *" --batch "* ]] || ARGS+=(--batch 80)
[[ " ${ARGS[*]} " == *" --calls "* ]] || ARGS+=(--calls 60)
"$BIN" bench script --redis-url "redis://127.0.0.1:$PORT" --callgrind-pid "$VG_PID" "${ARGS[@]}"
