"""Where the MPI engine of the collective ops (``CreateCommonWorld``, ``Allreduce``, ... with
``engine="MPI"``) finds MPI.

The Rust core loads the MPI library when the first collective op runs, in this order:

1. ``FERROCAFFE_MPI_LIBRARY`` (a path or a soname); when set, nothing else is tried;
2. an MPI library already loaded in the process (e.g. by ``mpi4py``), so both share one MPI;
3. the candidates set here: the libraries of the ``mpich`` wheel in this environment
   (``<prefix>/lib``), MPICH's ``libmpi.so.12`` first when ``mpi4py`` is installed (the
   library its wheel loads, so a later ``import mpi4py.MPI`` shares it), else the MPI 5.0
   standard-ABI ``libmpi_abi.so.1`` first;
4. the default names (``libmpi_abi.so.1``, ``libmpi.so.12``, ...), through the loader's path.

Nothing is loaded at import. At exit, MPI is finalized when ferrocaffe initialized it, unless a
collective timed out (its request cannot be cancelled, and finalizing could wait on it). ``FERROCAFFE_MPI_TIMEOUT_MS`` sets the default timeout of the
collectives (30 s otherwise; an op's ``timeout_ms`` argument, or its common world's, wins).
"""

import atexit
import importlib.util
import os
import sys

from ferrocaffe import _native

_ABI = "libmpi_abi.so.1"
_MPICH = "libmpi.so.12"


def library_candidates():
    """The MPI libraries of this Python environment, in the order they are tried."""
    names = [_ABI, _MPICH]
    if importlib.util.find_spec("mpi4py") is not None:
        names = [_MPICH, _ABI]
    prefixes = []
    for p in (sys.prefix, sys.base_prefix):
        if p not in prefixes:
            prefixes.append(p)
    found = []
    for prefix in prefixes:
        for name in names:
            path = os.path.join(prefix, "lib", name)
            if os.path.exists(path):
                found.append(path)
    return found


def configure():
    """Hands :func:`library_candidates` to the core (called at ``import ferrocaffe``)."""
    _native.mpi_set_library_candidates(library_candidates())
    atexit.register(_native.mpi_finalize)


def loaded_library():
    """``(path, abi, initialized_here)`` of the MPI library in use, or ``None`` before the
    first collective op ran. ``abi`` is ``"standard"`` (MPI 5.0 ABI) or ``"mpich"``."""
    return _native.mpi_library()
