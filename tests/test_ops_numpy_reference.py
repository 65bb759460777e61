"""Size, ElementwiseLinear, SigmoidCrossEntropyWithLogits, LRN, WeightedSumGradient and the
weighted SparseLengths gradient with the weights' gradient, against numpy versions of
Caffe2's definitions (forward values, gradient ops run directly, shapes, dtypes, errors)."""

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import core, workspace

RNG = np.random.default_rng(11)


# -- Size -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        np.zeros((2, 3, 4), np.float32),
        np.zeros((7,), np.int32),
        np.float32(3.0),
        np.zeros((3, 0), np.float64),
        np.array([b"a", b"bc"], dtype=object),
    ],
    ids=["float3d", "int_vector", "scalar", "empty", "strings"],
)
def test_size_is_the_element_count(value):
    (n,) = run("Size", {"X": value}, ["n"])
    assert n.dtype == np.int64
    assert n.shape == ()
    assert int(n) == np.asarray(value).size


def test_size_has_no_gradient_and_no_in_place():
    ops, g_in = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("Size", ["X"], ["Y"]), ["Y_grad"]
    )
    assert list(ops) == [] and list(g_in) == [None]
    workspace.FeedBlob("X", np.zeros(3, np.float32))
    with pytest.raises(RuntimeError):
        workspace.RunOperatorOnce(core.CreateOperator("Size", ["X"], ["X"]))


# -- ElementwiseLinear ----------------------------------------------------------------------


@pytest.mark.parametrize("shape, axis", [((4, 3), 1), ((2, 3, 5), 1), ((2, 3, 5), -1), ((6,), 0)])
def test_elementwise_linear_matches_numpy(shape, axis):
    x = RNG.normal(size=shape).astype(np.float32)
    a_ax = axis % len(shape)
    n, d = int(np.prod(shape[:a_ax])), int(np.prod(shape[a_ax:]))
    w = RNG.normal(size=d).astype(np.float32)
    b = RNG.normal(size=d).astype(np.float32)
    (y,) = run("ElementwiseLinear", {"X": x, "w": w, "b": b}, ["Y"], axis=axis)
    want = x.reshape(n, d) * w + b
    np.testing.assert_allclose(y, want.reshape(shape), rtol=1e-6, atol=1e-6)
    dy = RNG.normal(size=shape).astype(np.float32)
    dx, dw, db = run(
        "ElementwiseLinearGradient", {"dY": dy, "X": x, "w": w}, ["dX", "dw", "db"], axis=axis
    )
    g = dy.reshape(n, d)
    np.testing.assert_allclose(dx, (g * w).reshape(shape), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dw, (g * x.reshape(n, d)).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, g.sum(0), rtol=1e-5, atol=1e-5)


def test_elementwise_linear_errors_name_the_blob():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(RuntimeError, match=r"'bias'.*D = 3.*type ElementwiseLinear"):
        run(
            "ElementwiseLinear",
            {"X": x, "w": np.ones(3, np.float32), "bias": np.ones(2, np.float32)},
            ["Y"],
        )
    with pytest.raises(RuntimeError, match="axis 2 out of range"):
        run(
            "ElementwiseLinear",
            {"X": x, "w": np.ones(3, np.float32), "b": np.ones(3, np.float32)},
            ["Y"],
            axis=2,
        )


# -- SigmoidCrossEntropyWithLogits ----------------------------------------------------------


def _softplus(x):
    return np.logaddexp(0.0, x)


def xent_ref(x, t, mode):
    x, t = x.astype(np.float64), t.astype(np.float64)
    if mode == "plain":
        term = -t * _softplus(-x) - (1 - t) * _softplus(x)
        grad = t - 1 / (1 + np.exp(-x))
    elif mode == "log_D_trick":
        term = -(2 * t - 1) * _softplus(-x)
        grad = (2 * t - 1) / (1 + np.exp(x))
    else:
        term = t * x - (1 - t) * _softplus(x)
        grad = t - (1 - t) / (1 + np.exp(-x))
    inner = x.shape[-1] if x.ndim else 1
    return -term.mean(-1) if x.ndim else -term, grad, inner


@pytest.mark.parametrize("mode", ["plain", "log_D_trick", "unjoined_lr_loss"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 2, 5), (6,), ()])
def test_sigmoid_cross_entropy_matches_numpy(mode, shape):
    x = (RNG.normal(size=shape) * 3).astype(np.float32)
    t = RNG.uniform(0, 1, size=shape).astype(np.float32)
    args = {} if mode == "plain" else {mode: 1}
    (y,) = run("SigmoidCrossEntropyWithLogits", {"logits": x, "targets": t}, ["Y"], **args)
    loss, grad, inner = xent_ref(x, t, "plain" if not args else mode)
    assert y.shape == shape[:-1]
    np.testing.assert_allclose(y, loss, rtol=1e-5, atol=1e-6)
    dy = RNG.normal(size=shape[:-1]).astype(np.float32)
    (dx,) = run(
        "SigmoidCrossEntropyWithLogitsGradient",
        {"dY": dy, "logits": x, "targets": t},
        ["dX"],
        **args,
    )
    want = -np.asarray(dy, np.float64)[..., None] * grad / inner if shape else -dy * grad
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-6)


def test_sigmoid_cross_entropy_stays_finite_for_large_logits():
    x = np.array([[80.0, -80.0, 0.0]], np.float32)
    t = np.array([[0.0, 1.0, 0.5]], np.float32)
    (y,) = run("SigmoidCrossEntropyWithLogits", {"x": x, "t": t}, ["Y"])
    np.testing.assert_allclose(y, [(80.0 + 80.0 + np.log(2.0)) / 3], rtol=1e-6)


def test_sigmoid_cross_entropy_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(RuntimeError, match=r"logits 'x' \[2, 3\] and targets 't' \[3, 2\]"):
        run("SigmoidCrossEntropyWithLogits", {"x": x, "t": np.zeros((3, 2), np.float32)}, ["Y"])
    with pytest.raises(RuntimeError, match="cannot be set as True simultaneously"):
        run(
            "SigmoidCrossEntropyWithLogits",
            {"x": x, "t": x},
            ["Y"],
            log_D_trick=1,
            unjoined_lr_loss=1,
        )
    with pytest.raises(RuntimeError, match="one per example"):
        run(
            "SigmoidCrossEntropyWithLogitsGradient",
            {"dY": np.ones(3, np.float32), "x": x, "t": x},
            ["dX"],
        )


# -- LRN ------------------------------------------------------------------------------------


def lrn_ref(x, size, alpha, beta, bias, nhwc):
    """Y and the scale in float64, channels on axis 1 (NCHW) or last (NHWC)."""
    x = x.astype(np.float64)
    c_axis = x.ndim - 1 if nhwc else 1
    xc = np.moveaxis(x, c_axis, 0)
    c, pre = xc.shape[0], (size - 1) // 2
    scale = np.empty_like(xc)
    for ch in range(c):
        lo, hi = max(0, ch - pre), min(c, ch + size - pre)
        scale[ch] = bias + alpha / size * (xc[lo:hi] ** 2).sum(0)
    y = xc * scale**-beta
    return np.moveaxis(y, 0, c_axis), np.moveaxis(scale, 0, c_axis)


@pytest.mark.parametrize(
    "order, shape, size",
    [("NCHW", (2, 5, 3, 2), 3), ("NHWC", (2, 3, 2, 6), 5), ("NCHW", (1, 2, 2, 2), 5)],
)
def test_lrn_and_gradient_match_numpy(order, shape, size):
    args = dict(size=size, alpha=0.3, beta=0.75, bias=1.5, order=order)
    x = RNG.normal(size=shape).astype(np.float32)
    y, scale = run("LRN", {"X": x}, ["Y", "scale"], **args)
    want_y, want_s = lrn_ref(x, size, 0.3, 0.75, 1.5, order == "NHWC")
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scale, want_s, rtol=1e-5, atol=1e-6)
    dy = RNG.normal(size=shape).astype(np.float32)
    (dx,) = run("LRNGradient", {"X": x, "Y": y, "dY": dy}, ["dX"], **args)
    # Vector-Jacobian product by central differences of the float64 reference.
    want = np.zeros(x.size)
    flat = x.astype(np.float64).ravel()
    h = 1e-6
    for k in range(x.size):
        e = np.zeros_like(flat)
        e[k] = h
        plus = lrn_ref((flat + e).reshape(shape), size, 0.3, 0.75, 1.5, order == "NHWC")[0]
        minus = lrn_ref((flat - e).reshape(shape), size, 0.3, 0.75, 1.5, order == "NHWC")[0]
        want[k] = ((plus - minus) * dy).sum() / (2 * h)
    np.testing.assert_allclose(dx, want.reshape(shape), rtol=1e-4, atol=1e-5)


def test_lrn_gradient_refuses_mismatched_shapes():
    x = np.ones((1, 3, 1, 1), np.float32)
    with pytest.raises(RuntimeError, match=r"input 2 \('dY'\).*type LRNGradient"):
        run(
            "LRNGradient", {"X": x, "Y": x, "dY": np.ones((1, 2, 1, 1), np.float32)}, ["dX"], size=3
        )


# -- WeightedSumGradient --------------------------------------------------------------------


@pytest.mark.parametrize("pairs", [1, 2, 4])
@pytest.mark.parametrize("grad_on_w", [0, 1])
def test_weighted_sum_gradient_matches_numpy(pairs, grad_on_w):
    dy = RNG.normal(size=(3, 2)).astype(np.float32)
    inputs = {"dY": dy}
    for k in range(pairs):
        inputs[f"X{k}"] = RNG.normal(size=(3, 2)).astype(np.float32)
        inputs[f"w{k}"] = RNG.normal(size=(1,)).astype(np.float32)
    outs = [f"dX{k}" for k in range(pairs)]
    if grad_on_w:
        outs += [f"dw{k}" for k in range(pairs)]
    got = run("WeightedSumGradient", inputs, outs, grad_on_w=grad_on_w)
    for k in range(pairs):
        np.testing.assert_allclose(got[k], inputs[f"w{k}"][0] * dy, rtol=1e-6)
        if grad_on_w:
            dw = got[pairs + k]
            assert dw.shape == (1,)
            np.testing.assert_allclose(dw, [(dy * inputs[f"X{k}"]).sum()], rtol=1e-5)


def test_weighted_sum_gradient_errors():
    dy = np.ones((2,), np.float32)
    with pytest.raises(RuntimeError, match=r"input 2 \('w0'\) must hold one value"):
        run(
            "WeightedSumGradient",
            {"dY": dy, "X0": dy, "w0": np.ones(2, np.float32)},
            ["dX0"],
        )
    with pytest.raises(RuntimeError, match=r"input 1 \('X0'\) has 3 values, expected 2"):
        run(
            "WeightedSumGradient",
            {"dY": dy, "X0": np.ones(3, np.float32), "w0": np.ones(1, np.float32)},
            ["dX0", "dw0"],
            grad_on_w=1,
        )


# -- SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient -------------------------


@pytest.mark.parametrize("row_shape", [(3,), (2, 2), ()])
def test_sparse_lengths_weighted_gradient_with_main_input(row_shape):
    data = RNG.normal(size=(5,) + row_shape).astype(np.float32)
    idx = np.array([4, 0, 0, 2, 1, 4], np.int64)
    lengths = np.array([2, 0, 3, 1], np.int32)
    w = RNG.normal(size=6).astype(np.float32)
    dy = RNG.normal(size=(4,) + row_shape).astype(np.float32)
    values, w_grad = run(
        "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
        {"W": w, "dY": dy, "L": lengths, "D": data, "I": idx},
        ["D_grad_values", "W_grad"],
        grad_on_weights=1,
    )
    seg = np.repeat(np.arange(4), lengths)
    want_values = w.reshape((6,) + (1,) * len(row_shape)) * dy[seg]
    want_w = (dy[seg] * data[idx]).reshape(6, -1).sum(1)
    assert values.shape == (6,) + row_shape and w_grad.shape == (6,)
    np.testing.assert_allclose(values, want_values, rtol=1e-6)
    np.testing.assert_allclose(w_grad, want_w, rtol=1e-5, atol=1e-6)


def test_sparse_lengths_weighted_gradient_with_main_input_is_what_the_maker_emits():
    op = core.CreateOperator(
        "SparseLengthsWeightedSum", ["D", "W", "I", "L"], ["Y"], grad_on_weights=1
    )
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    (g,) = grad_ops
    assert g.type == "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient"
    data = RNG.normal(size=(4, 2)).astype(np.float32)
    w = RNG.normal(size=3).astype(np.float32)
    for name, value in {
        "D": data,
        "W": w,
        "I": np.array([3, 1, 3], np.int32),
        "L": np.array([1, 2], np.int32),
        "Y_grad": np.array([[1.0, 2.0], [3.0, -1.0]], np.float32),
    }.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(g)
    np.testing.assert_allclose(
        workspace.FetchBlob(g.output[1]),
        [data[3] @ [1.0, 2.0], data[1] @ [3.0, -1.0], data[3] @ [3.0, -1.0]],
        rtol=1e-6,
    )
