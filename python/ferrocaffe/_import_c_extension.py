"""Caffe2's ``_import_c_extension`` (imported as ``C``): the native module and the flags
saying which backends it has.

Caffe2 loaded the CUDA build of its extension, else the ROCm one, else the CPU one; here the
native module is always ``ferrocaffe._native`` and its names are re-exported. The cuDNN-only
names of Caffe2's CUDA build (``cudnn_convolution_fwd_algo_count``, ...) do not exist, as on
a CPU-only Caffe2.
"""

from ferrocaffe import workspace as _workspace
from ferrocaffe._native import *  # noqa: F401,F403

has_cuda_support = _workspace.has_cuda_support
has_gpu_support = _workspace.has_gpu_support
has_hip_support = _workspace.has_hip_support
