#!/usr/bin/env bash
# The previous release (docs/RELEASES.md, or FLASHSALE_UPGRADE_FROM=<commit>) beside the binary of
# this tree, on one Redis, a Redis Cluster and one fresh MariaDB database each: both directions
# of a rolling upgrade, a roll forward and a rollback, spikes on a sale of one bucket and on a
# sale of three, then the checker (`flashsale reconcile` exits 0, every acknowledged order is in
# the database once). The orchestration is the cli testsuite's `upgrade` test; this script
# builds the previous release's binary for it (once per machine: the binary is cached in
# ${FLASHSALE_UPGRADE_CACHE:-$HOME/.cache/flashsale-upgrade}/<commit>/flashsale) and runs it.
# Exits non-zero on any failure; what it starts (processes, servers, databases) is removed by
# the test's guards (and, past the budget, by timeout's signal to the process group); the
# previous release's sources, unpacked for its build, by the trap below.
#
# Measured on a 2-core machine shared with other builds: 28 s with the binary cached (about
# 25 s of tests); an empty cache adds one debug build of the previous release, 270 s seeded
# from this tree's target dir (as after scripts/test.sh), 1,470 s from nothing.
#
#   scripts/upgrade-check.sh                        # the previous release
#   FLASHSALE_UPGRADE_FROM=<commit> scripts/upgrade-check.sh
#   FLASHSALE_UPGRADE_BUDGET_S=900                  # the tests' time budget (default)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh

from=${FLASHSALE_UPGRADE_FROM:-$(sed -n 's/^previous release: `\([0-9a-f]*\)`.*/\1/p' docs/RELEASES.md)}
[ -n "$from" ] || { echo "upgrade-check: no previous release in docs/RELEASES.md" >&2; exit 1; }
if ! commit=$(git rev-parse --verify --quiet "$from^{commit}"); then
    # A shallow clone may lack it: fetch that one commit.
    git fetch --quiet --depth 1 origin "$from" || true
    commit=$(git rev-parse --verify "$from^{commit}") || {
        echo "upgrade-check: commit $from is not in this clone" >&2
        exit 1
    }
fi
cache=${FLASHSALE_UPGRADE_CACHE:-$HOME/.cache/flashsale-upgrade}/$commit
old=$cache/flashsale

build_old() {
    local src=$cache/src here=${CARGO_TARGET_DIR:-target}
    rm -rf "$src"
    mkdir -p "$src"
    # The sources go whatever happens; a target dir cut short stays for the next try.
    trap 'rm -rf "$cache/src"' EXIT
    # An archive of the commit, not a checkout: nothing of this clone's state leaks in.
    git archive "$commit" | tar -x -C "$src"
    # Its own target dir in the cache: this tree's artifacts are never overwritten, and a
    # build cut short goes on where it stopped. Seeded with this tree's debug build when there
    # is one, so only what differs is compiled (the dependencies mostly do not).
    if [ ! -d "$cache/target" ] && [ -d "$here/debug/deps" ]; then
        mkdir -p "$cache/target/debug"
        for d in .fingerprint build deps; do
            cp -a "$here/debug/$d" "$cache/target/debug/"
        done
    fi
    CARGO_TARGET_DIR=$cache/target cargo build --locked --quiet \
        --manifest-path "$src/Cargo.toml" -p flashsale --bin flashsale
    cp "$cache/target/debug/flashsale" "$old.part"
    mv "$old.part" "$old"
    rm -rf "$src" "$cache/target"
}

started=$SECONDS
if [ -x "$old" ]; then
    echo "upgrade-check: previous release $commit from the cache ($old)"
else
    echo "upgrade-check: building the previous release $commit into $cache (once per machine)"
    build_old
    echo "upgrade-check: built in $((SECONDS - started)) s"
fi
# The tests' budget (the build above is paid once per machine); past it, timeout stops the
# whole process group: the test's servers and instances stop with it.
cargo build --locked --quiet -p flashsale --bin flashsale --tests
FLASHSALE_UPGRADE_OLD_BIN=$old timeout "${FLASHSALE_UPGRADE_BUDGET_S:-900}" \
    cargo test --locked -p flashsale --test testsuite upgrade:: -- --ignored --test-threads 1
echo "upgrade-check: passed in $((SECONDS - started)) s"
