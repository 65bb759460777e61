"""Every collective op on every dtype, in place and not; run as ``mpiexec -n N python this``.

Each rank checks its own results exactly and prints ``RANK <r> OK`` at the end; any mismatch
raises (non-zero exit, which mpiexec reports).
"""

import os

import numpy as np

from ferrocaffe import core, workspace

R = int(os.environ["PMI_RANK"])
S = int(os.environ["PMI_SIZE"])
DTYPES = [np.float32, np.float64, np.int32, np.int64]


def run(net):
    workspace.RunNetOnce(net)


def expect_error(net, *fragments):
    try:
        run(net)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        msg = str(e)
        for f in fragments:
            assert f in msg, (f, msg)
        return msg
    raise AssertionError(f"no error, expected one containing {fragments}")


def mine(dt, shape=(2, 3), rank=R):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * rank).astype(dt)


def total(dt, shape=(2, 3)):
    return sum(mine(dt, shape, r) for r in range(S)).astype(dt)


def feed(name, arr):
    workspace.FeedBlob(name, np.ascontiguousarray(arr))


def fetch(name):
    return workspace.FetchBlob(name)


def check(name, want):
    got = fetch(name)
    assert got.dtype == np.asarray(want).dtype, (name, got.dtype, np.asarray(want).dtype)
    np.testing.assert_array_equal(got, want, err_msg=f"rank {R}: {name}")


init = core.Net("init")
init.CreateCommonWorld([], "cw", engine="MPI", size=S, rank=R, timeout_ms=60000)
init.MPICreateCommonWorld([], "mpi_cw")
init.CloneCommonWorld(["cw"], "cw2", engine="MPI")
run(init)

for dt in DTYPES:
    # Allreduce: out of place, in place, several inputs, Caffe2's MPI name.
    feed("X", mine(dt))
    n = core.Net("allreduce")
    n.Allreduce(["cw", "X"], ["Y"], engine="MPI")
    run(n)
    check("Y", total(dt))
    check("X", mine(dt))
    n = core.Net("allreduce_inplace")
    n.Allreduce(["cw", "X"], ["X"], engine="MPI")
    run(n)
    check("X", total(dt))
    feed("A", mine(dt))
    feed("B", 2 * mine(dt))
    n = core.Net("allreduce_many")
    n.Allreduce(["cw2", "A", "B"], ["A", "B"], engine="MPI")
    run(n)
    check("A", 3 * total(dt))
    check("B", 3 * total(dt))
    feed("X", mine(dt, (5,)))
    n = core.Net("mpi_allreduce")
    n.MPIAllreduce(["mpi_cw", "X"], ["Z"])
    run(n)
    check("Z", total(dt, (5,)))

    # Broadcast from the last rank; other ranks start with another shape.
    root = S - 1
    feed("X", mine(dt) if R == root else np.zeros((1,), dt))
    feed("W", np.zeros((4, 4), dt))
    n = core.Net("broadcast")
    n.Broadcast(["cw", "X", "W"], ["X", "W"], engine="MPI", root=root)
    run(n)
    check("X", mine(dt, rank=root))
    check("W", mine(dt, rank=root))
    feed("X", mine(dt, (3,)))
    n = core.Net("mpi_broadcast")
    n.MPIBroadcast(["mpi_cw", "X"], ["X"], root=0)
    run(n)
    check("X", mine(dt, (3,), rank=0))

    # Reduce onto rank 1 % S: other ranks keep their output as it was.
    root = 1 % S
    feed("X", mine(dt))
    feed("Y", np.full((1,), 7, dt))
    n = core.Net("reduce")
    n.Reduce(["cw", "X"], ["Y"], engine="MPI", root=root)
    run(n)
    check("Y", total(dt) if R == root else np.full((1,), 7, dt))
    check("X", mine(dt))
    n = core.Net("reduce_inplace")
    n.MPIReduce(["mpi_cw", "X"], ["X"], root=root)
    run(n)
    check("X", total(dt) if R == root else mine(dt))

    # Allgather: ranks stacked along the first dimension, several inputs rank-major.
    feed("X", mine(dt))
    feed("V", -mine(dt))
    n = core.Net("allgather")
    n.Allgather(["cw", "X"], ["G"], engine="MPI")
    n.Allgather(["cw", "X", "V"], ["G2"], engine="MPI")
    n.MPIAllgather(["mpi_cw", "X"], ["G3"])
    run(n)
    check("G", np.concatenate([mine(dt, rank=r) for r in range(S)]))
    check("G3", np.concatenate([mine(dt, rank=r) for r in range(S)]))
    check(
        "G2", np.concatenate([a for r in range(S) for a in (mine(dt, rank=r), -mine(dt, rank=r))])
    )

    # ReduceScatter on 7 elements: uneven blocks, zeros outside this rank's block.
    counts = [7 // S + (r < 7 % S) for r in range(S)]
    start = sum(counts[:R])
    want = np.zeros(7, dt)
    want[start : start + counts[R]] = total(dt, (7,))[start : start + counts[R]]
    feed("X", mine(dt, (7,)))
    n = core.Net("reduce_scatter")
    n.ReduceScatter(["cw", "X"], ["Y"], engine="MPI")
    n.MPIReduceScatter(["mpi_cw", "X"], ["X"])
    run(n)
    check("Y", want)
    check("X", want)

# Barrier, and dtypes that only move (bool, uint8) through broadcast and gather.
n = core.Net("barrier")
n.Barrier(["cw"], [], engine="MPI")
run(n)
feed("M", np.array([R % 2 == 0, True, False]))
feed("U", np.arange(4, dtype=np.uint8) + R)
n = core.Net("bytes")
n.Broadcast(["cw", "M"], ["M"], engine="MPI", root=S - 1)
n.Allgather(["cw", "U"], ["UG"], engine="MPI")
run(n)
check("M", np.array([(S - 1) % 2 == 0, True, False]))
check("UG", np.concatenate([np.arange(4, dtype=np.uint8) + r for r in range(S)]))

# Point to point around a ring: with the shape (default), raw, and peer/tag from inputs.
nxt, prv = (R + 1) % S, (R - 1) % S
for raw in (False, True):
    feed("P", mine(np.float64, (2, 2)))
    feed("Q", np.zeros((2, 2)) if raw else np.zeros((9,), np.int32))
    send = core.Net("send")
    send.SendTensor(["cw", "P"], [], engine="MPI", dst=nxt, tag=100 + R, raw_buffer=raw)
    recv = core.Net("recv")
    recv.ReceiveTensor(["cw", "Q"], ["Q", "src", "tag"], engine="MPI", src=prv, raw_buffer=raw)
    for net in (send, recv) if R % 2 == 0 else (recv, send):
        run(net)
    check("Q", mine(np.float64, (2, 2), rank=prv))
    check("src", np.int32(prv))
    check("tag", np.int32(100 + prv))
feed("P", mine(np.int64, (3,)))
feed("dst", np.array(nxt, np.int32))
feed("src", np.array(prv, np.int32))
feed("tag", np.array(7, np.int32))
send = core.Net("send2")
send.MPISendTensor(["mpi_cw", "P", "dst", "tag"], [])
recv = core.Net("recv2")
recv.MPIReceiveTensor(["mpi_cw", "Q", "src", "tag"], ["Q", "src", "tag"])
for net in (send, recv) if R % 2 == 0 else (recv, send):
    run(net)
check("Q", mine(np.int64, (3,), rank=prv))
check("src", np.int32(prv))
check("tag", np.int32(7))

# Errors: a reduction of bools, a wrong size, a destroyed world.
feed("M", np.array([True]))
n = core.Net("bad_dtype")
n.Allreduce(["cw", "M"], ["M"], engine="MPI")
expect_error(n, "reductions support", "'M'")
n = core.Net("bad_size")
n.CreateCommonWorld([], "cw3", engine="MPI", size=S + 1)
expect_error(n, f"size={S + 1}", f"MPI runs {S} processes")
n = core.Net("destroy")
n.DestroyCommonWorld(["cw2"], ["cw2"], engine="MPI")
run(n)
feed("X", mine(np.float32))
n = core.Net("after_destroy")
n.Allreduce(["cw2", "X"], ["X"], engine="MPI")
expect_error(n, "'cw2' was destroyed")

n = core.Net("final")
n.Barrier(["cw"], [], engine="MPI")
run(n)
print(f"RANK {R} OK", flush=True)
