"""Errors keep their kind from the Rust core to Python: out of memory is a MemoryError (the
workspace stays usable), what Caffe2 enforced in C++ is a RuntimeError with Caffe2's wording,
and a CUDA op on this build is refused at creation naming the device."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2


def setup_function(_):
    workspace.ResetWorkspace()


def test_a_fill_no_buffer_could_hold_is_a_memory_error_and_the_workspace_survives():
    op = core.CreateOperator("ConstantFill", [], ["y"], shape=[1 << 40, 1 << 30], value=1.0)
    with pytest.raises(MemoryError) as info:
        workspace.RunOperatorOnce(op)
    assert "ConstantFill" in str(info.value)
    workspace.FeedBlob("x", np.ones(3, dtype=np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["z"]))
    assert workspace.FetchBlob("z").tolist() == [1.0, 1.0, 1.0]


def test_an_op_on_a_device_without_kernels_is_refused_at_creation_naming_the_device():
    op = core.CreateOperator(
        "Relu", ["x"], ["y"], device_option=core.DeviceOption(caffe2_pb2.HIP, 0)
    )
    workspace.FeedBlob("x", np.ones(2, dtype=np.float32))
    with pytest.raises(
        RuntimeError, match="Cannot create operator of type 'Relu' on the device 'HIP'"
    ):
        workspace.RunOperatorOnce(op)


def test_enforced_failures_stay_runtime_errors():
    workspace.FeedBlob("a", np.ones((2, 3), dtype=np.float32))
    workspace.FeedBlob("b", np.ones((4, 5), dtype=np.float32))
    with pytest.raises(RuntimeError, match="Error from operator"):
        workspace.RunOperatorOnce(core.CreateOperator("MatMul", ["a", "b"], ["c"]))
    with pytest.raises(RuntimeError, match="non-existing input blob: nope"):
        workspace.RunOperatorOnce(core.CreateOperator("Relu", ["nope"], ["y"]))
