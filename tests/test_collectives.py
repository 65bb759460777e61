"""Collective ops over MPI: every op and dtype under ``mpiexec -n 2`` and ``-n 3``, a rank that
dies before an Allreduce, and the error without MPI.

The multi-process cases need ``mpiexec`` (the ``mpich`` wheel of the ``test`` extra ships it,
next to the Python executable) and are skipped only when it is not found.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi_util import GUARD_S, MPIEXEC, mpi_env

from ferrocaffe import core, workspace

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_scripts")


needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install mpich)")


def _mpirun(n, script, *flags, env=None):
    cmd = [MPIEXEC, *flags, "-n", str(n), sys.executable, os.path.join(SCRIPTS, script)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=GUARD_S, env=env or mpi_env()
    )


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_every_op_and_dtype(n):
    p = _mpirun(n, "collectives.py")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(n):
        assert f"RANK {r} OK" in p.stdout, out


@needs_mpiexec
def test_every_op_through_the_standard_abi_library():
    # The mpich wheel ships both libmpi.so.12 (MPICH's ABI, which mpi4py's wheel loads and the
    # tests above use) and libmpi_abi.so.1 (the MPI 5.0 standard ABI, other handle values).
    lib = os.path.join(os.path.dirname(os.path.dirname(MPIEXEC)), "lib", "libmpi_abi.so.1")
    if not os.path.exists(lib):
        pytest.skip(f"this mpiexec's MPI has no standard-ABI library ({lib})")
    p = _mpirun(2, "collectives.py", env=mpi_env(FERROCAFFE_MPI_LIBRARY=lib))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANK 0 OK" in p.stdout and "RANK 1 OK" in p.stdout, p.stdout + p.stderr


@needs_mpiexec
def test_a_dead_rank_makes_the_others_fail_with_a_timeout():
    p = _mpirun(2, "dead_rank.py", "-disable-auto-cleanup")
    out = p.stdout + p.stderr
    assert "RANK 1 LEAVING" in p.stdout, out
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RANK 0")]
    assert lines and lines[0].startswith("RANK 0 ERROR"), out
    err = lines[0]
    assert "Allreduce (engine MPI)" in err, err
    assert "'grad_cw'" in err, err
    assert "timed out after 2000 ms" in err, err
    assert "rank 0 of 2" in err, err
    again = [ln for ln in lines if ln.startswith("RANK 0 AGAIN")]
    assert again and "cannot be used after an earlier failure" in again[0], out


NO_MPI = """
import numpy as np
from ferrocaffe import core, workspace
op = core.CreateOperator("CreateCommonWorld", [], ["cw"], engine="MPI")
try:
    workspace.RunOperatorOnce(op)
except RuntimeError as e:
    print("ERROR:", e)
else:
    print("NO ERROR")
workspace.FeedBlob("x", np.ones(3, np.float32))
net = core.Net("n")
net.Relu(["x"], ["y"])
workspace.RunNetOnce(net)
print("RELU", workspace.FetchBlob("y").tolist())
"""


def test_without_mpi_the_ops_say_how_to_provide_it():
    env = mpi_env(FERROCAFFE_MPI_LIBRARY="/nonexistent")
    p = subprocess.run(
        [sys.executable, "-c", NO_MPI], capture_output=True, text=True, timeout=GUARD_S, env=env
    )
    assert p.returncode == 0, p.stdout + p.stderr
    err = [ln for ln in p.stdout.splitlines() if ln.startswith("ERROR:")]
    assert err, p.stdout + p.stderr
    msg = err[0]
    assert "MPI was not found" in msg, msg
    assert "FERROCAFFE_MPI_LIBRARY=/nonexistent" in msg, msg
    assert "pip install mpich" in msg, msg
    assert "CreateCommonWorld" in msg, msg
    assert "RELU [1.0, 1.0, 1.0]" in p.stdout


def test_the_ops_are_registered_and_build_into_netdefs():
    net = core.Net("dist")
    net.CreateCommonWorld([], "cw", engine="MPI", size=2, rank=0, timeout_ms=5000)
    net.Allreduce(["cw", "g1", "g2"], ["g1", "g2"], engine="MPI")
    net.Broadcast(["cw", "w"], ["w"], engine="MPI", root=0)
    proto = net.Proto()
    assert [op.type for op in proto.op] == ["CreateCommonWorld", "Allreduce", "Broadcast"]
    assert all(op.engine == "MPI" for op in proto.op)
    args = {a.name: a.i for a in proto.op[0].arg}
    assert args == {"size": 2, "rank": 0, "timeout_ms": 5000}
    for t in [
        "MPICreateCommonWorld",
        "MPIAllreduce",
        "MPIBroadcast",
        "MPIReduce",
        "MPIAllgather",
        "MPIReduceScatter",
        "MPISendTensor",
        "MPIReceiveTensor",
        "CloneCommonWorld",
        "DestroyCommonWorld",
        "Barrier",
        "ReduceScatter",
    ]:
        assert core.IsOperator(t), t


def test_wrong_engine_and_schema_errors_name_the_op():
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.FeedBlob("cw", np.ones(1, np.float32))
    with pytest.raises(Exception, match="engine='MPI'"):
        workspace.RunOperatorOnce(
            core.CreateOperator("Allreduce", ["cw", "x"], ["x"], engine="GLOO")
        )
    with pytest.raises(Exception, match="must be the same blob"):
        workspace.RunOperatorOnce(
            core.CreateOperator("Broadcast", ["cw", "x"], ["y"], engine="MPI")
        )
    workspace.FeedBlob("not_a_world", np.ones(1, np.float32))
    with pytest.raises(Exception, match="must be a common world"):
        workspace.RunOperatorOnce(
            core.CreateOperator("Allreduce", ["not_a_world", "x"], ["x"], engine="MPI")
        )
