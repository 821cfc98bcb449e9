#!/usr/bin/env bash
# The test command: makes sure Redis, MariaDB and PostgreSQL are reachable and that the Debian
# tools the tests call are installed (scripts/test-deps.sh, once, before any test runs), then
# runs every test of the workspace (unit, integration against real Redis, MariaDB and
# PostgreSQL, HTTP on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
scripts/test-deps.sh
# Tests put their keys under fstest_<random> prefixes on the shared Redis and drop their own
# databases; remove the keys when the run ends, whatever its outcome.
cleanup() {
    redis-cli -h 127.0.0.1 -p "${FLASHSALE_TEST_REDIS_PORT:-6379}" --scan --pattern 'fstest_*' \
        | xargs -r -n 500 redis-cli -h 127.0.0.1 -p "${FLASHSALE_TEST_REDIS_PORT:-6379}" del >/dev/null || true
}
trap cleanup EXIT
cargo test --workspace --locked "$@"
