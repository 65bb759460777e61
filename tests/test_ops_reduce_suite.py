"""Reduction, gather and utility kernels that Caffe2's reduce_ops / reduction_ops / gather_ops /
utility_ops tests exercise: ReduceFront*/ReduceBack* (with LENGTHS) and their gradient ops,
ReduceL1/L2, SumElementsInt, RowwiseMax/ColwiseMax, Gather/BatchGather with match_outer, Range,
LengthsToRanges, LengthsGather, LengthsRangeFill and NanCheck, each against numpy. Numerical
gradient checks of the differentiable ones are in tests/gradcheck_specs.py."""

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import core, workspace

RNG = np.random.default_rng(7)


def x4():
    return RNG.random((3, 4, 2, 5)).astype(np.float32)


@pytest.mark.parametrize("k", [0, 1, 2, 4])
@pytest.mark.parametrize(
    "name,fn", [("Sum", np.sum), ("Mean", np.mean), ("Max", np.max)], ids=["sum", "mean", "max"]
)
def test_front_and_back_reductions(k, name, fn):
    x = x4()
    (front,) = run("ReduceFront" + name, {"X": x}, ["Y"], num_reduce_dim=k)
    np.testing.assert_allclose(front, fn(x, axis=tuple(range(k))), rtol=1e-5)
    (back,) = run("ReduceBack" + name, {"X": x}, ["Y"], num_reduce_dim=k)
    np.testing.assert_allclose(back, fn(x, axis=tuple(range(4 - k, 4))), rtol=1e-5)


def test_reductions_with_lengths():
    x = RNG.random((2, 3, 4)).astype(np.float32)
    front_len = np.array([1, 2, 2, 1, 1, 2, 2, 1, 1, 1, 2, 2], np.int32)
    (y,) = run("ReduceFrontMean", {"X": x, "L": front_len}, ["Y"], num_reduce_dim=1)
    flat = x.reshape(2, 12)
    want = np.array([flat[: front_len[j], j].mean() for j in range(12)]).reshape(3, 4)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    back_len = np.array([4, 1, 3, 2, 2, 1], np.int32)
    (y,) = run("ReduceBackMax", {"X": x, "L": back_len}, ["Y"], num_reduce_dim=1)
    rows = x.reshape(6, 4)
    want = np.array([rows[i, : back_len[i]].max() for i in range(6)]).reshape(2, 3)
    np.testing.assert_array_equal(y, want)
    with pytest.raises(RuntimeError, match="out of range"):
        run("ReduceBackSum", {"X": x, "L": back_len + 4}, ["Y"], num_reduce_dim=1)


def test_front_sum_gradient_reads_shape_or_data():
    x = x4()
    dy = RNG.random((2, 5)).astype(np.float32)
    (a,) = run("ReduceFrontSumGradient", {"dY": dy, "X": x}, ["dX"], num_reduce_dim=2)
    shape = np.array(x.shape, np.int64)
    (b,) = run("ReduceFrontSumGradient", {"dY": dy, "S": shape}, ["dX1"], num_reduce_dim=2)
    np.testing.assert_array_equal(a, np.broadcast_to(dy, x.shape))
    np.testing.assert_array_equal(a, b)
    (m,) = run("ReduceBackMeanGradient", {"dY": x, "S": np.array([3, 4, 2, 5, 6])}, ["dM"])
    np.testing.assert_allclose(m, np.repeat(x[..., None] / 6, 6, axis=-1), rtol=1e-6)


def test_front_sum_empty_batch_then_full():
    net = core.Net("front_sum")
    net.ReduceFrontSum(["X"], ["Y"], num_reduce_dim=2)
    workspace.FeedBlob("X", np.ones((2, 4, 3), np.float32))
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    np.testing.assert_array_equal(workspace.FetchBlob("Y"), np.full(3, 8.0, np.float32))
    workspace.FeedBlob("X", np.ones((0, 4, 3), np.float32))
    workspace.RunNet(net.Name())
    np.testing.assert_array_equal(workspace.FetchBlob("Y"), np.zeros(3, np.float32))


def test_max_gradient_routes_to_the_maxima():
    x = np.array([[1.0, 5.0], [3.0, 2.0]], np.float32)
    y = x.max(axis=0)
    dy = np.array([10.0, 20.0], np.float32)
    (dx,) = run("ReduceFrontMaxGradient", {"dY": dy, "X": x, "Y": y}, ["dX"])
    np.testing.assert_array_equal(dx, [[0.0, 20.0], [10.0, 0.0]])


@pytest.mark.parametrize("axes", [None, [0], [1, 2], [0, 2]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_l1_l2(axes, keepdims):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    args = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
    ax = None if axes is None else tuple(axes)
    (l1,) = run("ReduceL1", {"X": x}, ["Y"], **args)
    np.testing.assert_allclose(l1, np.abs(x).sum(axis=ax, keepdims=bool(keepdims)), rtol=1e-5)
    (l2,) = run("ReduceL2", {"X": x}, ["Y"], **args)
    want = np.sqrt((x * x).sum(axis=ax, keepdims=bool(keepdims)))
    np.testing.assert_allclose(l2, want, rtol=1e-5)


def test_reduce_l_gradients():
    x = np.array([[3.0, -4.0], [0.0, 0.0]], np.float32)
    y = np.array([5.0, 0.0], np.float32)
    dy = np.array([2.0, 1.0], np.float32)
    (d2,) = run("ReduceL2Gradient", {"dY": dy, "X": x, "Y": y}, ["dX"], axes=[1], keepdims=0)
    np.testing.assert_allclose(d2, [[1.2, -1.6], [0.0, 0.0]], rtol=1e-6)
    (d1,) = run("ReduceL1Gradient", {"dY": dy, "X": x, "Y": y}, ["dX"], axes=[1], keepdims=0)
    np.testing.assert_array_equal(d1, [[2.0, -2.0], [0.0, 0.0]])


def test_sum_elements_int_and_batch_max():
    x = np.array([3, -1, 7], np.int32)
    (s,) = run("SumElementsInt", {"X": x}, ["Y"])
    assert s.dtype == np.int32 and s.shape == () and s == 9
    with pytest.raises(RuntimeError):
        run("SumElementsInt", {"F": x.astype(np.float32)}, ["Y"])
    b = RNG.random((2, 3, 4)).astype(np.float32)
    (r,) = run("RowwiseMax", {"X": b}, ["R"])
    np.testing.assert_array_equal(r, b.max(axis=2))
    (c,) = run("ColwiseMax", {"X": b}, ["C"])
    np.testing.assert_array_equal(c, b.max(axis=1))


def test_gather_match_outer_and_batch_gather():
    data = RNG.random((3, 4, 5)).astype(np.float32)
    ind = RNG.integers(0, 4, size=(3, 6)).astype(np.int32)
    want = np.stack([data[i, ind[i]] for i in range(3)])
    (g,) = run("Gather", {"D": data, "I": ind}, ["Y"], axis=1, match_outer=True)
    np.testing.assert_array_equal(g, want)
    (b,) = run("BatchGather", {"D": data, "I": ind}, ["Z"], match_outer=True)
    np.testing.assert_array_equal(b, want)
    (plain,) = run("BatchGather", {"D": data, "I": ind}, ["P"])
    np.testing.assert_array_equal(plain, data.take(ind, axis=1))
    dy = RNG.random(want.shape).astype(np.float32)
    (dd,) = run(
        "BatchGatherGradient", {"D": data, "I": ind, "dY": dy}, ["dD"], axis=1, match_outer=1
    )
    expect = np.zeros_like(data)
    for i in range(3):
        np.add.at(expect[i], ind[i], dy[i])
    np.testing.assert_allclose(dd, expect, rtol=1e-6)
    with pytest.raises(RuntimeError, match="match_outer"):
        run("Gather", {"D": data, "I": ind[:2]}, ["Y"], axis=1, match_outer=True)


def test_gather_axis2_4d_match_outer():
    data = RNG.random((2, 3, 4, 5)).astype(np.float32)
    ind = RNG.integers(0, 4, size=(2, 3, 2, 2)).astype(np.int32)
    (g,) = run("Gather", {"D": data, "I": ind}, ["Y"], axis=2, match_outer=True)
    want = np.zeros((2, 3, 2, 2, 5), np.float32)
    for i in range(2):
        for j in range(3):
            want[i, j] = data[i, j, ind[i, j]]
    np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize(
    "args",
    [(10,), (np.float32(10.0),), (0,), (0, 0), (10.0, 5.0, -1.0), (2, 100, 7), (2, 100, -1)],
)
def test_range(args):
    arrays = [np.array(v) for v in args]
    names = ["a", "b", "c"][: len(arrays)]
    (y,) = run("Range", dict(zip(names, arrays, strict=True)), ["Y"])
    want = np.arange(*arrays)
    assert y.dtype == arrays[0].dtype  # the inputs' type
    np.testing.assert_array_equal(y, want)


def test_range_errors():
    with pytest.raises(RuntimeError, match="Step size cannot be 0"):
        run("Range", {"a": np.array(0), "b": np.array(10), "c": np.array(0)}, ["Y"])
    with pytest.raises(RuntimeError, match="same type"):
        run("Range", {"a": np.array(0), "b": np.array(1.0)}, ["Y"])


def test_lengths_utilities():
    lengths = np.array([2, 0, 3, 1], np.int32)
    (r,) = run("LengthsToRanges", {"L": lengths}, ["R"])
    assert r.dtype == np.int32
    np.testing.assert_array_equal(r, [[0, 2], [2, 0], [2, 3], [5, 1]])
    (f,) = run("LengthsRangeFill", {"L": lengths}, ["F"])
    np.testing.assert_array_equal(f, [0, 1, 0, 1, 2, 0])
    items = RNG.random((6, 2)).astype(np.float32)
    idx = np.array([2, 0, 2, 1], np.int32)
    (g,) = run("LengthsGather", {"items": items, "L": lengths, "I": idx}, ["G"])
    np.testing.assert_array_equal(g, np.concatenate([items[2:5], items[0:2], items[2:5]]))
    with pytest.raises(RuntimeError):
        run("LengthsGather", {"items": items, "L": lengths, "I": np.array([4], np.int32)}, ["G"])


def test_nan_check():
    x = RNG.random((3, 2)).astype(np.float32)
    (y,) = run("NanCheck", {"X": x, "other": np.ones(3, np.float32)}, ["Y"])
    np.testing.assert_array_equal(y, x)
    x[1, 1] = np.nan
    with pytest.raises(RuntimeError, match="NaN or inf"):
        run("NanCheck", {"X": x}, ["Y"])
    x[1, 1] = np.inf
    with pytest.raises(RuntimeError, match="NaN or inf"):
        run("NanCheck", {"X": x}, ["Y"])
    ops, g_in = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("NanCheck", ["X"], ["Y"]), ["Y_grad"]
    )
    assert [o.type for o in ops] == ["NanCheck"] and g_in == ["X_grad"]


def test_gradient_makers_of_front_back_reductions():
    op = core.CreateOperator("ReduceFrontMax", ["X", "L"], ["Y"], num_reduce_dim=2)
    ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [o.type for o in ops] == ["ReduceFrontMaxGradient"]
    assert list(ops[0].input) == ["Y_grad", "X", "Y", "L"] and g_in == ["X_grad", None]
    op = core.CreateOperator("ReduceBackSum", ["X"], ["Y"])
    ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [o.type for o in ops] == ["ReduceBackSumGradient"]
    assert list(ops[0].input) == ["Y_grad", "X"]
