"""Which GEMM the engine's matrix products run on.

Every FC, MatMul, BatchMatMul and Conv (and through them the RNN step nets) calls one
single-precision GEMM. ``import ferrocaffe`` picks the backend:

- ``FERROCAFFE_BLAS`` unset, or ``gemm``: ferrocaffe's own (``backend() == 'gemm'``):
  products with one small dimension (an RNN step's batch, a weight gradient summed over a
  batch) on its AVX-512/AVX2 kernels, which read the large operand in place; products of 2M
  multiply-adds and up with ``A`` not transposed on its cache-blocked AVX-512 or AVX2 kernel
  (the operands of a product read in place or packed once and shared by the threads;
  ``FERROCAFFE_BLOCKED=avx2`` keeps AVX-512 CPUs on the AVX2 kernel, ``off`` sends these
  products to the ``gemm`` crate); the rest on the pure-Rust ``gemm`` crate; products above a megaflop are shared out to one team of compute
  threads (``num_threads()``: the machine's cores, ``FERROCAFFE_NUM_THREADS=n`` caps it), which
  convolutions, pooling and element-wise work use too;
- ``FERROCAFFE_BLAS=numpy``: the OpenBLAS that numpy's wheels bundle (``numpy.libs``), or else
  the ``scipy-openblas32`` / ``scipy-openblas64`` package, for every product;
- ``FERROCAFFE_BLAS=/path/to/libcblas.so``: that CBLAS library (``cblas_sgemm`` exported).

On small machines a BLAS library's worker threads keep spinning on a core for a while after
each product (OpenBLAS 0.3: about 0.1 s), and so do ferrocaffe's compute threads (0.3 ms): a program
that alternates large numpy products with ferrocaffe nets on 2 cores may do better sharing
numpy's OpenBLAS (``FERROCAFFE_BLAS=numpy``), one pool for both.
"""

import glob
import importlib.util
import os

from ferrocaffe import _native

__all__ = [
    "autoload",
    "backend",
    "load",
    "num_threads",
    "use_blocked",
    "use_cblas",
    "use_small_kernels",
]


def load(path):
    """Loads the CBLAS library at ``path`` and runs every GEMM on it."""
    _native.blas_load(os.fspath(path))


def use_cblas(enabled):
    """Switches between the loaded CBLAS library (True) and the ``gemm`` crate (False)."""
    _native.blas_set_enabled(bool(enabled))


def use_small_kernels(enabled):
    """Turns ferrocaffe's own kernels for products with one small dimension (RNN steps, batch
    weight gradients; x86-64 CPUs with AVX-512 or AVX2) on or off; they are on by default."""
    _native.blas_set_small_kernels(bool(enabled))


def use_blocked(enabled):
    """Turns ferrocaffe's own blocked kernel for large products (FC, MatMul, convolutions;
    x86-64 CPUs with AVX-512 or AVX2) on or off; it is on by default, and off the
    ``gemm`` crate runs those products."""
    _native.blas_set_blocked(bool(enabled))


def num_threads():
    """Threads that share out one piece of work (products, convolutions, element-wise work),
    the calling thread included: the machine's cores, or ``FERROCAFFE_NUM_THREADS`` if lower
    (read once, at the first parallel piece of work)."""
    return _native.num_threads()


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
    if choice.lower() in ("", "gemm"):
        use_cblas(False)
    elif choice.lower() == "numpy":
        path = _default_library()
        if path is None:
            raise ImportError(
                "FERROCAFFE_BLAS=numpy: numpy bundles no OpenBLAS here and no scipy-openblas "
                "package is installed"
            )
        load(path)
    else:
        load(choice)
    return backend()
