"""Static shape/type inference (workspace.InferShapesAndTypes) and operator cost
(workspace.GetOperatorCost): each op family's rule, checked against what running the net
produces, and Caffe2's cost numbers."""

import numpy as np
import pytest

from ferrocaffe import brew, build, core, model_helper, workspace
from ferrocaffe.proto import caffe2_pb2

T = caffe2_pb2.TensorProto

_NP_TYPES = {
    np.dtype("float32"): T.FLOAT,
    np.dtype("float64"): T.DOUBLE,
    np.dtype("int32"): T.INT32,
    np.dtype("int64"): T.INT64,
    np.dtype("bool"): T.BOOL,
    np.dtype("uint8"): T.UINT8,
    np.dtype("int8"): T.INT8,
    np.dtype("int16"): T.INT16,
    np.dtype("uint16"): T.UINT16,
    np.dtype("float16"): T.FLOAT16,
}


@pytest.fixture(autouse=True)
def fresh():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def infer_run_compare(model, uninferred=()):
    """Infers from the workspace, runs the model, and checks every blob's shape and type."""
    shapes, types = workspace.InferShapesAndTypes([model.param_init_net, model.net])
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    checked = 0
    for b in workspace.Blobs():
        if b in uninferred:
            assert b not in shapes
            continue
        arr = workspace.FetchBlob(b)
        assert shapes[b] == list(arr.shape), b
        assert types[b] == _NP_TYPES[arr.dtype], b
        checked += 1
    return checked


def feed(name, shape, dtype=np.float32):
    workspace.FeedBlob(name, np.random.rand(*shape).astype(dtype))


def test_build_module():
    assert build.CAFFE2_NO_OPERATOR_SCHEMA is False
    assert isinstance(build.build_options, dict)


def test_fc_from_dimensions():
    m = model_helper.ModelHelper(name="fc")
    brew.fc(m, "data", "fc1", dim_in=96, dim_out=32)
    brew.fc(m, "fc1", "fc2", dim_in=32, dim_out=55)
    shapes, types = workspace.InferShapesAndTypes([m.param_init_net, m.net], {"data": [8, 96]})
    assert shapes["fc1_w"] == [32, 96]
    assert shapes["fc1_b"] == [32]
    assert shapes["fc2"] == [8, 55]
    assert types["fc2"] == T.FLOAT


def test_fc_axis_and_transposed():
    m = model_helper.ModelHelper(name="fc")
    m.net.FC(["x", "w", "b"], ["y"], axis=2)
    m.net.FCTransposed(["x2", "wt", "b2"], ["y2"])
    feed("x", (4, 3, 6))
    feed("w", (5, 6))
    feed("b", (5,))
    feed("x2", (3, 6))
    feed("wt", (6, 7))
    feed("b2", (7,))
    assert infer_run_compare(m) == 8


def test_conv_pool_batchnorm_and_gradients():
    m = model_helper.ModelHelper(name="conv")
    m.NHWC2NCHW("data", "data_nchw")
    brew.conv(m, "data_nchw", "conv1", 3, 4, kernel=3, stride=2, pad=1)
    brew.spatial_bn(m, "conv1", "bn", 4, epsilon=1e-3, is_test=False)
    brew.relu(m, "bn", "bn")
    brew.max_pool(m, "bn", "pool", kernel=2, stride=2)
    brew.fc(m, "pool", "fc", dim_in=4 * 3 * 3, dim_out=5)
    brew.dropout(m, "fc", "drop", is_test=False)
    brew.softmax(m, "drop", "softmax")
    m.LabelCrossEntropy(["softmax", "label"], "xent")
    loss = m.AveragedLoss("xent", "loss")
    m.AddGradientOperators([loss])
    feed("data", (2, 11, 11, 3))
    workspace.FeedBlob("label", np.array([1, 3], dtype=np.int32))
    assert infer_run_compare(m) > 20


def test_conv_orders_and_legacy_pad():
    net = core.Net("c")
    net.Conv(["x", "w"], "y", kernel_h=3, kernel_w=2, stride_h=2, dilation=2, order="NHWC")
    net.AveragePool(["x2"], "p", kernel=3, stride=2, pad=1, legacy_pad=3)
    net.MaxPool(["x2"], "g", global_pooling=1)
    net.ConvTranspose(["x2", "wt"], "ct", kernel=3, stride=2, pad=1, adj=1)
    shapes, _ = workspace.InferShapesAndTypes(
        [net], {"x": [1, 12, 9, 3], "w": [8, 3, 2, 3], "x2": [1, 2, 6, 6], "wt": [2, 5, 3, 3]}
    )
    assert shapes["y"] == [1, 4, 7, 8]
    assert shapes["p"] == [1, 2, 4, 4]
    assert shapes["g"] == [1, 2, 1, 1]
    assert shapes["ct"] == [1, 5, 12, 12]


def test_elementwise_and_casts():
    m = model_helper.ModelHelper(name="ew")
    m.net.Add(["a", "b"], "c")
    m.net.GT(["a", "b"], "d")
    m.net.Add(["a", "v"], "e", broadcast=1, axis=2)
    m.net.Cast("a", "i", to=T.INT32)
    m.net.Cast("a", "l", to=T.INT64)
    m.net.Sigmoid("a", "s")
    feed("a", (2, 3, 4))
    feed("b", (3, 1))
    feed("v", (4,))
    assert infer_run_compare(m) == 9


def test_tensor_manipulations():
    m = model_helper.ModelHelper(name="t")
    m.net.Transpose("x", "t", axes=[2, 0, 1])
    m.net.Reshape("x", ["r", "old"], shape=[0, -1])
    m.net.Slice("x", "sl", starts=[0, 1], ends=[-1, -2])
    m.net.Tile("x", "ti", tiles=2, axis=1)
    m.net.Gather(["x", "idx"], "ga")
    m.net.Flatten("x", "fl", axis=2)
    m.net.FlattenToVec("x", "fv")
    m.net.ReduceSum("x", "rf", axes=[0, 2], keepdims=0)
    m.net.ReduceMean("x", "rb", axes=[1])
    m.net.Concat(["x", "x"], ["cc", "info"], axis=2)
    m.net.Split("x", ["s1", "s2"], axis=2, split=[1, 3])
    m.net.ConstantFill([], "k", shape=[2, 2], dtype=T.INT64)
    m.net.ConstantFill(["x"], "kx", value=1.0)
    m.net.GivenTensorIntFill([], "gi", shape=[3], values=[1, 2, 3])
    m.net.Shape("x", "sh")
    feed("x", (2, 3, 4))
    workspace.FeedBlob("idx", np.array([[1, 0], [1, 1]], dtype=np.int32))
    assert infer_run_compare(m) == 20


def test_softmax_with_loss():
    m = model_helper.ModelHelper(name="swl")
    m.SoftmaxWithLoss(["logits", "labels"], ["softmax", "loss"])
    feed("logits", (4, 3))
    workspace.FeedBlob("labels", np.array([0, 2, 1, 1], dtype=np.int32))
    assert infer_run_compare(m) == 4


def test_softmax_with_loss_along_axis_2():
    m = model_helper.ModelHelper(name="swl2")
    m.SoftmaxWithLoss(["logits", "labels"], ["probs", "loss"], axis=2)
    feed("logits", (2, 2, 4))
    workspace.FeedBlob("labels", np.array([[0, 3], [1, 2]], dtype=np.int32))
    assert infer_run_compare(m) == 4


def test_runtime_data_leaves_shapes_unknown():
    net = core.Net("u")
    net.Reshape(["x", "new_shape"], ["y", "old"])
    net.Relu("y", "z")
    shapes, types = workspace.InferShapesAndTypes([net], {"x": [2, 3]})
    assert "y" not in shapes and "z" not in shapes
    assert shapes["old"] == [2] and types["old"] == T.INT64


def test_inconsistent_op_gives_empty_result():
    net = core.Net("bad")
    net.Reshape("x", ["y", "old"], shape=[5, -1])
    assert workspace.InferShapesAndTypes([net], {"x": [4, 3]}) == ({}, {})


def test_blob_types_and_nets_proto():
    net = core.Net("concat")
    net.Concat(["A", "B"], ["C", "splits"], axis=1)
    shapes, types = workspace.InferShapesAndTypes(
        [net.Proto()],
        blob_dimensions={"A": [2, 3], "B": [2, 4]},
        nets_proto=True,
        blob_types={"A": T.INT32, "B": T.INT32},
    )
    assert shapes["C"] == [2, 7] and types["C"] == T.INT32
    assert shapes["splits"] == [2] and types["splits"] == T.INT32


def test_operator_cost_split_concat():
    workspace.FeedBlob("input", np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32))
    workspace.FeedBlob("split", np.array([1, 1, 1], dtype=np.int32))
    split = core.CreateOperator("Split", ["input", "split"], ["o1", "o2", "o3"], axis=1, add_axis=1)
    workspace.RunOperatorOnce(split)
    assert workspace.GetOperatorCost(split, split.input) == (0, 24, 36)
    concat = core.CreateOperator("Concat", ["o1", "o2", "o3"], ["out", "info"], axis=1, add_axis=1)
    workspace.RunOperatorOnce(concat)
    assert workspace.GetOperatorCost(concat, concat.input) == (0, 36, 24)
    workspace.FeedBlob("h", np.zeros((2, 3), dtype=np.float16))
    half = core.CreateOperator("Concat", ["h", "h"], ["hc", "hinfo"])
    assert workspace.GetOperatorCost(half, half.input) == (0, 24 + 8, 24)


def test_operator_cost_fc_conv_and_undefined():
    feed("x", (4, 5))
    feed("w", (3, 5))
    feed("b", (3,))
    fc = core.CreateOperator("FC", ["x", "w", "b"], ["y"])
    assert workspace.GetOperatorCost(fc, fc.input) == (4 * 3 * 11, 12 * 4, (5 * 7 + 3) * 4)
    feed("img", (1, 2, 5, 5))
    feed("filt", (4, 2, 3, 3))
    conv = core.CreateOperator("Conv", ["img", "filt"], ["out"], kernel=3)
    flops, written, read = workspace.GetOperatorCost(conv, conv.input)
    assert (flops, written, read) == (9 * 9 * 2 * 4 * 2, 36 * 4, (50 + 72) * 4)
    with pytest.raises(RuntimeError, match="Cost inference function not defined"):
        workspace.GetOperatorCost(core.CreateOperator("Print", ["x"], []), ["x"])


def test_rowwise_colwise_max_scatter_assign_and_lengths_to_ranges():
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", np.zeros((2, 3, 4), np.float32))
    workspace.FeedBlob("lengths", np.array([1, 2], np.int32))
    workspace.FeedBlob("data", np.zeros((5, 2), np.float32))
    workspace.FeedBlob("idx", np.array([0, 3], np.int64))
    workspace.FeedBlob("slices", np.ones((2, 2), np.float32))
    net = core.Net("rules")
    net.ColwiseMax("x", "col")
    net.RowwiseMax("x", "row")
    net.LengthsToRanges("lengths", "ranges")
    net.ScatterAssign(["data", "idx", "slices"], "data")
    shapes, types = workspace.InferShapesAndTypes([net])
    workspace.RunNetOnce(net)
    for name in ("col", "row", "ranges", "data"):
        assert shapes[name] == list(workspace.FetchBlob(name).shape), name
    assert shapes["col"] == [2, 4] and shapes["row"] == [2, 3] and shapes["ranges"] == [2, 2]
    assert types["ranges"] == caffe2_pb2.TensorProto.INT32
    assert types["col"] == caffe2_pb2.TensorProto.FLOAT
