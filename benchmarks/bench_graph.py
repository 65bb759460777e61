"""Benchmark: core.get_ssa & friends and ferrocaffe.graph surgery, through the Python API
(protobuf crossing included), against straightforward pure-Python versions of the same
functions (tests/graph_reference.py), in the same run. (get_undefined_blobs,
get_output_producers and get_op_ids_in_path take an ssa list, which they walk in Python: the
comparison checks they are no slower than the reference loops.)

    maturin develop --release -q && python benchmarks/bench_graph.py [--sizes 1000,10000,100000]

Prints the best time of a few runs per function and size, the ratio reference / ferrocaffe,
and the growth factor of ferrocaffe's time from one size to the next (10x more ops should cost
about 10x). Each time includes freeing the function's result, except the "(result kept)"
row, which frees it after the clock stops. For get_ssa, "(with gc)" adds the garbage
collector's first pass over the result (it runs on the caller's next allocation, whoever
pays it). "(floor: build result)" is what CPython itself takes to build and free an object
graph equal to get_ssa's result (marshal.loads, all in C, garbage collector off): no get_ssa returning Caffe2's
lists and tuples can be faster.
"""

import argparse
import gc
import marshal
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# numpy's OpenBLAS threads (numpy comes with ferrocaffe) spin on idle cores and steal time
# from the single-threaded code measured here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import graph_reference as ref  # noqa: E402

from ferrocaffe import core, graph  # noqa: E402
from ferrocaffe.proto import caffe2_pb2  # noqa: E402


def build_net(n_ops):
    """An MLP-like predict net: FC layers with their own weights, in-place Relus, and every
    tenth layer a debug branch that reaches no external output."""
    net = caffe2_pb2.NetDef()
    net.name = "bench_%d" % n_ops
    net.external_input.append("data")
    h = "data"
    i = 0
    while len(net.op) < n_ops:
        kind = i % 10
        op = net.op.add()
        op.name = ""
        if kind in (1, 4, 7):
            op.type = "Relu"
            op.input.append(h)
            op.output.append(h)
        elif kind == 9:
            op.type = "Copy"
            op.input.append(h)
            op.output.append("dbg_%d" % i)
        else:
            op.type = "FC"
            w, b = "fc%d_w" % i, "fc%d_b" % i
            net.external_input.extend([w, b])
            out = "fc%d" % i
            op.input.extend([h, w, b])
            op.output.append(out)
            arg = op.arg.add()
            arg.name = "axis"
            arg.i = 1
            h = out
        i += 1
    net.external_output.append(h)
    return net


def best_of(fn, repeats, keep=False):
    """Best wall time and best CPU time of the calling thread (ms) over `repeats` runs. The
    result of `fn` is freed inside the timed span, unless `keep`: then it is freed after the
    clock stops (what the call costs a caller who keeps what it returns)."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        result = fn()
        if not keep:
            del result
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.thread_time() - c0)
        result = None
    return best * 1e3, best_cpu * 1e3


def fresh_memory_ms_per_mb():
    """What touching newly mapped memory costs here (page faults): large inputs and results
    pay it for every megabyte, which makes every time grow faster than linearly on machines
    where it is high."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        b = bytearray(32 << 20)
        best = min(best, time.perf_counter() - t0)
        del b
    return best * 1e3 / 32


# Marks a case whose results are freed after the clock stops.
KEEP = object()


def cases(net):
    n = len(net.op)
    ssa, versions = core.get_ssa(net)
    ref_ssa, ref_versions = ref.get_ssa(net)
    last = net.external_output[0]
    mid_fc = next(op_id for op_id in range(n // 2, n) if net.op[op_id].type == "FC")
    sub = list(range(n // 2, n // 2 + 20))
    yield "get_ssa", lambda: core.get_ssa(net), lambda: ref.get_ssa(net)
    yield "get_ssa (result kept)", KEEP, lambda: core.get_ssa(net), lambda: ref.get_ssa(net)
    yield (
        "get_ssa (with gc)",
        lambda: (core.get_ssa(net), gc.collect(0)),
        lambda: (ref.get_ssa(net), gc.collect(0)),
    )
    yield (
        "get_undefined_blobs",
        lambda: core.get_undefined_blobs(ssa),
        lambda: ref.get_undefined_blobs(ref_ssa),
    )
    yield (
        "get_output_producers",
        lambda: core.get_output_producers(ssa),
        lambda: ref.get_output_producers(ref_ssa),
    )
    yield (
        "get_op_ids_in_path",
        lambda: core.get_op_ids_in_path(ssa, versions, ["data"], [last]),
        lambda: ref.get_op_ids_in_path(ref_ssa, ref_versions, ["data"], [last]),
    )
    yield "producer_map", lambda: graph.producer_map(net), lambda: ref.producer_map(net)
    yield "consumer_map", lambda: graph.consumer_map(net), lambda: ref.consumer_map(net)
    yield (
        "rename_op_input",
        lambda: graph.rename_op_input(net, mid_fc, 1, "renamed_w"),
        lambda: ref.rename_op_input(net, mid_fc, 1, "renamed_w"),
    )
    yield (
        "rename_op_output",
        lambda: graph.rename_op_output(net, mid_fc, 0, "renamed"),
        lambda: ref.rename_op_output(net, mid_fc, 0, "renamed"),
    )
    yield (
        "remove_dead_end_ops",
        lambda: graph.remove_dead_end_ops(net),
        lambda: ref.remove_dead_end_ops(net),
    )
    yield (
        "sub_graph_external_io",
        lambda: graph.sub_graph_external_io(net, sub),
        lambda: ref.sub_graph_external_io(net, sub),
    )
    yield (
        "find_chains",
        lambda: graph.find_chains(net, "Relu", 1),
        lambda: ref.find_chains(net, "Relu", 1),
    )


def check_same(net):
    """The two implementations agree on this net (so the timings compare like with like)."""
    assert core.get_ssa(net) == ref.get_ssa(net)
    out, removed = graph.remove_dead_end_ops(net)
    ref_out, ref_removed = ref.remove_dead_end_ops(net)
    assert removed == ref_removed and out == ref_out
    assert graph.find_chains(net, "Relu", 1) == ref.find_chains(net, "Relu", 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print("load average %.1f %.1f %.1f on %d CPUs" % (*os.getloadavg(), os.cpu_count()))
    print("fresh memory costs %.2f ms per MB here" % fresh_memory_ms_per_mb())
    results = {}
    names = []
    for n in sizes:
        net = build_net(n)
        check_same(net)
        data = net.SerializeToString()
        ser = best_of(net.SerializeToString, args.repeats)
        parse = best_of(lambda: type(net)().ParseFromString(data), args.repeats)  # noqa: B023
        results[("(protobuf serialize)", n)] = ser
        results[("(protobuf parse)", n)] = parse
        print("\n%d ops, %.1f MB serialized" % (n, len(data) / 1e6))
        print(
            "%-24s %9s %9s %11s %8s" % ("function", "ours ms", "(cpu ms)", "ref. ms", "ref./ours")
        )
        print(
            "%-24s %9.2f %9.2f   (the protobuf runtime, for scale)" % ("(protobuf serialize)", *ser)
        )
        print("%-24s %9.2f %9.2f" % ("(protobuf parse)", *parse))
        # What CPython alone takes to build (and free) an object graph equal to get_ssa's
        # result, from C with no bytecode: a floor for any get_ssa returning Caffe2's types.
        blob = marshal.dumps(core.get_ssa(net))
        gc.disable()  # the collector would otherwise run over the new objects (not ours to pay)
        floor = best_of(lambda: marshal.loads(blob), args.repeats)  # noqa: B023
        kept = best_of(lambda: marshal.loads(blob), args.repeats, keep=True)  # noqa: B023
        gc.enable()
        results[("(floor: build result)", n)] = floor
        print(
            "%-24s %9.2f %9.2f   (marshal.loads of get_ssa's result; %.2f ms kept)"
            % ("(floor: build result)", *floor, kept[0])
        )
        py_repeats = max(1, min(args.repeats, 200_000 // (n * 2)))
        names = []
        for name, *fns in cases(net):
            keep = fns[0] is KEEP
            fast, slow = fns[-2:]
            names.append(name)
            rust = best_of(fast, args.repeats, keep)
            py, _ = best_of(slow, py_repeats, keep)
            results[(name, n)] = rust
            print("%-24s %9.2f %9.2f %11.2f %7.1fx" % (name, *rust, py, py / rust[0]))

    if len(sizes) > 1:
        pairs = list(zip(sizes, sizes[1:], strict=False))
        print(
            "\ngrowth of the wall (cpu) time from one size to the next (linear: the ratio of sizes)"
        )
        print("%-24s%s" % ("function", "".join("%18s" % ("%d->%d" % p) for p in pairs)))
        for name in ["(protobuf serialize)", "(protobuf parse)", "(floor: build result)", *names]:
            row = "".join(
                "%11.1fx (%4.1fx)"
                % (
                    results[(name, b)][0] / results[(name, a)][0],
                    results[(name, b)][1] / max(results[(name, a)][1], 1e-3),
                )
                for a, b in pairs
            )
            print("%-24s%s" % (name, row))
    print("\nload average %.1f %.1f %.1f" % os.getloadavg())


if __name__ == "__main__":
    main()
