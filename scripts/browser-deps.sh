#!/usr/bin/env bash
# Makes sure a headless browser and its WebDriver are installed: Debian's `chromium` and
# `chromium-driver`. Idempotent: does nothing when both are there. Installs them with apt-get
# when run as root; otherwise says what to run and fails. Called by the dashboard browser test
# (crates/server/tests/dashboard.rs); prints the two paths, one a line, when they are ready.
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if ! have; then
    if [ "$(id -u)" != 0 ]; then
        echo "browser-deps: chromium and chromedriver are missing; install them as root:" >&2
        echo "    apt-get update && apt-get install -y chromium chromium-driver" >&2
        exit 1
    fi
    echo "browser-deps: installing chromium and chromium-driver with apt-get" >&2
    # A lock held by another apt run (e.g. a concurrent install) is waited for, not failed on.
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q >&2
    apt-get -o DPkg::Lock::Timeout=300 install -y -q chromium chromium-driver >&2
fi
have || { echo "browser-deps: chromium or chromedriver still missing after the install" >&2; exit 1; }
command -v chromium
command -v chromedriver
