"""Fuzzing: hostile operators, nets and protobuf bytes through the Python API, in child
processes, so that a crash (abort, segfault), a hang or a panic is seen and recorded with the
case that reproduces it.

    python scripts/fuzz.py --cases 1000000 --seed 1 [--workers 2] [--timeout 20]
    python scripts/fuzz.py --replay SEED:INDEX      # runs one case in this process, verbosely

Each case is drawn from (seed, index) alone, so any case can be replayed:
- 80%: one operator of a random registered type, its input and output counts, in-place pairs
  and argument names taken from its schema, fed inputs of hostile shapes (empty dims, scalars),
  dtypes and values (NaN, inf, huge or negative indices) and given hostile argument values
  (huge, negative, empty or long lists, unknown strings, wrong types), sometimes on a device
  this machine lacks or with an unknown engine; run with ``RunOperatorOnce`` and, as a net,
  with ``RunNetOnce`` (with the dag executor sometimes);
- 20%: the bytes of such a net, an op or a plan, mutated (bits flipped, bytes inserted, deleted
  or duplicated, truncated), given to the decoder and to ``CreateNet`` / ``RunPlan``.

A Python exception is the expected outcome of hostile input. What counts against the engine:
a panic (an exception whose message says a kernel panicked, or pyo3's ``PanicException``),
an abort (the child process dies), a hang (a case runs past ``--timeout`` seconds). Workers run
with their address space limited (``--memory-gb``) so that an allocation sized by input fails
as ``MemoryError`` rather than swapping the machine. The last line reads
``N cases, P panics, A aborts, H hangs`` (and the time taken); every failure is listed above
it as ``kind SEED:INDEX message``.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import subprocess
import sys
import time

# Ops that wait for another thread by design (queues), loop as long as their net says
# (While), or only print: hostile inputs make them wait or spin legitimately.
EXCLUDED = re.compile(r"Queue|Dequeue|Enqueue|^While$|^Print$|Sleep|Wait|^Barrier|Rebatching")

DTYPES = ["float32"] * 5 + [
    "int32",
    "int32",
    "int64",
    "int64",
    "bool",
    "uint8",
    "float64",
    "float16",
    "int8",
    "int16",
    "uint16",
    "object",
]
DIMS = [0, 1, 1, 2, 2, 3, 4, 5, 7, 8]
BIG_INTS = [2**31 - 1, 2**31, 2**40, 2**62, -(2**31), -(2**40), -1, -2]
ARG_NAMES = [
    "axis",
    "axes",
    "shape",
    "dims",
    "kernel",
    "kernels",
    "stride",
    "strides",
    "pad",
    "pads",
    "dilation",
    "dilations",
    "group",
    "order",
    "to",
    "dtype",
    "value",
    "tiles",
    "num_output",
    "broadcast",
    "keepdims",
    "split",
    "k",
    "ratio",
    "is_test",
    "epsilon",
    "scale",
    "min",
    "max",
    "lengths",
    "starts",
    "ends",
    "size",
    "sizes",
    "extra_shape",
    "input_as_shape",
    "count_include_pad",
    "global_pooling",
    "trans_a",
    "trans_b",
    "alpha",
    "beta",
    "num_batches",
    "seed",
    "block_size",
    "label_prob",
    "step_net",
]


# -- case generation -------------------------------------------------------------------------


def _array(rs, np):
    dtype = DTYPES[rs.randint(len(DTYPES))]
    rank = rs.choice([0, 1, 1, 2, 2, 3, 4])
    dims = [int(DIMS[rs.randint(len(DIMS))]) for _ in range(rank)]
    n = int(np.prod(dims)) if dims else 1
    if dtype == "object":
        return np.array([b"x" * int(rs.randint(3)) for _ in range(n)], dtype=object).reshape(dims)
    if dtype == "bool":
        return (rs.rand(n) > 0.5).reshape(dims)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        mode = rs.randint(4)
        if mode == 0:
            vals = rs.randint(max(info.min, -3), min(info.max, 10) + 1, size=n)
        elif mode == 1:
            vals = rs.choice([info.min, info.max, 0, -1 if info.min < 0 else 0], size=n)
        else:
            vals = rs.randint(0, min(info.max, 6) + 1, size=n)
        return vals.astype(dtype).reshape(dims)
    vals = rs.randn(n)
    if rs.rand() < 0.3:
        specials = [np.nan, np.inf, -np.inf, 1e38, -1e38, 0.0, -0.0, 1e-45]
        k = max(1, n // 3)
        idx = rs.randint(0, max(n, 1), size=k) if n else []
        for i in idx:
            vals[i] = specials[rs.randint(len(specials))]
    return vals.astype(dtype).reshape(dims)


def _arg_value(rs, name):
    kind = rs.randint(10)
    if kind <= 2:
        return int(rs.choice([-1, 0, 1, 2, 3, 4]))
    if kind == 3:
        return int(BIG_INTS[rs.randint(len(BIG_INTS))])
    if kind == 4:
        return float(rs.choice([0.0, -1.0, 0.5, 1e30, float("nan"), float("inf")]))
    if kind == 5:
        return [int(rs.choice([-1, 0, 1, 2, 3])) for _ in range(rs.randint(0, 5))]
    if kind == 6:
        return [int(BIG_INTS[rs.randint(len(BIG_INTS))]) for _ in range(rs.randint(1, 4))]
    if kind == 7:
        return str(rs.choice(["NCHW", "NHWC", "", "bogus", "sum", "mean", "FLOAT", "x" * 300]))
    if kind == 8:
        return [float(rs.choice([0.0, 1.5, float("nan")])) for _ in range(rs.randint(0, 4))]
    return [str(rs.choice(["a", "b", "", "NCHW"])) for _ in range(rs.randint(0, 3))]


def _count(rs, bounds):
    lo, hi = bounds
    hi = min(hi if hi is not None else lo + 3, lo + 4, 6)
    if rs.rand() < 0.1:  # sometimes outside the schema, to check the refusal
        return int(rs.randint(0, 7))
    return int(rs.randint(lo, max(lo, hi) + 1))


def make_op(rs, op_types, native, core, caffe2_pb2):
    op_type = op_types[rs.randint(len(op_types))]
    schema = native.op_schema(op_type) or {"inputs": (0, 3), "outputs": (1, 2), "args": []}
    n_in = _count(rs, schema["inputs"])
    n_out = _count(rs, schema["outputs"])
    pool = ["a", "b", "c", "d", "e", "f"]
    inputs = [pool[rs.randint(len(pool))] for _ in range(n_in)]
    outputs = [pool[rs.randint(len(pool))] if rs.rand() < 0.3 else f"y{j}" for j in range(n_out)]
    for i, j in schema.get("inplace_enforced", []):
        if i < n_in and j < n_out:
            outputs[j] = inputs[i]
    names = list(schema.get("args", [])) + ARG_NAMES
    args = {}
    for _ in range(rs.randint(0, 5)):
        name = names[rs.randint(len(names))]
        if name == "step_net":
            continue
        args[name] = _arg_value(rs, name)
    device = None
    r = rs.rand()
    if r < 0.03:
        device = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA, device_id=int(rs.randint(3)))
    elif r < 0.05:
        device = caffe2_pb2.DeviceOption(device_type=int(rs.choice([2, 5, 6, 42])))
    engine = str(rs.choice(["", "", "", "CUDNN", "bogus"]))
    try:
        op = core.CreateOperator(
            op_type, inputs, outputs, device_option=device, engine=engine, **args
        )
    except Exception:  # noqa: BLE001 - an argument the builder refuses: keep the op plain
        op = core.CreateOperator(op_type, inputs, outputs)
    return op, sorted(set(inputs))


def _mutate(rs, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rs.randint(1, 6)):
        kind = rs.randint(5)
        if kind == 0 and b:
            i = rs.randint(len(b))
            b[i] ^= 1 << rs.randint(8)
        elif kind == 1:
            i = rs.randint(len(b) + 1)
            b[i:i] = bytes(rs.randint(0, 256, size=rs.randint(1, 8)).astype("uint8"))
        elif kind == 2 and b:
            i = rs.randint(len(b))
            del b[i : i + rs.randint(1, 8)]
        elif kind == 3 and b:
            i, j = sorted(rs.randint(0, len(b) + 1, size=2))
            b[j:j] = b[i:j]
        elif kind == 4 and b:
            del b[rs.randint(len(b)) :]
    return bytes(b)


class Runner:
    """Runs cases in this process."""

    def __init__(self):
        import numpy as np

        from ferrocaffe import _native, core, workspace
        from ferrocaffe.proto import caffe2_pb2

        self.np, self.native, self.core, self.ws, self.pb = np, _native, core, workspace, caffe2_pb2
        self.op_types = [t for t in _native.registered_operators() if not EXCLUDED.search(t)]

    def case(self, seed: int, index: int, verbose=False) -> str | None:
        """Runs one case; returns a panic description or None."""
        np = self.np
        rs = np.random.RandomState([seed & 0xFFFFFFFF, index & 0xFFFFFFFF])
        self.ws.ResetWorkspace()
        op, inputs = make_op(rs, self.op_types, self.native, self.core, self.pb)
        if verbose:
            print(op)
        if rs.rand() < 0.2:
            return self._bytes_case(rs, op, verbose)
        for name in inputs:
            if rs.rand() < 0.92:
                arr = _array(rs, np)
                if verbose:
                    print(name, arr.dtype, arr.shape)
                self._call(lambda n=name, a=arr: self.ws.FeedBlob(n, a))
        problems = [self._call(lambda: self.ws.RunOperatorOnce(op), verbose)]
        if rs.rand() < 0.3:
            # A NetDef, not core.Net: core.Net keeps every name it gave out, as Caffe2 did,
            # and looks for a free one linearly, which a million cases would make quadratic.
            net = self.pb.NetDef(name="fuzz")
            net.op.extend([op, op])
            if rs.rand() < 0.5:
                net.type = "dag"
                net.num_workers = int(rs.choice([1, 2, 4, 64]))
            problems.append(self._call(lambda: self.ws.RunNetOnce(net), verbose))
        return next((p for p in problems if p), None)

    def _bytes_case(self, rs, op, verbose):
        net = self.pb.NetDef(name="fuzz")
        net.op.extend([op])
        kind = rs.randint(3)
        if kind == 0:
            data, what = net.SerializeToString(), "NetDef"
        elif kind == 1:
            data, what = op.SerializeToString(), "OperatorDef"
        else:
            plan = self.pb.PlanDef(name="p")
            plan.network.extend([net])
            step = plan.execution_step.add(name="s", num_iter=int(rs.choice([1, 2, 3])))
            step.network.extend(["fuzz"])
            data, what = plan.SerializeToString(), "PlanDef"
        data = _mutate(rs, data)
        if what == "PlanDef":
            # A plan runs as many iterations as it asks for (a mutation can ask for 10^18):
            # that is requested work, not a hang. Plans run only when the mutated bytes still
            # parse, with their step counts clamped; otherwise only the decoder sees them.
            data = self._clamped_plan(data)
        if verbose:
            print(what, data)
        raw = data if data is not None else b""
        problems = [self._call(lambda: self.native.roundtrip(what, raw), verbose)]
        ws = self.ws._ws()
        if what == "NetDef":
            problems.append(self._call(lambda: ws.create_net(data, True), verbose))
            problems.append(self._call(lambda: ws.run_net("fuzz", 1), verbose))
        elif what == "PlanDef" and data is not None:
            problems.append(self._call(lambda: self.ws.RunPlan(data), verbose))
        return next((p for p in problems if p), None)

    def _clamped_plan(self, data: bytes) -> bytes | None:
        plan = self.pb.PlanDef()
        try:
            plan.ParseFromString(data)
        except Exception:  # noqa: BLE001 - bytes Python's protobuf refuses
            return None

        def clamp(step):
            # Iterations, a stop blob (loop until it is true), a period between runs and
            # concurrent instances are what the plan asks for: kept small.
            if step.HasField("should_stop_blob") or not (0 <= step.num_iter <= 3):
                step.num_iter = 3
            step.ClearField("should_stop_blob")
            step.run_every_ms = min(max(step.run_every_ms, 0), 5)
            step.num_concurrent_instances = min(max(step.num_concurrent_instances, 0), 64)
            step.report_interval = min(max(step.report_interval, 0), 1)
            for sub in step.substep:
                clamp(sub)

        for step in plan.execution_step:
            clamp(step)
        # Partial: a mutation may leave required fields of nested messages unset.
        return plan.SerializePartialToString()

    @staticmethod
    def _call(fn, verbose=False):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - classified below
            if isinstance(e, KeyboardInterrupt):
                raise
            text = f"{type(e).__name__}: {e}"
            if verbose:
                print("raised", text[:500])
            if type(e).__name__ == "PanicException" or "panicked" in str(e):
                return text[:300].replace("\n", " ")
        return None


# -- workers and the parent ------------------------------------------------------------------


def worker(seed, start, end, memory_gb):
    try:
        import resource

        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    runner = Runner()
    out = sys.stdout
    for i in range(start, end):
        out.write(f"S {i}\n")
        out.flush()
        try:
            problem = runner.case(seed, i)
        except Exception as e:  # noqa: BLE001 - a fault of the harness, not of the engine
            out.write(f"H {i} {type(e).__name__}: {str(e)[:200]}\n".replace("\n", " ") + "\n")
            continue
        if problem:
            out.write(f"P {i} {problem}\n")
    out.write("D\n")
    out.flush()


class Worker:
    def __init__(self, args, start, end):
        self.args, self.end = args, end
        self.failures = []
        self.current = start
        self.spawn(start)

    def spawn(self, start):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--seed",
            str(self.args.seed),
            "--start",
            str(start),
            "--end",
            str(self.end),
            "--memory-gb",
            str(self.args.memory_gb),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.args.workdir,
            text=True,
            bufsize=1,
        )
        self.started_at = time.monotonic()
        self.current = start - 1

    def poll(self, timeout) -> bool:
        """Reads what the child says; returns True when its range is done."""
        ready, _, _ = select.select([self.proc.stdout], [], [], 0.05)
        if ready:
            line = self.proc.stdout.readline()
            if line.startswith("S "):
                self.current = int(line.split()[1])
                self.started_at = time.monotonic()
            elif line.startswith(("P ", "H ")):
                _, i, msg = line.rstrip("\n").split(" ", 2)
                kind = "panic" if line.startswith("P") else "harness"
                self.failures.append((kind, int(i), msg))
            elif line.startswith("D"):
                self.proc.wait()
                return True
            elif line == "":  # the child died
                code = self.proc.wait()
                self.failures.append(("abort", self.current, f"exit status {code}"))
                return self._restart()
            return False
        if time.monotonic() - self.started_at > timeout:
            self.proc.kill()
            self.proc.wait()
            self.failures.append(("hang", self.current, f"over {timeout} s"))
            return self._restart()
        return False

    def _restart(self) -> bool:
        nxt = self.current + 1
        if nxt >= self.end:
            return True
        self.spawn(nxt)
        return False


def run(args) -> int:
    t0 = time.monotonic()
    n = args.cases
    w = max(1, args.workers)
    chunk = (n + w - 1) // w
    workers = [Worker(args, i * chunk, min(n, (i + 1) * chunk)) for i in range(w) if i * chunk < n]
    active = list(workers)
    while active:
        active = [x for x in active if not x.poll(args.timeout)]
    failures = sorted(f for x in workers for f in x.failures)
    for kind, i, msg in failures:
        print(f"{kind} {args.seed}:{i} {msg}")
    count = {
        k: sum(1 for f in failures if f[0] == k) for k in ("panic", "abort", "hang", "harness")
    }
    took = time.monotonic() - t0
    print(
        f"{n} cases, {count['panic']} panics, {count['abort']} aborts, {count['hang']} hangs "
        f"(seed {args.seed}, {w} workers, {took:.0f} s)"
    )
    return 1 if failures else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--memory-gb", type=float, default=4.0)
    p.add_argument("--workdir", default=None, help="folder the workers run in (files ops write)")
    p.add_argument("--replay", help="SEED:INDEX: run one case here, verbosely")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.seed, a.start, a.end, a.memory_gb)
        return 0
    if a.replay:
        seed, index = (int(v) for v in a.replay.split(":"))
        problem = Runner().case(seed, index, verbose=True)
        print("panic:", problem) if problem else print("no panic")
        return 1 if problem else 0
    if a.workdir is None:
        import tempfile

        a.workdir = tempfile.mkdtemp(prefix="ferrocaffe-fuzz-")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
