"""Which GEMM the engine's matrix products run on.

Every FC, MatMul, BatchMatMul and Conv (and through them the RNN step nets) calls one
single-precision GEMM: the pure-Rust ``gemm`` crate, or a CBLAS library loaded at run time.
``import ferrocaffe`` picks the backend:

- ``FERROCAFFE_BLAS`` unset: the OpenBLAS that numpy's wheels bundle (the ``scipy-openblas64``
  build in ``numpy.libs``), so numpy and ferrocaffe share one library and one thread pool
  (two OpenBLAS pools spinning on the same cores slow each other down several times); else
  the ``scipy-openblas32`` or ``scipy-openblas64`` package when installed; else ``gemm``;
- ``FERROCAFFE_BLAS=gemm``: the ``gemm`` crate;
- ``FERROCAFFE_BLAS=/path/to/libcblas.so``: that CBLAS library (``cblas_sgemm`` exported).

OpenBLAS sizes its thread pool from ``OPENBLAS_NUM_THREADS`` (default: all cores).
"""

import glob
import importlib.util
import os

from ferrocaffe import _native

__all__ = ["autoload", "backend", "load", "use_cblas", "use_small_kernels"]


def load(path):
    """Loads the CBLAS library at ``path`` and runs every GEMM on it."""
    _native.blas_load(os.fspath(path))


def use_cblas(enabled):
    """Switches between the loaded CBLAS library (True) and the ``gemm`` crate (False)."""
    _native.blas_set_enabled(bool(enabled))


def use_small_kernels(enabled):
    """Turns ferrocaffe's own kernels for products with one small dimension (RNN steps, batch
    weight gradients; AVX-512 CPUs only) on or off; they are on by default."""
    _native.blas_set_small_kernels(bool(enabled))


def backend():
    """``'cblas:<library path>'`` or ``'gemm'``."""
    return _native.blas_backend()


def _shared_libraries(folder, prefix):
    found = sorted(glob.glob(os.path.join(folder, prefix + "*")))
    return [f for f in found if f.endswith((".so", ".dylib", ".dll"))]


def _default_library():
    """numpy's bundled OpenBLAS, else a scipy-openblas package's, else None."""
    spec = importlib.util.find_spec("numpy")
    for root in (spec.submodule_search_locations or []) if spec else []:
        site = os.path.dirname(os.path.abspath(root))
        for folder in ("numpy.libs", os.path.join("numpy", ".dylibs")):
            found = _shared_libraries(os.path.join(site, folder), "libscipy_openblas")
            if found:
                return found[0]
    for package in ("scipy_openblas32", "scipy_openblas64"):
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            found = _shared_libraries(os.path.join(root, "lib"), "libscipy_openblas")
            if found:
                return found[0]
    return None


def autoload():
    """Applies ``FERROCAFFE_BLAS`` (see the module doc); returns the backend in use."""
    choice = os.environ.get("FERROCAFFE_BLAS", "").strip()
    if choice.lower() == "gemm":
        use_cblas(False)
    elif choice:
        load(choice)
    else:
        path = _default_library()
        if path is not None:
            load(path)
    return backend()
