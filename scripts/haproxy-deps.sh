#!/usr/bin/env bash
# Makes sure HAProxy is installed (Debian's `haproxy`) and that deploy/haproxy.cfg is valid
# for it. Idempotent: installs nothing when haproxy is there. Installs it with apt-get when run
# as root (without starting the package's own service); otherwise says what to run and fails.
# Called by the multi-instance test (crates/cli/tests/haproxy.rs); prints haproxy's path.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v haproxy >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "haproxy-deps: haproxy is missing; install it as root:" >&2
        echo "    apt-get update && apt-get install -y haproxy" >&2
        exit 1
    fi
    echo "haproxy-deps: installing haproxy with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Only the binary is wanted: a policy-rc.d that says "no" keeps the package's service
    # from being started (where an init system would start it).
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get -o DPkg::Lock::Timeout=300 update -q >&2
    apt-get -o DPkg::Lock::Timeout=300 install -y -q haproxy >&2
    if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi
FLASHSALE_LB_BIND=127.0.0.1:1 FLASHSALE_S1=127.0.0.1:2 FLASHSALE_S2=127.0.0.1:3 \
    FLASHSALE_S3=127.0.0.1:4 FLASHSALE_LB_STATS=127.0.0.1:5 \
    haproxy -c -q -f deploy/haproxy.cfg >&2
command -v haproxy
