"""Caffe2's ``build`` module: facts about how the library was built."""

from ferrocaffe import _native

# Operator schemas are always present (Caffe2 could be built without them).
CAFFE2_NO_OPERATOR_SCHEMA = False

build_options = {
    "BUILD_SHARED_LIBS": "ON",
    "USE_CUDA": "ON" if _native.cuda_built() else "OFF",
    "USE_MPI": "ON",
}
