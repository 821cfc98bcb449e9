#!/usr/bin/env bash
# Checks that a headless browser and its WebDriver are installed: Debian's `chromium` and
# `chromium-driver` (scripts/test-deps.sh installs them before the tests; this installs
# nothing, so tests running at once never race for apt's lock). Called by the dashboard browser test
# (crates/server/tests/testsuite/dashboard.rs); prints the two paths, one a line, when they are ready.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

have || {
    echo "browser-check: chromium or chromedriver is missing: run scripts/test-deps.sh (the test command does)" >&2
    exit 1
}
command -v chromium
command -v chromedriver
