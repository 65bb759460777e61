"""Caffe2's ``hip_test_util``: whether a Hypothesis test's devices include HIP (ROCm)."""

from ferrocaffe.proto import caffe2_pb2

__all__ = ["run_in_hip"]


def run_in_hip(gc, dc):
    """True when the gradient-check device ``gc`` or one of the device-check devices ``dc``
    is a HIP device."""
    return gc.device_type == caffe2_pb2.HIP or any(d.device_type == caffe2_pb2.HIP for d in dc)
