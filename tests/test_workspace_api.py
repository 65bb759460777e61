"""Caffe2's workspace object API (``workspace.C.Workspace``, ``Blob``, ``TensorCPU``, ``Net``)
and the module functions around it: blob sizes, torch tensors, immediate mode, Predictor."""

import os

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def fresh():
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    yield
    workspace.StopImmediate()
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()


def _fill_net(name="fill", blob="b", value=1.0):
    net = core.Net(name)
    net.ConstantFill([], blob, shape=[2, 3], value=value)
    return net


def test_a_new_workspace_is_separate_and_empty():
    ws = workspace.C.Workspace()
    assert ws.blobs == {} and ws.nets == {}
    ws.run(_fill_net())
    assert "b" in ws.blobs and not workspace.HasBlob("b")
    np.testing.assert_array_equal(ws.blobs["b"].fetch(), np.ones((2, 3), np.float32))


def test_current_wraps_the_module_workspace():
    assert "b" not in workspace.C.Workspace.current.blobs
    workspace.RunNetOnce(_fill_net())
    assert "b" in workspace.C.Workspace.current.blobs
    workspace.ResetWorkspace()
    assert "b" not in workspace.C.Workspace.current.blobs


def test_create_net_overwrite_and_run():
    ws = workspace.C.Workspace()
    net = _fill_net("made")
    handle = ws.create_net(net)
    assert handle.name == "made"
    with pytest.raises(RuntimeError):
        ws.create_net(net)
    ws.create_net(net, True)
    ws.create_net(net, overwrite=True).run()
    assert list(ws.nets) == ["made"]
    ws.nets["made"].run()
    assert ws.blobs["b"].fetch().shape == (2, 3)
    with pytest.raises(TypeError):
        ws.create_net("not a net")
    with pytest.raises(TypeError):
        ws.run(42)


def test_run_operator_net_and_plan_objects():
    ws = workspace.C.Workspace()
    ws.run(core.CreateOperator("ConstantFill", [], ["o"], shape=[1], value=2.0))
    np.testing.assert_array_equal(ws.blobs["o"].fetch(), [2.0])
    net = _fill_net("in_plan", "p")
    plan = core.Plan("plan")
    plan.AddStep(core.ExecutionStep("step", nets=[net], num_iter=1))
    ws.run(plan)
    assert "p" in ws.blobs
    ws.run(core.ExecutionStep("as_plan", _fill_net("stepnet", "s")))
    assert "s" in ws.blobs


def test_blob_feed_copies_and_fetch_copies():
    ws = workspace.C.Workspace()
    value = np.array([1.0, 2.0])
    ws.create_blob("v").feed(value)
    value[0] = 9.0
    got = ws.blobs["v"].fetch()
    np.testing.assert_array_equal(got, [1.0, 2.0])
    got[1] = 7.0  # a copy: the blob keeps its value
    np.testing.assert_array_equal(ws.blobs["v"].fetch(), [1.0, 2.0])
    assert ws.blobs["v"].is_tensor()
    ws.create_blob("s").feed(b"bytes")
    assert not ws.blobs["s"].is_tensor()
    assert ws.blobs["s"].fetch() == b"bytes"


def test_tensor_handle_writes_in_place_and_initializes():
    ws = workspace.C.Workspace()
    ws.create_blob("t").feed(np.array([1.1, 1.2, 1.3]))
    t = ws.blobs["t"].tensor()
    before = ws.blobs["t"].fetch()
    t.data[0] = 3.3
    np.testing.assert_array_equal(ws.blobs["t"].fetch(), [3.3, 1.2, 1.3])
    np.testing.assert_array_equal(before, [1.1, 1.2, 1.3])
    t.init([2, 3], core.DataType.INT32)
    t.data[1, 1] = 100
    expected = np.zeros((2, 3), np.int32)
    expected[1, 1] = 100
    np.testing.assert_array_equal(ws.blobs["t"].fetch(), expected)
    assert t.shape == (2, 3)
    with pytest.raises(RuntimeError):
        t.init([3, 4], core.DataType.STRING)
    strings = np.array([[b"abc", b"def"]], dtype=object)
    t.feed(strings)
    assert t.data[0, 1] == b"def"
    val = np.array([1.5, 2.5])
    t.feed(val)
    val[0] = 0.0
    assert t.data[0] == 1.5
    copy = t.fetch()
    t.data[0] = 5.0
    assert copy[0] == 1.5 and t.fetch()[0] == 5.0
    t.reshape([2, 1])
    assert t.shape == (2, 1)


def test_serialize_and_deserialize_through_blob_handles():
    ws = workspace.C.Workspace()
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    ws.create_blob("x").feed(x)
    data = ws.blobs["x"].serialize("x")
    assert caffe2_pb2.BlobProto.FromString(data).name == "x"
    assert caffe2_pb2.BlobProto.FromString(ws.blobs["x"].serialize("other")).name == "other"
    copy = ws.create_blob("x_serde")
    copy.deserialize(data)
    np.testing.assert_array_equal(copy.fetch(), x)
    ws.create_blob("s").feed(b"text")
    ws.create_blob("s_serde").deserialize(ws.blobs["s"].serialize("s"))
    assert ws.blobs["s_serde"].fetch() == b"text"


def test_blob_size_bytes():
    for dtype in [np.float16, np.float32, np.float64, np.bool_, np.int8, np.uint16, np.int64]:
        workspace.FeedBlob("sized", np.zeros((2, 3), dtype=dtype))
        assert workspace.GetBlobSizeBytes("sized") == 6 * np.dtype(dtype).itemsize
    workspace.FeedBlob("s1", np.array([b"Hello World!", b"abcd"]))
    workspace.FeedBlob("s2", np.array([b"element1", b"element2"]))
    assert workspace.GetBlobSizeBytes("s1") - workspace.GetBlobSizeBytes("s2") == 0
    workspace.FeedBlob("s3", np.array([b"a", b""]))
    assert workspace.GetBlobSizeBytes("s1") - workspace.GetBlobSizeBytes("s3") == 16 - 1


def test_torch_tensors_feed_and_fetch():
    torch = pytest.importorskip("torch")
    workspace.FeedBlob("t", torch.arange(4, dtype=torch.int64))
    fetched = workspace.FetchBlob("t")
    assert fetched.dtype == np.int64
    np.testing.assert_array_equal(fetched, [0, 1, 2, 3])
    back = workspace.FetchTorch("t")
    assert isinstance(back, torch.Tensor) and back.dtype == torch.int64
    assert workspace.C.Workspace.current.blobs["t"].to_torch().tolist() == [0, 1, 2, 3]


def test_torch_tensors_stay_bound_to_their_blobs():
    torch = pytest.importorskip("torch")
    workspace.RunOperatorOnce(
        core.CreateOperator("ConstantFill", [], "foo", shape=(4,), value=2, dtype=10)
    )
    t = workspace.FetchTorch("foo")
    t.resize_(5)
    t[4] = t[2] = 777
    np.testing.assert_array_equal(workspace.FetchBlob("foo"), [2, 2, 777, 2, 777])
    # An op changing the blob (shape included) changes the fed tensor.
    z = torch.ones((4,), dtype=torch.int64)
    workspace.FeedBlob("bar", z)
    workspace.RunOperatorOnce(core.CreateOperator("Reshape", ["bar"], ["bar", "_"], shape=(2, 2)))
    assert tuple(z.shape) == (2, 2)
    z[0, 1] = 123
    np.testing.assert_array_equal(workspace.FetchBlob("bar"), [[1, 123], [1, 1]])
    # The blob never holds torch's memory: torch may reallocate it.
    z.resize_(100)
    z.fill_(0)
    workspace.FeedBlob("bar", np.array([5, 6]))  # feeding something else unbinds z
    z.fill_(1)
    np.testing.assert_array_equal(workspace.FetchBlob("bar"), [5, 6])


def test_immediate_mode_runs_ops_in_their_own_workspace():
    workspace.StartImmediate(i_know=True)
    assert workspace.IsImmediate()
    root = workspace._immediate_root_folder
    assert os.path.isdir(root)
    net = core.Net("immediate")
    net.ConstantFill([], "imm", shape=[2], value=3.0)
    assert workspace.ImmediateBlobs() == ["imm"]
    np.testing.assert_array_equal(workspace.FetchImmediate("imm"), [3.0, 3.0])
    assert not workspace.HasBlob("imm")
    workspace.StopImmediate()
    assert not workspace.IsImmediate() and not os.path.exists(root)
    assert workspace._immediate_root_folder == ""


def test_predictor_runs_the_init_net_once_and_the_predict_net_per_call():
    init = core.Net("init")
    init.ConstantFill([], "w", shape=[2, 3], value=1.0)
    init.ConstantFill([], "bias", shape=[2], value=0.5)
    predict = core.Net("predict")
    y = predict.FC(["data", "w", "bias"], "y")
    predict.AddExternalOutput(y)
    p = workspace.Predictor(init.Proto().SerializeToString(), predict.Proto())
    (out,) = p.run([np.array([[1.0, 2.0, 3.0]], dtype=np.float32)])
    np.testing.assert_allclose(out, [[6.5, 6.5]])
    (out,) = p.run({"data": np.zeros((1, 3), np.float32)})
    np.testing.assert_allclose(out, [[0.5, 0.5]])
    with pytest.raises(RuntimeError):
        p.run([np.zeros((1, 3), np.float32)] * 2)


def test_operator_cost_of_a_convolution():
    op = core.CreateOperator("Conv2D", ["X", "W"], ["Y"], stride=1, pad=1, kernel=3, order="NCHW")
    workspace.FeedBlob("X", np.zeros((1, 8, 8, 8)))  # float64: 8 bytes an element
    workspace.FeedBlob("W", np.zeros((1, 1, 3, 3)))
    cost = workspace.GetOperatorCost(op.SerializeToString(), ["X", "W"])
    assert cost == (1152, 256, 4168)
    assert cost.flops == 1152 and cost.bytes_read == 4168
    with pytest.raises(RuntimeError, match="[Cc]ost"):
        workspace.GetOperatorCost(core.CreateOperator("Softsign", ["X"], ["Y"]), ["X"])


def _conv_model():
    net = core.Net("convs")
    net.Conv(["data", "w", "b"], "c", kernel=3, engine="CUDNN")
    net.Relu("c", "c")
    return net


def test_apply_transform_and_if_faster():
    net = _conv_model()
    out = workspace.ApplyTransform("ConvToNNPack", net.Proto())
    assert [o.engine for o in out.op] == ["NNPACK", ""]
    assert net.Proto().op[0].engine == "CUDNN"
    with pytest.raises(RuntimeError, match="no_such_transform"):
        workspace.ApplyTransform("no_such_transform", net.Proto())
    init = core.Net("init")
    init.ConstantFill([], "data", shape=[1, 2, 5, 5], value=1.0)
    init.ConstantFill([], "w", shape=[2, 2, 3, 3], value=0.5)
    init.ConstantFill([], "b", shape=[2], value=0.0)
    # Never "faster" by a factor of 1000: the original comes back.
    kept = workspace.ApplyTransformIfFaster(
        "ConvToNNPack", net.Proto(), init.Proto(), 1, 2, improvement_threshold=1000.0
    )
    assert kept.op[0].engine == "CUDNN"
    workspace.RunNetOnce(init)
    workspace.RunNetOnce(out)
    np.testing.assert_allclose(workspace.FetchBlob("c"), np.full((1, 2, 3, 3), 9.0))
