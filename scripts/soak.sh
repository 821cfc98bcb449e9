#!/usr/bin/env bash
# Soak the seeded fault schedule: runs many seeds of crates/cli/tests/testsuite/fault_schedule/loopback.rs in one
# `cargo test` invocation, prints each seed's verdict and time, then "N passed, M failed".
#
#   scripts/soak.sh 50            seeds 1..=50
#   scripts/soak.sh 7,19,100..=120  a list and/or ranges (a..b excludes b, a..=b includes it)
#   scripts/soak.sh --cluster 20  the same seeds of the partitioned Redis Cluster schedule
#                                 (crates/cli/tests/testsuite/fault_schedule/cluster.rs; root, iproute2)
#
# Exits non-zero when any seed fails. Each failing seed prints its schedule, what broke and
# the command that replays it. The whole output is kept in target/soak-<test>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
test=fault_schedule seeds_var=FLASHSALE_SEEDS filter=fault_schedule::loopback::
if [[ "${1:-}" == --cluster ]]; then
    test=fault_schedule_cluster seeds_var=FLASHSALE_CLUSTER_SEEDS filter=fault_schedule::cluster::
    shift
fi
spec="${1:?usage: scripts/soak.sh [--cluster] N | SEED-LIST (e.g. 1,5..=9)}"
if [[ "$spec" =~ ^[0-9]+$ ]]; then
    spec="1..=$spec"
fi
log=target/soak-$test.log
mkdir -p target
started=$(date +%s)
set +e
env "$seeds_var=$spec" cargo test -p flashsale --test testsuite \
    -- "$filter" --nocapture >"$log" 2>&1
status=$?
set -e
# The test prints each failing seed's report again in its final panic: keep each line once.
once() { awk '!seen[$0]++'; }
sum_first() { awk '{ n += $1 } END { print n + 0 }'; }
verdicts=$(grep -E "^$test seed [0-9]+: (PASS|FAIL)" "$log" | once || true)
# One line per seed (verdict and time), then every failure line.
sed -E 's/; accepted orders.*//' <<<"$verdicts"
grep -E '^seed [0-9]+ FAIL \[' "$log" | once | head -300 || true
passed=$(grep -cE ': PASS' <<<"$verdicts" || true)
failed=$(grep -cE ': FAIL' <<<"$verdicts" || true)
# The documented limit (a loss that died with its instance's in-memory journal) is allowed
# but counted: its total over all seeds.
limit=$(grep -E "^($test seed [0-9]+: PASS|notes: )" "$log" | once \
    | grep -oE '[0-9]+ lost unreported with their instance' | sum_first || true)
echo "documented limit: ${limit:-0} orders/payments lost unreported with their instance's journal"
if [[ $test == fault_schedule_cluster ]]; then
    # Each cluster run prints what it drew: `WAIT on|off, partitions P, failovers F (primaries moved M),
    # losses reported: O orders, R resolutions`; their totals.
    total() { grep -oE "$1" <<<"$verdicts" | grep -oE '[0-9]+' | sum_first; }
    echo "drawn: $(total 'partitions [0-9]+') partitions, $(total 'failovers [0-9]+') failovers" \
        "($(total 'moved [0-9]+') primary moves); losses reported: $(total '[0-9]+ orders') orders," \
        "$(total '[0-9]+ resolutions') resolutions"
    # Seeds with a bucketed sale print `bucketed: transfers T, faults on buckets B (in flight I),
    # restarts empty R`.
    echo "bucketed: $(grep -c 'bucketed: transfers' <<<"$verdicts" || true) seeds," \
        "$(total 'transfers [0-9]+') transfers, $(total 'faults on buckets [0-9]+') faults on their" \
        "buckets ($(total 'in flight [0-9]+') with a transfer in flight), $(total 'restarts empty [0-9]+')" \
        "destinations restarted empty"
fi
if [[ $test == fault_schedule ]]; then
    # A seed with a bucketed sale prints `bucketed: transfers T`.
    total() { grep -oE "$1" <<<"$verdicts" | grep -oE '[0-9]+' | sum_first; }
    echo "bucketed: $(grep -c 'bucketed: transfers' <<<"$verdicts" || true) seeds," \
        "$(total 'transfers [0-9]+') transfers"
fi
echo "soak: $((passed + failed)) seeds in $(( $(date +%s) - started ))s (log: $log)"
echo "$passed passed, $failed failed"
if [[ $status -ne 0 || $failed -ne 0 ]]; then
    if [[ $failed -eq 0 ]]; then
        echo "cargo test failed before any seed ran; see $log" >&2
        tail -20 "$log" >&2
    fi
    exit 1
fi
