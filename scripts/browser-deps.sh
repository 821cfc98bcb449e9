#!/usr/bin/env bash
# Makes sure a headless browser and its WebDriver are installed: Debian's `chromium` and
# `chromium-driver`. Idempotent: does nothing when both are there. Installs them with apt-get
# when run as root; otherwise says what to run and fails. Called by the dashboard browser test
# (crates/server/tests/dashboard.rs); prints the two paths, one a line, when they are ready.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

have || scripts/apt-install.sh browser-deps chromium chromium-driver
have || { echo "browser-deps: chromium or chromedriver still missing after the install" >&2; exit 1; }
command -v chromium
command -v chromedriver
