#!/usr/bin/env bash
# The reconnect storm after a restart, twice in one run: clients following the Rust client
# library's policy, then a fleet without jitter (MQTT.js's and Phoenix's 1 s fixed retry),
# each with loadtest/storm.sh (CONNECTIONS clients, SIGTERM, a new gateway at once). Writes
# both runs' raw files and <OUT>-histogram.txt / .svg: reconnect attempts per 100 ms from
# the first cut-off.
#
# SIGNAL=KILL kills the first gateway instead (no BYE, no hint: every client cut at once).
#
#   loadtest/storm-compare.sh [CONNECTIONS] [OUT_PREFIX]     # about 4 minutes
set -uo pipefail
connections=${1:-19000}
out=${2:-docs/results/storm-policies-$connections}
cd "$(dirname "$0")/.."
signal=${SIGNAL:-TERM}
POLICY=library loadtest/storm.sh "$connections" "$out-library" "$signal"
library=$?
POLICY=fixed loadtest/storm.sh "$connections" "$out-fixed" "$signal"
fixed=$?
python3 loadtest/storm-histogram.py "$out-library.json" "$out-fixed.json" "$out-histogram"
echo "storm.sh exit status: library $library, fixed $fixed"
# The library's fleet must pass its check; the fixed fleet is the comparison.
[ "$library" -eq 0 ]
