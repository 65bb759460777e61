#!/usr/bin/env bash
# Everything the CUDA backend is checked and measured with, as one run on a GPU machine (the
# `device` tool lends one for a few minutes): the CUDA tests, the golden corpora replayed on
# CUDA, the CUDA benchmarks, and the CPU RNN benchmark on that machine's cores.
#   bash scripts/gpu_session.sh [OUTDIR]        (from the repository root, package importable)
# Each step has its own time limit, so one slow step cannot take the others' time.
set -u
OUT_DIR="${1:-${OUT:-/tmp/gpu_session}}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

# cuDNN (and the other CUDA libraries) from pip wheels, e.g. PyTorch's, when they are not on
# the loader's path: ferrocaffe loads them at run time by name.
for d in $("$PY" -c "import glob, site; [print(p) for s in site.getsitepackages() for p in glob.glob(s + '/nvidia/*/lib')]" 2>/dev/null); do
    LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nproc
"$PY" -c "from ferrocaffe import workspace as w, _native as n; print('cuda devices', w.NumCudaDevices(), n.cuda_unavailable_reason(), 'cudnn', n.cuda_cudnn_version())"

step "CUDA tests"
# One process per file: a kernel fault leaves its CUDA context unusable, and should not take
# the other files' results with it.
: >"$OUT_DIR/tests.log"
for f in tests/test_cuda_*.py; do
    echo "-- $f" | tee -a "$OUT_DIR/tests.log"
    timeout "${T_TEST_FILE:-90}" "$PY" -m pytest -q -p no:cacheprovider --tb=line -rf "$f" \
        >>"$OUT_DIR/tests.log" 2>&1
    echo "exit $?" >>"$OUT_DIR/tests.log"
    grep -E '^(FAILED|ERROR)|passed|failed|^exit' "$OUT_DIR/tests.log" | tail -n 25 | sed -n '$p'
done
grep -E '^(FAILED|ERROR)' "$OUT_DIR/tests.log" | cut -c1-220 | head -80

step "golden corpora on CUDA"
timeout "${T_REPLAY:-150}" "$PY" -m ferrocaffe.cuda_check --corpora "${CORPORA:-ops,models,rnn,dpm}" \
    2>&1 | tee "$OUT_DIR/replay.log" | tail -70

step "CUDA benchmarks"
timeout "${T_BENCH:-120}" "$PY" benchmarks/bench_cuda.py --quick 2>&1 | tee "$OUT_DIR/bench.log"

if [[ -n "${WITH_RNN_CPU:-}" ]]; then
    step "CPU RNN benchmark"
    timeout 90 "$PY" benchmarks/bench_rnn.py 2>&1 | tee "$OUT_DIR/bench_rnn.log" | tail -20
fi
step "done"
