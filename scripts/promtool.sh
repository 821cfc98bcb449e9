#!/usr/bin/env bash
# Checks the Prometheus files in deploy/prometheus with promtool: the alert rules
# (`check rules`), their unit tests (`test rules alerts.test.yml`) and the example scrape
# config (`check config`). Any further arguments are more rule files to check (the browser-free
# deploy test passes the Grafana dashboard's queries this way).
#
# Installs nothing: scripts/test-deps.sh installs Debian's `prometheus` (which ships promtool)
# before the tests; tests run at once and must not race for apt's lock.
#
#   scripts/promtool.sh            # ~1 s once installed
set -euo pipefail
cd "$(dirname "$0")/.."

command -v promtool >/dev/null 2>&1 || {
    echo "promtool.sh: promtool is missing: run scripts/test-deps.sh (the test command does)" >&2
    exit 1
}

promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts.test.yml)
promtool check config deploy/prometheus/prometheus.yml
for extra in "$@"; do
    promtool check rules "$extra"
done
