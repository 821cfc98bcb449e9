#!/usr/bin/env bash
# The server's own cost per answer, measured with wrk: a C client that costs little per request,
# so on a two-core machine the ratios show the server, not the client (`flashsale bench http`'s
# own client spends ~50 µs per answer and hides most of it).
#
# Method: the `flashsale serve` binary alone (release build), rate limits off, one wrk thread and
# 64 connections; tokens of 2,000 users signed with the server's secret, cycled by a Lua script;
# each path and /healthz are run in turn three times and the median of the three ratios
# path / /healthz is reported; each round starts once the server is idle (no work left over
# from the round before). A non-2xx answer on a path that must succeed (accepted purchase,
# stock read, queue join) fails the run; on the sold-out path every answer must be the 409, and
# on a queue sale's purchase without an admission pass every answer must be the 403.
# The join path joins a queue sale's pre-queue with the tokens of WRK_JOIN_USERS users (default:
# 50,000 per second of the path's rounds), a new user per request, the rounds one after another
# through the list; a run that used them up (second joins measured) says so. After the join
# rounds the server's /metrics gives how many joins one write of the admission book took and
# how long a write took (a table of its own).
#
# Beside the ratios of rates, each round's CPU per answer (from /proc, user + system, the round's
# deferred work included: it is read once the server is idle again): the server's, on the path
# and on /healthz, and their ratio, which does not move with the rate a busy machine lets a round
# reach; on the Redis ledger also redis-server's and mariadbd's (the servers at BENCH_REDIS_URL
# and BENCH_MYSQL, on this machine) per answer of the path.
#
# With BENCH_RELAY_NATS set to a NATS URL (e.g. nats://127.0.0.1:4222), each ledger's accepted
# path is measured a second time on a server started with the order-event relay publishing to
# it (a JetStream stream of the run's own, deleted after), and the ratio of the two accepted
# rates is printed: the relay's cost to the accepted path, measured in one run.
#
# Usage: scripts/bench-wrk.sh [embedded] [redis]      (default: both)
# Environment: FLASHSALE_BIN (default target/release/flashsale, built when missing),
# WRK_DURATION (5s), WRK_CONNECTIONS (64), WRK_ROUNDS (3), BENCH_REDIS_URL
# (redis://127.0.0.1:6379), BENCH_MYSQL (the MariaDB server: `-h 127.0.0.1 -P 3306 -u root`),
# BENCH_RELAY_NATS (unset: no relay run), WRK_PATHS (unset: every path; else some of `read
# soldout accepted join pass`; the accepted path is always run with BENCH_RELAY_NATS),
# FLASHSALE_BENCH_EXPAND (set: the database stays in its expand shape, two rows per purchase).
# The server's own settings pass through the environment: FLASHSALE_REDIS_LAYOUT=2 measures the
# Redis ledger with its copies in key layout 2 (one record per buyer; the server's default is 1).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${FLASHSALE_BIN:-target/release/flashsale}
DURATION=${WRK_DURATION:-5s}
CONNECTIONS=${WRK_CONNECTIONS:-64}
ROUNDS=${WRK_ROUNDS:-3}
REDIS_URL=${BENCH_REDIS_URL:-redis://127.0.0.1:6379}
MYSQL_ARGS=${BENCH_MYSQL:--h 127.0.0.1 -P 3306 -u root}
LEDGERS=("$@")
[ ${#LEDGERS[@]} -gt 0 ] || LEDGERS=(embedded redis)
USERS=2000
# A round's seconds, for sizing the join's users (a duration not in seconds counts as 10 s; a
# run that runs out of users says so).
DURATION_S=${DURATION%s}
[[ "$DURATION_S" =~ ^[0-9]+$ ]] || DURATION_S=10
JOIN_USERS=${WRK_JOIN_USERS:-$((50000 * ROUNDS * DURATION_S))}

command -v wrk >/dev/null || scripts/apt-install.sh bench-wrk wrk
[ -x "$BIN" ] || cargo build --release --locked -p flashsale

WORK=$(mktemp -d)
SERVER_PID=""
DB=""
CHARGED="" # "name pid" lines of the processes a round is charged with (charged_pids)
TAG="fswrk$$"
# Deletes every key under the run's prefix.
drop_keys() { redis-cli -u "$REDIS_URL" --scan --pattern "$TAG:*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null 2>&1; }
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    [ -n "$DB" ] && mariadb $MYSQL_ARGS -e "DROP DATABASE IF EXISTS \`$DB\`" 2>/dev/null
    drop_keys
    rm -rf "$WORK"
}
trap cleanup EXIT

source scripts/wrk-requests.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The wrk scripts. Each user's request is formatted once, at wrk's start (a `request` that
# builds headers per request costs the client ~1.5 µs more an answer, which the server's share
# of the two cores pays for); a purchase request adds only its body. wrk's Lua starts every
# process from the same random state, so what must differ between rounds comes from the
# command line: args[1] names the round (a purchase's request id is the round's name and a
# counter: never sent before), args[2] is how many users earlier rounds of the path used (a
# join round goes on with the next user).
write_lua() {
    purchase_lua "$WORK/tokens" >"$WORK/purchase.lua"
    cat >"$WORK/join.lua" <<EOF
local reqs, n = {}, 0
init = function(args)
    n = tonumber(args[2])
    local host = wrk.headers["Host"]
    for line in io.lines("$WORK/join-tokens") do
        reqs[#reqs + 1] = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. host
            .. "\r\nauthorization: Bearer " .. line .. "\r\ncontent-length: 0\r\n\r\n"
    end
end
request = function()
    n = n + 1
    return reqs[((n - 1) % #reqs) + 1]
end
EOF
}

start_server() { # ledger
    local ledger=$1 port data="$WORK/$1"
    port=$(free_port)
    # Each server starts from nothing: a fresh data dir (the embedded ledger's SQLite) and no
    # keys under the run's prefix (a Redis sale the previous server of this run warmed).
    rm -rf "$data"
    mkdir -p "$data"
    drop_keys || true
    JWT=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
    ADMIN=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
    local env=(FLASHSALE_LISTEN="127.0.0.1:$port" FLASHSALE_DATA_DIR="$data"
        FLASHSALE_JWT_SECRET="$JWT" FLASHSALE_ADMIN_TOKEN="$ADMIN" FLASHSALE_LOG=warn
        FLASHSALE_RATE_INSTANCE=off FLASHSALE_RATE_SALE=off FLASHSALE_RATE_USER=off
        FLASHSALE_RATE_IP=off FLASHSALE_REDIS_PREFIX="$TAG")
    if [ "$ledger" = redis ]; then
        DB="${TAG}_db"
        mariadb $MYSQL_ARGS -e "DROP DATABASE IF EXISTS \`$DB\`; CREATE DATABASE \`$DB\`"
        env+=(FLASHSALE_REDIS_URL="$REDIS_URL" FLASHSALE_DATABASE_URL="mysql://root@127.0.0.1:3306/$DB")
    else
        env+=(FLASHSALE_DATABASE_URL="sqlite://$data/flashsale.db")
    fi
    if [ -n "${RELAY:-}" ]; then
        env+=(FLASHSALE_EVENTS_NATS_URL="$BENCH_RELAY_NATS" FLASHSALE_EVENTS_NATS_SUBJECT="$TAG.events"
            FLASHSALE_EVENTS_NATS_STREAM="${TAG^^}")
    fi
    # The database contracted to one row per purchase, as a new install runs it before its
    # first sale (docs/DEPLOY.md; what the other benches do); FLASHSALE_BENCH_EXPAND=1 keeps
    # the expand shape.
    if [ -z "${FLASHSALE_BENCH_EXPAND:-}" ]; then
        env -u FLASHSALE_REDIS_URL "${env[@]}" "$BIN" migrate --contract >"$data/migrate.log" 2>&1 ||
            { cat "$data/migrate.log" >&2; exit 1; }
    fi
    env -u FLASHSALE_REDIS_URL "${env[@]}" "$BIN" serve >"$data/server.log" 2>&1 &
    SERVER_PID=$!
    BASE="http://127.0.0.1:$port"
    for _ in $(seq 1 300); do
        if curl -fs "$BASE/healthz" >/dev/null 2>&1; then
            CHARGED=$(charged_pids)
            return 0
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "bench-wrk: the server did not start:" >&2
    cat "$data/server.log" >&2
    exit 1
}

stop_server() {
    kill "$SERVER_PID" && wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
    if [ -n "$DB" ]; then
        mariadb $MYSQL_ARGS -e "DROP DATABASE IF EXISTS \`$DB\`"
        DB=""
    fi
}

admin() { # method path [body]
    curl -fsS -X "$1" "$BASE$2" -H "authorization: Bearer $ADMIN" \
        -H 'content-type: application/json' ${3:+-d "$3"} >/dev/null
}

open_sale() { # sku stock
    admin POST /api/v1/sales "{\"sku_id\":$1,\"name\":\"wrk\",\"total_stock\":$2,\"per_user_limit\":1000}"
    admin POST "/api/v1/sales/$1/warm"
}

# A queue sale whose queue is open and whose start is an hour away: joins form its pre-queue.
queue_sale() { # sku stock
    local now
    now=$(python3 -c 'import time; print(int(time.time() * 1000))')
    admin POST /api/v1/sales "{\"sku_id\":$1,\"name\":\"wrk queue\",\"total_stock\":$2,\"per_user_limit\":1,\"admission\":\"queue\",\"admission_opens_at_ms\":$((now - 1000)),\"starts_at_ms\":$((now + 3600000)),\"ends_at_ms\":$((now + 7200000))}"
}

# Runs wrk on one path; prints "requests/s non2xx total". The script's args: the round's name
# (never used before) and the users the path's earlier rounds used.
wrk_run() { # url [lua [used]]
    local out
    out=$(wrk -t1 -c"$CONNECTIONS" -d"$DURATION" ${2:+-s "$2"} "$1" -- "r$(date +%s%N)" "${3:-0}")
    local rps non total
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    non=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    echo "$rps ${non:-0} $total"
}

# Whether a path is measured: every path, unless WRK_PATHS names some.
wanted() { [ -z "${WRK_PATHS:-}" ] || [[ " $WRK_PATHS " == *" $1 "* ]]; }

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# A process's CPU time so far, in clock ticks (user + system); the server's by default.
cpu_ticks() { awk '{print $14 + $15}' "/proc/${1:-$SERVER_PID}/stat"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# The processes whose CPU a round is charged with, as "name pid" lines: the server, and on the
# Redis ledger the Redis and MariaDB servers it talks to; the pid of one that is not a process of
# that name on this machine (a server elsewhere) is "-". Found once per server started
# (`CHARGED`), so that no round is charged with the look-ups' own queries.
charged_pids() {
    echo "server $SERVER_PID"
    [ "$LEDGER" = redis ] || return 0
    local redis_pid maria_pid
    redis_pid=$(redis-cli -u "$REDIS_URL" info server | awk -F: '/^process_id:/ {print $2}' | tr -d '\r')
    maria_pid=$(cat "$(mariadb $MYSQL_ARGS -N -e 'SELECT @@pid_file')" 2>/dev/null || true)
    echo "redis-server $(local_pid redis-server "$redis_pid")"
    echo "mariadbd $(local_pid mariadbd "$maria_pid")"
}

# `pid` when it is a process named `name` on this machine, else "-".
local_pid() { # name pid
    if [ -n "$2" ] && [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ]; then echo "$2"; else echo -; fi
}

# Each charged process's CPU ticks ("-" for one not on this machine), in the order of
# `CHARGED`, on one line.
charged_ticks() {
    local name pid line=""
    while read -r name pid; do
        if [ "$pid" = - ]; then line+="- "; else line+="$(cpu_ticks "$pid") "; fi
    done <<<"$CHARGED"
    echo "$line"
}

# µs of CPU per answer of each charged process between two `charged_ticks` lines (nan for one
# not on this machine).
cpu_per_answer() { # before after answers
    python3 -c '
import sys
b, a, n, tick_us = sys.argv[1].split(), sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
per = lambda x, y: (int(y) - int(x)) * tick_us / max(n, 1) if "-" not in (x, y) else float("nan")
print(" ".join(f"{per(x, y):.1f}" for x, y in zip(b, a)))
' "$1" "$2" "$3" "$TICK_US"
}

# Polls until the server is idle (at most one 10 ms tick of CPU in 300 ms), for at most 30 s:
# no round, of a path or of /healthz, may carry work the round before it left behind (the
# persister writing the accepted path's orders, the embedded writer's joins).
settle() {
    local deadline=$((SECONDS + 30)) before
    while [ $SECONDS -lt $deadline ]; do
        before=$(cpu_ticks)
        sleep 0.3
        [ $(($(cpu_ticks) - before)) -le 1 ] && return
    done
    echo "bench-wrk: the server was still busy after 30 s" >&2
}

# One row: the path and /healthz in turn ROUNDS times; the median ratio. $3: what a run must
# answer (ok: 2xx only; refused: no 2xx at all).
measure() { # label url expect [lua]
    local label=$1 url=$2 expect=$3 lua=${4:-} ratios=() rates=() r h non total used=0
    local before cpus=() hcpus=() htotal
    for _ in $(seq 1 "$ROUNDS"); do
        settle
        before=$(charged_ticks)
        read -r r non total < <(wrk_run "$url" "$lua" "$used")
        # Every request the round made: those answered, and at most one unanswered per connection.
        used=$((used + total + CONNECTIONS))
        if [ "$expect" = ok ] && [ "$non" != 0 ]; then
            echo "bench-wrk: $label: $non of $total answers were not 2xx" >&2
            FAILED=1
        fi
        if [ "$expect" = refused ] && [ "$non" != "$total" ]; then
            echo "bench-wrk: $label: $((total - non)) of $total answers were 2xx, not refused" >&2
            FAILED=1
        fi
        # The path's work done first (the persister storing a round's orders), so /healthz
        # is not measured beside it, and the round's CPU counts that work too.
        settle
        cpus+=("$(cpu_per_answer "$before" "$(charged_ticks)" "$total")")
        before=$(cpu_ticks)
        read -r h _ htotal < <(wrk_run "$BASE/healthz")
        hcpus+=("$(cpu_per_answer "$before" "$(cpu_ticks)" "$htotal")")
        ratios+=("$(python3 -c "print(f'{$r / $h:.3f}')")")
        rates+=("$r")
        RATES+=("$label $r/s, /healthz $h/s")
    done
    if [ "$lua" = "$WORK/join.lua" ] && [ "$used" -gt "$JOIN_USERS" ]; then
        echo "bench-wrk: $label: $used joins of $JOIN_USERS users: some were second joins (raise WRK_JOIN_USERS)" >&2
    fi
    local m
    m=$(printf '%s\n' "${ratios[@]}" | median)
    ROWS+=("| $label | $LEDGER_NAME | $m | ${ratios[*]} |")
    cpu_row "$label" cpus hcpus
    LAST_RATES=("${rates[@]}")
}

# A row of the CPU table: the medians over the rounds of each charged process's µs per answer
# of the path, the server's per /healthz answer, and the ratio of the server's two (the steadier
# measure of the server's own cost: it does not move with the rate a round let through).
cpu_row() { # label path-cpus-array healthz-cpus-array
    local -n path_cpus=$2 health_cpus=$3
    local row
    row=$(python3 - "${#path_cpus[@]}" "${path_cpus[@]}" "${health_cpus[@]}" <<'EOF'
import statistics, sys
n = int(sys.argv[1])
path = [list(map(float, r.split())) for r in sys.argv[2:2 + n]]
health = [float(r) for r in sys.argv[2 + n:]]
med = [statistics.median(col) for col in zip(*path)]
h = statistics.median(health)
others = " / ".join("–" if m != m else f"{m:.1f}" for m in med[1:]) or "–"
print(f"{med[0]:.1f} | {h:.1f} | {h / med[0]:.3f} | {others}")
EOF
)
    CPU_ROWS+=("| $1 | $LEDGER_NAME | $row |")
}

# The accepted path with the relay on, after it was measured off: the median accepted rates
# off and on, their ratio, and the relay's lag when the run ends.
measure_relay() {
    local off on ratio lag
    off=$(printf '%s\n' "${ACCEPTED_RATES[@]}" | median)
    stop_server
    RELAY=1 start_server "$LEDGER"
    sign_tokens "$JWT" "$USERS" >"$WORK/tokens"
    write_lua
    open_sale 1 1000000000
    measure "accepted (202), relay to NATS on" "$BASE/api/v1/sales/1/purchases" ok "$WORK/purchase.lua"
    on=$(printf '%s\n' "${LAST_RATES[@]}" | median)
    ratio=$(python3 -c "print(f'{$on / $off:.3f}')")
    lag=$(curl -fsS "$BASE/api/v1/admin/events" -H "authorization: Bearer $ADMIN" | python3 -c \
        'import json,sys; print(sum(s["lag_events"] for s in json.load(sys.stdin)["sinks"] if s["sink"]=="nats"))')
    RELAY_ROWS+=("| $LEDGER_NAME | $off | $on | $ratio | $lag |")
    nats_delete_stream
}

# The join rounds' groups, from the server's /metrics: how many joins one write of the
# admission book took, and how long a write took, on average.
join_groups() {
    local row
    row=$(curl -fsS "$BASE/metrics" | python3 -c '
import sys
v = {}
for line in sys.stdin:
    name, _, value = line.partition(" ")
    if name.startswith("flashsale_admission_join_group_"):
        v[name] = float(value)
n = v.get("flashsale_admission_join_group_joins_count", 0)
if n:
    joins = v["flashsale_admission_join_group_joins_sum"]
    write_us = v["flashsale_admission_join_group_seconds_sum"] / n * 1e6
    print(f"{int(n)} | {joins / n:.1f} | {write_us:.0f}")
else:
    print("0 | – | –")
')
    JOIN_ROWS+=("| $LEDGER_NAME | $row |")
}

# Deletes the run's JetStream stream through the JetStream API on a plain NATS connection
# (no `nats` CLI needed).
nats_delete_stream() {
    python3 - "$BENCH_RELAY_NATS" "${TAG^^}" <<'EOF' || true
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
s = socket.create_connection((u.hostname, u.port or 4222), timeout=5)
s.recv(4096)
s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.fswrk 1\r\n'
          b'PUB $JS.API.STREAM.DELETE.%s _INBOX.fswrk 0\r\n\r\n' % sys.argv[2].encode())
answer = b""
while b"MSG _INBOX.fswrk" not in answer:
    answer += s.recv(4096)
EOF
}

FAILED=0
ROWS=()
RELAY_ROWS=()
JOIN_ROWS=()
CPU_ROWS=()
LAST_RATES=()
ACCEPTED_RATES=()
RATES=()
for LEDGER in "${LEDGERS[@]}"; do
    case "$LEDGER" in
    embedded) LEDGER_NAME="embedded (SQLite)" ;;
    redis) LEDGER_NAME="Redis + MariaDB, persister on" ;;
    *) echo "bench-wrk: unknown ledger $LEDGER (embedded, redis)" >&2; exit 2 ;;
    esac
    start_server "$LEDGER"
    sign_tokens "$JWT" "$USERS" >"$WORK/tokens"
    sign_tokens "$JWT" "$JOIN_USERS" >"$WORK/join-tokens"
    write_lua
    open_sale 1 1000000000
    open_sale 2 1
    queue_sale 3 1000
    first=$(head -1 "$WORK/tokens")
    curl -fsS -XPOST "$BASE/api/v1/sales/2/purchases" -H "authorization: Bearer $first" \
        -H 'content-type: application/json' -d '{"request_id":"only","quantity":1}' >/dev/null
    if wanted read; then
        measure "stock read (GET /api/v1/sales/{sku})" "$BASE/api/v1/sales/1" ok
    fi
    if wanted soldout; then
        measure "sold out (409)" "$BASE/api/v1/sales/2/purchases" refused "$WORK/purchase.lua"
    fi
    if wanted join; then
        measure "queue join (POST …/queue)" "$BASE/api/v1/sales/3/queue" ok "$WORK/join.lua"
        join_groups
    fi
    if wanted pass; then
        measure "no admission pass (403)" "$BASE/api/v1/sales/3/purchases" refused "$WORK/purchase.lua"
    fi
    # The accepted path last: its orders are still being written (the persister into MariaDB,
    # the embedded writer) after its rounds end; `settle` waits for that between paths too.
    if wanted accepted || [ -n "${BENCH_RELAY_NATS:-}" ]; then
        measure "accepted (202)" "$BASE/api/v1/sales/1/purchases" ok "$WORK/purchase.lua"
        ACCEPTED_RATES=("${LAST_RATES[@]}")
    fi
    if [ -n "${BENCH_RELAY_NATS:-}" ]; then measure_relay; fi
    stop_server
done

echo
echo "wrk -t1 -c$CONNECTIONS -d$DURATION, $ROUNDS rounds, $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg), $BIN"
for line in "${RATES[@]}"; do echo "  $line"; done
echo
echo "| path | ledger | ratio to /healthz (median) | rounds |"
echo "|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "| path | ledger | server µs CPU per answer | per /healthz answer | /healthz ÷ path | redis-server / mariadbd µs per answer |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${CPU_ROWS[@]}"
if [ ${#JOIN_ROWS[@]} -gt 0 ]; then
    echo
    echo "| ledger | join groups written | joins per group (mean) | µs per group write (mean) |"
    echo "|---|---|---|---|"
    printf '%s\n' "${JOIN_ROWS[@]}"
fi
if [ ${#RELAY_ROWS[@]} -gt 0 ]; then
    echo
    echo "| ledger | accepted/s, relay off (median) | accepted/s, relay to NATS on (median) | on / off | NATS lag at the end |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${RELAY_ROWS[@]}"
fi
exit "$FAILED"
