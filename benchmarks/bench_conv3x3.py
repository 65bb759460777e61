"""3x3 stride-1 convolutions (pad 1, bias): im2col + GEMM against Winograd F(2x2,3x3) and
F(4x4,3x3), A/B in one process.

    python benchmarks/bench_conv3x3.py [--channels 16,64,256] [--sizes 8,28,56] [--batches 1,8]
                                       [--orders NCHW,NHWC] [--runs 7] [--budget 0.3]

For each shape, three one-op nets are created with ``FERROCAFFE_WINOGRAD`` set to ``0``
(im2col + GEMM), ``2`` and ``4`` (the variable is read when the op is created), and, unless
``--no-auto``, one with it unset (the rules the kernel picks). Their runs are interleaved
(round after round, each net once per round), so a machine that gets busier or quieter during
the run weighs on all alike; the time of each is the median of its runs. Printed per shape:
the im2col time and the ratio ``im2col / other`` for each (above 1: faster than im2col), then
the geomean of the ratios per variant.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

VAR = "FERROCAFFE_WINOGRAD"


def _net(name, order, env):
    old = os.environ.get(VAR)
    if env is None:
        os.environ.pop(VAR, None)
    else:
        os.environ[VAR] = env
    try:
        net = caffe2_pb2.NetDef(name=name)
        net.op.extend(
            [core.CreateOperator("Conv", ["x", "w", "b"], [name], kernel=3, pad=1, order=order)]
        )
        workspace.CreateNet(net, overwrite=True)
    finally:
        if old is None:
            os.environ.pop(VAR, None)
        else:
            os.environ[VAR] = old
    return name


def bench(n, c, k, hw, order, runs, budget, variants):
    rng = np.random.RandomState(0)
    x = rng.randn(n, c, hw, hw).astype(np.float32)
    w = (rng.randn(k, c, 3, 3) / math.sqrt(9 * c)).astype(np.float32)
    if order == "NHWC":
        x, w = x.transpose(0, 2, 3, 1).copy(), w.transpose(0, 2, 3, 1).copy()
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("w", w)
    workspace.FeedBlob("b", rng.randn(k).astype(np.float32))
    nets = {label: _net(f"y_{label}", order, env) for label, env in variants}
    for name in nets.values():
        workspace.RunNet(name)
    ref = workspace.FetchBlob(nets["im2col"])
    err = {}
    for label, name in nets.items():
        y = workspace.FetchBlob(name)
        err[label] = float(np.abs(y - ref).max() / (np.abs(ref).max() + 1e-30))
    # As many rounds as fit the budget (at least `runs`).
    t0 = time.perf_counter()
    workspace.RunNet(nets["im2col"])
    one = time.perf_counter() - t0
    rounds = max(runs, min(50, int(budget / max(one * len(nets), 1e-6))))
    times = {label: [] for label in nets}
    for _ in range(rounds):
        for label, name in nets.items():
            t0 = time.perf_counter()
            workspace.RunNet(name)
            times[label].append(time.perf_counter() - t0)
    return {label: float(np.median(ts)) for label, ts in times.items()}, err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--channels", default="16,32,64,128,256", help="C=K, or C:K")
    ap.add_argument("--sizes", default="8,14,28,56")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--orders", default="NCHW,NHWC")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per shape (about)")
    ap.add_argument("--no-auto", action="store_true", help="leave out the default rules")
    args = ap.parse_args()
    variants = [("im2col", "0"), ("F2", "2"), ("F4", "4")]
    if not args.no_auto:
        variants.append(("auto", None))
    labels = [v[0] for v in variants[1:]]
    ratios = {label: [] for label in labels}
    head = f"{'order':5} {'N':>2} {'C:K':>7} {'HxW':>7} {'im2col ms':>10} " + " ".join(
        f"{label:>7}" for label in labels
    )
    print(head + "   (ratio im2col/variant; max rel. diff F2, F4)")
    for order in args.orders.split(","):
        for n in map(int, args.batches.split(",")):
            for ck in args.channels.split(","):
                c, k = (int(v) for v in (ck.split(":") if ":" in ck else (ck, ck)))
                for hw in map(int, args.sizes.split(",")):
                    t, err = bench(n, c, k, hw, order, args.runs, args.budget, variants)
                    row = f"{order:5} {n:2d} {ck:>7} {hw:3d}x{hw:<3d} {t['im2col'] * 1e3:10.3f} "
                    for label in labels:
                        r = t["im2col"] / t[label]
                        ratios[label].append(r)
                        row += f"{r:7.2f} "
                    row += f"  ({err['F2']:.1e}, {err['F4']:.1e})"
                    print(row, flush=True)
    for label in labels:
        g = math.exp(sum(math.log(r) for r in ratios[label]) / len(ratios[label]))
        print(f"geomean im2col/{label}: {g:.3f}")


if __name__ == "__main__":
    main()
