"""What a machine without a CUDA driver sees: no devices, CPU work unchanged, and CUDA ops,
feeds and nets refused with an exception that names what is missing (never a crash)."""

from __future__ import annotations

import numpy as np
import pytest

from ferrocaffe import _native, core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(
    workspace.NumCudaDevices() > 0, reason="checks the machine without a GPU"
)

CUDA = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)


@pytest.fixture(autouse=True)
def _fresh():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def test_no_devices_and_the_reason():
    assert workspace.NumCudaDevices() == 0
    assert workspace.NumGpuDevices() == 0
    # As on a CPU-only Caffe2 build, whatever the wheel carries.
    assert workspace.has_cuda_support is False
    assert workspace.has_gpu_support is False
    reason = _native.cuda_unavailable_reason()
    assert reason and ("CUDA" in reason or "cuda" in reason)


@pytest.mark.parametrize("op_type", ["Relu", "FC", "Tanh", "ConstantFill"])
def test_a_cuda_op_fails_with_an_exception_naming_the_cause(op_type):
    workspace.FeedBlob("x", np.ones((2, 3), np.float32))
    inputs = {"FC": ["x", "x", "x"], "ConstantFill": []}.get(op_type, ["x"])
    op = core.CreateOperator(op_type, inputs, ["y"], device_option=CUDA, shape=[2])
    with pytest.raises(RuntimeError) as e:
        workspace.RunOperatorOnce(op)
    msg = str(e.value)
    assert op_type in msg and ("CUDA" in msg or "cuda" in msg), msg
    # The workspace still works on the CPU afterwards.
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["z"]))
    np.testing.assert_array_equal(workspace.FetchBlob("z"), np.ones((2, 3), np.float32))


def test_a_cuda_net_fails_at_creation():
    net = core.Net("n")
    net.Relu("x", "y")
    net.Proto().device_option.CopyFrom(CUDA)
    workspace.FeedBlob("x", np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        workspace.RunNetOnce(net)


def test_feeding_to_cuda_fails_and_keeps_nothing_on_a_device():
    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        workspace.FeedBlob("x", np.ones(3, np.float32), CUDA)
    with core.DeviceScope(CUDA), pytest.raises(RuntimeError, match="CUDA|cuda"):
        workspace.FeedBlob("y", np.ones(3, np.float32))
    workspace.FeedBlob("z", np.ones(3, np.float32), caffe2_pb2.DeviceOption())
    np.testing.assert_array_equal(workspace.FetchBlob("z"), np.ones(3, np.float32))


def test_the_memory_calls_answer_without_a_device():
    _native.cuda_empty_cache()
    assert _native.cuda_memory_stats(0) == (0, 0)
    _native.cuda_synchronize()
    with pytest.raises(RuntimeError):
        _native.cuda_sgemm_seconds(8, 8, 8)
