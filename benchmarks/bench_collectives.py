"""All-reduce bandwidth of the MPI engine, beside an alpha-beta model of ring all-reduce.

    python benchmarks/bench_collectives.py [--procs 2 4] [--max-mib 64]

For p processes on this machine (``mpiexec -n p``, MPI's shared-memory transport) it times an
in-place float32 ``Allreduce`` net of 4 KiB .. 64 MiB, and prints per size: the time, the
algorithm bandwidth (n / t) and the bus bandwidth (2(p-1)/p * n / t, what each link carries in
a ring all-reduce). It then fits the ring model

    t(n, p) = 2(p-1) * alpha + 2(p-1)/p * n / B

to all measurements (least squares, weighted by 1/t so small and large sizes count alike),
prints the model's time beside each measurement, and what the same model gives for N hosts
on a network of a given speed (default 25 Gbit/s, with the latency alpha given by --net-alpha-us:
one host's fitted alpha is a shared-memory latency, not a network one).
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def worker(max_bytes):
    from ferrocaffe import core, workspace

    rank = int(os.environ["PMI_RANK"])
    init = core.Net("init")
    init.CreateCommonWorld([], "cw", engine="MPI", timeout_ms=120000)
    workspace.RunNetOnce(init)
    barrier = core.Net("barrier")
    barrier.Barrier(["cw"], [], engine="MPI")
    workspace.CreateNet(barrier)
    for size in [s for s in SIZES if s <= max_bytes]:
        name = f"allreduce_{size}"
        workspace.FeedBlob("x", np.ones(size // 4, np.float32))
        net = core.Net(name)
        net.Allreduce(["cw", "x"], ["x"], engine="MPI")
        workspace.CreateNet(net)
        workspace.RunNet(name, 2)  # warm-up
        iters = int(max(3, min(200, (256 << 20) // size)))
        times = []
        for _ in range(5):
            workspace.RunNet("barrier")
            t0 = time.perf_counter()
            workspace.RunNet(name, iters)
            times.append((time.perf_counter() - t0) / iters)
        if rank == 0:
            print(f"RESULT {size} {min(times):.9e}", flush=True)


def measure(p, max_bytes):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = "mpiexec"
    cmd = [
        mpiexec,
        "-n",
        str(p),
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--max-mib",
        str(max_bytes >> 20),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("RESULT"):
            _, size, t = line.split()
            res[int(size)] = float(t)
    return res


def fit(points):
    """alpha, B of the ring model from [(p, n, t)] (least squares on relative error)."""
    a = np.array([[2 * (p - 1), 2 * (p - 1) / p * n] for p, n, _ in points])
    t = np.array([t for _, _, t in points])
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    alpha, inv_b = coef
    return max(alpha, 0.0), 1.0 / inv_b


def model(alpha, bw, p, n):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw


def human(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--net-gbit", type=float, default=25.0)
    ap.add_argument("--net-alpha-us", type=float, default=20.0)
    args = ap.parse_args()
    max_bytes = args.max_mib << 20
    if args.worker:
        worker(max_bytes)
        return
    results = {p: measure(p, max_bytes) for p in args.procs}
    points = [(p, n, t) for p, r in results.items() for n, t in r.items()]
    alpha, bw = fit(points)
    print(f"MPI all-reduce (float32, in place) on this machine ({os.cpu_count()} CPUs)")
    print(f"ring model fit: alpha = {alpha * 1e6:.2f} us, B = {bw / 1e9:.2f} GB/s")
    print(f"{'p':>2} {'size':>8} {'time':>11} {'model':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for p, r in results.items():
        for n, t in sorted(r.items()):
            print(
                f"{p:>2} {human(n):>8} {t * 1e6:>9.1f}us {model(alpha, bw, p, n) * 1e6:>9.1f}us "
                f"{n / t / 1e9:>11.3f} {2 * (p - 1) / p * n / t / 1e9:>11.3f}"
            )
    net_bw = args.net_gbit * 1e9 / 8
    net_alpha = args.net_alpha_us * 1e-6
    print(
        f"\nring model for N hosts at {args.net_gbit:g} Gbit/s ({net_bw / 1e9:.3f} GB/s per "
        f"link), alpha = {args.net_alpha_us:g} us per step:"
    )
    print(f"{'N':>4} {'1 MiB':>12} {'64 MiB':>12} {'busbw 64 MiB':>14}")
    for n_hosts in [2, 4, 8, 16, 32, 64]:
        t1 = model(net_alpha, net_bw, n_hosts, 1 << 20)
        t64 = model(net_alpha, net_bw, n_hosts, 64 << 20)
        busbw = 2 * (n_hosts - 1) / n_hosts * (64 << 20) / t64
        print(f"{n_hosts:>4} {t1 * 1e3:>10.2f}ms {t64 * 1e3:>10.2f}ms {busbw / 1e9:>11.3f} GB/s")


if __name__ == "__main__":
    main()
