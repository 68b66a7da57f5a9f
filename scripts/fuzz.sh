#!/usr/bin/env bash
# Structured fuzzing of the parsers that read what strangers send (tests/fuzz_parsers/): the ENVI
# header, ENVI data sizes and offsets, .npy files and .npy uploads, multipart uploads and the query
# parameters. Runs N generated inputs per parser (default 10^6; scripts/test.sh runs a shorter pass)
# and prints, per parser, the inputs run, the time taken and what they came to. Exits non-zero on any
# failure (a panic, a wrong result, or an allocation larger than the input allows), after printing
# the smallest failing input proptest found.
#   scripts/fuzz.sh [N]        PROPTEST_RNG_SEED=... fixes the seed
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The test executable is run directly, so that the long run does not hold cargo's build lock.
bin=$(cargo test --no-run --test fuzz_parsers 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "fuzz.sh: cannot find the fuzz_parsers test executable" >&2; exit 1; }
start=$(date +%s)
set +e
HYPERMNF_FUZZ_CASES=$N RUST_BACKTRACE=0 "$bin" --test-threads=1 --nocapture >"$log" 2>&1
rc=$?
set -e
grep -oE 'fuzz [a-z_]+: .*|test result: .*' "$log" || true
if [ $rc -ne 0 ]; then
    # The failure report (minimal input) without the repeated panic messages of shrinking.
    grep -vE "^thread '.*' panicked at|^note: run with" "$log" | tail -n 80 >&2
    echo "fuzz.sh: FAIL (exit $rc)" >&2
    exit 1
fi
runs=$(grep -oE 'fuzz [a-z_]+: [0-9]+ inputs' "$log" | wc -l)
[ "$runs" -ge 7 ] || { echo "fuzz.sh: expected 7 fuzz targets, saw $runs" >&2; exit 1; }
echo "fuzz.sh: $runs parsers x $N inputs, all passed in $(( $(date +%s) - start )) s"
