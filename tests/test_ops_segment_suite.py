"""Segment and sparse-lengths kernels that Caffe2's segment_ops / specialized_segment_ops /
gather_ops / sparse_ops tests exercise: SortedSegment*, SparseSorted/UnsortedSegment*, the
SortedSegmentRange* reducers, LengthsMax, SparseLengthsPositionalWeightedSum, float16 tables in
SparseLengthsSum, the 8-bit row-wise ops (fused and with SCALE_BIAS), and the gradient ops and
makers of the segment reductions, each against numpy. Numerical gradient checks are in
tests/gradcheck_specs.py."""

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import core

RNG = np.random.default_rng(11)


def segment_ref(data, ids, reduce, rows=None):
    rows = np.arange(len(ids)) if rows is None else rows
    k = int(ids.max()) + 1 if len(ids) else 0
    out = np.zeros((k,) + data.shape[1:], np.float32)
    for s in range(k):
        sel = data[rows[ids == s]]
        if len(sel):
            out[s] = reduce(sel)
    return out


def logsumexp(x):
    return np.log(np.exp(x).sum(axis=0))


REDUCERS = {
    "Sum": lambda x: x.sum(axis=0),
    "Mean": lambda x: x.mean(axis=0),
}
RANGE_REDUCERS = {
    "RangeSum": lambda x: x.sum(axis=0),
    "RangeMean": lambda x: x.mean(axis=0),
    "RangeMax": lambda x: x.max(axis=0),
    "RangeLogSumExp": logsumexp,
    "RangeLogMeanExp": lambda x: np.log(np.exp(x).mean(axis=0)),
}


@pytest.mark.parametrize("name", list(REDUCERS) + list(RANGE_REDUCERS))
def test_sorted_segments(name):
    data = RNG.random((7, 2, 3)).astype(np.float32)
    ids = np.array([0, 0, 2, 2, 2, 3, 5], np.int32)
    (y,) = run("SortedSegment" + name, {"D": data, "S": ids}, ["Y"])
    ref = {**REDUCERS, **RANGE_REDUCERS}[name]
    np.testing.assert_allclose(y, segment_ref(data, ids, ref), rtol=1e-5)


@pytest.mark.parametrize("name", ["Sum", "Mean"])
@pytest.mark.parametrize("order", ["Sorted", "Unsorted"])
def test_sparse_segments(name, order):
    data = RNG.random((5, 3)).astype(np.float32)
    idx = np.array([4, 0, 4, 2, 1, 3], np.int64)
    ids = np.array([0, 0, 1, 3, 3, 3] if order == "Sorted" else [3, 0, 1, 3, 0, 3], np.int32)
    (y,) = run(f"Sparse{order}Segment{name}", {"D": data, "I": idx, "S": ids}, ["Y"])
    np.testing.assert_allclose(y, segment_ref(data, ids, REDUCERS[name], rows=idx), rtol=1e-6)


def test_segment_errors_and_empty_input():
    data = np.ones((3, 2), np.float32)
    with pytest.raises(RuntimeError, match="sorted"):
        run("SortedSegmentSum", {"D": data, "S": np.array([1, 0, 0], np.int32)}, ["Y"])
    with pytest.raises(RuntimeError, match="INDICES"):
        run(
            "SparseSortedSegmentSum",
            {"D": data, "I": np.array([0, 3], np.int32), "S": np.array([0, 0], np.int32)},
            ["Y"],
        )
    (y,) = run(
        "SortedSegmentMean", {"E": np.zeros((0, 2), np.float32), "S": np.zeros(0, np.int32)}, ["Y"]
    )
    assert y.shape == (0, 2)


def test_segment_gradients():
    dy = RNG.random((4, 2)).astype(np.float32)
    ids = np.array([0, 0, 1, 3, 3, 3], np.int32)
    (g,) = run("SortedSegmentMeanGradient", {"dY": dy, "S": ids}, ["G"])
    counts = np.bincount(ids, minlength=4)
    np.testing.assert_allclose(g, dy[ids] / counts[ids][:, None], rtol=1e-6)
    (g,) = run("SortedSegmentSumGradient", {"dY": dy, "S": ids}, ["G2"])
    np.testing.assert_array_equal(g, dy[ids])
    data = RNG.random((6, 2)).astype(np.float32)
    (y,) = run("SortedSegmentRangeLogSumExp", {"D": data, "S": ids}, ["Y"])
    (dx,) = run(
        "SortedSegmentRangeLogSumExpGradient", {"dY": dy, "D": data, "Y": y, "S": ids}, ["dX"]
    )
    np.testing.assert_allclose(dx, dy[ids] * np.exp(data - y[ids]), rtol=1e-5)


def test_segment_gradient_makers():
    op = core.CreateOperator("SparseUnsortedSegmentMean", ["D", "I", "S"], ["Y"])
    ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [o.type for o in ops] == ["UnsortedSegmentMeanGradient"]
    assert list(ops[0].input) == ["Y_grad", "S"]
    assert g_in[0].indices == "I" and g_in[0].values == "D_grad_values"
    op = core.CreateOperator("SortedSegmentRangeMax", ["D", "S"], ["Y"])
    ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert list(ops[0].input) == ["Y_grad", "D", "Y", "S"] and g_in == ["D_grad", None]
    op = core.CreateOperator("LengthsMax", ["D", "L"], ["Y"])
    ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert ops[0].type == "LengthsMaxWithMainInputAndForwardOutputGradient"
    assert list(ops[0].input) == ["Y", "Y_grad", "L", "D"]


def test_lengths_max_and_gradient():
    data = RNG.random((6, 3)).astype(np.float32)
    lengths = np.array([2, 0, 4], np.int32)
    (y,) = run("LengthsMax", {"D": data, "L": lengths}, ["Y"])
    want = np.stack([data[:2].max(0), np.zeros(3), data[2:].max(0)])
    np.testing.assert_array_equal(y, want.astype(np.float32))
    dy = RNG.random((3, 3)).astype(np.float32)
    (dx,) = run(
        "LengthsMaxWithMainInputAndForwardOutputGradient",
        {"Y": y, "dY": dy, "L": lengths, "D": data},
        ["dX"],
    )
    seg = np.repeat([0, 1, 2], lengths)
    np.testing.assert_array_equal(dx, np.where(data == y[seg], dy[seg], 0))


def test_positional_weighted_sum():
    data = RNG.random((10, 3)).astype(np.float32)
    w = RNG.random(10).astype(np.float32)
    idx = RNG.integers(0, 10, size=7).astype(np.int64)
    lengths = np.array([4, 0, 3], np.int32)
    (y,) = run(
        "SparseLengthsPositionalWeightedSum", {"D": data, "W": w, "I": idx, "L": lengths}, ["Y"]
    )
    pos = np.concatenate([np.arange(n) for n in lengths])
    (ref,) = run(
        "SparseLengthsWeightedSum", {"D": data, "W2": w[pos], "I": idx, "L": lengths}, ["R"]
    )
    np.testing.assert_allclose(y, ref, rtol=1e-6)


def test_sparse_lengths_sum_of_a_float16_table():
    table = (RNG.random((20, 8)) * 10).round().astype(np.float16)
    idx = RNG.integers(0, 20, size=9).astype(np.int64)
    lengths = np.array([5, 0, 4], np.int32)
    (y,) = run("SparseLengthsMean", {"T": table, "I": idx, "L": lengths}, ["Y"])
    assert y.dtype == np.float32
    t = table.astype(np.float32)
    want = np.stack([t[idx[:5]].mean(0), np.zeros(8), t[idx[5:]].mean(0)])
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_fused_8bit_rowwise_round_trip_and_gather():
    x = RNG.random((6, 5)).astype(np.float32)
    (q,) = run("FloatToFused8BitRowwiseQuantized", {"X": x}, ["Q"])
    assert q.dtype == np.uint8 and q.shape == (6, 13)
    scale_bias = q[:, 5:].copy().view(np.float32)
    np.testing.assert_allclose(scale_bias[:, 1], x.min(1))
    np.testing.assert_allclose(scale_bias[:, 0], (x.max(1) - x.min(1)) / 255, rtol=1e-6)
    (d,) = run("Fused8BitRowwiseQuantizedToFloat", {"Q": q}, ["D"])
    np.testing.assert_allclose(d, x, atol=(x.max() - x.min()) / 255)
    idx = np.array([5, 0, 5], np.int32)
    (g,) = run("GatherFused8BitRowwise", {"Q": q, "I": idx}, ["G"])
    np.testing.assert_array_equal(g, d[idx])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mean", [False, True])
def test_sparse_lengths_8bits_rowwise(weighted, mean):
    table = RNG.integers(0, 7, size=(30, 6)).astype(np.uint8)
    sb = RNG.random((30, 2)).astype(np.float32)
    idx = RNG.integers(0, 30, size=8).astype(np.int64)
    lengths = np.array([3, 0, 5], np.int32)
    w = RNG.random(8).astype(np.float32)
    inputs = {"T": table}
    if weighted:
        inputs["W"] = w
    inputs.update({"I": idx, "L": lengths, "SB": sb})
    name = "SparseLengths" + ("Weighted" if weighted else "") + ("Mean" if mean else "Sum")
    (y,) = run(name + "8BitsRowwise", inputs, ["Y"])
    rows = table[idx] * sb[idx, :1] + sb[idx, 1:]
    if weighted:
        rows = rows * w[:, None]
    want = np.zeros((3, 6), np.float32)
    start = 0
    for s, n in enumerate(lengths):
        if n:
            want[s] = rows[start : start + n].sum(0) / (n if mean else 1)
        start += n
    np.testing.assert_allclose(y, want, rtol=1e-5)
    bad = dict(inputs, I=idx + 100)
    with pytest.raises(RuntimeError, match="out of bounds"):
        run(name + "8BitsRowwise", bad, ["Y"])
