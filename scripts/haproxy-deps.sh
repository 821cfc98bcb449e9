#!/usr/bin/env bash
# Makes sure HAProxy is installed (Debian's `haproxy`) and that deploy/haproxy.cfg is valid
# for it. Idempotent: installs nothing when haproxy is there. Installs it with apt-get when run
# as root (scripts/apt-install.sh); otherwise says what to run and fails.
# Called by the multi-instance test (crates/cli/tests/haproxy.rs); prints haproxy's path.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v haproxy >/dev/null 2>&1 || scripts/apt-install.sh haproxy-deps haproxy
FLASHSALE_LB_BIND=127.0.0.1:1 FLASHSALE_S1=127.0.0.1:2 FLASHSALE_S2=127.0.0.1:3 \
    FLASHSALE_S3=127.0.0.1:4 FLASHSALE_LB_STATS=127.0.0.1:5 \
    haproxy -c -q -f deploy/haproxy.cfg >&2
command -v haproxy
