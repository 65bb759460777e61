"""CPU kernels of Caffe2's shape-inference suite's last operators: the half-precision fused
8-bit row-wise conversions, LengthsPad, DotProductWithPadding (and its gradient), Im2Col /
Col2Im and RoIPool (and its gradient). Each op runs through ``workspace.RunOperatorOnce``
against a numpy version of Caffe2's formula; creation-time and run-time refusals are checked
too. Numerical gradient checks of the differentiable ones are in tests/gradcheck_specs.py."""

import math

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import core, workspace

RNG = np.random.default_rng(4321)


def f32(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


# -- fused 8-bit row-wise conversions ------------------------------------------------------------


def quantize_ref(x, half_sb):
    """Fused rows of ``x`` (float32 values): bytes, then scale and bias (float32 or float16)."""
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    out = []
    for row in rows:
        lo, hi = np.float32(row.min()), np.float32(row.max())
        if half_sb:
            bias = np.float32(np.float16(lo))
            rng = np.float32(hi - bias)
            scale = np.float32(1.0) if rng == 0 else np.float32(rng / np.float32(255.0))
            scale = np.float32(np.float16(scale))
            if scale == 0:
                scale = np.float32(1.0)
            inv = np.float32(1.0) / scale
            q = np.clip(np.round((row - bias) * inv), 0, 255).astype(np.uint8)
            sb = np.array([scale, bias], np.float16).view(np.uint8)
        else:
            rng = np.float32(hi - lo)
            inv = np.float32(255.0) / np.float32(rng + np.float32(1e-8))
            q = np.clip(np.round((row - lo) * inv), 0, 255).astype(np.uint8)
            sb = np.array([rng / np.float32(255.0), lo], np.float32).view(np.uint8)
        out.append(np.concatenate([q, sb]))
    return np.stack(out).reshape(x.shape[:-1] + (-1,))


def dequantize_ref(q, half_sb):
    n = 4 if half_sb else 8
    sb = np.ascontiguousarray(q[..., -n:]).view(np.float16 if half_sb else np.float32)
    sb = sb.astype(np.float32)
    return q[..., :-n].astype(np.float32) * sb[..., :1] + sb[..., 1:]


@pytest.mark.parametrize("half_in", [False, True])
@pytest.mark.parametrize("half_sb", [False, True])
def test_fused_rowwise_conversions_match_the_reference(half_in, half_sb):
    src = "HalfFloat" if half_in else "Float"
    suffix = "HalfScaleBias" if half_sb else ""
    x = f32(3, 4, 7, lo=-2.0, hi=3.0)
    x[1, 2] = 0.5  # a constant row
    if half_in:
        x = x.astype(np.float16)
    (q,) = run(f"{src}ToFused8BitRowwiseQuantized{suffix}", {"X": x}, ["Q"])
    assert q.dtype == np.uint8
    assert q.shape == (3, 4, 7 + (4 if half_sb else 8))
    np.testing.assert_array_equal(q, quantize_ref(x.astype(np.float32), half_sb))
    (y,) = run(f"Fused8BitRowwiseQuantized{suffix}To{src}", {"Q": q}, ["Y"])
    assert y.dtype == (np.float16 if half_in else np.float32)
    assert y.shape == x.shape
    want = dequantize_ref(q, half_sb)
    if half_in:
        want = want.astype(np.float16)
    np.testing.assert_array_equal(y, want)
    # Within one quantization step (plus the float16 rounding) of the input.
    step = (x.max(-1, keepdims=True) - x.min(-1, keepdims=True)).astype(np.float32) / 255
    err = np.abs(y.astype(np.float32) - x.astype(np.float32))
    assert np.all(err <= step * 0.5 + 2e-3 + 1e-3 * np.abs(x.astype(np.float32)))


def test_fused_rowwise_conversions_refuse_wrong_inputs():
    with pytest.raises(RuntimeError, match="float16"):
        run("HalfFloatToFused8BitRowwiseQuantized", {"X": f32(2, 3)}, ["Q"])
    with pytest.raises(RuntimeError, match="float"):
        run(
            "FloatToFused8BitRowwiseQuantizedHalfScaleBias",
            {"X": f32(2, 3).astype(np.float64)},
            ["Q"],
        )
    with pytest.raises(RuntimeError, match="at least 4 bytes"):
        run(
            "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat",
            {"Q": np.zeros((2, 3), np.uint8)},
            ["Y"],
        )
    with pytest.raises(RuntimeError, match="uint8"):
        run("Fused8BitRowwiseQuantizedToHalfFloat", {"Q": f32(2, 9)}, ["Y"])


# -- LengthsPad ----------------------------------------------------------------------------------


def lengths_pad_ref(data, lengths, target, value):
    out = np.full((len(lengths) * target,) + data.shape[1:], value, dtype=data.dtype)
    at = 0
    for i, n in enumerate(lengths):
        out[i * target : i * target + n] = data[at : at + n]
        at += n
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_lengths_pad(dtype):
    data = (RNG.uniform(-5, 5, size=(6, 2, 3)) * 10).astype(dtype)
    lengths = np.array([1, 0, 3, 2], np.int32)
    (y,) = run("LengthsPad", {"D": data, "L": lengths}, ["Y"], target_length=4, padding_value=-2.7)
    # The argument is a float32 field; C++ truncates it for integer data.
    value = np.float32(-2.7) if np.issubdtype(dtype, np.floating) else -2
    assert y.dtype == dtype and y.shape == (16, 2, 3)
    np.testing.assert_array_equal(y, lengths_pad_ref(data, lengths, 4, dtype(value)))
    # 1-D data, default padding -1, int64 lengths.
    d1 = np.arange(3, dtype=np.float32)
    (y,) = run("LengthsPad", {"D": d1, "L": np.array([2, 1], np.int64)}, ["Y"], target_length=3)
    np.testing.assert_array_equal(y, [0, 1, -1, 2, -1, -1])


def test_lengths_pad_refusals():
    data, lengths = f32(3, 2), np.array([1, 2], np.int32)
    with pytest.raises(RuntimeError, match="target_length argument must be >= 1"):
        run("LengthsPad", {"D": data, "L": lengths}, ["Y"])
    with pytest.raises(RuntimeError, match="larger than target length"):
        run("LengthsPad", {"D": data, "L": lengths}, ["Y"], target_length=1)
    with pytest.raises(RuntimeError, match="DATA has 3 rows"):
        run("LengthsPad", {"D": data, "L": np.array([1, 1], np.int32)}, ["Y"], target_length=2)
    with pytest.raises(RuntimeError, match="int32 or int64"):
        run("LengthsPad", {"D": data, "L": lengths.astype(np.float32)}, ["Y"], target_length=3)
    with pytest.raises(RuntimeError, match="LENGTHS must be 1-D"):
        run("LengthsPad", {"D": data, "L": np.array([[3]], np.int32)}, ["Y"], target_length=3)
    with pytest.raises(RuntimeError):
        run("LengthsPad", {"D": data}, ["Y"], target_length=3)


# -- DotProductWithPadding -----------------------------------------------------------------------


def dot_pad_ref(x, y, pad_value, replicate):
    n = x.shape[0]
    x2, y2 = x.reshape(n, -1).astype(np.float64), y.reshape(n, -1).astype(np.float64)
    long_, short = (x2, y2) if x2.shape[1] > y2.shape[1] else (y2, x2)
    if replicate:
        short = np.tile(short, (1, long_.shape[1] // short.shape[1]))
    else:
        pad = np.full((n, long_.shape[1] - short.shape[1]), pad_value)
        short = np.concatenate([short, pad], axis=1)
    return (long_ * short).sum(axis=1)


def dot_pad_grad_ref(x, y, g, pad_value, replicate):
    """dX, dY of sum(g * dot_pad(X, Y)) by the closed form."""
    n = x.shape[0]
    x2, y2 = x.reshape(n, -1).astype(np.float64), y.reshape(n, -1).astype(np.float64)
    dx, dy = np.zeros_like(x2), np.zeros_like(y2)
    g = g.astype(np.float64)[:, None]
    x_long = x2.shape[1] > y2.shape[1]
    long_, short = (x2, y2) if x_long else (y2, x2)
    d = short.shape[1]
    dl, ds = (dx, dy) if x_long else (dy, dx)
    if replicate:
        k = long_.shape[1] // d
        dl[:] = g * np.tile(short, (1, k))
        ds[:] = g * long_.reshape(n, k, d).sum(axis=1)
    else:
        dl[:, :d] = g * short
        dl[:, d:] = g * pad_value
        ds[:] = g * long_[:, :d]
    return dx.reshape(x.shape), dy.reshape(y.shape)


@pytest.mark.parametrize(
    "xs,ys,args",
    [
        ((4, 3), (4, 5), {"pad_value": 0.5}),
        ((4, 6), (4, 2), {"pad_value": -1.5}),
        ((4, 3), (4, 3), {"pad_value": 2.0}),
        ((3, 2, 2), (3, 1, 2), {}),
        ((4, 2), (4, 6), {"replicate": True}),
        ((4, 8), (4, 4), {"replicate": True, "pad_value": 3.0}),
        ((4, 3), (4, 3), {"replicate": True}),
    ],
)
def test_dot_product_with_padding(xs, ys, args):
    x, y = f32(*xs), f32(*ys)
    pad, rep = args.get("pad_value", 0.0), args.get("replicate", False)
    (z,) = run("DotProductWithPadding", {"X": x, "Y": y}, ["Z"], **args)
    assert z.shape == (xs[0],)
    np.testing.assert_allclose(z, dot_pad_ref(x, y, pad, rep), rtol=1e-5, atol=1e-6)
    g = f32(xs[0])
    dx, dy = run("DotProductWithPaddingGradient", {"X": x, "Y": y, "G": g}, ["dX", "dY"], **args)
    want_dx, want_dy = dot_pad_grad_ref(x, y, g, pad, rep)
    assert dx.shape == x.shape and dy.shape == y.shape
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dy, want_dy, rtol=1e-5, atol=1e-6)


def test_dot_product_with_padding_gradient_maker_and_refusals():
    op = core.CreateOperator(
        "DotProductWithPadding", ["X", "Y"], ["Z"], pad_value=0.25, replicate=True
    )
    grad_ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["Z_grad"])
    assert [g.type for g in grad_ops] == ["DotProductWithPaddingGradient"]
    assert list(grad_ops[0].input) == ["X", "Y", "Z_grad"]
    assert list(grad_ops[0].output) == ["X_grad", "Y_grad"]
    assert g_in == ["X_grad", "Y_grad"]
    args = {a.name: a for a in grad_ops[0].arg}
    assert args["pad_value"].f == pytest.approx(0.25) and args["replicate"].i == 1
    with pytest.raises(RuntimeError, match="multiple"):
        run("DotProductWithPadding", {"X": f32(2, 3), "Y": f32(2, 4)}, ["Z"], replicate=True)
    with pytest.raises(RuntimeError, match="first dimension"):
        run("DotProductWithPadding", {"X": f32(2, 3), "Y": f32(3, 3)}, ["Z"])
    with pytest.raises(RuntimeError, match="number of dimensions"):
        run("DotProductWithPadding", {"X": f32(2, 3), "Y": f32(2, 3, 1)}, ["Z"])
    with pytest.raises(RuntimeError):
        run("DotProductWithPadding", {"X": f32(2, 3)}, ["Z"])


# -- Im2Col / Col2Im -----------------------------------------------------------------------------


def im2col_ref(x, order, kernel, stride, pad, dilation):
    """Im2Col by its definition: kernel, stride and dilation are (h, w) pairs."""
    (kh, kw) = kernel
    if order == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    n, c, h, w = x.shape
    oh = (h + 2 * pad - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    col = np.zeros((n, c, kh, kw, oh, ow), np.float32)
    for i in range(kh):
        for j in range(kw):
            for oy in range(oh):
                for ox in range(ow):
                    iy = oy * stride[0] + i * dilation[0] - pad
                    ix = ox * stride[1] + j * dilation[1] - pad
                    if 0 <= iy < h and 0 <= ix < w:
                        col[:, :, i, j, oy, ox] = x[:, :, iy, ix]
    if order == "NCHW":
        return col.reshape(n, c * kh * kw, oh, ow)
    return col.transpose(0, 4, 5, 2, 3, 1).reshape(n, oh, ow, kh * kw * c)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "geom",
    [
        {"kernel": 3, "stride": 1, "pad": 0, "dilation": 1},
        {"kernel": 2, "stride": 2, "pad": 1, "dilation": 2},
        {"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1, "pad": 2, "dilation_w": 2},
    ],
)
def test_im2col_and_col2im(order, geom):
    n, c, h, w = 2, 3, 7, 6
    shape = (n, c, h, w) if order == "NCHW" else (n, h, w, c)
    x = f32(*shape)

    def per_axis(name, default):
        both = geom.get(name, default)
        return geom.get(f"{name}_h", both), geom.get(f"{name}_w", both)

    (col,) = run("Im2Col", {"X": x}, ["C"], order=order, **geom)
    want = im2col_ref(
        x, order, per_axis("kernel", 0), per_axis("stride", 1), geom["pad"], per_axis("dilation", 1)
    )
    assert col.shape == want.shape
    np.testing.assert_array_equal(col, want)
    # Col2Im is the adjoint of Im2Col: <im2col(x), r> == <x, col2im(r)>.
    r = f32(*col.shape)
    (back,) = run("Col2Im", {"R": r, "X": x}, ["B"], order=order, **geom)
    assert back.shape == x.shape
    np.testing.assert_allclose(
        np.vdot(col.astype(np.float64), r), np.vdot(x.astype(np.float64), back), rtol=1e-5
    )


def test_im2col_gradient_is_col2im_and_refusals():
    op = core.CreateOperator("Im2Col", ["X"], ["Y"], kernel=2)
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [(g.type, list(g.input), list(g.output)) for g in grad_ops] == [
        ("Col2Im", ["Y_grad", "X"], ["X_grad"])
    ]
    op = core.CreateOperator("Col2Im", ["Y", "X"], ["Z"], kernel=2)
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Z_grad"])
    assert [(g.type, list(g.input), list(g.output)) for g in grad_ops] == [
        ("Im2Col", ["Z_grad"], ["Y_grad"])
    ]
    x = f32(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match="kernel"):
        run("Im2Col", {"X": x}, ["Y"])
    with pytest.raises(RuntimeError, match="H >= dkernel"):
        run("Im2Col", {"X": x}, ["Y"], kernel=3, dilation=2, pad=3)
    with pytest.raises(RuntimeError, match="Unknown storage order"):
        run("Im2Col", {"X": x}, ["Y"], kernel=2, order="CHWN")
    with pytest.raises(RuntimeError, match="4-d"):
        run("Im2Col", {"X": f32(2, 4, 4)}, ["Y"], kernel=2)
    with pytest.raises(RuntimeError, match="do not fit"):
        run("Col2Im", {"C": f32(1, 8, 3, 2), "X": x}, ["Y"], kernel=2)


# -- RoIPool -------------------------------------------------------------------------------------


def c_round(v):
    return math.copysign(math.floor(abs(v) + 0.5), v)


def roi_pool_ref(x, rois, ph, pw, scale):
    n, c, h, w = x.shape
    y = np.zeros((len(rois), c, ph, pw), np.float32)
    am = np.full(y.shape, -1, np.int32)
    f = np.float32
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (int(c_round(f(v) * f(scale))) for v in roi[1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = f(rh) / f(ph), f(rw) / f(pw)
        for i in range(ph):
            hs = min(max(int(math.floor(f(i) * bh)) + y1, 0), h)
            he = min(max(int(math.ceil(f(i + 1) * bh)) + y1, 0), h)
            for j in range(pw):
                ws = min(max(int(math.floor(f(j) * bw)) + x1, 0), w)
                we = min(max(int(math.ceil(f(j + 1) * bw)) + x1, 0), w)
                if he <= hs or we <= ws:
                    continue
                region = x[b, :, hs:he, ws:we].reshape(c, -1)
                k = region.argmax(axis=1)
                y[r, :, i, j] = region[np.arange(c), k]
                am[r, :, i, j] = (hs + k // (we - ws)) * w + ws + k % (we - ws)
    return y, am


def roi_inputs():
    # Distinct values, so that every maximum is unique.
    x = (RNG.permutation(2 * 3 * 6 * 7).reshape(2, 3, 6, 7) * 0.1 - 10).astype(np.float32)
    rois = np.array(
        [
            [0, 0.2, 0.4, 5.2, 4.6],
            [1, 2.2, 1.1, 3.1, 5.4],
            [1, 4.0, 4.0, 1.0, 1.0],  # malformed: 1 x 1
            [0, -3.2, -2.1, 12.3, 9.6],  # past the borders
            [1, 20.0, 20.0, 30.0, 30.0],  # outside: empty bins
        ],
        np.float32,
    )
    return x, rois


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_roi_pool(scale):
    x, rois = roi_inputs()
    y, am = run(
        "RoIPool", {"X": x, "R": rois}, ["Y", "A"], pooled_h=2, pooled_w=3, spatial_scale=scale
    )
    want_y, want_am = roi_pool_ref(x, rois, 2, 3, scale)
    assert y.shape == (5, 3, 2, 3) and am.dtype == np.int32
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(am, want_am)
    (yt,) = run(
        "RoIPool",
        {"X": x, "R": rois},
        ["Yt"],
        pooled_h=2,
        pooled_w=3,
        spatial_scale=scale,
        is_test=1,
    )
    np.testing.assert_array_equal(yt, want_y)
    # The gradient adds each dY at its argmax (rois may overlap).
    g = f32(*y.shape)
    (dx,) = run(
        "RoIPoolGradient", {"X": x, "R": rois, "A": am, "G": g}, ["dX"], pooled_h=2, pooled_w=3
    )
    want = np.zeros_like(x)
    for r in range(len(rois)):
        b = int(rois[r, 0])
        for ch in range(3):
            for k, idx in enumerate(am[r, ch].ravel()):
                if idx >= 0:
                    want[b, ch].ravel()[idx] += g[r, ch].ravel()[k]
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-6)


def test_roi_pool_gradient_maker_and_refusals():
    op = core.CreateOperator("RoIPool", ["X", "R"], ["Y", "A"], pooled_h=2)
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad", None])
    assert [(g.type, list(g.input), list(g.output)) for g in grad_ops] == [
        ("RoIPoolGradient", ["X", "R", "A", "Y_grad"], ["X_grad"])
    ]
    x, rois = roi_inputs()
    with pytest.raises(RuntimeError, match="Output size mismatch"):
        run("RoIPool", {"X": x, "R": rois}, ["Y"])
    with pytest.raises(RuntimeError, match="Output size mismatch"):
        run("RoIPool", {"X": x, "R": rois}, ["Y", "A"], is_test=1)
    with pytest.raises(RuntimeError, match="Only NCHW"):
        run("RoIPool", {"X": x, "R": rois}, ["Y", "A"], order="NHWC")
    with pytest.raises(RuntimeError, match="pooled_w"):
        run("RoIPool", {"X": x, "R": rois}, ["Y", "A"], pooled_w=0)
    with pytest.raises(RuntimeError, match="spatial_scale"):
        run("RoIPool", {"X": x, "R": rois}, ["Y", "A"], spatial_scale=0.0)
    bad = rois.copy()
    bad[2, 0] = 2  # batch index past N
    with pytest.raises(RuntimeError, match="batch index 2"):
        run("RoIPool", {"X": x, "R": bad}, ["Y", "A"])
    with pytest.raises(RuntimeError, match="R.dim32"):
        run("RoIPool", {"X": x, "R": rois[:, :4]}, ["Y", "A"])
    with pytest.raises(RuntimeError):
        run("RoIPool", {"X": x, "R": rois, "Z": rois}, ["Y", "A"])


@pytest.mark.parametrize(
    "op_type,inputs,outputs,args",
    [
        ("Im2Col", ["X"], ["X"], {"kernel": 1}),
        ("Col2Im", ["C", "X"], ["X"], {"kernel": 1}),
        ("LengthsPad", ["X", "L"], ["X"], {"target_length": 2}),
        ("DotProductWithPadding", ["X", "Y"], ["X"], {}),
        ("RoIPool", ["X", "R"], ["X", "A"], {}),
        ("HalfFloatToFused8BitRowwiseQuantized", ["X"], ["X"], {}),
        ("Fused8BitRowwiseQuantizedHalfScaleBiasToFloat", ["X"], ["X"], {}),
    ],
)
def test_new_ops_do_not_run_in_place(op_type, inputs, outputs, args):
    for name in set(inputs):
        workspace.FeedBlob(name, f32(1, 1, 2, 2))
    with pytest.raises(RuntimeError, match="cannot run in place"):
        workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **args))
