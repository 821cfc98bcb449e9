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

# Debian's prometheus package ships promtool (its server is not started: scripts/apt-install.sh).
command -v promtool >/dev/null 2>&1 || scripts/apt-install.sh promtool.sh prometheus

promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts.test.yml)
promtool check config deploy/prometheus/prometheus.yml
for extra in "$@"; do
    promtool check rules "$extra"
done
