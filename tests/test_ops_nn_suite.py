"""Convolution and pooling over any number of spatial axes (1-d, 3-d, and the 2-d names on the
N-d path), LpPool, NCHW2NHWC / NHWC2NCHW over 3 to 5 dims, and the refusals Caffe2 enforces
(a kernel that overhangs the padded input, a geometry of the wrong rank): each against a
float64 numpy reference or central differences (GradientChecker, every element)."""

import itertools

import numpy as np
import pytest

from ferrocaffe import core, utils, workspace
from ferrocaffe.gradient_checker import GradientChecker

f32 = np.float32


def run(op_type, inputs, outputs, **kw):
    names = [f"in{i}" for i in range(len(inputs))]
    for n, v in zip(names, inputs, strict=True):
        workspace.FeedBlob(n, v)
    op = core.CreateOperator(op_type, names, outputs, **kw)
    workspace.RunOperatorOnce(op)
    return [workspace.FetchBlob(o) for o in outputs]


def window_args(kernel, stride, pads):
    """The 2-d window arguments of a Conv or pooling op: ``kernel`` and ``stride`` as (h, w),
    ``pads`` as (top, left, bottom, right)."""
    return dict(
        kernel_h=kernel[0],
        kernel_w=kernel[1],
        stride_h=stride[0],
        stride_w=stride[1],
        pad_t=pads[0],
        pad_l=pads[1],
        pad_b=pads[2],
        pad_r=pads[3],
    )


def run_conv_in(order, x, wt, b, relu=False, **args):
    """Conv of NCHW ``x`` and ``wt`` (and bias ``b`` unless None) run in ``order`` (inputs
    converted to it), its output returned as NCHW. With ``relu``, the Conv and an in-place
    Relu run as one net, where the Relu is folded into the Conv."""
    xi, wi = (x, wt) if order == "NCHW" else (utils.NCHW2NHWC(x), utils.NCHW2NHWC(wt))
    ins = [np.ascontiguousarray(xi), np.ascontiguousarray(wi)] + ([] if b is None else [b])
    if relu:
        workspace.ResetWorkspace()
        names = ["X", "W", "b"][: len(ins)]
        for name, v in zip(names, ins, strict=True):
            workspace.FeedBlob(name, v)
        net = core.Net("conv_relu")
        net.Conv(names, "Y", order=order, **args)
        net.Relu("Y", "Y")
        workspace.RunNetOnce(net)
        y = workspace.FetchBlob("Y")
    else:
        (y,) = run("Conv", ins, ["Y"], order=order, **args)
    return utils.NHWC2NCHW(y) if order == "NHWC" else y


def ref_conv_nd(x, w, b, stride, pads, dil, group):
    """NCHW x [N, C, *S], w [M, C/G, *K] in float64."""
    nd = x.ndim - 2
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    xp = np.pad(
        x.astype(np.float64), [(0, 0), (0, 0)] + [(pads[d], pads[nd + d]) for d in range(nd)]
    )
    out = [(xp.shape[2 + d] - (dil[d] * (k[d] - 1) + 1)) // stride[d] + 1 for d in range(nd)]
    y = np.zeros((n, m, *out))
    mg = m // group
    for gi in range(group):
        xs = xp[:, gi * cg : (gi + 1) * cg]
        for tap in itertools.product(*[range(kk) for kk in k]):
            sl = tuple(
                slice(tap[d] * dil[d], tap[d] * dil[d] + stride[d] * (out[d] - 1) + 1, stride[d])
                for d in range(nd)
            )
            patch = xs[(slice(None), slice(None), *sl)]
            wt = w[(slice(gi * mg, (gi + 1) * mg), slice(None), *tap)].astype(np.float64)
            y[:, gi * mg : (gi + 1) * mg] += np.einsum("nc...,mc->nm...", patch, wt)
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return y


CONV_CASES = [
    # (spatial, c, m, kernel, stride, pad, dil, group)
    ((9,), 3, 4, 3, 2, 1, 1, 1),
    ((7,), 4, 6, 2, 1, 2, 2, 2),
    ((5, 4, 6), 2, 3, 2, 1, 1, 1, 1),
    ((5, 5, 4), 4, 4, 3, 2, 1, 1, 2),
    ((4, 5, 3), 2, 2, 1, 1, 0, 1, 1),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
def test_nd_conv_matches_the_reference(case, order, bias):
    spatial, c, m, k, s, p, d, g = case
    nd = len(spatial)
    rng = np.random.default_rng(len(spatial) * 7 + c)
    x = rng.standard_normal((2, c, *spatial)).astype(f32)
    w = rng.standard_normal((m, c // g, *([k] * nd))).astype(f32)
    b = rng.standard_normal(m).astype(f32)
    want = ref_conv_nd(x, w, b if bias else None, [s] * nd, [p] * (2 * nd), [d] * nd, g)
    xi, wi = (x, w) if order == "NCHW" else (utils.NCHW2NHWC(x), utils.NCHW2NHWC(w))
    ins = [np.ascontiguousarray(xi), np.ascontiguousarray(wi)] + ([b] if bias else [])
    for op_type in ["Conv", f"Conv{nd}D"]:
        (y,) = run(
            op_type,
            ins,
            ["Y"],
            kernels=[k] * nd,
            strides=[s] * nd,
            pads=[p] * (2 * nd),
            dilations=[d] * nd,
            group=g,
            order=order,
        )
        if order == "NHWC":
            y = utils.NHWC2NCHW(y)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("spatial", "order", "group", "bias"),
    [
        ((6,), "NCHW", 2, True),
        ((5,), "NHWC", 1, False),
        ((3, 4, 3), "NCHW", 1, True),
        ((3, 3, 4), "NHWC", 2, True),
    ],
)
def test_nd_conv_gradients_match_central_differences(spatial, order, group, bias):
    nd = len(spatial)
    rng = np.random.default_rng(3)
    c, m = 2 * group, 2 * group
    x = (rng.random((2, c, *spatial)) - 0.5).astype(f32)
    w = (rng.random((m, c // group, *([2] * nd))) - 0.5).astype(f32)
    if order == "NHWC":
        x, w = np.ascontiguousarray(utils.NCHW2NHWC(x)), np.ascontiguousarray(utils.NCHW2NHWC(w))
    inputs = [x, w] + ([(rng.random(m) - 0.5).astype(f32)] if bias else [])
    names = ["X", "W", "b"][: len(inputs)]
    op = core.CreateOperator(
        "Conv",
        names,
        ["Y"],
        kernels=[2] * nd,
        strides=[1] * nd,
        pads=[1] * (2 * nd),
        group=group,
        order=order,
    )
    checker = GradientChecker(0.005, 0.05, full_check=True)
    for i in range(len(inputs)):
        ok, grad, est = checker.CheckSimple(op, inputs, i, [0])
        assert ok, (i, grad, est)


def test_a_kernel_that_overhangs_the_padded_input_is_refused():
    # Caffe2 enforces in_size + pad_head + pad_tail >= dkernel, in 2-d and N-d alike.
    x = np.ones((1, 1, 2, 2), f32)
    w = np.ones((1, 1, 3, 3), f32)
    with pytest.raises(RuntimeError, match="dkernel"):
        run("Conv", [x, w], ["Y"], kernel=3, stride=2)
    with pytest.raises(RuntimeError, match="does not fit"):
        run("Conv", [np.ones((1, 1, 2), f32), np.ones((1, 1, 3), f32)], ["Y"], kernels=[3])
    with pytest.raises(RuntimeError):
        run(
            "Conv",
            [np.ones((1, 1, 2, 2, 2), f32), np.ones((1, 1, 2, 2, 3), f32)],
            ["Y"],
            kernels=[2, 2, 3],
            dilations=[1, 1, 2],
        )


def test_a_geometry_of_another_rank_than_the_input_is_refused():
    x = np.ones((1, 1, 4, 4), f32)
    with pytest.raises(RuntimeError, match="spatial axes"):
        run("MaxPool", [x], ["Y"], kernels=[2, 2, 2])
    with pytest.raises(RuntimeError, match="strides has 2 values"):
        core_op = core.CreateOperator("Conv", ["X", "W"], ["Y"], kernels=[1], strides=[1, 1])
        workspace.FeedBlob("X", np.ones((1, 1, 3), f32))
        workspace.FeedBlob("W", np.ones((1, 1, 1), f32))
        workspace.RunOperatorOnce(core_op)


def ref_pool_nd(x, kind, k, s, pads, include_pad=False, p=2.0):
    """NCHW x: (y, index of the first maximum per output) in float64."""
    nd = x.ndim - 2
    size = x.shape[2:]
    out = [(size[d] + pads[d] + pads[nd + d] - k[d]) // s[d] + 1 for d in range(nd)]
    y = np.zeros(x.shape[:2] + tuple(out))
    for o in itertools.product(*[range(v) for v in out]):
        lo = [o[d] * s[d] - pads[d] for d in range(nd)]
        hi = [min(lo[d] + k[d], size[d] + pads[nd + d]) for d in range(nd)]
        span = np.prod([hi[d] - lo[d] for d in range(nd)])
        sl = tuple(slice(max(lo[d], 0), min(hi[d], size[d])) for d in range(nd))
        win = x[(slice(None), slice(None), *sl)].astype(np.float64).reshape(x.shape[:2] + (-1,))
        if kind == "MaxPool":
            v = win.max(-1)
        elif kind == "AveragePool":
            v = win.sum(-1) / (span if include_pad else win.shape[-1])
        else:
            v = (np.abs(win) ** p).sum(-1) ** (1.0 / p)
        y[(slice(None), slice(None), *o)] = v
    return y


POOL_CASES = [
    # (spatial, kernel, stride, pad)
    ((9,), 3, 2, 1),
    ((8,), 1, 3, 0),
    ((4, 5, 4), 2, 1, 1),
    ((5, 4, 5), 3, 2, 0),
]


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    ("op_type", "include_pad"),
    [("MaxPool", False), ("AveragePool", False), ("AveragePool", True), ("LpPool", False)],
)
def test_nd_pooling_matches_the_reference(case, order, op_type, include_pad):
    spatial, k, s, p = case
    nd = len(spatial)
    x = np.random.default_rng(5).random((2, 3, *spatial)).astype(f32)
    want = ref_pool_nd(x, op_type, [k] * nd, [s] * nd, [p] * (2 * nd), include_pad, 2.5)
    xi = x if order == "NCHW" else np.ascontiguousarray(utils.NCHW2NHWC(x))
    names = [op_type] if op_type == "LpPool" else [op_type, f"{op_type}{nd}D"]
    for name in names:
        (y,) = run(
            name,
            [xi],
            ["Y"],
            kernels=[k] * nd,
            strides=[s] * nd,
            pads=[p] * (2 * nd),
            order=order,
            count_include_pad=include_pad,
            p=2.5,
        )
        if order == "NHWC":
            y = utils.NHWC2NCHW(y)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_lp_pool_on_images_matches_the_reference():
    x = np.random.default_rng(2).random((2, 3, 6, 7)).astype(f32)
    (y,) = run("LpPool", [x], ["Y"], kernel=3, stride=2, pad=1, p=3.0)
    np.testing.assert_allclose(
        y, ref_pool_nd(x, "LpPool", [3, 3], [2, 2], [1] * 4, p=3.0), rtol=1e-5
    )


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_global_3d_pooling_ignores_the_kernel(order, op_type):
    x = np.random.default_rng(1).random((2, 3, 3, 4, 2)).astype(f32)
    xi = x if order == "NCHW" else np.ascontiguousarray(utils.NCHW2NHWC(x))
    (y,) = run(op_type, [xi], ["Y"], kernels=[2, 2, 2], global_pooling=True, order=order)
    red = x.max(axis=(2, 3, 4)) if op_type == "MaxPool" else x.mean(axis=(2, 3, 4))
    want = red.reshape(2, 3, 1, 1, 1)
    if order == "NHWC":
        want = utils.NCHW2NHWC(want)
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize(
    ("op_type", "spatial", "order"),
    [
        ("AveragePool", (7,), "NCHW"),
        ("AveragePool", (3, 4, 3), "NHWC"),
        ("LpPool", (6,), "NHWC"),
        ("LpPool", (3, 3, 4), "NCHW"),
    ],
)
def test_nd_pooling_gradients_match_central_differences(op_type, spatial, order):
    nd = len(spatial)
    x = (np.random.default_rng(4).random((2, 2, *spatial)) + 0.2).astype(f32)
    if order == "NHWC":
        x = np.ascontiguousarray(utils.NCHW2NHWC(x))
    op = core.CreateOperator(
        op_type,
        ["X"],
        ["Y"],
        kernels=[2] * nd,
        strides=[1] * nd,
        pads=[1] * (2 * nd),
        order=order,
        p=2.0,
    )
    ok, grad, est = GradientChecker(0.005, 0.05, full_check=True).CheckSimple(op, [x], 0, [0])
    assert ok, (grad, est)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_nd_max_pool_gradient_goes_to_the_maximum(order):
    x = np.random.default_rng(6).permutation(2 * 2 * 5 * 4 * 3).reshape(2, 2, 5, 4, 3).astype(f32)
    xi = x if order == "NCHW" else np.ascontiguousarray(utils.NCHW2NHWC(x))
    kw = dict(kernels=[2, 2, 2], strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1], order=order)
    (y,) = run("MaxPool", [xi], ["Y"], **kw)
    dy = np.random.default_rng(7).random(y.shape).astype(f32)
    (dx,) = run("MaxPool3DGradient", [xi, y, dy], ["dX"], **kw)
    if order == "NHWC":
        dx, dy = utils.NHWC2NCHW(dx), utils.NHWC2NCHW(dy)
    # Every value is distinct: each output's gradient lands where its maximum is.
    want = np.zeros(x.shape)
    yc = utils.NHWC2NCHW(y) if order == "NHWC" else y
    flat = x.reshape(2, 2, -1)
    for n, c in itertools.product(range(2), range(2)):
        for o, v in zip(np.ndindex(*yc.shape[2:]), yc[n, c].reshape(-1), strict=True):
            i = int(np.flatnonzero(flat[n, c] == v)[0])
            want[(n, c, *np.unravel_index(i, x.shape[2:]))] += dy[(n, c, *o)]
    np.testing.assert_allclose(dx, want, rtol=1e-6)


def test_nd_conv_and_pool_gradients_come_from_the_registry():
    for op_type, want in [
        ("Conv3D", "Conv3DGradient"),
        ("Conv1D", "Conv1DGradient"),
        ("MaxPool1D", "MaxPool1DGradient"),
        ("AveragePool3D", "AveragePool3DGradient"),
        ("LpPool", "LpPoolGradient"),
    ]:
        ins = ["X", "W"] if op_type.startswith("Conv") else ["X"]
        ops, _ = core.GradientRegistry.GetGradientForOp(
            core.CreateOperator(op_type, ins, ["Y"]), ["Y_grad"]
        )
        assert [o.type for o in ops] == [want]


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 2, 4)])
def test_order_switch_over_any_rank_from_3(shape):
    x = np.arange(np.prod(shape), dtype=f32).reshape(shape)
    (y,) = run("NCHW2NHWC", [x], ["Y"])
    np.testing.assert_array_equal(y, np.moveaxis(x, 1, -1))
    (z,) = run("NHWC2NCHW", [y], ["Z"])
    np.testing.assert_array_equal(z, x)
    with pytest.raises(RuntimeError, match="at least 3-d"):
        run("NCHW2NHWC", [np.ones((2, 3), f32)], ["Y"])


# --- shape, cast, fill and dropout ops --------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "spec", "want"),
    [
        ((4, 2, 1), (0, 0, 0), (4, 2, 1)),
        ((4, 2, 1), (0, -1, 0), (4, 2, 1)),
        ((4, 3, 2), (-1, 0), (8, 3)),
        ((0, 0), (0, 0, 0), (0, 0, 0)),  # empty: a 0 stays 0, even past the input's rank
        ((2, 0), (-1, 0), (0, 0)),
        ((0,), (0, -1), (0, 0)),
        ((0,), (1, -1), (1, 0)),
        ((), (1, -1), (1, 1)),
    ],
)
def test_reshape_follows_caffe2_for_zeros_and_empty_tensors(old, spec, want):
    x = np.zeros(old, f32)
    y, old_shape = run("Reshape", [x, np.array(spec, np.int64)], ["Y", "old"])
    assert y.shape == want
    assert list(old_shape) == list(old)
    back, _ = run("Reshape", [y, old_shape], ["Z", "old2"])
    assert back.shape == old


def test_reshape_refuses_a_non_empty_tensor_to_zero_size():
    with pytest.raises(RuntimeError, match="non-zero size"):
        run("Reshape", [np.ones((2, 3), f32)], ["Y", "old"], shape=[0, 0, 0])
    with pytest.raises(RuntimeError, match="does not agree"):
        run("Reshape", [np.ones((2, 3), f32)], ["Y", "old"], shape=[4, -1])


def test_lengths_to_shape():
    (s,) = run("LengthsToShape", [np.array([200, 200, 200], np.int32)], ["s"])
    assert s.dtype == np.int32 and list(s) == [3, 200]
    with pytest.raises(RuntimeError, match="must be same"):
        run("LengthsToShape", [np.array([1, 2], np.int32)], ["s"])


def test_split_by_lengths_and_its_gradient():
    x = np.arange(12 * 2, dtype=f32).reshape(12, 2)
    lengths = np.array([1, 2, 3, 0, 4, 2], np.int32)
    outs = run("SplitByLengths", [x, lengths], ["a", "b", "c"])
    np.testing.assert_array_equal(outs[0], x[0:3])
    np.testing.assert_array_equal(outs[1], x[3:6])
    np.testing.assert_array_equal(outs[2], x[6:12])
    # Scaled: the lengths add up to 6, the input has 12 rows: each run counts twice.
    outs = run(
        "SplitByLengths", [x, np.array([1, 2], np.int32)], ["a", "b"], use_scaling_lengths=True
    )
    np.testing.assert_array_equal(outs[0], x[0:4])
    np.testing.assert_array_equal(outs[1], x[4:12])
    with pytest.raises(RuntimeError, match="do not match"):
        run("SplitByLengths", [x, np.array([1, 2], np.int32)], ["a", "b"])
    ops, _ = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("SplitByLengths", ["X", "L"], ["a", "b"]), ["a_g", "b_g"]
    )
    assert [o.type for o in ops] == ["Concat"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, np.bool_, np.float32])
def test_cast_to_string_writes_what_cpp_to_string_writes(dtype):
    x = np.array([[0, 3], [-7, 12]]).astype(dtype)
    (y,) = run("Cast", [x], ["Y"], to=core.DataType.STRING)
    assert y.shape == (2, 2)
    if dtype == np.float32:
        want = [b"0.000000", b"3.000000", b"-7.000000", b"12.000000"]
    else:
        want = [str(int(v)).encode() for v in x.reshape(-1)]
    assert [bytes(v) if isinstance(v, bytes) else v.encode() for v in y.reshape(-1)] == want


@pytest.mark.parametrize(
    ("shape", "dtype", "value"),
    [
        ([3, 3], core.DataType.FLOAT, 2.5),
        ([4, 4, 4], core.DataType.FLOAT, -1.0),
        ([3, 3], core.DataType.INT32, 2),
        ([5, 2], core.DataType.INT64, 7),
    ],
)
def test_diagonal_fill_matches_numpy_fill_diagonal(shape, dtype, value):
    (y,) = run("DiagonalFill", [], ["Y"], shape=shape, value=value, dtype=dtype)
    want = np.zeros(shape, y.dtype)
    np.fill_diagonal(want, value, wrap=True)
    np.testing.assert_array_equal(y, want)
    with pytest.raises(RuntimeError, match="equal length"):
        run("DiagonalFill", [], ["Y"], shape=[2, 3, 3], value=1.0)


def test_lengths_range_fill():
    (y,) = run("LengthsRangeFill", [np.array([3, 0, 1, 2], np.int32)], ["Y"])
    assert y.dtype == np.int32
    assert list(y) == [0, 1, 2, 0, 0, 1]
    (y,) = run("LengthsRangeFill", [np.array([], np.int32)], ["Y"])
    assert y.shape == (0,)


def test_float16_uniform_fill():
    (y,) = run("Float16UniformFill", [], ["Y"], shape=[200, 16], min=2.0, max=5.0)
    assert y.dtype == np.float16 and y.shape == (200, 16)
    assert y.min() >= 2.0 and y.max() <= 5.0 and y.min() < y.max()


def test_uniform_int_fill_with_bounds_the_wrong_way_round_has_no_rows():
    shape = np.array([3, 4], np.int64)
    (y,) = run(
        "UniformIntFill",
        [shape, np.array(9, np.int32), np.array(2, np.int32)],
        ["Y"],
        input_as_shape=1,
    )
    assert y.shape == (0, 4)


def test_dropout_gradient_in_place():
    dy = np.arange(1, 7, dtype=f32).reshape(2, 3)
    mask = np.array([[1, 0, 1], [0, 1, 1]], bool)
    workspace.FeedBlob("g", dy)
    workspace.FeedBlob("mask", mask)
    workspace.RunOperatorOnce(core.CreateOperator("DropoutGrad", ["g", "mask"], ["g"], ratio=0.5))
    np.testing.assert_allclose(workspace.FetchBlob("g"), dy * mask * 2.0)


def test_compat_restores_inspect_getargspec():
    import inspect

    import ferrocaffe.compat

    ferrocaffe.compat.install()
    try:

        def f(a, b, threshold=1e-4, *rest, **kw):
            return a

        spec = inspect.getargspec(f)
        assert spec.args == ["a", "b", "threshold"]
        assert spec.defaults == (1e-4,)
        assert (spec.varargs, spec.keywords) == ("rest", "kw")
    finally:
        ferrocaffe.compat.uninstall()


# 2-d pooling runs on one kernel over NHWC pixels (channels in blocks of 32 and 8, a last
# overlapping block, or one by one under 8); NCHW planes are transposed to NHWC a group of
# channels at a time and back. Shapes reach each case, in one part and split in many, with
# paddings up to far wider than the input.
POOL_2D_CASES = [
    # (n, c, h, w, kernel, stride, pads [t, l, b, r])
    (2, 3, 9, 11, (3, 3), (2, 2), (1, 1, 1, 1)),
    (3, 20, 24, 24, (2, 2), (2, 2), (0, 0, 0, 0)),
    (2, 40, 15, 15, (3, 3), (2, 2), (0, 0, 0, 0)),
    (1, 9, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1)),
    (2, 5, 36, 40, (3, 2), (2, 3), (1, 1, 0, 1)),
    (3, 8, 33, 32, (5, 5), (1, 1), (2, 2, 2, 2)),
    (1, 2, 34, 35, (1, 1), (3, 2), (0, 0, 0, 0)),
    (1, 3, 5, 33, (3, 200), (1, 1), (1, 100, 1, 100)),
    (4, 33, 16, 16, (3, 3), (2, 2), (1, 0, 1, 0)),
]


@pytest.mark.parametrize("case", POOL_2D_CASES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    ("op_type", "include_pad"),
    [("MaxPool", False), ("AveragePool", False), ("AveragePool", True)],
)
def test_2d_pooling_matches_the_reference_on_every_kernel(case, order, op_type, include_pad):
    n, c, h, w, k, s, pads = case
    x = np.random.default_rng(7).standard_normal((n, c, h, w)).astype(f32)
    want = ref_pool_nd(x, op_type, list(k), list(s), list(pads), include_pad)
    xi = x if order == "NCHW" else np.ascontiguousarray(utils.NCHW2NHWC(x))
    (y,) = run(
        op_type,
        [xi],
        ["Y"],
        kernel_h=k[0],
        kernel_w=k[1],
        stride_h=s[0],
        stride_w=s[1],
        pad_t=pads[0],
        pad_l=pads[1],
        pad_b=pads[2],
        pad_r=pads[3],
        order=order,
        count_include_pad=include_pad,
    )
    if order == "NHWC":
        y = utils.NHWC2NCHW(y)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("c", [3, 20])
@pytest.mark.parametrize("w", [12, 40])
def test_2d_global_pooling_on_every_kernel(order, c, w):
    x = np.random.default_rng(8).standard_normal((2, c, 5, w)).astype(f32)
    xi = x if order == "NCHW" else np.ascontiguousarray(utils.NCHW2NHWC(x))
    for op_type, red in (("MaxPool", x.max(axis=(2, 3))), ("AveragePool", x.mean(axis=(2, 3)))):
        (y,) = run(op_type, [xi], ["Y"], global_pooling=1, order=order)
        np.testing.assert_allclose(y.reshape(2, c), red, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("w", [12, 40])
def test_2d_max_pooling_never_picks_a_nan(order, w):
    # A NaN loses to every number, so a window with one gives the max of the others, and a
    # window of NaNs only gives -inf; the same on every kernel.
    x = np.random.default_rng(9).standard_normal((1, 10, 4, w)).astype(f32)
    x[0, :, 0:2, 0:2] = np.nan
    x[0, 3, 0, :] = np.nan
    want = ref_pool_nd(np.where(np.isnan(x), -np.inf, x), "MaxPool", [2, 2], [2, 2], [0] * 4)
    xi = x if order == "NCHW" else np.ascontiguousarray(utils.NCHW2NHWC(x))
    (y,) = run("MaxPool", [xi], ["Y"], kernel=2, stride=2, order=order)
    if order == "NHWC":
        y = utils.NHWC2NCHW(y)
    assert y[0, 0, 0, 0] == -np.inf
    np.testing.assert_array_equal(y, want.astype(f32))


# Float permutations that amount to a batch of 2-d transposes run on 8x8 register blocks
# (edges too); the rest, and other types, on the general loop. Both against numpy.
@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ((2, 3, 4, 5), (0, 2, 3, 1)),
        ((2, 9, 11, 3), (0, 3, 1, 2)),
        ((4, 6, 2, 3), (2, 3, 0, 1)),
        ((9, 17), (1, 0)),
        ((3, 20, 33), (0, 2, 1)),
        ((2, 16, 8), (0, 2, 1)),
        ((2, 3, 4, 5), (1, 0, 2, 3)),
        ((2, 3, 4, 5), (3, 1, 2, 0)),
        ((1, 0, 3), (0, 2, 1)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_transpose_matches_numpy(shape, axes, dtype):
    x = (np.random.default_rng(3).standard_normal(shape) * 100).astype(dtype)
    (y,) = run("Transpose", [x], ["Y"], axes=list(axes))
    np.testing.assert_array_equal(y, x.transpose(axes))
    if len(shape) == 4:
        (a,) = run("NCHW2NHWC", [x], ["Y"])
        (b,) = run("NHWC2NCHW", [x], ["Y"])
        np.testing.assert_array_equal(a, x.transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(b, x.transpose(0, 3, 1, 2))


# Depthwise convolution (group == C == M) runs on a direct kernel: NHWC pixels with the
# channels in register blocks of 32 and 8 (the last one overlapping, or one by one under 8),
# NCHW planes 16 or more wide at column stride 1 a plane at a time, the other NCHW planes
# through NHWC in groups of channels. The shapes reach each, in one part and split in many.
DEPTHWISE_CASES = [
    # (n, c, h, w, kernel, stride, pad, dilation)
    (8, 16, 16, 16, 3, 1, 1, 1),
    (8, 32, 16, 16, 3, 2, 1, 1),
    (2, 20, 7, 9, 3, 1, 1, 1),
    (2, 40, 12, 11, 5, 2, 2, 1),
    (1, 3, 5, 6, 3, 1, 0, 2),
    (3, 8, 33, 40, 3, 1, 1, 1),
    (2, 1, 6, 6, 3, 2, 1, 1),
    (1, 36, 8, 8, 3, 1, 1, 1),
]


@pytest.mark.parametrize("case", DEPTHWISE_CASES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_conv_matches_the_reference_on_every_kernel(case, order, bias):
    n, c, h, w, k, s, p, d = case
    rng = np.random.default_rng(c * 31 + w)
    x = rng.standard_normal((n, c, h, w)).astype(f32)
    wt = rng.standard_normal((c, 1, k, k)).astype(f32)
    b = rng.standard_normal(c).astype(f32)
    want = ref_conv_nd(x, wt, b if bias else None, [s] * 2, [p] * 4, [d] * 2, c)
    y = run_conv_in(
        order, x, wt, b if bias else None, kernel=k, stride=s, pad=p, dilation=d, group=c
    )
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# NCHW convolutions with 8+ input and output channels and short (or strided) rows run on the
# NHWC kernels, X, W and Y transposed around them; a following in-place Relu is fused into them.
NCHW_AS_NHWC_CASES = [
    # (n, c, h, w, m, kernel, stride, pad, dilation)
    (2, 8, 7, 7, 16, 3, 1, 1, 1),
    (3, 16, 3, 3, 32, 3, 1, 1, 1),
    (2, 20, 12, 12, 32, 5, 1, 0, 1),
    (2, 8, 32, 32, 16, 3, 2, 1, 1),
    (1, 16, 16, 16, 8, 3, 2, 1, 2),
    (2, 9, 10, 5, 11, 2, 1, 0, 1),
]


@pytest.mark.parametrize("case", NCHW_AS_NHWC_CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_nchw_conv_through_nhwc_matches_the_reference(case, bias, relu):
    n, c, h, w, m, k, s, p, d = case
    rng = np.random.default_rng(c * 7 + m)
    x = rng.standard_normal((n, c, h, w)).astype(f32)
    wt = rng.standard_normal((m, c, k, k)).astype(f32)
    b = rng.standard_normal(m).astype(f32)
    want = ref_conv_nd(x, wt, b if bias else None, [s] * 2, [p] * 4, [d] * 2, 1)
    if relu:
        want = np.maximum(want, 0)
    y = run_conv_in(
        "NCHW", x, wt, b if bias else None, relu=relu, kernel=k, stride=s, pad=p, dilation=d
    )
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# Convolutions with at most 4 input or at most 4 output channels run on a direct kernel (the
# input split into its stride phases, output channels in register blocks of 6, 4, 3, 2 and 1,
# runs of pixels across rows). The cases reach every block size and its leftovers, strides 1-4,
# asymmetric kernels, strides and pads, dilation, pads wider than the kernel, one output pixel,
# rows longer than a run, a fused Relu, and images split among parts.
DIRECT_CASES = [
    # (n, c, h, w, m, (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw))
    (8, 3, 32, 32, 8, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    (8, 8, 16, 16, 3, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    (4, 3, 17, 19, 32, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),
    (3, 3, 35, 33, 24, (11, 11), (4, 4), (2, 2, 2, 2), (1, 1)),
    (2, 1, 28, 28, 20, (5, 5), (1, 1), (0, 0, 0, 0), (1, 1)),
    (2, 4, 7, 7, 12, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    (2, 2, 13, 11, 7, (3, 5), (2, 3), (1, 2, 0, 1), (1, 1)),
    (2, 3, 20, 17, 10, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    (1, 2, 9, 40, 5, (2, 3), (1, 2), (0, 1, 1, 0), (2, 1)),
    (2, 16, 9, 9, 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (2, 32, 6, 6, 2, (3, 3), (2, 1), (1, 1, 1, 1), (1, 1)),
    (2, 3, 4, 4, 4, (3, 3), (1, 1), (4, 4, 4, 4), (1, 1)),
    (3, 2, 3, 3, 6, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
    (2, 3, 2, 70, 13, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1)),
    (1, 4, 5, 5, 11, (5, 1), (3, 1), (1, 0, 2, 0), (1, 1)),
    # Rows whose computed-and-discarded columns lie past the last output plane (caught by
    # Caffe2's conv_test: the store of such a stretch named a place past the output's end).
    (3, 3, 2, 12, 8, (1, 5), (1, 1), (1, 0, 0, 0), (2, 2)),
    (1, 5, 2, 9, 3, (2, 4), (1, 1), (0, 1, 3, 3), (1, 2)),
]


@pytest.mark.parametrize("case", DIRECT_CASES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_few_channel_conv_matches_the_reference(case, order, bias, relu):
    n, c, h, w, m, (kh, kw), stride, pads, dil = case
    rng = np.random.default_rng(c * 13 + m * 5 + w)
    x = rng.standard_normal((n, c, h, w)).astype(f32)
    wt = rng.standard_normal((m, c, kh, kw)).astype(f32)
    b = rng.standard_normal(m).astype(f32)
    nd_pads = [pads[0], pads[1], pads[2], pads[3]]
    want = ref_conv_nd(x, wt, b if bias else None, list(stride), nd_pads, list(dil), 1)
    if relu:
        want = np.maximum(want, 0)
    y = run_conv_in(
        order,
        x,
        wt,
        b if bias else None,
        relu=relu,
        **window_args((kh, kw), stride, pads),
        dilation_h=dil[0],
        dilation_w=dil[1],
    )
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# Grouped convolutions with few channels per group, and depthwise ones in NCHW at stride 1 on
# rows of 16 or more, run on the same kernel, each register block inside one group.
DIRECT_GROUP_CASES = [
    # (n, c, h, w, m, kernel, stride, pad, group)
    (4, 24, 7, 7, 32, 5, 1, 2, 2),
    (2, 32, 16, 16, 32, 3, 1, 1, 4),
    (2, 4, 9, 10, 8, 3, 2, 1, 4),
    (2, 6, 8, 8, 10, 3, 1, 1, 2),
    (3, 16, 16, 16, 16, 3, 1, 1, 16),
    (2, 24, 20, 21, 24, 5, 1, 2, 24),
    (1, 8, 3, 40, 8, 3, 1, 1, 8),
]


@pytest.mark.parametrize("case", DIRECT_GROUP_CASES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
def test_few_channel_grouped_conv_matches_the_reference(case, order, bias):
    n, c, h, w, m, k, s, p, group = case
    rng = np.random.default_rng(c * 3 + m + group)
    x = rng.standard_normal((n, c, h, w)).astype(f32)
    wt = rng.standard_normal((m, c // group, k, k)).astype(f32)
    b = rng.standard_normal(m).astype(f32)
    want = ref_conv_nd(x, wt, b if bias else None, [s] * 2, [p] * 4, [1, 1], group)
    y = run_conv_in(order, x, wt, b if bias else None, kernel=k, stride=s, pad=p, group=group)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_few_channel_conv_gives_the_same_values_run_after_run():
    # The phase buffer is kept between runs and never cleared: a smaller convolution after a
    # larger one, and the first again, must not see the other's values.
    rng = np.random.default_rng(5)
    shapes = [((2, 3, 30, 30), (8, 3, 5, 5)), ((1, 2, 6, 7), (3, 2, 3, 3))]
    first = {}
    for rep in range(2):
        for i, (xs, ws) in enumerate(shapes):
            x = rng.standard_normal(xs).astype(f32) if rep == 0 else first[i][0]
            wt = rng.standard_normal(ws).astype(f32) if rep == 0 else first[i][1]
            (y,) = run("Conv", [x, wt], ["Y"], kernel=ws[2], pad=1)
            want = ref_conv_nd(x, wt, None, [1, 1], [1] * 4, [1, 1], 1)
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
            if rep == 0:
                first[i] = (x, wt, y)
            else:
                np.testing.assert_array_equal(y, first[i][2])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("spatial", [(3, 0), (0, 3)])
def test_2d_pooling_of_an_input_without_pixels_gives_empty_windows(order, spatial):
    # Padding gives such an input output pixels, all of whose windows are empty: -inf for a
    # max, 0 for an average (the NCHW kernel once failed here on a zero-length row).
    h, w = spatial
    x = np.zeros((1, 9, h, w) if order == "NCHW" else (1, h, w, 9), f32)
    for op_type, value in (("MaxPool", -np.inf), ("AveragePool", 0.0)):
        (y,) = run(op_type, [x], ["Y"], kernel=2, pad=1, order=order)
        assert y.size > 0
        assert np.all(y == value)


def _pool_reference(x, kernel, stride, pads, op_type, include_pad):
    """NCHW pooling from the definition, in float64: windows clipped to the input (and to the
    padded input for ``count_include_pad``); an empty window gives -inf (max) or 0."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, stride, pads
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    y = np.zeros((n, c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * sh - pt, ox * sw - pl
            y1, x1 = min(y0 + kh, h + pb), min(x0 + kw, w + pr)
            win = x[:, :, max(y0, 0) : min(y1, h), max(x0, 0) : min(x1, w)].astype(np.float64)
            if op_type == "MaxPool":
                y[:, :, oy, ox] = win.max(axis=(2, 3)) if win.size else -np.inf
            else:
                cnt = (y1 - y0) * (x1 - x0) if include_pad else win.shape[2] * win.shape[3]
                with np.errstate(invalid="ignore"):  # inf - inf: NaN, as the op gives
                    y[:, :, oy, ox] = win.sum(axis=(2, 3)) / max(cnt, 1)
    return y


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "pads"),
    [
        ((8, 32, 15, 15), (3, 3), (2, 2), (0, 0, 0, 0)),  # squeezenet's
        ((8, 16, 32, 32), (3, 3), (2, 2), (0, 0, 0, 0)),  # googlenet's first: rows of 32
        ((2, 20, 24, 24), (2, 2), (2, 2), (0, 0, 0, 0)),  # lenet's: rows of 24
        ((2, 48, 7, 7), (3, 3), (1, 1), (1, 1, 1, 1)),  # stride 1, padded
        ((2, 6, 10, 16), (3, 3), (1, 1), (1, 1, 1, 1)),  # rows of 16, 16 output columns
        ((8, 8, 16, 16), (2, 2), (2, 2), (0, 0, 0, 0)),  # layout_ops's
        ((3, 5, 9, 17), (2, 4), (3, 2), (1, 2, 0, 3)),  # uneven windows and pads
        ((1, 3, 6, 33), (3, 3), (2, 2), (1, 1, 1, 1)),  # rows too long for one plane vector
        ((1, 3, 5, 40), (2, 2), (2, 2), (0, 0, 0, 0)),  # 20 output columns
        ((2, 4, 8, 2), (2, 2), (1, 1), (0, 0, 0, 0)),  # one output column
    ],
)
def test_nchw_pooling_gives_the_bits_of_nhwc_and_the_definition(
    op_type, shape, kernel, stride, pads
):
    # NCHW planes 16 to 32 wide run on their own kernel where the CPU has AVX-512 (lane =
    # output column), others through NHWC; either way each output folds its window row by row, left to
    # right, as the NHWC kernel does: the same bits in both orders. NaN (never the max),
    # signed zeros (the first of equal maxima stays) and infinities included.
    rng = np.random.default_rng(sum(shape) + kernel[1] + stride[0])
    x = rng.standard_normal(shape).astype(f32)
    flat = x.reshape(-1)
    specials = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf], f32)
    at = rng.choice(flat.size, size=max(flat.size // 50, 5), replace=False)
    flat[at] = specials[np.arange(at.size) % specials.size]
    for include_pad in (False, True):
        args = dict(window_args(kernel, stride, pads), count_include_pad=int(include_pad))
        (nchw,) = run(op_type, [x], ["Y"], order="NCHW", **args)
        (nhwc,) = run(
            op_type, [np.ascontiguousarray(utils.NCHW2NHWC(x))], ["Y"], order="NHWC", **args
        )
        nhwc = utils.NHWC2NCHW(nhwc)
        assert nchw.tobytes() == np.ascontiguousarray(nhwc).tobytes()
        if op_type == "MaxPool":
            # The reference's max propagates NaN; the op skips it.
            clean = np.where(np.isnan(x), -np.inf, x)
            want = _pool_reference(clean, kernel, stride, pads, op_type, include_pad)
            np.testing.assert_array_equal(nchw, want.astype(f32))
        else:
            want = _pool_reference(x, kernel, stride, pads, op_type, include_pad)
            np.testing.assert_allclose(nchw, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("n", [1, 8])
def test_conv_transpose_matches_the_reference_with_images_shared_out(order, n):
    # Eight images of this size are shared out to the team, each part with its own column
    # buffer; the bias is added after.
    rng = np.random.default_rng(n)
    cin, cout, h, w, k, s, p = 32, 16, 8, 7, 4, 2, 1
    x = rng.standard_normal((n, cin, h, w)).astype(f32)
    wt = rng.standard_normal((cin, cout, k, k)).astype(f32)
    b = rng.standard_normal(cout).astype(f32)
    full = np.zeros((n, cout, (h - 1) * s + k, (w - 1) * s + k))
    for i in range(k):
        for j in range(k):
            contrib = np.einsum("nchw,cd->ndhw", x.astype(np.float64), wt[:, :, i, j])
            full[:, :, i : i + s * h : s, j : j + s * w : s] += contrib
    want = full[:, :, p : full.shape[2] - p, p : full.shape[3] - p] + b.reshape(1, -1, 1, 1)
    xi, wi = (x, wt) if order == "NCHW" else (utils.NCHW2NHWC(x), utils.NCHW2NHWC(wt))
    ins = [np.ascontiguousarray(xi), np.ascontiguousarray(wi), b]
    (y,) = run("ConvTranspose", ins, ["Y"], kernel=k, stride=s, pad=p, order=order)
    if order == "NHWC":
        y = utils.NHWC2NCHW(y)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
