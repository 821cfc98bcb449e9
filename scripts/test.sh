#!/usr/bin/env bash
# The test command: makes sure Redis and MariaDB are reachable, then runs every test of the
# workspace (unit, integration against real Redis and real MariaDB, HTTP on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo test --workspace --locked "$@"
