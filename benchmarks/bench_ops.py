"""Time single operators on the shapes of the models corpus, optionally against another build.

    python benchmarks/bench_ops.py [--only pool,lrn,...] [--reps N] [--trials N]
    python benchmarks/bench_ops.py --against DIR [--rounds N]
    python benchmarks/bench_ops.py --against-env VAR=VALUE [--rounds N]

Each case is one op in a created net, run ``--reps`` times per ``RunNet`` call; its time is the
best of ``--trials`` such calls, in microseconds per run. The cases are the pooling, LRN,
layout, upsampling, InstanceNorm, Softmax, ConvTranspose, depthwise-convolution and
few-channel convolution shapes of ``tests/golden/models`` (those ops were a third of some
models' time before their kernels were vectorized).

``--against DIR`` compares with another build of the package: ``DIR`` is a directory holding
a ``ferrocaffe`` package (a copy of ``python/ferrocaffe`` with that build's
``_native.abi3.so``). Both run as subprocesses, alternating, ``--rounds`` times; each case
keeps its best time per side, and the last column is ours over theirs (below 1 is faster
here). ``FERROCAFFE_NUM_THREADS`` and the rest of the environment are passed on unchanged.

``--against-env VAR=VALUE`` compares the same build with ``VAR`` set to ``VALUE`` on the other
side, in the same way: ``--only conv --against-env FERROCAFFE_DIRECT_CONV=0`` measures the
few-channel direct convolution kernel against im2col + GEMM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# (family, label, op type, input shapes, arguments): the first input is random, the others
# are parameters sized for it.
CASES = [
    (
        "pool",
        "MaxPool NCHW 8x32x15x15 k3 s2",
        "MaxPool",
        [(8, 32, 15, 15)],
        {"kernel": 3, "stride": 2, "order": "NCHW"},
    ),
    (
        "pool",
        "MaxPool NCHW 8x20x24x24 k2 s2",
        "MaxPool",
        [(8, 20, 24, 24)],
        {"kernel": 2, "stride": 2, "order": "NCHW"},
    ),
    (
        "pool",
        "MaxPool NCHW 8x16x32x32 k3 s2",
        "MaxPool",
        [(8, 16, 32, 32)],
        {"kernel": 3, "stride": 2, "order": "NCHW"},
    ),
    (
        "pool",
        "MaxPool NCHW 8x48x7x7 k3 s1 p1",
        "MaxPool",
        [(8, 48, 7, 7)],
        {"kernel": 3, "stride": 1, "pad": 1, "order": "NCHW"},
    ),
    (
        "pool",
        "MaxPool NHWC 8x15x15x24 k3 s2",
        "MaxPool",
        [(8, 15, 15, 24)],
        {"kernel": 3, "stride": 2, "order": "NHWC"},
    ),
    (
        "pool",
        "MaxPool NHWC 8x32x32x16 k2 s2",
        "MaxPool",
        [(8, 32, 32, 16)],
        {"kernel": 2, "stride": 2, "order": "NHWC"},
    ),
    (
        "pool",
        "AveragePool NCHW 8x64x7x7 k7",
        "AveragePool",
        [(8, 64, 7, 7)],
        {"kernel": 7, "stride": 1, "order": "NCHW"},
    ),
    (
        "lrn",
        "LRN NHWC 8x15x15x24",
        "LRN",
        [(8, 15, 15, 24)],
        {"size": 5, "alpha": 1e-4, "beta": 0.75, "order": "NHWC"},
    ),
    (
        "lrn",
        "LRN NCHW 8x32x15x15",
        "LRN",
        [(8, 32, 15, 15)],
        {"size": 5, "alpha": 1e-4, "beta": 0.75, "order": "NCHW"},
    ),
    ("layout", "NCHW2NHWC 8x8x8x8", "NCHW2NHWC", [(8, 8, 8, 8)], {}),
    ("layout", "NHWC2NCHW 8x16x16x3", "NHWC2NCHW", [(8, 16, 16, 3)], {}),
    (
        "layout",
        "Transpose 8x64x56x56 (0,2,3,1)",
        "Transpose",
        [(8, 64, 56, 56)],
        {"axes": [0, 2, 3, 1]},
    ),
    (
        "upsample",
        "UpsampleBilinear 8x16x16x16 x2",
        "UpsampleBilinear",
        [(8, 16, 16, 16)],
        {"width_scale": 2.0, "height_scale": 2.0},
    ),
    (
        "norm",
        "InstanceNorm 8x8x32x32",
        "InstanceNorm",
        [(8, 8, 32, 32), (8,), (8,)],
        {"epsilon": 1e-5},
    ),
    (
        "norm",
        "InstanceNorm 8x16x16x16",
        "InstanceNorm",
        [(8, 16, 16, 16), (16,), (16,)],
        {"epsilon": 1e-5},
    ),
    (
        "depthwise",
        "Conv dw NCHW 8x16x16x16 3x3 s1",
        "Conv",
        [(8, 16, 16, 16), (16, 1, 3, 3)],
        {"kernel": 3, "stride": 1, "pad": 1, "group": 16, "order": "NCHW"},
    ),
    (
        "depthwise",
        "Conv dw NCHW 8x32x16x16 3x3 s2",
        "Conv",
        [(8, 32, 16, 16), (32, 1, 3, 3)],
        {"kernel": 3, "stride": 2, "pad": 1, "group": 32, "order": "NCHW"},
    ),
    (
        "depthwise",
        "Conv dw NHWC 8x16x16x32 3x3 s1",
        "Conv",
        [(8, 16, 16, 32), (32, 3, 3, 1)],
        {"kernel": 3, "stride": 1, "pad": 1, "group": 32, "order": "NHWC"},
    ),
    ("softmax", "Softmax 8x64", "Softmax", [(8, 64)], {}),
    ("softmax", "Softmax 6x8x40 axis 2", "Softmax", [(6, 8, 40)], {"axis": 2}),
    (
        "convtranspose",
        "ConvTranspose 8x32x8x8 4x4 s2 to 16",
        "ConvTranspose",
        [(8, 32, 8, 8), (32, 16, 4, 4), (16,)],
        {"kernel": 4, "stride": 2, "pad": 1},
    ),
    (
        "conv",
        "Conv NCHW 8x3x32x32 5x5 to 8",
        "Conv",
        [(8, 3, 32, 32), (8, 3, 5, 5), (8,)],
        {"kernel": 5, "pad": 2, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x8x32x32 5x5 to 3",
        "Conv",
        [(8, 8, 32, 32), (3, 8, 5, 5), (3,)],
        {"kernel": 5, "pad": 2, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x16x32x32 3x3 to 8",
        "Conv",
        [(8, 16, 32, 32), (8, 16, 3, 3), (8,)],
        {"kernel": 3, "pad": 1, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x16x32x32 3x3 to 16",
        "Conv",
        [(8, 16, 32, 32), (16, 16, 3, 3), (16,)],
        {"kernel": 3, "pad": 1, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x3x32x32 3x3 s2 to 32",
        "Conv",
        [(8, 3, 32, 32), (32, 3, 3, 3), (32,)],
        {"kernel": 3, "stride": 2, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x3x32x32 5x5 to 16",
        "Conv",
        [(8, 3, 32, 32), (16, 3, 5, 5), (16,)],
        {"kernel": 5, "pad": 2, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x3x32x32 3x3 s2 to 16",
        "Conv",
        [(8, 3, 32, 32), (16, 3, 3, 3), (16,)],
        {"kernel": 3, "stride": 2, "pad": 1, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NCHW 8x4x7x7 5x5 to 12",
        "Conv",
        [(8, 4, 7, 7), (12, 4, 5, 5), (12,)],
        {"kernel": 5, "pad": 2, "order": "NCHW"},
    ),
    (
        "conv",
        "Conv NHWC 8x64x64x3 11x11 s4 to 24",
        "Conv",
        [(8, 64, 64, 3), (24, 11, 11, 3), (24,)],
        {"kernel": 11, "stride": 4, "pad": 2, "order": "NHWC"},
    ),
    (
        "conv",
        "Conv NHWC 8x32x32x3 3x3 to 16",
        "Conv",
        [(8, 32, 32, 3), (16, 3, 3, 3), (16,)],
        {"kernel": 3, "pad": 1, "order": "NHWC"},
    ),
    (
        "conv",
        "Conv NHWC 8x28x28x1 5x5 to 20",
        "Conv",
        [(8, 28, 28, 1), (20, 5, 5, 1), (20,)],
        {"kernel": 5, "order": "NHWC"},
    ),
    (
        "conv",
        "Conv NHWC 8x7x7x24 5x5 g2 to 32",
        "Conv",
        [(8, 7, 7, 24), (32, 5, 5, 12), (32,)],
        {"kernel": 5, "pad": 2, "group": 2, "order": "NHWC"},
    ),
]


def measure(only: set[str] | None, reps: int, trials: int) -> dict[str, float]:
    from ferrocaffe import core, workspace

    rng = np.random.default_rng(0)
    out = {}
    for family, label, op_type, shapes, args in CASES:
        if only and family not in only:
            continue
        workspace.ResetWorkspace()
        names = [f"in{i}" for i in range(len(shapes))]
        for n, s in zip(names, shapes, strict=True):
            workspace.FeedBlob(n, rng.standard_normal(s).astype(np.float32))
        net = core.Net("bench_op")
        net.Proto().op.extend([core.CreateOperator(op_type, names, ["out"], **args)])
        workspace.CreateNet(net)
        workspace.RunNet(net.Name())
        best = float("inf")
        for _ in range(trials):
            t0 = time.perf_counter()
            workspace.RunNet(net.Name(), reps)
            best = min(best, (time.perf_counter() - t0) / reps)
        out[label] = best * 1e6
    return out


def against(args) -> int:
    cmd = [
        sys.executable,
        __file__,
        "--json",
        "--reps",
        str(args.reps),
        "--trials",
        str(args.trials),
    ] + (["--only", args.only] if args.only else [])
    ours = str(ROOT / "python")
    if args.against_env:
        var, _, value = args.against_env.partition("=")
        sides = {"ours": (ours, {}), "theirs": (ours, {var: value})}
    else:
        sides = {"ours": (ours, {}), "theirs": (str(Path(args.against).resolve()), {})}
    best: dict[str, dict[str, float]] = {s: {} for s in sides}
    for _ in range(args.rounds):
        for side, (path, extra) in sides.items():
            env = dict(os.environ, PYTHONPATH=path, **extra)
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            for label, us in json.loads(res.stdout).items():
                best[side][label] = min(us, best[side].get(label, float("inf")))
    ratios = []
    for label, ours in best["ours"].items():
        theirs = best["theirs"][label]
        ratios.append(ours / theirs)
        print(f"{label:36s} ours {ours:9.1f} us  theirs {theirs:9.1f} us  x {ours / theirs:.2f}")
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"geomean ours/theirs x{geo:.3f} over {len(ratios)} ops (below 1 is faster here)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--only", help="comma-separated families: " + ",".join(sorted({c[0] for c in CASES}))
    )
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--against", help="a directory holding another build's ferrocaffe package")
    p.add_argument("--against-env", help="VAR=VALUE: this build with VAR set, on the other side")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.against or args.against_env:
        return against(args)
    only = set(args.only.split(",")) if args.only else None
    res = measure(only, args.reps, args.trials)
    if args.json:
        print(json.dumps(res))
    else:
        for label, us in res.items():
            print(f"{label:36s} {us:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
