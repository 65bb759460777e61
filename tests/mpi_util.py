"""What the tests that start MPI processes share: the mpiexec to use (the one the `mpich` wheel
puts beside this Python, else the one on PATH), a hang guard, and the environment the
processes get (this checkout's ferrocaffe first on the path, no MPI library override, no
variables of an outer MPI launcher)."""

import os
import shutil
import sys

import ferrocaffe

PYTHONPATH = os.path.dirname(os.path.dirname(os.path.abspath(ferrocaffe.__file__)))
# A hang guard for the subprocesses, far above what they need (a few seconds).
GUARD_S = 300


def _mpiexec():
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(local):
        return local
    return shutil.which("mpiexec")


MPIEXEC = _mpiexec()


def mpi_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHONPATH + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FERROCAFFE_MPI_LIBRARY", None)
    # Not under an outer MPI launcher: a script must see mpiexec's rank, or none.
    for k in list(env):
        if k.startswith(("PMI_", "OMPI_COMM_WORLD_", "MV2_COMM_WORLD_")):
            del env[k]
    env.update(extra)
    return env
