#!/usr/bin/env bash
# Installs, once and before any test runs, every Debian tool the tests call: HAProxy (the
# multi-instance test), Chromium + ChromeDriver (the dashboard's browser test), promtool (the
# alert rules' checks, from Debian's `prometheus`), nats-server (the order-event relay's tests,
# which spawn their own with JetStream) and iproute2 (`ip netns` for the partition
# tests). Called by scripts/test.sh; no test installs anything itself (tests that ran at once
# raced for apt's lock). One lock serialises concurrent callers, and apt-get waits for
# another apt run's lock instead of failing. Idempotent: installs nothing when all are there.
set -euo pipefail
cd "$(dirname "$0")/.."

# command → the Debian package that ships it
TOOLS=(
    "haproxy haproxy"
    "promtool prometheus"
    "chromium chromium"
    "chromedriver chromium-driver"
    "ip iproute2"
    "nats-server nats-server"
)

missing() {
    local want=()
    for pair in "${TOOLS[@]}"; do
        set -- $pair
        command -v "$1" >/dev/null 2>&1 || want+=("$2")
    done
    echo "${want[@]:-}"
}

install_missing() {
    local want
    want=$(missing)
    if [ -z "$want" ]; then return 0; fi
    # shellcheck disable=SC2086 # one word per package
    scripts/apt-install.sh test-deps $want
    want=$(missing)
    [ -z "$want" ] || { echo "test-deps: still missing after the install: $want" >&2; exit 1; }
}

if [ "${1:-}" = --check ]; then
    want=$(missing)
    [ -z "$want" ] || { echo "test-deps: missing $want (run scripts/test-deps.sh)" >&2; exit 1; }
    exit 0
fi

exec 9>/tmp/flashsale-test-deps.lock
flock --wait 900 9 || { echo "test-deps: another install holds the lock" >&2; exit 1; }
install_missing
echo "test-deps: haproxy, promtool, chromium, chromedriver, nats-server and ip are installed" >&2
