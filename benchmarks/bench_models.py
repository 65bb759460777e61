"""Time every model of the golden models corpus against the time recorded on Caffe2.

    python benchmarks/bench_models.py [--models a,b] [--profile] [--runs N] [--trials N]

For each predict net: our time (the lowest of ``--trials`` medians of ``--runs`` RunNet calls
after CreateNet), Caffe2's recorded time (``peer_ms``), the ratio, the ratio normalized by a
numpy sgemm measured in this run against the one recorded beside Caffe2's time (so a slower or
busier machine does not count against us), and, for the models whose time is mostly
convolutions and matrix products, the share of this machine's sgemm rate the model reaches
(its multiply-add FLOPs over its time, against numpy's 1024^3 sgemm measured here). A last
line gives the geomean normalized by the run's median sgemm instead of each model's own
measurement: steadier on many cores, where numpy's threaded sgemm moves 2x between runs.

``--train`` also times a training step of a small ResNet block (NCHW and NHWC: conv 3x3 ->
SpatialBN -> Relu -> conv 3x3 -> SpatialBN -> + x -> Relu, forward and backward) against the
floor its convolutions' FLOPs would take at this machine's sgemm rate.

``--ab-winograd`` instead times each predict net twice in one process, created with
``FERROCAFFE_WINOGRAD=0`` (3x3 convolutions on im2col + GEMM) and with the variable unset
(the Winograd rules), their runs interleaved (medians of ``--runs`` rounds, each net once per
round), and prints the ratio of the two.

``--ab-direct`` does the same with ``FERROCAFFE_DIRECT_CONV=0`` (few-channel convolutions on
im2col + GEMM, or Winograd) and unset (their direct kernel).

``--ab-slices`` does the same with ``FERROCAFFE_CONV_SLICES=0`` (an NHWC batch of fewer images
than threads runs a part per image) and unset (each image cut into slices of output rows).

``--ab-blocked`` does the same with ferrocaffe's blocked GEMM kernel switched off (the
``gemm`` crate runs the large products) and on, on one net.

``--profile`` also prints, per model, the time of each op type (each op run alone as a one-op
net, in order, on the workspace the full run left behind) and their share of the total.

The last lines are the geomean of the normalized ratios and the worst model.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ferrocaffe import workspace  # noqa: E402
from ferrocaffe.proto import caffe2_pb2  # noqa: E402

CORPUS = ROOT / "tests" / "golden" / "models"
SGEMM_N = 1024


def _net(b64: str) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef()
    net.ParseFromString(base64.b64decode(b64))
    return net


def _inputs(case: dict):
    from replay.common import array

    return [(m["name"], array("models", m)) for m in case["inputs"]]


# Seconds to wait after numpy's sgemm before timing anything else.
SETTLE_S = 0.25


def sgemm_gflops(runs: int = 7) -> float:
    r = np.random.RandomState(0)
    a = r.rand(SGEMM_N, SGEMM_N).astype(np.float32)
    b = r.rand(SGEMM_N, SGEMM_N).astype(np.float32)
    a.dot(b)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        a.dot(b)
        ts.append(time.perf_counter() - t0)
    # numpy's OpenBLAS threads keep spinning on every core for ~0.1 s after a product: timing a
    # net meanwhile would measure it against them (on 16 cores, 3x slower for some models).
    time.sleep(SETTLE_S)
    return 2.0 * SGEMM_N**3 / float(np.median(ts)) / 1e9


def _arg(op, name, default=None):
    for a in op.arg:
        if a.name == name:
            if a.ints:
                return list(a.ints)
            return a.i if a.HasField("i") else (a.s.decode() if a.HasField("s") else default)
    return default


def model_flops(pred: caffe2_pb2.NetDef) -> float:
    """Multiply-add FLOPs (2 per MAC) of the Conv and FC ops, from the shapes the run left."""
    total = 0.0
    for op in pred.op:
        try:
            if op.type == "Conv":
                w = workspace.FetchBlob(op.input[1])
                y = workspace.FetchBlob(op.output[0])
                order = _arg(op, "order", "NCHW")
                spatial = y.shape[2:] if order == "NCHW" else y.shape[1:-1]
                cout = y.shape[1] if order == "NCHW" else y.shape[-1]
                per_out = int(np.prod(w.shape[1:]))  # cin/groups * kernel
                total += 2.0 * y.shape[0] * cout * float(np.prod(spatial)) * per_out
            elif op.type == "FC":
                w = workspace.FetchBlob(op.input[1])
                y = workspace.FetchBlob(op.output[0])
                total += 2.0 * float(np.prod(y.shape)) * w.shape[1]
        except Exception:  # noqa: BLE001 - a blob the net does not keep: not counted
            continue
    return total


def _load(case: dict) -> caffe2_pb2.NetDef:
    """A fresh workspace with the case's init net run and its inputs fed; returns its predict
    net (not yet created)."""
    workspace.ResetWorkspace()
    init, pred = _net(case["init_net_b64"]), _net(case["predict_net_b64"])
    workspace.RunNetOnce(init)
    for name, value in _inputs(case):
        workspace.FeedBlob(name, value)
    return pred


def time_net(name: str, runs: int, trials: int) -> float:
    for _ in range(3):
        workspace.RunNet(name)
    medians = []
    for _ in range(trials):
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            workspace.RunNet(name)
            ts.append(time.perf_counter() - t0)
        medians.append(float(np.median(ts)))
    return min(medians)


def ab_env(case: dict, runs: int, var: str) -> tuple[float, float]:
    """Medians of interleaved runs of the predict net created with ``var=0`` (a kernel off)
    and without it (on)."""
    import os

    pred = _load(case)
    names = []
    old = os.environ.get(var)
    for label, env in (("off", "0"), ("on", None)):
        if env is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = env
        net = caffe2_pb2.NetDef()
        net.CopyFrom(pred)
        net.name = f"{pred.name}_{label}"
        workspace.CreateNet(net, overwrite=True)
        names.append(net.name)
    if old is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = old
    times = {n: [] for n in names}
    for _ in range(3):
        for n in names:
            workspace.RunNet(n)
    for _ in range(runs):
        for n in names:
            t0 = time.perf_counter()
            workspace.RunNet(n)
            times[n].append(time.perf_counter() - t0)
    off, on = (float(np.median(times[n])) for n in names)
    return off, on


def ab_blocked(case: dict, runs: int) -> tuple[float, float]:
    """Medians of interleaved runs of the predict net on the ``gemm`` crate and on the
    blocked kernel (``ferrocaffe.blas.use_blocked``)."""
    from ferrocaffe import blas

    pred = _load(case)
    workspace.CreateNet(pred, overwrite=True)
    times = {False: [], True: []}
    try:
        for _ in range(3):
            workspace.RunNet(pred.name)
        for _ in range(runs):
            for blocked in (False, True):
                blas.use_blocked(blocked)
                t0 = time.perf_counter()
                workspace.RunNet(pred.name)
                times[blocked].append(time.perf_counter() - t0)
    finally:
        blas.use_blocked(True)
    return float(np.median(times[False])), float(np.median(times[True]))


def profile(pred: caffe2_pb2.NetDef, runs: int) -> dict[str, float]:
    """Seconds per op type, each op run alone as a one-op net (median of ``runs``)."""
    per_type: dict[str, float] = defaultdict(float)
    for i, op in enumerate(pred.op):
        net = caffe2_pb2.NetDef()
        net.name = f"_profile_{i}"
        net.op.add().CopyFrom(op)
        workspace.CreateNet(net, overwrite=True)
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            workspace.RunNet(net.name)
            ts.append(time.perf_counter() - t0)
        per_type[op.type] += float(np.median(ts))
    return per_type


def train_step(order: str, runs: int, trials: int) -> tuple[float, float]:
    """Seconds per forward + backward of the ResNet block, and its conv FLOPs."""
    from ferrocaffe import core

    n, c, hw = 8, 64, 16
    workspace.ResetWorkspace()
    rng = np.random.RandomState(0)
    shape = (n, c, hw, hw) if order == "NCHW" else (n, hw, hw, c)
    wshape = (c, c, 3, 3) if order == "NCHW" else (c, 3, 3, c)
    net = core.Net(f"resblock_{order}")
    feeds = {"x": rng.randn(*shape).astype(np.float32)}
    x = "x"
    h = x
    for i in (1, 2):
        feeds[f"w{i}"] = (rng.randn(*wshape) * 0.05).astype(np.float32)
        feeds[f"b{i}"] = np.zeros(c, np.float32)
        feeds[f"s{i}"] = np.ones(c, np.float32)
        feeds[f"o{i}"] = np.zeros(c, np.float32)
        feeds[f"rm{i}"] = np.zeros(c, np.float32)
        feeds[f"rv{i}"] = np.ones(c, np.float32)
        h = net.Conv([h, f"w{i}", f"b{i}"], f"conv{i}", kernel=3, pad=1, order=order)
        h, _, _, _, _ = net.SpatialBN(
            [h, f"s{i}", f"o{i}", f"rm{i}", f"rv{i}"],
            [f"bn{i}", f"rm{i}", f"rv{i}", f"sm{i}", f"sv{i}"],
            is_test=0,
            order=order,
            epsilon=1e-5,
            momentum=0.9,
        )
        if i == 1:
            h = net.Relu(h, "relu1")
    h = net.Sum([h, x], "sum")
    h = net.Relu(h, "out")
    loss = net.AveragedLoss(net.SumElements(h, "total"), "loss")
    net.AddGradientOperators([loss])
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.CreateNet(net, overwrite=True)
    t = time_net(net.Proto().name, runs, trials)
    conv_flops = 2.0 * n * c * c * 9 * hw * hw
    # Forward: two convs; backward: dW and dX of each (the first conv's dX included).
    return t, 6 * conv_flops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", help="comma-separated substrings of model names")
    ap.add_argument("--profile", action="store_true", help="time per op type")
    ap.add_argument("--train", action="store_true", help="ResNet block training step too")
    ap.add_argument("--ab-winograd", action="store_true", help="Winograd off/on, interleaved")
    ap.add_argument("--ab-blocked", action="store_true", help="blocked GEMM off/on, interleaved")
    ap.add_argument(
        "--ab-direct", action="store_true", help="few-channel direct conv off/on, interleaved"
    )
    ap.add_argument(
        "--ab-slices",
        action="store_true",
        help="NHWC row slices (fewer images than threads) off/on, interleaved",
    )
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()

    cases = [json.loads(line) for line in (CORPUS / "cases.jsonl").open()]
    if args.models:
        wanted = args.models.split(",")
        cases = [c for c in cases if any(w in c["name"] for w in wanted)]
    if args.ab_winograd or args.ab_blocked or args.ab_direct or args.ab_slices:
        if args.ab_winograd:
            ab = functools.partial(ab_env, var="FERROCAFFE_WINOGRAD")
            a_name, b_name = "im2col", "winograd"
        elif args.ab_slices:
            ab = functools.partial(ab_env, var="FERROCAFFE_CONV_SLICES")
            a_name, b_name = "per-image", "slices"
        elif args.ab_direct:
            ab = functools.partial(ab_env, var="FERROCAFFE_DIRECT_CONV")
            a_name, b_name = "im2col", "direct"
        else:
            ab, (a_name, b_name) = ab_blocked, ("gemm-crate", "blocked")
        ratios = []
        for case in cases:
            off, on = ab(case, args.runs)
            ratios.append(off / on)
            print(
                f"{case['name']:42s} {a_name} {off * 1e3:9.4f} ms  {b_name} {on * 1e3:9.4f} ms  "
                f"x{off / on:5.2f}",
                flush=True,
            )
        if not ratios:
            print("no model matched", file=sys.stderr)
            return 1
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"geomean speed-up x{geo:.3f} over {len(ratios)} models")
        return 0
    rows = []
    rates = []  # (numpy sgemm here, recorded beside Caffe2's time), per model
    for case in cases:
        pred = _load(case)
        workspace.CreateNet(pred, overwrite=True)
        ours = time_net(pred.name, args.runs, args.trials)
        gflops = sgemm_gflops()
        peer = case["peer_ms"] / 1e3
        ratio = ours / peer
        norm = ratio * gflops / case["numpy_sgemm_gflops"]
        flops = model_flops(pred)
        share = flops / ours / 1e9 / gflops if flops else 0.0
        rows.append((case["name"], ours, peer, ratio, norm, share))
        rates.append((gflops, case["numpy_sgemm_gflops"]))
        peak = f", {share * 100:5.1f}% of sgemm peak" if share > 0.02 else ""
        print(
            f"{case['name']:42s} ours {ours * 1e3:9.4f} ms  Caffe2 {peer * 1e3:8.3f} ms  "
            f"x{ratio:5.2f}  normalized x{norm:5.2f}{peak}",
            flush=True,
        )
        if args.profile:
            per_type = profile(pred, max(args.runs, 5))
            total = sum(per_type.values())
            for t, s in sorted(per_type.items(), key=lambda kv: -kv[1]):
                print(f"    {t:28s} {s * 1e3:9.4f} ms  {s / total * 100:5.1f}%")
    if args.train:
        for order in ("NCHW", "NHWC"):
            t, flops = train_step(order, args.runs, args.trials)
            gflops = sgemm_gflops()
            floor = flops / (gflops * 1e9)
            print(
                f"ResNet block training step {order} [8,64,16,16]: {t * 1e3:.3f} ms, "
                f"sgemm-FLOP floor {floor * 1e3:.3f} ms ({floor / t * 100:.1f}% of sgemm peak; "
                f"numpy sgemm {gflops:.1f} GFLOP/s)",
                flush=True,
            )
    if not rows:
        print("no model matched", file=sys.stderr)
        return 1
    geo = math.exp(sum(math.log(r[4]) for r in rows) / len(rows))
    worst = max(rows, key=lambda r: r[4])
    print(f"geomean normalized x{geo:.3f} over {len(rows)} models (below 1 is faster than Caffe2)")
    # The same with this run's median sgemm for every model: on many cores numpy's threaded
    # sgemm moves 2x from one measurement to the next, and each model's figure with it.
    here = float(np.median([g for g, _ in rates]))
    steady = math.exp(
        sum(math.log(r[3] * here / rec) for r, (_, rec) in zip(rows, rates, strict=True))
        / len(rows)
    )
    print(f"geomean normalized by the run's median sgemm ({here:.1f} GFLOP/s) x{steady:.3f}")
    print(f"worst: {worst[0]} normalized x{worst[4]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
