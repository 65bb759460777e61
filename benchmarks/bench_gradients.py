"""Gradient generation time for large FC+Relu nets: chains (``FC -> Relu -> FC -> ...``, the
shape of the golden 4,001-op case) and ladders (every rung adds its input back with a ``Sum``,
so every rung needs a gradient accumulation), at about 1k, 4k, 20k and 100k operators.

Prints, per net: the best time of ``GradientRegistry.GetBackwardPass(ops, ["loss"])``, the
time per 1,000 ops, the growth against the previous size (1.0 = linear), the ratio to a
reference measured in the same run (serializing the forward ops one by one and parsing as many
ops back: the per-op protobuf I/O of that list-in, list-out API), then the time of
``gradients.add_gradient_operators(net_proto, ["loss"])`` (the net crosses as one message, as
``Net.AddGradientOperators`` uses it) with its CPU time, and of
``core.Net.AddGradientOperators`` (the ``core.Net`` built beforehand, outside the timing),
beside it the Rust side of that call alone (``_native.time_backward_pass_net``: serialized net
in, serialized gradient ops and gradient map out, no Python object made; what
``examples/gradient_chain.rs`` times from Rust), and last the floor of that call's result: the
time to build, from a finished run's output, only the Python objects it returns (the gradient
ops parsed into the NetDef, and the gradient map of ``BlobReference`` keys and values built by
the same native code as the real call, from names held natively) with nothing computed. The
call itself returns the map held natively (``core.gradients.GradientMap``, a dict whose
entries are made on first use): the map's part of the floor is paid then, not in the call.

Times are the best of ``--repeat`` runs (wall clock, and CPU time of the calling thread where
shown):
on a machine shared with other work, the best run is the one least disturbed.

    maturin develop --release -q && python benchmarks/bench_gradients.py [--repeat N] [--max-ops N]
"""

import argparse
import gc
import os
import time

# numpy's OpenBLAS threads (numpy comes with ferrocaffe) spin on idle cores and steal time
# from the single-threaded code measured here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ferrocaffe import _native, core  # noqa: E402
from ferrocaffe.core.gradients import add_gradient_operators  # noqa: E402
from ferrocaffe.proto import caffe2_pb2  # noqa: E402

# Net.AddGradientOperators: 5 ms for the golden 4,001-op chain (Caffe2 took 0.26-0.41 s),
# and linear growth from there.
TARGETS_MS = {4001: 5.0, 100001: 125.0}


def op(t, ins, outs):
    return caffe2_pb2.OperatorDef(type=t, input=ins, output=outs, name="")


def chain(n_layers):
    """``2 * n_layers + 1`` ops: FC, Relu per layer, then SumElements."""
    ops, x = [], "x"
    for k in range(n_layers):
        ops.append(op("FC", [x, f"W{k}", f"b{k}"], [f"fc{k}"]))
        ops.append(op("Relu", [f"fc{k}"], [f"r{k}"]))
        x = f"r{k}"
    ops.append(op("SumElements", [x], ["loss"]))
    return ops


def ladder(n_rungs):
    """``3 * n_rungs + 1`` ops: FC, Relu, Sum(relu, input) per rung, then SumElements."""
    ops, x = [], "x"
    for k in range(n_rungs):
        ops.append(op("FC", [x, f"W{k}", f"b{k}"], [f"fc{k}"]))
        ops.append(op("Relu", [f"fc{k}"], [f"r{k}"]))
        ops.append(op("Sum", [f"r{k}", x], [f"h{k}"]))
        x = f"h{k}"
    ops.append(op("SumElements", [x], ["loss"]))
    return ops


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def reference(ops, repeat):
    net = caffe2_pb2.NetDef()
    net.op.extend(ops)
    data = net.SerializeToString()

    def io():
        [o.SerializeToString() for o in ops]
        caffe2_pb2.NetDef.FromString(data).op[:]

    return best(io, repeat)


def proto_path(ops):
    proto = caffe2_pb2.NetDef(name="bench")
    proto.op.extend(ops)

    def run():
        net = caffe2_pb2.NetDef()
        net.CopyFrom(proto)
        t0, c0 = time.perf_counter(), time.thread_time()
        add_gradient_operators(net, ["loss"])
        return time.perf_counter() - t0, time.thread_time() - c0

    return run


def best_inner(fn, repeat):
    """Best wall time and best CPU time (ms) of ``fn`` (which returns both, in seconds)."""
    runs = [fn() for _ in range(repeat)]
    return min(r[0] for r in runs) * 1e3, min(r[1] for r in runs) * 1e3


def net_path(ops):
    net_cls = getattr(core, "Net", None)
    if net_cls is None or not hasattr(net_cls, "AddGradientOperators"):
        return None
    proto = caffe2_pb2.NetDef(name="bench")
    proto.op.extend(ops)

    def run():
        net = net_cls(proto)
        t0, c0 = time.perf_counter(), time.thread_time()
        net.AddGradientOperators(["loss"])
        return time.perf_counter() - t0, time.thread_time() - c0

    return run


def rust_only(ops, repeat):
    """Best time (ms) of the Rust side of ``Net.AddGradientOperators`` for ``ops``."""
    net = caffe2_pb2.NetDef(name="bench")
    net.op.extend(ops)
    return _native.time_backward_pass_net(net.SerializeToString(), 0, ["loss"], repeat) * 1e3


def result_floor(ops, repeat):
    """Best time (ms) to build the objects ``Net.AddGradientOperators`` returns for ``ops``
    (gradient ops parsed into a NetDef, {BlobReference: BlobReference} map), from the
    serialized gradient ops and the gradient map of one real run."""
    net = caffe2_pb2.NetDef()
    net.op.extend(ops)
    grads = add_gradient_operators(net, ["loss"])
    grad_bytes = caffe2_pb2.NetDef(op=net.op[len(ops) :]).SerializeToString()
    keys = [str(k) for k in grads]
    values = [str(v) for v in grads.values()]
    native_map = _native.GradientMap(list(zip(keys, values, strict=True)))

    def build():
        caffe2_pb2.NetDef().MergeFromString(grad_bytes)
        return native_map.to_dict(blob_ref=core.BlobReference)

    gc.disable()
    try:
        return best(build, repeat)
    finally:
        gc.enable()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-ops", type=int, default=100001)
    args = ap.parse_args(argv)

    sizes = {"chain": [500, 2000, 10000, 50000], "ladder": [333, 1333, 6666, 33333]}
    builders = {"chain": chain, "ladder": ladder}
    print(
        f"{'net':>7} {'ops':>7} {'GetBackwardPass':>16} {'per 1k ops':>11} {'growth':>7} "
        f"{'vs proto I/O':>12} {'NetDef path':>12} {'(cpu)':>9} {'growth':>7} "
        f"{'Net.AddGradientOperators':>25} {'Rust only':>10} {'result floor':>13}"
    )
    for kind, ns in sizes.items():
        prev = prev_net = None
        for n in ns:
            ops = builders[kind](n)
            if len(ops) > args.max_ops:
                continue
            repeat = args.repeat if len(ops) <= 20001 else max(2, args.repeat // 2)
            ms = best(lambda ops=ops: core.GradientRegistry.GetBackwardPass(ops, ["loss"]), repeat)
            ref = reference(ops, repeat)
            net_ms, net_cpu = best_inner(proto_path(ops), repeat)
            growth = net_growth = ""
            if prev is not None:
                growth = f"{(ms / prev[1]) / (len(ops) / prev[0]):.2f}"
                net_growth = f"{(net_ms / prev_net[1]) / (len(ops) / prev_net[0]):.2f}"
            agg = net_path(ops)
            if agg:
                agg_ms, agg_cpu = best_inner(agg, repeat)
                agg_text = f"{agg_ms:.2f} ms (cpu {agg_cpu:.2f})"
            else:
                agg_text = "(no core.Net)"
            rust_ms = rust_only(ops, repeat)
            floor_ms = result_floor(ops, repeat)
            target = TARGETS_MS.get(len(ops))
            note = f"  target <= {target:g} ms" if target else ""
            print(
                f"{kind:>7} {len(ops):>7} {ms:>13.2f} ms {ms / len(ops) * 1e3:>8.3f} ms "
                f"{growth:>7} {ms / ref:>11.1f}x {net_ms:>9.2f} ms {net_cpu:>9.2f} {net_growth:>7} "
                f"{agg_text:>25} {rust_ms:>7.2f} ms {floor_ms:>10.2f} ms{note}"
            )
            prev = (len(ops), ms)
            prev_net = (len(ops), net_ms)


if __name__ == "__main__":
    main()
