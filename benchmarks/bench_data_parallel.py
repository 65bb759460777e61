"""Weak scaling of data_parallel_model over MPI processes, beside MPI's all-reduce bandwidth
and an alpha-beta model of what N hosts would give.

    python benchmarks/bench_data_parallel.py [--procs 1 2 4] [--models 10,16,4 512,2048,16]

For each model (an MLP ``in,hidden,classes``: the first is ``examples/data_parallel_mpi.py``'s,
the golden dpm.mlp_sgd model; the second a wider one whose gradient is megabytes) and each
process count p it runs ``mpiexec -n p`` processes (p = 1: one plain process, no rendezvous),
each training the model on ``--devices-per-process`` CPU devices with the same per-process
batch, and times ``data_parallel_model.RunNet`` (barrier net + training net, gradients summed
over the devices and then over the processes by ``Allreduce`` ops of the MPI engine).
Weak-scaling efficiency is t1 / tp per iteration (1.0: adding processes costs nothing).

It then times the MPI engine's all-reduce (``benchmarks/bench_collectives.py``'s measurement,
2 and 4 processes, 4 KiB .. ``--max-mib``), fits the ring model

    t_allreduce(n, p) = 2(p-1) * alpha + 2(p-1)/p * n / B

and prints, per model, the all-reduce time the model predicts for the model's gradients (one
Allreduce per parameter blob, as data_parallel_model issues them) and the efficiency
t1 / (t1 + t_allreduce) that N hosts would give (no overlap of communication with compute)
on this machine's fitted alpha and B, and on a network (``--net-gbit``, ``--net-alpha-us``).

Each process uses ``--threads`` compute threads (FERROCAFFE_NUM_THREADS, 1 by default) so that
p processes want p cores: on a machine with fewer cores than processes (this one has 2) the
larger counts are oversubscribed, and their efficiency measures CPU sharing, not the network.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import bench_collectives  # noqa: E402


def parse_dims(s):
    dims = tuple(int(x) for x in s.split(","))
    if len(dims) != 3:
        raise argparse.ArgumentTypeError(f"a model is in,hidden,classes, not {s!r}")
    return dims


def param_sizes(dims):
    """Bytes of each parameter's gradient (float32), as data_parallel_model all-reduces them."""
    n_in, n_hidden, n_out = dims
    return [4 * n_hidden * n_in, 4 * n_hidden, 4 * n_out * n_hidden, 4 * n_out]


def worker(args):
    import data_parallel_mpi as ex

    from ferrocaffe import core, data_parallel_model, workspace

    rank, size = ex.mpi_rank_size()
    dims = args.dims
    devices = list(range(args.devices_per_process))
    rendezvous = None
    if size > 1:
        rendezvous = dict(
            engine="MPI", shard_id=rank, num_shards=size, kv_handler=None, timeout_ms=120000
        )
    model = ex.build_model("bench_dp", devices, rendezvous, dims=dims, barrier_net_timeout_sec=120)
    ex.start_model(model, devices, 0, dims, None, rank)
    rows = args.batch_per_device * len(devices) * size
    data, label = ex.global_batch(0, 0, rows, dims)
    ex.feed_slices(data, label, devices, rank * len(devices), len(devices) * size)
    align = None
    if size > 1:
        init = core.Net("bench_align_init")
        init.CreateCommonWorld([], "bench_align_cw", engine="MPI", size=size, timeout_ms=120000)
        workspace.RunNetOnce(init)
        align = core.Net("bench_align")
        align.Barrier(["bench_align_cw"], [], engine="MPI")
        workspace.CreateNet(align)
    data_parallel_model.RunNet(model, args.warmup)
    iters = args.iterations
    times = []
    for _ in range(args.repeats):
        if align is not None:
            workspace.RunNet(align.Proto().name)
        t0 = time.perf_counter()
        data_parallel_model.RunNet(model, iters)
        times.append((time.perf_counter() - t0) / iters)
    if rank == 0:
        print(f"RESULT {min(times):.9e} {np.median(times):.9e}", flush=True)


def run_procs(p, args, dims):
    env = dict(os.environ)
    env["FERROCAFFE_NUM_THREADS"] = str(args.threads)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--dims",
        ",".join(map(str, dims)),
        "--devices-per-process",
        str(args.devices_per_process),
        "--batch-per-device",
        str(args.batch_per_device),
        "--iterations",
        str(args.iterations),
        "--repeats",
        str(args.repeats),
        "--warmup",
        str(args.warmup),
    ]
    if p > 1:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        if not os.path.exists(mpiexec):
            mpiexec = "mpiexec"
        cmd = [mpiexec, "-n", str(p)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT"):
            _, best, median = line.split()
            return float(best), float(median)
    raise SystemExit(f"no RESULT from {' '.join(cmd)}:\n{out.stdout}{out.stderr}")


def allreduce_time(alpha, bw, p, sizes):
    """One ring all-reduce per gradient blob (sequential: an upper bound)."""
    return sum(bench_collectives.model(alpha, bw, p, n) for n in sizes) if p > 1 else 0.0


def human(n):
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--models", type=parse_dims, nargs="+", default=[(10, 16, 4), (512, 2048, 16)])
    ap.add_argument("--dims", type=parse_dims, default=(10, 16, 4), help=argparse.SUPPRESS)
    ap.add_argument("--devices-per-process", type=int, default=2)
    ap.add_argument("--batch-per-device", type=int, default=32)
    ap.add_argument("--iterations", type=int, default=20, help="timed iterations per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="FERROCAFFE_NUM_THREADS per process")
    ap.add_argument("--max-mib", type=int, default=8, help="largest all-reduce timed")
    ap.add_argument("--net-gbit", type=float, default=25.0)
    ap.add_argument("--net-alpha-us", type=float, default=20.0)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    cpus = os.cpu_count()
    print(
        f"weak scaling of data_parallel_model over MPI on this machine: {cpus} CPUs; each "
        f"process {args.devices_per_process} CPU devices x {args.batch_per_device} rows, "
        f"{args.threads} compute thread(s)"
    )
    over = [p for p in args.procs if p * args.threads > cpus]
    if over:
        print(
            f"NOTE: this machine has only {cpus} cores: {', '.join(map(str, over))} "
            f"process(es) are oversubscribed (more threads than cores); their efficiency "
            f"measures CPU sharing, not communication"
        )
    results = {}
    for dims in args.models:
        for p in args.procs:
            results[dims, p] = run_procs(p, args, dims)

    coll_procs = sorted({p for p in args.procs if p > 1}) or [2]
    coll = {p: bench_collectives.measure(p, args.max_mib << 20) for p in coll_procs}
    # Fit on the counts that have a core per process (an oversubscribed rank that is not
    # scheduled stalls the others: that is not the model's alpha).
    fit_procs = [p for p in coll if p <= cpus] or list(coll)
    points = [(p, n, t) for p in fit_procs for n, t in coll[p].items()]
    alpha, bw = bench_collectives.fit(points)
    print(
        f"\nMPI all-reduce (float32, in place, shared memory): ring fit on p = "
        f"{', '.join(map(str, fit_procs))}: alpha = {alpha * 1e6:.2f} us, "
        f"B = {bw / 1e9:.2f} GB/s"
    )
    print(f"{'p':>2} {'size':>10} {'time':>11} {'model':>11} {'busbw GB/s':>11}")
    for p, r in coll.items():
        for n, t in sorted(r.items()):
            print(
                f"{p:>2} {human(n):>10} {t * 1e6:>9.1f}us "
                f"{bench_collectives.model(alpha, bw, p, n) * 1e6:>9.1f}us "
                f"{2 * (p - 1) / p * n / t / 1e9:>11.3f}"
            )

    net_bw = args.net_gbit * 1e9 / 8
    net_alpha = args.net_alpha_us * 1e-6
    for dims in args.models:
        sizes = param_sizes(dims)
        grad = sum(sizes)
        t1 = results[dims, min(args.procs)][0]
        print(
            f"\nmodel MLP {dims[0]}->{dims[1]}->{dims[2]}: gradients {human(grad)} in "
            f"{len(sizes)} Allreduce ops ({', '.join(human(n) for n in sizes)})"
        )
        print(
            f"{'p':>2} {'ms/iter':>9} {'median':>9} {'efficiency':>10} {'allreduce model ms':>19}"
        )
        for p in args.procs:
            best, median = results[dims, p]
            flag = "  (oversubscribed)" if p in over else ""
            print(
                f"{p:>2} {best * 1e3:>9.3f} {median * 1e3:>9.3f} {t1 / best:>10.2f} "
                f"{allreduce_time(alpha, bw, p, sizes) * 1e3:>19.3f}{flag}"
            )
        print(
            f"  alpha-beta model for N hosts (t1 = {t1 * 1e3:.3f} ms of compute per iteration, "
            f"no overlap): efficiency t1 / (t1 + t_allreduce)"
        )
        here = f"alpha {alpha * 1e6:.1f} us, {bw / 1e9:.2f} GB/s (fit)"
        there = f"{args.net_gbit:g} Gbit/s, {args.net_alpha_us:g} us"
        print(f"  {'N':>4} {here:>30} {there:>26}")
        for n_hosts in [2, 4, 8, 16, 64, 256]:
            local = allreduce_time(alpha, bw, n_hosts, sizes)
            net = allreduce_time(net_alpha, net_bw, n_hosts, sizes)
            print(
                f"  {n_hosts:>4} {local * 1e3:>17.3f} ms {t1 / (t1 + local):>8.2f} "
                f"{net * 1e3:>13.3f} ms {t1 / (t1 + net):>8.2f}"
            )


if __name__ == "__main__":
    main()
