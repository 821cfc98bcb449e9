#!/usr/bin/env bash
# Checks that HAProxy is installed (scripts/test-deps.sh installs it before the tests) and
# that deploy/haproxy.cfg is valid for it; prints haproxy's path. Installs nothing: tests run
# at once and must not race for apt's lock.
# Called by the multi-instance test (crates/cli/tests/testsuite/haproxy.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v haproxy >/dev/null 2>&1 || {
    echo "haproxy-check: haproxy is missing: run scripts/test-deps.sh (the test command does)" >&2
    exit 1
}
FLASHSALE_LB_BIND=127.0.0.1:1 FLASHSALE_S1=127.0.0.1:2 FLASHSALE_S2=127.0.0.1:3 \
    FLASHSALE_S3=127.0.0.1:4 FLASHSALE_LB_STATS=127.0.0.1:5 \
    haproxy -c -q -f deploy/haproxy.cfg >&2
command -v haproxy
