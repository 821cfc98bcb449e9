#!/usr/bin/env bash
# Checks the Prometheus files in deploy/prometheus with promtool: the alert rules
# (`check rules`), their unit tests (`test rules alerts.test.yml`) and the example scrape
# config (`check config`). Any further arguments are more rule files to check (the browser-free
# deploy test passes the Grafana dashboard's queries this way).
#
# Installs Debian's `prometheus` package (which ships promtool) when promtool is missing and
# this runs as root; otherwise says what to install and fails. Idempotent.
#
#   scripts/promtool.sh            # ~1 s once installed
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "promtool.sh: promtool is missing; install it as root:" >&2
        echo "    apt-get update && apt-get install -y prometheus" >&2
        exit 1
    fi
    echo "promtool.sh: installing Debian's prometheus package for promtool" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Only promtool is wanted: a policy-rc.d that says "no" keeps the package's Prometheus
    # server from being started (where an init system would start it).
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get -o DPkg::Lock::Timeout=300 update -q >&2
    apt-get -o DPkg::Lock::Timeout=300 install -y -q prometheus >&2
    if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi

promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts.test.yml)
promtool check config deploy/prometheus/prometheus.yml
for extra in "$@"; do
    promtool check rules "$extra"
done
