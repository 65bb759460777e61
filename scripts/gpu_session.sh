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

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nproc
"$PY" -c "from ferrocaffe import workspace as w, _native as n; print('cuda devices', w.NumCudaDevices(), n.cuda_unavailable_reason())"

step "CUDA tests"
timeout "${T_TESTS:-200}" "$PY" -m pytest -q -p no:cacheprovider -rf tests/test_cuda_*.py \
    2>&1 | tee "$OUT_DIR/tests.log" | grep -vE '^\s*$' | tail -60

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
