#!/usr/bin/env bash
# HTTP fuzz pass: schemathesis against /openapi.json of `flashsale serve` on the embedded ledger.
#
#   scripts/fuzz.sh [MAX_EXAMPLES]      # default 50 examples per operation
#   FUZZ_CHECKS=all scripts/fuzz.sh 20  # every schemathesis check (stricter, informational)
#   FUZZ_PROFILE=dev scripts/fuzz.sh    # fuzz the debug build (no release build needed)
#   FUZZ_LEDGER=redis scripts/fuzz.sh   # the Redis ledger and MariaDB instead: the Redis at
#                                       # FUZZ_REDIS_URL (redis://127.0.0.1:6379), a key prefix
#                                       # and a database of MariaDB at FUZZ_MYSQL_URL
#                                       # (mysql://root@127.0.0.1:3306) of the run's own, both
#                                       # removed after
#
# Installs schemathesis into a venv (~/.cache/flashsale-fuzz-venv, or $FUZZ_VENV) when missing, builds the binary, starts it on a
# free port with a fresh data dir, creates and warms sale 1, then runs schemathesis twice (a
# user token, the admin token) with the checks: no 5xx, status codes and content types and
# bodies as documented, Retry-After where promised. Stops the server, and exits non-zero on any
# failure. Not part of CI (it needs PyPI and takes minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_EXAMPLES="${1:-50}"
VENV="${FUZZ_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/flashsale-fuzz-venv}"
if [ ! -x "$VENV/bin/schemathesis" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet 'schemathesis>=4,<5'
fi

PROFILE="${FUZZ_PROFILE:-release}"
cargo build --quiet --profile "$PROFILE" -p flashsale
# Cargo writes the dev profile to target/debug, every other profile to target/<name>.
BIN="target/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/flashsale"

DATA="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
BASE="http://127.0.0.1:$PORT"
export FLASHSALE_DATA_DIR="$DATA" FLASHSALE_LISTEN="127.0.0.1:$PORT"
export FLASHSALE_JWT_SECRET="fuzz-secret-$RANDOM$RANDOM" FLASHSALE_ADMIN_TOKEN="fuzz-admin-$RANDOM$RANDOM"
# Fuzzing is a flood from one user: rate limits would answer most of it 429.
export FLASHSALE_RATE_USER=off FLASHSALE_RATE_INSTANCE=off FLASHSALE_RATE_SALE=off
export FLASHSALE_LOG="${FLASHSALE_LOG:-warn}"
unset FLASHSALE_REDIS_URL FLASHSALE_DATABASE_URL
LEDGER="${FUZZ_LEDGER:-embedded}"
REDIS_URL="${FUZZ_REDIS_URL:-redis://127.0.0.1:6379}"
MYSQL_URL="${FUZZ_MYSQL_URL:-mysql://root@127.0.0.1:3306}"
TAG="fsfuzz$$"
case "$LEDGER" in
embedded) ;;
redis)
    # The run's own database (created by the MariaDB client, which takes the URL's host, port
    # and user) and key prefix.
    read -r MY_HOST MY_PORT MY_USER < <(python3 -c 'import sys, urllib.parse as u
p = u.urlparse(sys.argv[1]); print(p.hostname, p.port or 3306, p.username or "root")' "$MYSQL_URL")
    mysql_run() { mariadb -h "$MY_HOST" -P "$MY_PORT" -u "$MY_USER" -e "$1"; }
    mysql_run "DROP DATABASE IF EXISTS \`$TAG\`; CREATE DATABASE \`$TAG\`"
    export FLASHSALE_REDIS_URL="$REDIS_URL" FLASHSALE_REDIS_PREFIX="$TAG"
    export FLASHSALE_DATABASE_URL="$MYSQL_URL/$TAG"
    ;;
*) echo "fuzz: FUZZ_LEDGER is embedded or redis" >&2; exit 2 ;;
esac

"$BIN" serve >"$DATA/server.log" 2>&1 &
SERVER=$!
cleanup() {
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    rm -rf "$DATA"
    if [ "$LEDGER" = redis ]; then
        mysql_run "DROP DATABASE IF EXISTS \`$TAG\`" || true
        redis-cli -u "$REDIS_URL" --scan --pattern "$TAG:*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null || true
    fi
}
trap cleanup EXIT

for _ in $(seq 1 100); do
    curl -fs "$BASE/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fs "$BASE/healthz" >/dev/null || { cat "$DATA/server.log"; exit 1; }

USER_TOKEN="$("$BIN" token --user 7 --ttl-s 3600)"
ADMIN="$FLASHSALE_ADMIN_TOKEN"
curl -fs -XPOST "$BASE/api/v1/sales" -H "authorization: Bearer $ADMIN" -H 'content-type: application/json' \
    -d '{"sku_id":1,"name":"fuzz","total_stock":1000000,"per_user_limit":1000}' >/dev/null
curl -fs -XPOST "$BASE/api/v1/sales/1/warm" -H "authorization: Bearer $ADMIN" >/dev/null

CHECKS="${FUZZ_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance}"
status=0
for who in user admin; do
    if [ "$who" = user ]; then token="$USER_TOKEN"; else token="$ADMIN"; fi
    echo "== schemathesis as $who, $LEDGER ledger: $MAX_EXAMPLES examples per operation"
    # From the temp dir: schemathesis keeps a cache (.schemathesis/) in its working directory.
    (cd "$DATA" && "$VENV/bin/schemathesis" run "$BASE/openapi.json" \
        --url "$BASE" \
        --header "Authorization: Bearer $token" \
        --checks "$CHECKS" \
        --max-examples "$MAX_EXAMPLES" \
        --workers 2 \
        --suppress-health-check all \
        --exclude-path '/metrics' --exclude-path '/') || status=1
done

if grep -q 'panicked' "$DATA/server.log"; then
    echo "the server panicked:"; grep -A5 'panicked' "$DATA/server.log"; status=1
fi
exit "$status"
