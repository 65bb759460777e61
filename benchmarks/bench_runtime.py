"""Runtime benchmarks, each against a reference measured in the same run.

    python benchmarks/bench_runtime.py            (build with `maturin develop --release` first)

1. dispatch: per-op overhead of a created net of 1,000 tiny ops (Relu on one float, a chain),
   from RunNet wall time / ops. Target <= 0.15 us/op.
2. FC vs numpy: FC (Y = X W^T + b) at 256/512/1024/2048 square, against numpy's `x @ w.T + b` in
   float32 (`--fc-sizes`, `--fc-rounds` for the worst of several rounds); the ratio
   numpy_time / fc_time is printed (target >= 1.0).
3. LSTM step products (batch 32, hidden 256): X W^T, dY W, dY^T X as MatMul ops, on the default
   GEMM (small-dimension kernels) and on the gemm crate alone, against numpy (OpenBLAS).
4. dag speedup: independent branches of elementwise ops, `dag` (num_workers = cores) vs `simple`.
5. shapes: MatMul (A B^T) on the products the models corpus and FC layers run (NHWC
   convolutions' `pixels x C_out x k*k*C_in`, squares), ferrocaffe's blocked kernel against the
   gemm crate, interleaved (best of 15 rounds each).

Each library is timed in its own blocks after a pause: a BLAS library's workers spin on a core
for a while after each product and would otherwise be billed to the other library.
"""

import argparse
import os
import time

import numpy as np

from ferrocaffe import blas, workspace
from ferrocaffe.proto import caffe2_pb2


def op(op_type, inputs, outputs, **args):
    o = caffe2_pb2.OperatorDef(type=op_type, input=inputs, output=outputs)
    for k, v in args.items():
        a = o.arg.add(name=k)
        if isinstance(v, float):
            a.f = v
        else:
            a.i = v
    return o


def best_of(fn, repeat=5, number=1):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def bench_dispatch(n_ops=1000):
    workspace.ResetWorkspace()
    workspace.FeedBlob("x0", np.ones(1, dtype=np.float32))
    net = caffe2_pb2.NetDef(name="chain")
    for i in range(n_ops):
        net.op.append(op("Relu", ["x%d" % i], ["x%d" % (i + 1)]))
    workspace.CreateNet(net)
    workspace.RunNet("chain", 10)
    t = best_of(lambda: workspace.RunNet("chain", 20), repeat=7) / 20
    per_op_us = t / n_ops * 1e6
    print("dispatch: %d-op chain of tiny Relu: %.3f us/op (target <= 0.15)" % (n_ops, per_op_us))
    return per_op_us


def bench_fc(sizes=(256, 512, 1024)):
    out = {}
    for n in sizes:
        workspace.ResetWorkspace()
        rng = np.random.RandomState(0)
        x = rng.randn(n, n).astype(np.float32)
        w = rng.randn(n, n).astype(np.float32)
        b = rng.randn(n).astype(np.float32)
        for k, v in dict(x=x, w=w, b=b).items():
            workspace.FeedBlob(k, v)
        net = caffe2_pb2.NetDef(name="fc", op=[op("FC", ["x", "w", "b"], ["y"])])
        workspace.CreateNet(net)
        workspace.RunNet("fc")
        np.testing.assert_allclose(workspace.FetchBlob("y"), x @ w.T + b, rtol=1e-3, atol=1e-2)
        number = max(1, int(2e8 / n**3))
        # Lowest of many blocks, each library timed in its own blocks with a pause before
        # each: a BLAS worker keeps spinning on a core for a while after a product (numpy's
        # OpenBLAS for ~0.1 s), which would bill one library for the other's idle threads.
        t_fc, t_np, t_crate = float("inf"), float("inf"), float("inf")
        for _ in range(8):
            time.sleep(0.15)
            workspace.RunNet("fc")
            t_fc = min(t_fc, best_of(lambda n=number: workspace.RunNet("fc", n), 3) / number)
            time.sleep(0.15)
            x @ w.T + b
            t_np = min(t_np, best_of(lambda x=x, w=w, b=b: x @ w.T + b, 3, number=number))
            # The same op on the gemm crate (ferrocaffe's blocked kernel off), for reference.
            blas.use_blocked(False)
            try:
                workspace.RunNet("fc")
                t_crate = min(
                    t_crate, best_of(lambda n=number: workspace.RunNet("fc", n), 3) / number
                )
            finally:
                blas.use_blocked(True)
        ratio = t_np / t_fc
        gflops = 2 * n**3 / t_fc / 1e9
        print(
            "FC %4d: ferrocaffe %.3f ms (%.1f GFLOP/s), numpy %.3f ms, ratio numpy/fc = %.2f "
            "(target >= 1.0); gemm crate %.3f ms (x%.2f)"
            % (n, t_fc * 1e3, gflops, t_np * 1e3, ratio, t_crate * 1e3, t_crate / t_fc)
        )
        out[n] = ratio
    return out


def bench_step_gemm(n=32, h=256):
    """The three products of an LSTM step (batch n, hidden h): FC forward X W^T, the input
    gradient dY W and the weight gradient dY^T X, as MatMul ops, on ferrocaffe's default GEMM
    and with its small-dimension kernels off (the gemm crate), against numpy's x @ w products
    (OpenBLAS), each timed in its own blocks."""
    rng = np.random.RandomState(1)
    x = rng.randn(n, h).astype(np.float32)
    w = rng.randn(4 * h, h).astype(np.float32)
    dy = rng.randn(n, 4 * h).astype(np.float32)
    cases = [  # label, (m, n, k), A, B, trans_a, trans_b, numpy
        ("X W^T ", (n, 4 * h, h), "x", "w", 0, 1, lambda: x @ w.T),
        ("dY W  ", (n, h, 4 * h), "dy", "w", 0, 0, lambda: dy @ w),
        ("dY^T X", (4 * h, h, n), "dy", "x", 1, 0, lambda: dy.T @ x),
    ]
    out = {}
    for label, mnk, a, b, ta, tb, ref in cases:
        workspace.ResetWorkspace()
        for k, v in dict(x=x, w=w, dy=dy).items():
            workspace.FeedBlob(k, v)
        net = caffe2_pb2.NetDef(name="mm", op=[op("MatMul", [a, b], ["c"], trans_a=ta, trans_b=tb)])
        workspace.CreateNet(net)
        workspace.RunNet("mm")
        np.testing.assert_allclose(workspace.FetchBlob("c"), ref(), rtol=1e-3, atol=1e-3)
        times = {}
        for name, small in (("ours", True), ("gemm crate", False)):
            blas.use_small_kernels(small)
            t = float("inf")
            for _ in range(5):
                time.sleep(0.15)
                t = min(t, best_of(lambda: workspace.RunNet("mm", 200), 3) / 200)
            times[name] = t
        blas.use_small_kernels(True)
        t_np = float("inf")
        for _ in range(5):
            time.sleep(0.15)
            t_np = min(t_np, best_of(ref, 3, number=200))
        print(
            "step GEMM %s (%dx%dx%d): ferrocaffe %.1f us, gemm crate alone %.1f us, "
            "numpy %.1f us, ratio numpy/ferrocaffe = %.2f"
            % (
                label,
                *mnk,
                times["ours"] * 1e6,
                times["gemm crate"] * 1e6,
                t_np * 1e6,
                t_np / times["ours"],
            )
        )
        out[label.strip()] = t_np / times["ours"]
    return out


def bench_dag(branches=None, depth=20, size=256):
    branches = branches or max(2, os.cpu_count() or 2)
    results = {}
    for net_type in ("simple", "dag"):
        workspace.ResetWorkspace()
        workspace.FeedBlob("x", np.random.RandomState(0).rand(size, size).astype(np.float32))
        net = caffe2_pb2.NetDef(name="branches", type=net_type, num_workers=branches)
        for i in range(branches):
            prev = "x"
            for d in range(depth):
                cur = "b%d_%d" % (i, d)
                net.op.append(op("Tanh" if d % 2 else "Sigmoid", [prev], [cur]))
                prev = cur
        workspace.CreateNet(net)
        workspace.RunNet("branches", 2)
        results[net_type] = best_of(lambda: workspace.RunNet("branches", 5), repeat=5) / 5
    speedup = results["simple"] / results["dag"]
    print(
        "dag: %d independent branches x %d ops on %dx%d: simple %.2f ms, dag %.2f ms, "
        "speedup %.2fx (cores: %s)"
        % (
            branches,
            depth,
            size,
            size,
            results["simple"] * 1e3,
            results["dag"] * 1e3,
            speedup,
            os.cpu_count(),
        )
    )
    return speedup


GEMM_SHAPES = (
    (256, 32, 144),
    (1024, 16, 27),
    (225, 24, 363),
    (512, 64, 576),
    (3136, 64, 576),
    (1000, 1000, 64),
    (128, 128, 128),
    (256, 256, 256),
    (1024, 1024, 1024),
)


def bench_gemm_shapes(shapes=GEMM_SHAPES, rounds=15):
    """MatMul (trans_b) on the blocked kernel and on the gemm crate, interleaved; returns the
    speed-up of the blocked kernel per shape."""
    out = {}
    rng = np.random.RandomState(3)
    try:
        for m, n, k in shapes:
            workspace.ResetWorkspace()
            workspace.FeedBlob("a", rng.rand(m, k).astype(np.float32))
            workspace.FeedBlob("b", rng.rand(n, k).astype(np.float32))
            net = caffe2_pb2.NetDef(name="mm", op=[op("MatMul", ["a", "b"], ["c"], trans_b=1)])
            workspace.CreateNet(net)
            reps = max(1, int(3e8 / (m * n * k)))
            best = {False: float("inf"), True: float("inf")}
            for _ in range(rounds):
                for blocked in (False, True):
                    blas.use_blocked(blocked)
                    t0 = time.perf_counter()
                    workspace.RunNet("mm", reps)
                    best[blocked] = min(best[blocked], (time.perf_counter() - t0) / reps)
            out[(m, n, k)] = best[False] / best[True]
            print(
                "shape %5dx%4dx%4d: gemm crate %9.1f us, blocked %9.1f us (%.1f GFLOP/s), x%.2f"
                % (
                    m,
                    n,
                    k,
                    best[False] * 1e6,
                    best[True] * 1e6,
                    2 * m * n * k / best[True] / 1e9,
                    out[(m, n, k)],
                )
            )
    finally:
        blas.use_blocked(True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument(
        "--fc-sizes",
        default="256,512,1024,2048",
        help="square FC sizes (comma-separated; the issue's range is 64..4096)",
    )
    ap.add_argument(
        "--fc-rounds",
        type=int,
        default=1,
        help="repeat the FC comparison this many times and print the worst ratio per size",
    )
    ap.add_argument(
        "--only", choices=["dispatch", "fc", "step", "dag", "shapes"], help="one benchmark"
    )
    args = ap.parse_args()

    def run(name):
        return args.only in (None, name)

    if run("dispatch"):
        bench_dispatch(200 if args.quick else 1000)
    if run("fc"):
        sizes = (64, 128) if args.quick else tuple(int(v) for v in args.fc_sizes.split(","))
        worst = {}
        for _ in range(max(1, args.fc_rounds)):
            for n, r in bench_fc(sizes).items():
                worst[n] = min(worst.get(n, r), r)
        if args.fc_rounds > 1:
            print(
                "FC worst ratio numpy/fc over %d rounds: %s"
                % (args.fc_rounds, ", ".join("%d: %.2f" % kv for kv in sorted(worst.items())))
            )
    if run("step"):
        bench_step_gemm(*((8, 32) if args.quick else (32, 256)))
    if run("shapes"):
        bench_gemm_shapes(GEMM_SHAPES[:3] if args.quick else GEMM_SHAPES)
    if run("dag"):
        bench_dag(depth=4 if args.quick else 20, size=64 if args.quick else 256)


if __name__ == "__main__":
    main()
