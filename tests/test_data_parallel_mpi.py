"""data_parallel_model over MPI processes: ``examples/data_parallel_mpi.py`` under
``mpiexec -n 2`` ends with the parameters of one process holding all the devices, a checkpoint
written by shard 0 of a 2-process run resumes with 4 processes (and with 1) to the parameters of
an uninterrupted run, and a process that dies makes the others fail with an error naming the
collective instead of hanging.

``mpiexec`` comes from the ``mpich`` wheel of the ``test`` extra (next to the Python
executable); the tests are skipped, saying why, only where it is missing or cannot start a
process.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi_util import GUARD_S, MPIEXEC, mpi_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "data_parallel_mpi.py")
SCRIPTS = os.path.join(ROOT, "tests", "mpi_scripts")
PARAMS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")
ITERATIONS = 12


@pytest.fixture(scope="module")
def mpiexec():
    if MPIEXEC is None:
        pytest.skip("mpiexec not found (pip install mpich, or the package's [test] extra)")
    try:
        p = subprocess.run(
            [MPIEXEC, "-n", "2", sys.executable, "-c", "pass"],
            capture_output=True,
            text=True,
            timeout=120,
            env=mpi_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"{MPIEXEC} cannot start processes here: {e}")
    if p.returncode != 0:
        pytest.skip(f"{MPIEXEC} -n 2 cannot start processes here: {(p.stdout + p.stderr)[-500:]}")
    return MPIEXEC


def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=GUARD_S, env=mpi_env())
    return p, p.stdout + p.stderr


def _example(mpiexec, n, *args):
    cmd = [EXAMPLE, "--iterations", str(ITERATIONS), *args]
    if n is None:
        return _run([sys.executable, *cmd])
    return _run([mpiexec, "-n", str(n), sys.executable, *cmd])


def _load(path):
    with np.load(path) as f:
        return {p: f[p] for p in PARAMS}


def _assert_params_close(got, want):
    for p in PARAMS:
        np.testing.assert_allclose(got[p], want[p], rtol=1e-5, atol=1e-6, err_msg=p)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, mpiexec):
    """The uninterrupted run in one process with 4 CPU devices (no rendezvous, no MPI)."""
    out = str(tmp_path_factory.mktemp("dpm_mpi") / "one_process.npz")
    p, log = _example(
        mpiexec, None, "--devices-per-process", "4", "--no-reference", "--output", out
    )
    assert p.returncode == 0, log
    assert "1 process(es) x 4 CPU devices" in log, log
    params = _load(out)
    # Training moved the parameters away from where they started.
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import data_parallel_mpi
    finally:
        sys.path.pop(0)
    init = data_parallel_mpi.initial_params(0)
    assert all(np.max(np.abs(params[k] - init[k])) > 1e-3 for k in ("fc1_w", "fc2_w"))
    return params


def test_two_processes_end_with_the_parameters_of_one_process(mpiexec, one_process, tmp_path):
    out = str(tmp_path / "n2.npz")
    p, log = _example(mpiexec, 2, "--output", out)
    assert p.returncode == 0, log
    assert "2 process(es) x 2 CPU devices, global batch 48 (12 rows per device)" in log, log
    assert "one process with 4 CPU devices" in log, log
    assert "against the one-process run" in log and "(OK, tolerance" in log, log
    assert "largest difference between the ranks' parameters" in log, log
    _assert_params_close(_load(out), one_process)


@pytest.mark.parametrize("resume_n", [4, 1])
def test_checkpoint_of_two_processes_resumes_with_another_count(
    mpiexec, one_process, tmp_path, resume_n
):
    ckpt = str(tmp_path / "ckpt.minidb")
    p, log = _example(mpiexec, 2, "--checkpoint", ckpt, "--stop-after", "5")
    assert p.returncode == 0, log
    assert os.path.exists(ckpt), log
    assert "checkpoint after 5 iterations" in log and "optimizer_iteration" in log, log
    # The checkpoint holds the first device's parameters after 5 iterations, not the end's.
    out = str(tmp_path / "resumed.npz")
    p, log = _example(mpiexec, resume_n, "--resume", ckpt, "--output", out)
    assert p.returncode == 0, log
    assert f"{resume_n} process(es) x 2 CPU devices" in log, log
    assert f"iterations 5 -> {ITERATIONS} (resumed from" in log, log
    assert "(OK, tolerance" in log, log
    _assert_params_close(_load(out), one_process)


def test_a_dead_process_makes_the_others_fail_naming_the_collective(mpiexec):
    p, log = _run(
        [
            mpiexec,
            "-disable-auto-cleanup",
            "-n",
            "2",
            sys.executable,
            os.path.join(SCRIPTS, "dpm_dead_rank.py"),
        ]
    )
    assert "RANK 0 ITERATION 1 DONE" in p.stdout and "RANK 1 LEAVING" in p.stdout, log
    lines = {ln.split(" ")[2]: ln for ln in p.stdout.splitlines() if ln.startswith("RANK 0 ")}
    # data_parallel_model.RunNet: the barrier net before the training net.
    err = lines.get("RUNNET", "")
    assert "RUNNET ERROR" in err, log
    assert "Barrier (engine MPI) on common world 'pre_training_barrier_cw'" in err, err
    assert "timed out after 2000 ms" in err and "rank 0 of 2" in err, err
    # The training net alone: its first gradient all-reduce.
    err = lines.get("TRAIN_NET", "")
    assert "TRAIN_NET ERROR" in err, log
    assert "Allreduce (engine MPI) on common world 'allreduce_" in err, err
    assert "timed out after 3000 ms" in err and "rank 0 of 2" in err, err
