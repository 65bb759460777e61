"""Data-parallel training over MPI processes with ``data_parallel_model``.

    mpiexec -n 2 python examples/data_parallel_mpi.py
    mpiexec -n 4 python examples/data_parallel_mpi.py
    python examples/data_parallel_mpi.py                 # one process, no MPI needed

Every process (a *shard*) builds the same model on ``--devices-per-process`` CPU devices with
``data_parallel_model.Parallelize_CPU(..., rendezvous=dict(engine="MPI", shard_id=rank,
num_shards=size, kv_handler=None))``: the gradients are summed over the devices of a process
and then over the processes by the MPI engine's ``Allreduce`` ops, so every process applies the
same update. The model is the golden ``dpm.mlp_sgd`` case of Caffe2's data_parallel_model
(FC(10->16) Relu FC(16->4) Softmax LabelCrossEntropy AveragedLoss, SGD at learning rate 0.1,
policy ``fixed``).

The data is a stream of global batches (``--global-batch`` rows each, batch ``i`` drawn from a
generator seeded with ``(seed, i)``, labels from a fixed random linear teacher). The global
batch is cut in one slice per device of the whole job, in rank order; each process feeds only
its own slices. As the loss of each device is scaled by 1 / (number of devices of the job), the
updates are those of one process holding all the devices, whatever the number of processes.

At the end rank 0 prints the parameters' checksum, gathers every rank's parameters (an
``Allgather`` op) to check that they agree, and replays the same global batches in ONE process
with all the devices of the job (``2 * size`` CPU devices, no rendezvous) in a workspace of its
own, printing the largest difference between the two runs; the exit status is 1 when it
exceeds ``--tolerance`` (``--no-reference`` skips the replay).

Checkpoints, as Caffe2's trainers did: ``--checkpoint FILE --stop-after K`` makes rank 0 write
``data_parallel_model.GetCheckpointParams(model)`` (the first device's parameters and the
iteration counter) with a ``Save`` op (minidb) after K iterations, then every process stops.
``--resume FILE`` (with any number of processes) has every process ``Load`` the file (it must
be readable by all of them: a shared file system here), then
``data_parallel_model.FinalizeAfterCheckpoint`` copies the first device's parameters to the
other devices and broadcasts rank 0's to the other processes; training goes on from the saved
iteration counter to ``--iterations``. ``--output FILE`` writes the final parameters (.npz).

The rank and size come from the launcher's environment (``PMI_RANK`` / ``PMI_SIZE`` of MPICH's
``mpiexec``, ``OMPI_COMM_WORLD_RANK`` / ``..._SIZE`` of Open MPI); without them the script runs
as one process without a rendezvous.
"""

import argparse
import os
import sys
import time

import numpy as np

from ferrocaffe import brew, core, data_parallel_model, model_helper, optimizer, workspace

# dpm.mlp_sgd: data [B, 10] float32, label [B] int32.
INPUT, HIDDEN, CLASSES = 10, 16, 4
PARAMS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")


def mpi_rank_size():
    """(rank, size) of this process as the MPI launcher tells it; (0, 1) without one."""
    for rank_var, size_var in (
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
    ):
        if rank_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ.get(size_var, "1"))
    return 0, 1


def add_forward(model, loss_scale, dims=(INPUT, HIDDEN, CLASSES)):
    """The forward pass of one device (in its device and name scope); returns its losses."""
    n_in, n_hidden, n_out = dims
    x = brew.fc(model, "data", "fc1", n_in, n_hidden)
    x = brew.relu(model, x, "relu1")
    x = brew.fc(model, x, "fc2", n_hidden, n_out)
    softmax = brew.softmax(model, x, "softmax")
    xent = model.LabelCrossEntropy([softmax, "label"], "xent")
    loss = model.AveragedLoss(xent, "loss")
    return [model.Scale(loss, "loss_scaled", scale=loss_scale)]


def build_model(name, devices, rendezvous, lr=0.1, dims=(INPUT, HIDDEN, CLASSES), **kwargs):
    """A ModelHelper parallelized over CPU ``devices`` (and the shards of ``rendezvous``)."""
    model = model_helper.ModelHelper(name=name)
    data_parallel_model.Parallelize_CPU(
        model,
        input_builder_fun=lambda m: None,  # the data is fed (FeedBlob) before each iteration
        forward_pass_builder_fun=lambda m, loss_scale: add_forward(m, loss_scale, dims),
        optimizer_builder_fun=lambda m: optimizer.build_sgd(
            m, base_learning_rate=lr, policy="fixed"
        ),
        devices=devices,
        rendezvous=rendezvous,
        **kwargs,
    )
    return model


def initial_params(seed, dims=(INPUT, HIDDEN, CLASSES)):
    """Deterministic initial parameters (Xavier-like), the same in every process."""
    n_in, n_hidden, n_out = dims
    rng = np.random.default_rng([seed, 1 << 20])

    def xavier(fan_out, fan_in):
        s = np.sqrt(3.0 / fan_in)
        return rng.uniform(-s, s, (fan_out, fan_in)).astype(np.float32)

    return {
        "fc1_w": xavier(n_hidden, n_in),
        "fc1_b": np.zeros(n_hidden, np.float32),
        "fc2_w": xavier(n_out, n_hidden),
        "fc2_b": np.zeros(n_out, np.float32),
    }


def global_batch(seed, iteration, rows, dims=(INPUT, HIDDEN, CLASSES)):
    """Global batch ``iteration`` of the data stream: (data [rows, in], label [rows])."""
    n_in, _, n_out = dims
    teacher = np.random.default_rng([seed, 1 << 21]).standard_normal((n_in, n_out))
    rng = np.random.default_rng([seed, iteration])
    data = rng.standard_normal((rows, n_in)).astype(np.float32)
    label = np.argmax(data @ teacher, axis=1).astype(np.int32)
    return data, label


def feed_slices(data, label, devices, first_global_device, total_devices):
    """Feed this process's slices of a global batch: device ``d`` (the
    ``first_global_device + k``-th of the job) gets rows ``[g * per, (g + 1) * per)``."""
    per = data.shape[0] // total_devices
    for k, d in enumerate(devices):
        g = first_global_device + k
        workspace.FeedBlob(f"cpu_{d}/data", data[g * per : (g + 1) * per])
        workspace.FeedBlob(f"cpu_{d}/label", label[g * per : (g + 1) * per])


def fetch_params(device=0):
    return {p: workspace.FetchBlob(f"cpu_{device}/{p}").copy() for p in PARAMS}


def flatten(params):
    return np.concatenate([params[p].ravel() for p in PARAMS]).astype(np.float64)


def checksum(params):
    """Sum and sum of absolute values of all parameters (float64)."""
    flat = flatten(params)
    return float(flat.sum()), float(np.abs(flat).sum())


def start_model(model, devices, seed, dims, resume, rank=0):
    """Run the init nets, then set the first device's parameters to the deterministic
    initial values (on rank 0) or to a checkpoint's (on every rank) and let
    FinalizeAfterCheckpoint copy them to the other devices and broadcast rank 0's to the other
    processes. Returns the iteration to start from."""
    # Dummy inputs so that the training nets can be created (shapes do not matter).
    for d in devices:
        workspace.FeedBlob(f"cpu_{d}/data", np.zeros((1, dims[0]), np.float32))
        workspace.FeedBlob(f"cpu_{d}/label", np.zeros(1, np.int32))
    data_parallel_model.RunInitNet(model)
    if resume is None:
        # Rank 0 decides; the other processes keep what their init nets drew until the
        # broadcast below.
        if rank == 0:
            for name, value in initial_params(seed, dims).items():
                workspace.FeedBlob(f"cpu_{devices[0]}/{name}", value)
    else:
        blobs = sorted(str(b) for b in data_parallel_model.GetCheckpointParams(model))
        load = core.Net("checkpoint_load")
        load.Load([], blobs, db=os.path.abspath(resume), db_type="minidb", absolute_path=1)
        workspace.RunNetOnce(load)
    data_parallel_model.FinalizeAfterCheckpoint(model, cpu_mode=True)
    return int(workspace.FetchBlob("optimizer_iteration").reshape(-1)[0])


def save_checkpoint(model, path):
    blobs = sorted(str(b) for b in data_parallel_model.GetCheckpointParams(model))
    save = core.Net("checkpoint_save")
    save.Save(blobs, [], db=os.path.abspath(path), db_type="minidb", absolute_path=1)
    workspace.RunNetOnce(save)
    return blobs


def train(model, devices, rank, total_devices, start, stop, seed, rows, dims, log=None):
    first = rank * len(devices)
    times = []
    for it in range(start, stop):
        data, label = global_batch(seed, it, rows, dims)
        feed_slices(data, label, devices, first, total_devices)
        t0 = time.perf_counter()
        data_parallel_model.RunNet(model, 1)
        times.append(time.perf_counter() - t0)
        if log is not None:
            loss = sum(float(workspace.FetchBlob(f"cpu_{d}/loss")) for d in devices) / len(devices)
            log(f"iteration {it + 1}: loss on rank {rank}'s devices {loss:.6f}")
    return times


def reference_run(total_devices, iterations, seed, rows, lr, dims):
    """The same training in this process with all ``total_devices`` devices and no rendezvous,
    in a workspace of its own; returns the final parameters."""
    previous = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace("data_parallel_mpi_reference", True)
    try:
        devices = list(range(total_devices))
        model = build_model("dp_mpi_reference", devices, None, lr=lr, dims=dims)
        start_model(model, devices, seed, dims, None)
        train(model, devices, 0, total_devices, 0, iterations, seed, rows, dims)
        return fetch_params()
    finally:
        workspace.SwitchWorkspace(previous)


def gather_params_over_ranks(params, size):
    """Every rank's flattened parameters (rows in rank order), with an Allgather op."""
    workspace.FeedBlob("check_params", flatten(params).astype(np.float32)[None, :])
    net = core.Net("check_params_gather")
    net.CreateCommonWorld([], "check_cw", engine="MPI", size=size, timeout_ms=60000)
    net.Allgather(["check_cw", "check_params"], ["all_params"], engine="MPI")
    workspace.RunNetOnce(net)
    return workspace.FetchBlob("all_params")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices-per-process", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument(
        "--global-batch",
        type=int,
        default=48,
        help="rows per global batch; a multiple of the job's device count",
    )
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", help="rank 0 writes a checkpoint here after --stop-after")
    ap.add_argument("--stop-after", type=int, help="iterations before the checkpoint and stop")
    ap.add_argument("--resume", help="every process loads this checkpoint and goes on")
    ap.add_argument("--output", help="rank 0 writes the final parameters here (.npz)")
    ap.add_argument(
        "--no-reference", action="store_true", help="skip the one-process replay on rank 0"
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        help="largest |difference| allowed against the one-process run",
    )
    ap.add_argument(
        "--timeout-sec",
        type=int,
        default=60,
        help="timeout of the collectives (a dead process makes the others fail)",
    )
    ap.add_argument("--verbose", action="store_true", help="print every iteration's loss")
    args = ap.parse_args(argv)
    if (args.checkpoint is None) != (args.stop_after is None):
        ap.error("--checkpoint and --stop-after go together")
    return args


def main(argv=None):
    args = parse_args(argv)
    rank, size = mpi_rank_size()
    dims = (INPUT, HIDDEN, CLASSES)
    devices = list(range(args.devices_per_process))
    total_devices = size * len(devices)
    if args.global_batch % total_devices:
        sys.exit(
            f"--global-batch {args.global_batch} is not a multiple of the job's "
            f"{total_devices} devices ({size} processes x {len(devices)})"
        )

    def log(msg):
        print(f"[rank {rank}/{size}] {msg}", flush=True)

    rendezvous = None
    if size > 1:
        rendezvous = dict(
            engine="MPI",
            shard_id=rank,
            num_shards=size,
            kv_handler=None,
            timeout_ms=args.timeout_sec * 1000,
        )
    model = build_model(
        "dp_mpi",
        devices,
        rendezvous,
        lr=args.lr,
        dims=dims,
        barrier_net_timeout_sec=args.timeout_sec,
    )
    start = start_model(model, devices, args.seed, dims, args.resume, rank)
    stop = args.iterations if args.stop_after is None else args.stop_after
    if rank == 0:
        print(
            f"{size} process(es) x {len(devices)} CPU devices, global batch "
            f"{args.global_batch} ({args.global_batch // total_devices} rows per device), "
            f"iterations {start} -> {stop}"
            + (f" (resumed from {args.resume})" if args.resume else ""),
            flush=True,
        )
    times = train(
        model,
        devices,
        rank,
        total_devices,
        start,
        stop,
        args.seed,
        args.global_batch,
        dims,
        log if args.verbose else None,
    )
    params = fetch_params()
    # Every device of this process holds the same parameters.
    for d in devices[1:]:
        for p, v in fetch_params(d).items():
            if not np.array_equal(v, params[p]):
                log(f"ERROR: cpu_{d}/{p} differs from cpu_0/{p}")
                return 1

    if args.checkpoint is not None:
        if rank == 0:
            blobs = save_checkpoint(model, args.checkpoint)
            print(
                f"checkpoint after {stop} iterations: {args.checkpoint} ({', '.join(blobs)})",
                flush=True,
            )
        return 0

    status = 0
    if size > 1:
        rows = gather_params_over_ranks(params, size)
        if rank == 0:
            spread = float(np.max(np.abs(rows - rows[0:1])))
            print(f"largest difference between the ranks' parameters: {spread:.3g}", flush=True)
            if spread > args.tolerance:
                print("ERROR: the ranks' parameters differ", flush=True)
                status = 1
    if rank != 0:
        return status

    total, total_abs = checksum(params)
    per_it = np.median(times) * 1e3 if times else float("nan")
    print(
        f"final parameters after {stop} iterations: checksum sum={total:.6f} "
        f"sum|.|={total_abs:.6f} ({per_it:.2f} ms per iteration)",
        flush=True,
    )
    if args.output:
        np.savez(args.output, **params)
    if not args.no_reference:
        ref = reference_run(total_devices, stop, args.seed, args.global_batch, args.lr, dims)
        diff = max(float(np.max(np.abs(params[p] - ref[p]))) for p in PARAMS)
        ref_total, ref_abs = checksum(ref)
        print(
            f"one process with {total_devices} CPU devices: checksum sum={ref_total:.6f} "
            f"sum|.|={ref_abs:.6f}",
            flush=True,
        )
        ok = diff <= args.tolerance
        print(
            f"max |difference| against the one-process run: {diff:.3g} "
            f"({'OK' if ok else 'MISMATCH'}, tolerance {args.tolerance:g})",
            flush=True,
        )
        if not ok:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
