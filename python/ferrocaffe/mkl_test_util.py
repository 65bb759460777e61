"""Caffe2's ``mkl_test_util``: Hypothesis device strategies that add the MKLDNN device.

ferrocaffe has no MKLDNN backend (Caffe2's ``workspace.C.has_mkldnn`` is False here), so
``device_options`` and ``gcs`` are those of :mod:`ferrocaffe.hypothesis_test_util`; the
MKL-only pairs (``gcs_mkl_only``, ``gcs_cpu_mkl``) name ``mkl_do`` for the tests that skip
themselves without MKLDNN.
"""

import hypothesis.strategies as st

from ferrocaffe import hypothesis_test_util as hu
from ferrocaffe import workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "cpu_do",
    "device_checker_device_options",
    "device_options",
    "gcs",
    "gcs_cpu_mkl",
    "gcs_cpu_only",
    "gcs_gpu_only",
    "gcs_mkl_only",
    "gpu_do",
    "gradient_checker_device_option",
    "has_mkldnn",
    "mkl_do",
]

has_mkldnn = bool(getattr(workspace.C, "has_mkldnn", False))
cpu_do = hu.cpu_do
gpu_do = hu.gpu_do
mkl_do = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.MKLDNN)
device_options = hu.device_options + ([mkl_do] if has_mkldnn else [])


def device_checker_device_options():
    return st.just(device_options)


def gradient_checker_device_option():
    return st.sampled_from(device_options)


gcs = dict(gc=gradient_checker_device_option(), dc=device_checker_device_options())
gcs_cpu_only = dict(gc=st.sampled_from([cpu_do]), dc=st.just([cpu_do]))
gcs_gpu_only = dict(gc=st.sampled_from([gpu_do]), dc=st.just([gpu_do]))
gcs_mkl_only = dict(gc=st.sampled_from([mkl_do]), dc=st.just([mkl_do]))
gcs_cpu_mkl = dict(gc=st.sampled_from([cpu_do, mkl_do]), dc=st.just([cpu_do, mkl_do]))
