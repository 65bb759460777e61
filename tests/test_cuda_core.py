"""The CUDA backend on a GPU: blobs on the device, the cuBLAS ops, the copy ops, the CPU
fallback, memory, mixed CPU/GPU nets and a model trained under ``DeviceScope(CUDA)``, each
against the same work on the CPU. Skipped where no CUDA device is present."""

from __future__ import annotations

import numpy as np
import pytest

from ferrocaffe import _native, brew, core, model_helper, optimizer, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

CUDA = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)
CPU = caffe2_pb2.DeviceOption()


@pytest.fixture(autouse=True)
def _fresh():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _ws():
    return workspace._ws()


def _run_both(op_type, inputs: dict, outputs, **args):
    """Runs the op on the CPU and on CUDA from the same inputs; returns both output lists."""
    results = []
    for dev in (CPU, CUDA):
        workspace.ResetWorkspace()
        for k, v in inputs.items():
            workspace.FeedBlob(k, v, dev)
        op = core.CreateOperator(op_type, list(inputs), outputs, device_option=dev, **args)
        workspace.RunOperatorOnce(op)
        results.append([workspace.FetchBlob(o) for o in outputs])
    return results


def _close(a, b, rtol=1e-4, atol=1e-5):
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(5, dtype=np.int32),
        np.array([1, -2, 3], dtype=np.int64),
        np.array([True, False]),
        np.zeros((0, 3), np.float32),
        np.float32(2.5),
    ],
    ids=["f32", "i32", "i64", "bool", "empty", "scalar"],
)
def test_feed_to_the_device_and_fetch_back(arr):
    workspace.FeedBlob("x", arr, CUDA)
    assert _ws().blob_device("x") == 0
    back = workspace.FetchBlob("x")
    assert back.dtype == np.asarray(arr).dtype and back.shape == np.asarray(arr).shape
    np.testing.assert_array_equal(back, arr)


def test_feed_under_a_device_scope_places_the_blob():
    with core.DeviceScope(CUDA):
        workspace.FeedBlob("x", np.ones(3, np.float32))
    workspace.FeedBlob("y", np.ones(3, np.float32))
    assert _ws().blob_device("x") == 0 and _ws().blob_device("y") is None


def test_relu_and_its_gradient():
    x = np.random.RandomState(0).randn(4, 5).astype(np.float32)
    cpu, gpu = _run_both("Relu", {"x": x}, ["y"])
    _close(cpu, gpu)
    cpu, gpu = _run_both("ReluGradient", {"y": np.maximum(x, 0), "dy": x * 2}, ["dx"])
    _close(cpu, gpu)


@pytest.fixture(params=["1", "0"], ids=["cublaslt", "cublas"])
def fc_path(request, monkeypatch):
    """FC with the bias in cuBLASLt's epilogue, and with cuBLAS plus a bias kernel."""
    monkeypatch.setenv("FERROCAFFE_CUBLASLT", request.param)
    return request.param


@pytest.mark.parametrize(
    "m,k,n", [(4, 3, 5), (64, 128, 32), (1, 1, 1), (33, 17, 5), (0, 3, 2), (3, 0, 2)]
)
def test_fc_and_gradient(m, k, n, fc_path):
    rs = np.random.RandomState(1)
    x = rs.randn(m, k).astype(np.float32)
    w = rs.randn(n, k).astype(np.float32)
    b = rs.randn(n).astype(np.float32)
    cpu, gpu = _run_both("FC", {"x": x, "w": w, "b": b}, ["y"])
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)
    dy = rs.randn(m, n).astype(np.float32)
    cpu, gpu = _run_both("FCGradient", {"x": x, "w": w, "dy": dy}, ["dw", "db", "dx"])
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)


def test_fc_transposed_and_axis(fc_path):
    rs = np.random.RandomState(2)
    x = rs.randn(2, 3, 4).astype(np.float32)
    wt = rs.randn(12, 5).astype(np.float32)
    b = rs.randn(5).astype(np.float32)
    cpu, gpu = _run_both("FCTransposed", {"x": x, "w": wt, "b": b}, ["y"])
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)
    w = rs.randn(5, 4).astype(np.float32)
    cpu, gpu = _run_both("FC", {"x": x, "w": w, "b": b}, ["y"], axis=2)
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)
    dy = rs.randn(2, 5).astype(np.float32)
    cpu, gpu = _run_both("FCTransposedGradient", {"x": x, "w": wt, "dy": dy}, ["dw", "db", "dx"])
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul(ta, tb):
    rs = np.random.RandomState(3)
    a = rs.randn(*((7, 6) if ta else (6, 7))).astype(np.float32)
    b = rs.randn(*((5, 7) if tb else (7, 5))).astype(np.float32)
    cpu, gpu = _run_both("MatMul", {"a": a, "b": b}, ["y"], trans_a=ta, trans_b=tb)
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    "ashape,bshape,args",
    [
        ((3, 4, 5), (3, 5, 2), {}),
        ((2, 3, 4, 5), (2, 3, 6, 5), {"trans_b": 1}),
        ((3, 4, 5), (5, 2), {"broadcast": 1}),
    ],
    ids=["batched", "trans_b-4d", "broadcast-b"],
)
def test_batch_matmul(ashape, bshape, args):
    rs = np.random.RandomState(4)
    a = rs.randn(*ashape).astype(np.float32)
    b = rs.randn(*bshape).astype(np.float32)
    cpu, gpu = _run_both("BatchMatMul", {"a": a, "b": b}, ["y"], **args)
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)


def test_copy_ops_move_between_host_and_device():
    x = np.arange(6, dtype=np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("CopyCPUToGPU", ["x"], ["g"], device_option=CUDA))
    assert _ws().blob_device("g") == 0
    workspace.RunOperatorOnce(core.CreateOperator("CopyGPUToCPU", ["g"], ["h"], device_option=CUDA))
    assert _ws().blob_device("h") is None
    workspace.RunOperatorOnce(
        core.CreateOperator("EnsureCPUOutput", ["g"], ["e"], device_option=CUDA)
    )
    assert _ws().blob_device("e") is None
    workspace.RunOperatorOnce(core.CreateOperator("Copy", ["g"], ["c"], device_option=CUDA))
    assert _ws().blob_device("c") == 0
    for name in "ghec":
        np.testing.assert_array_equal(workspace.FetchBlob(name), x)


def test_an_op_without_a_cuda_kernel_runs_through_the_fallback():
    # Where has no CUDA kernel of its own: its CPU kernel runs, the output lands on the GPU.
    c = np.array([True, False, True])
    a = np.array([1, 2, 3], np.float32)
    b = np.array([9, 8, 7], np.float32)
    cpu, gpu = _run_both("Where", {"c": c, "a": a, "b": b}, ["y"])
    _close(cpu, gpu)
    assert _ws().blob_device("y") == 0


def test_a_fallback_op_in_place_on_a_device_blob():
    workspace.FeedBlob("it", np.array([5], np.int64), CUDA)
    workspace.RunOperatorOnce(core.CreateOperator("Iter", ["it"], ["it"], device_option=CUDA))
    assert workspace.FetchBlob("it")[0] == 6
    assert _ws().blob_device("it") == 0


def test_shape_ops_share_device_memory():
    workspace.FeedBlob("x", np.arange(12, dtype=np.float32), CUDA)
    workspace.RunOperatorOnce(
        core.CreateOperator("Reshape", ["x"], ["y", "old"], shape=[3, 4], device_option=CUDA)
    )
    assert _ws().blob_device("y") == 0
    np.testing.assert_array_equal(workspace.FetchBlob("y"), np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(workspace.FetchBlob("old"), [12])


def test_a_device_tensor_given_to_a_cpu_op_is_an_error_not_a_crash():
    workspace.FeedBlob("x", np.ones(3, np.float32), CUDA)
    with pytest.raises(RuntimeError, match="CUDA"):
        workspace.RunOperatorOnce(core.CreateOperator("Tanh", ["x"], ["y"]))


def test_serializing_a_device_blob_equals_the_host_blob():
    x = np.arange(10, dtype=np.float32)
    workspace.FeedBlob("x", x)
    host = workspace.SerializeBlob("x")
    workspace.FeedBlob("x", x, CUDA)
    assert workspace.SerializeBlob("x") == host


def test_memory_is_reused_and_returned_on_reset():
    x = np.ones((256, 256), np.float32)
    workspace.FeedBlob("x", x, CUDA)
    net = core.Net("chain")
    for i in range(10):
        net.Relu("x" if i == 0 else f"y{i - 1}", f"y{i}")
    net.Proto().device_option.CopyFrom(CUDA)
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    in_use, cached = _native.cuda_memory_stats(0)
    workspace.RunNet(net.Name())
    assert _native.cuda_memory_stats(0)[0] == in_use  # the second run allocated nothing new
    workspace.ResetWorkspace()
    assert _native.cuda_memory_stats(0) == (0, 0)
    del cached


def test_a_mixed_cpu_gpu_net_with_injected_copies():
    net = core.Net("mixed")
    with core.DeviceScope(CPU):
        net.Scale("x", "x2", scale=2.0)
    with core.DeviceScope(CUDA):
        net.Relu("x2", "y")
    with core.DeviceScope(CPU):
        net.Scale("y", "z", scale=3.0)
    new_net, _ = core.InjectCrossDeviceCopies(net)
    x = np.array([-1, 2, -3, 4], np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(new_net)
    np.testing.assert_allclose(workspace.FetchBlob("z"), np.maximum(2 * x, 0) * 3)
    types = [op.type for op in new_net.Proto().op]
    assert "CopyCPUToGPU" in types and "CopyGPUToCPU" in types


def test_run_all_on_gpu():
    net = core.Net("all")
    net.Relu("x", "y")
    net.RunAllOnGPU()
    workspace.FeedBlob("x", np.array([-1, 1], np.float32), CUDA)
    workspace.RunNetOnce(net)
    assert _ws().blob_device("y") == 0
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [0, 1])


def _train(device, iters=5):
    workspace.ResetWorkspace()
    rs = np.random.RandomState(7)
    data = rs.randn(16, 8).astype(np.float32)
    label = rs.randint(0, 4, size=16).astype(np.int32)
    model = model_helper.ModelHelper(name="mlp")
    with core.DeviceScope(device):
        fc1 = brew.fc(model, "data", "fc1", dim_in=8, dim_out=16)
        r = brew.relu(model, fc1, "r")
        fc2 = brew.fc(model, r, "fc2", dim_in=16, dim_out=4)
        _, loss = model.net.SoftmaxWithLoss([fc2, "label"], ["softmax", "loss"])
        model.AddGradientOperators([loss])
        optimizer.build_sgd(model, base_learning_rate=0.1)
    workspace.FeedBlob("data", data, device)
    workspace.FeedBlob("label", label, device)
    workspace.RunNetOnce(model.param_init_net)
    # The same initial parameters on both devices.
    for p in model.params:
        workspace.FeedBlob(
            str(p), rs.randn(*workspace.FetchBlob(str(p)).shape).astype(np.float32), device
        )
    workspace.CreateNet(model.net)
    losses = []
    for _ in range(iters):
        workspace.RunNet(model.net.Name())
        losses.append(float(workspace.FetchBlob("loss")))
    return losses, {str(p): workspace.FetchBlob(str(p)) for p in model.params}


def test_a_model_trains_under_a_cuda_device_scope_as_on_the_cpu():
    cpu_losses, cpu_params = _train(CPU)
    gpu_losses, gpu_params = _train(CUDA)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for k, v in cpu_params.items():
        np.testing.assert_allclose(gpu_params[k], v, rtol=1e-3, atol=1e-5)
    assert gpu_losses[-1] < gpu_losses[0]


def test_cast_from_a_dtype_without_a_cuda_kernel_runs_the_cpu_kernel():
    x = np.array([1.5, -2.25, 3.0], np.float64)
    cpu, gpu = _run_both("Cast", {"x": x}, ["y"], to=caffe2_pb2.TensorProto.FLOAT)
    _close(cpu, gpu)
    assert _ws().blob_device("y") == 0


def test_matmul_takes_the_shape_of_a_third_input():
    rs = np.random.RandomState(5)
    a = rs.randn(4, 3).astype(np.float32)
    b = rs.randn(3, 6).astype(np.float32)
    like = np.zeros((2, 2, 6), np.float32)
    cpu, gpu = _run_both("MatMul", {"a": a, "b": b, "like": like}, ["y"])
    _close(cpu, gpu, rtol=1e-3, atol=1e-4)
    assert gpu[0].shape == (2, 2, 6)


def test_reshape_reads_a_shape_input_that_lives_on_the_device():
    x = np.arange(6, dtype=np.float32)
    cpu, gpu = _run_both("Reshape", {"x": x, "s": np.array([2, 3], np.int64)}, ["y", "old"])
    _close(cpu, gpu)


def _lstm(device):
    from ferrocaffe import rnn_cell

    workspace.ResetWorkspace()
    rs = np.random.RandomState(11)
    t, n, d, h = 5, 3, 4, 6
    model = model_helper.ModelHelper(name="lstm")
    with core.DeviceScope(device):
        out, _, _, _ = rnn_cell.LSTM(
            model, "x", "seq", ("h0", "c0"), d, h, scope="lstm", forward_only=False
        )
        loss = model.net.AveragedLoss(model.net.Sqr(out), "loss")
        model.AddGradientOperators([loss])
    feeds = {
        "x": rs.randn(t, n, d).astype(np.float32),
        "seq": np.full(n, t, np.int32),
        "h0": rs.randn(1, n, h).astype(np.float32),
        "c0": rs.randn(1, n, h).astype(np.float32),
    }
    workspace.RunNetOnce(model.param_init_net)
    for p in model.params:
        shape = workspace.FetchBlob(str(p)).shape
        feeds[str(p)] = rs.randn(*shape).astype(np.float32) * 0.3
    for k, v in feeds.items():
        workspace.FeedBlob(k, v, device)
    workspace.RunNetOnce(model.net)
    names = ["loss"] + [str(model.param_to_grad[p]) for p in model.params]
    return {k: workspace.FetchBlob(k) for k in names}


def test_an_lstm_trains_under_a_cuda_device_scope_as_on_the_cpu():
    cpu = _lstm(CPU)
    gpu = _lstm(CUDA)
    for k, v in cpu.items():
        np.testing.assert_allclose(gpu[k], v, rtol=1e-3, atol=1e-5, err_msg=k)
