#!/usr/bin/env bash
# Caffe2's own test suite (the 79 files of the torch 1.10.2 wheel) run against the installed
# ferrocaffe through ferrocaffe.compat, compared test by test with what passed on Caffe2.
#
#   bash scripts/caffe2_suite.sh                    # both modes, every file
#   bash scripts/caffe2_suite.sh --files core_test,workspace_test -v
#
# Modes: "own helpers" (--no-fallback: only ferrocaffe's modules, what a user program sees) and
# "Caffe2's helpers" (--force-upstream: Caffe2's test_util, hypothesis_test_util, ... do the
# checking). Set MODE=own or MODE=upstream to run one. Extra arguments go to the runner.
#
# The kit (fetch.sh, run.py, census.json) is the workplace's shared one, found at
# $CAFFE2_TESTS_KIT (default: ../shared/caffe2-tests beside the repository). fetch.sh downloads
# the wheel once (~880 MB) into $CAFFE2_TESTS_DIR (default ~/.cache/ferrocaffe/caffe2-tests)
# and keeps only Caffe2's Python files; nothing of Caffe2's is copied into this repository.
# The test environment needs: pip install -e '.[test]' torch future six mock
# (several files import torch, as they did inside the torch wheel). Not part of .ci/run.
# Caffe2's tests were written for numpy 1.x (the census ran numpy 1.21): in an environment with
# "numpy<2" (1.26 is the oldest with wheels for Python 3.11/3.12) fewer of their own reference
# functions break; the report says which listed exceptions apply to the numpy in use.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${CAFFE2_TESTS_KIT:-../shared/caffe2-tests}
PY=${PYTHON:-$(command -v python || command -v python3)}
if [[ ! -f $KIT/run.py ]]; then
    echo "caffe2_suite.sh: no runner at $KIT/run.py (set CAFFE2_TESTS_KIT)" >&2
    exit 2
fi
DIR=$(bash "$KIT/fetch.sh" "${CAFFE2_TESTS_DIR:-$HOME/.cache/ferrocaffe/caffe2-tests}")
JOBS=${JOBS:-$(nproc)}
HELPERS=test_util,hypothesis_test_util,serialized_test_util,device_checker,hip_test_util,rnn_cell_test_util
OUT=${CAFFE2_SUITE_OUT:-$(mktemp -d)}
mkdir -p "$OUT"
# Per group, with and without the listed exceptions (tests/caffe2_suite_exceptions.toml), and
# the wall time against Caffe2's; the runner's JSON stays in $OUT.
report() {
    if [[ -f $OUT/$1.json ]]; then
        "$PY" scripts/caffe2_suite_report.py "$OUT/$1.json" --census "$KIT/census.json" --mode "$1"
    fi
}
status=0
if [[ ${MODE:-both} != upstream ]]; then
    echo "== ferrocaffe's own helpers (--no-fallback)"
    "$PY" "$KIT/run.py" "$PY" "$DIR" --no-fallback -j "$JOBS" --json "$OUT/own.json" "$@" \
        || status=$?
    report own
fi
if [[ ${MODE:-both} != own ]]; then
    echo "== Caffe2's helpers (--no-fallback --force-upstream $HELPERS)"
    "$PY" "$KIT/run.py" "$PY" "$DIR" --no-fallback --force-upstream "$HELPERS" -j "$JOBS" \
        --json "$OUT/upstream.json" "$@" || status=$?
    report upstream
fi
exit $status
