"""ferrocaffe: Caffe2, maintained. A Rust core with Caffe2's Python API.

The modules mirror Caffe2's: ``ferrocaffe.core``, ``ferrocaffe.scope``, ``ferrocaffe.workspace``,
``ferrocaffe.proto.caffe2_pb2``. ``ferrocaffe.compat.install()`` makes ``import caffe2.python...``
resolve to them.
"""

from ferrocaffe import blas as _blas
from ferrocaffe import collective as _collective
from ferrocaffe._native import __version__

_blas.autoload()
_collective.configure()

__all__ = ["__version__"]
