#!/usr/bin/env bash
# The server's own instructions per answer, counted, not timed: `flashsale serve` on the embedded
# ledger under valgrind's callgrind, wrk sending each path for a while, callgrind's count of the
# user-space instructions the whole process ran (every thread: the handlers, the runtime, the
# workers) divided by the answers. On two shared cores a ratio of rates moves by ±0.08 from one
# run to the next; this count moves by about 1%, so a cut of a few hundred instructions on a
# path shows here when it cannot show in `scripts/bench-wrk.sh`. It is not that script's measure
# (the kernel's share, about half of a /healthz answer's CPU, is not counted; nor are caches),
# and no issue's target is read from it: it says which of two builds does less per answer.
#
# Paths: /healthz, a stock read, a sold-out purchase (409) and a queue sale's purchase without an
# admission pass (403), with wrk's Lua request of 2,000 users' tokens as bench-wrk sends them;
# each path is warmed first (its caches filled) and then counted. Prints a table: instructions
# per answer, and each path's instructions over /healthz's.
#
# Usage: scripts/bench-instr.sh [BIN...]   (default: target/release/flashsale, built when missing)
# Environment: INSTR_SECONDS (5), INSTR_CONNECTIONS (8).
set -euo pipefail
cd "$(dirname "$0")/.."

BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=(target/release/flashsale)
SECONDS_PER_PATH=${INSTR_SECONDS:-5}
CONNECTIONS=${INSTR_CONNECTIONS:-8}

command -v wrk >/dev/null || scripts/apt-install.sh bench-instr wrk
command -v valgrind >/dev/null || scripts/apt-install.sh bench-instr valgrind
for bin in "${BINS[@]}"; do
    [ -x "$bin" ] || [ "$bin" != target/release/flashsale ] || cargo build --release --locked -p flashsale
    [ -x "$bin" ] || { echo "bench-instr: no binary at $bin" >&2; exit 2; }
done

WORK=$(mktemp -d)
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

source scripts/wrk-requests.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

JWT=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
ADMIN=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
sign_tokens "$JWT" 2000 >"$WORK/tokens"
purchase_lua "$WORK/tokens" >"$WORK/purchase.lua"

start_server() { # bin
    local port data="$WORK/data"
    port=$(free_port)
    rm -rf "$data" "$WORK/cg"
    mkdir -p "$data" "$WORK/cg"
    local env=(FLASHSALE_LISTEN="127.0.0.1:$port" FLASHSALE_DATA_DIR="$data"
        FLASHSALE_JWT_SECRET="$JWT" FLASHSALE_ADMIN_TOKEN="$ADMIN" FLASHSALE_LOG=warn
        FLASHSALE_RATE_INSTANCE=off FLASHSALE_RATE_SALE=off FLASHSALE_RATE_USER=off
        FLASHSALE_RATE_IP=off FLASHSALE_DATABASE_URL="sqlite://$data/flashsale.db")
    env -u FLASHSALE_REDIS_URL "${env[@]}" "$1" migrate --contract >"$data/migrate.log" 2>&1 ||
        { cat "$data/migrate.log" >&2; exit 1; }
    env -u FLASHSALE_REDIS_URL "${env[@]}" valgrind --tool=callgrind \
        --callgrind-out-file="$WORK/cg/out.%p" "$1" serve >"$data/server.log" 2>&1 &
    SERVER_PID=$!
    BASE="http://127.0.0.1:$port"
    for _ in $(seq 1 600); do
        curl -fs "$BASE/healthz" >/dev/null 2>&1 && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench-instr: the server did not start:" >&2
    cat "$data/server.log" >&2
    exit 1
}

admin() { # method path [body]
    curl -fsS -X "$1" "$BASE$2" -H "authorization: Bearer $ADMIN" \
        -H 'content-type: application/json' ${3:+-d "$3"} >/dev/null
}

# The sales bench-wrk measures: 1 (stock to spare, read), 2 (one unit, sold), 3 (a queue sale
# whose start is an hour away).
open_sales() {
    local now
    now=$(python3 -c 'import time; print(int(time.time() * 1000))')
    for sku in 1 2; do
        local stock=$((sku == 1 ? 1000000 : 1))
        admin POST /api/v1/sales "{\"sku_id\":$sku,\"name\":\"instr\",\"total_stock\":$stock,\"per_user_limit\":1000}"
        admin POST "/api/v1/sales/$sku/warm"
    done
    admin POST /api/v1/sales "{\"sku_id\":3,\"name\":\"instr queue\",\"total_stock\":1000,\"per_user_limit\":1,\"admission\":\"queue\",\"admission_opens_at_ms\":$((now - 1000)),\"starts_at_ms\":$((now + 3600000)),\"ends_at_ms\":$((now + 7200000))}"
    curl -fsS -XPOST "$BASE/api/v1/sales/2/purchases" -H "authorization: Bearer $(head -1 "$WORK/tokens")" \
        -H 'content-type: application/json' -d '{"request_id":"only","quantity":1}' >/dev/null
}

# wrk on one path for `seconds`; prints the answers. A purchase path must answer only refusals.
wrk_path() { # path seconds name
    local out url="$BASE$1"
    if [[ "$1" == */purchases ]]; then
        out=$(wrk -t1 -c"$CONNECTIONS" -d"$2s" -s "$WORK/purchase.lua" "$url" -- "$3$(date +%s%N)")
        local total non
        total=$(awk '/requests in/ {print $1}' <<<"$out")
        non=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
        [ "${non:-0}" = "$total" ] || { echo "bench-instr: $1 answered 2xx" >&2; exit 1; }
    else
        out=$(wrk -t1 -c"$CONNECTIONS" -d"$2s" "$url")
    fi
    awk '/requests in/ {print $1}' <<<"$out"
}

# Instructions per answer of one path: callgrind's counters zeroed, the path sent, then dumped.
count() { # path name
    wrk_path "$1" 2 "warm" >/dev/null
    callgrind_control -z "$SERVER_PID" >/dev/null 2>&1
    local n file total
    n=$(wrk_path "$1" "$SECONDS_PER_PATH" "$2")
    callgrind_control -d "$2" "$SERVER_PID" >/dev/null 2>&1
    file=$(ls -t "$WORK"/cg/out.* | head -1)
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$file")
    echo $((total / n))
}

PATHS=("/healthz healthz" "/api/v1/sales/1 read" "/api/v1/sales/2/purchases soldout"
    "/api/v1/sales/3/purchases pass")
ROWS=()
for bin in "${BINS[@]}"; do
    start_server "$bin"
    open_sales
    declare -A ir=()
    for p in "${PATHS[@]}"; do
        read -r path name <<<"$p"
        ir[$name]=$(count "$path" "$name")
    done
    kill "$SERVER_PID" && wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
    ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
    ROWS+=("| $bin | ${ir[healthz]} | ${ir[read]} ($(ratio "${ir[read]}" "${ir[healthz]}")) | ${ir[soldout]} ($(ratio "${ir[soldout]}" "${ir[healthz]}")) | ${ir[pass]} ($(ratio "${ir[pass]}" "${ir[healthz]}")) |")
    unset ir
done

echo
echo "callgrind, user-space instructions per answer (÷ /healthz's), embedded ledger, wrk -t1 -c$CONNECTIONS -d${SECONDS_PER_PATH}s a path"
echo
echo "| build | /healthz | stock read | sold out (409) | no admission pass (403) |"
echo "|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
