#!/usr/bin/env bash
# The CPU benchmarks at several core counts, for a many-core machine (issue 20's 16-core run):
# FC against numpy, GEMM shapes (blocked kernel against the gemm crate), the models corpus,
# single ops (bench_ops), dispatch and the LSTM benchmark, at 2, 8 and all cores; before them,
# the GEMM, conv and golden-model tests on this CPU, with the default kernel choice and with
# FERROCAFFE_BLOCKED=avx2.
#
#     bash benchmarks/cores.sh [log]      (needs python/ferrocaffe/_native.abi3.so built)
#
# FC_SIZES (default 64 to 4096) sets the square FC sizes at all cores; RNN=0 skips the LSTM
# benchmark.
#
# A core count runs under `taskset` on the first n cores, with FERROCAFFE_NUM_THREADS and
# OPENBLAS_NUM_THREADS set to n, so that numpy's OpenBLAS (the reference) gets the same cores.
# The FC and shapes lines give ferrocaffe's blocked kernel (AVX-512 where the CPU has it; set
# FERROCAFFE_BLOCKED=avx2 to measure the AVX2 one there) beside the gemm crate.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${1:-/dev/null}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
ALL=$(nproc)

say() { echo "### $*" | tee -a "$LOG"; }
# at N CMD...: runs CMD on the first N cores with both libraries capped to N threads.
at() {
    local n=$(($1 < ALL ? $1 : ALL))
    shift
    say "[$n cores] $*"
    FERROCAFFE_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n OMP_NUM_THREADS=$n \
        taskset -c "0-$((n - 1))" "$@" 2>&1 | tee -a "$LOG"
}

say "machine"
{
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L[123])'
    grep -o -E 'avx512[a-z_]*|avx2|fma|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' '
    echo
    $PY -c 'import numpy, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
    $PY -c 'import numpy; numpy.show_config()' 2>/dev/null | grep -iE 'openblas|mkl|version' | head -6
} 2>&1 | tee -a "$LOG"

T="tests/test_blas.py tests/test_conv_cpu.py tests/test_conv_winograd.py tests/test_models_golden.py
   tests/test_rnn_golden.py tests/test_ops_golden.py"
# shellcheck disable=SC2086
at "$ALL" $PY -m pytest -q -p no:cacheprovider $T
# shellcheck disable=SC2086
FERROCAFFE_BLOCKED=avx2 at "$ALL" $PY -m pytest -q -p no:cacheprovider $T

at "$ALL" $PY benchmarks/bench_runtime.py --only fc --fc-sizes "${FC_SIZES:-64,128,256,512,1024,2048,4096}" \
    --fc-rounds 3
at "$ALL" $PY benchmarks/bench_runtime.py --only shapes
at "$ALL" $PY benchmarks/bench_models.py --ab-blocked
at "$ALL" $PY benchmarks/bench_models.py --ab-slices
at "$ALL" $PY benchmarks/bench_models.py --profile --models mlp,lenet,squeezenet,mobilenet_like.nchw,style,embedding,layout,alexnet
for n in "$ALL" 8 2; do
    [ "$n" -le "$ALL" ] || continue
    at "$n" $PY benchmarks/bench_models.py
done
at "$ALL" $PY benchmarks/bench_models.py --train
at "$ALL" $PY benchmarks/bench_ops.py
at 2 $PY benchmarks/bench_ops.py
at "$ALL" $PY benchmarks/bench_runtime.py --only dispatch
at 8 $PY benchmarks/bench_runtime.py --only fc --fc-sizes 256,512,1024,2048
at 2 $PY benchmarks/bench_runtime.py --only fc --fc-sizes 256,512,1024,2048 \
    --fc-rounds 2
at 2 $PY benchmarks/bench_runtime.py --only shapes
[ "${RNN:-1}" = 0 ] || at "$ALL" timeout 120 $PY benchmarks/bench_rnn.py
say "done"
