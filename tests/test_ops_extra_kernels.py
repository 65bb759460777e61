"""CPU kernels of the ops ferrocaffe's own builders emit (fp16 conversions and updates, Lars,
LearningRateAdaption, the row-wise sparse optimizers, GroupNorm, Moments, PadImage, ArgMin /
ArgMax) and the unary math gradient kernels: each op through ``workspace.RunOperatorOnce``
against a numpy version of Caffe2's formula, and every gradient kernel numerically against
its forward op with ``GradientChecker`` (the gradient ops are written by hand with Caffe2's
input/output order, no gradient maker being registered for these types yet)."""

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import brew, core, gradient_checker, model_helper, optimizer, workspace

RNG = np.random.default_rng(1234)


def run_named(op_type, inputs, feeds, outputs, **args):
    """Like ``run`` with an explicit input list (blobs may repeat as outputs)."""
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **args))
    return [workspace.FetchBlob(o) for o in outputs]


def f32(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def check_gradient(op, inputs, grad_ops, check, outputs_with_grads=(0,), step=0.01, tol=0.01):
    checker = gradient_checker.GradientChecker(
        step, tol, workspace_name="extra_kernels_gc", full_check=True
    )
    for i in check:
        ok, grad, estimate = checker.CheckSimple(
            op, [a.copy() for a in inputs], i, list(outputs_with_grads), grad_ops=grad_ops
        )
        assert np.any(estimate != 0), (op.type, op.input[i])
        assert ok, (op.type, op.input[i], grad.ravel()[:6], estimate.ravel()[:6])


# -- fp16 ------------------------------------------------------------------------------------


def test_float_to_half_and_back():
    x = np.array([[1.5, -0.1, 7e4], [-7e4, 3.14159, 0.0]], np.float32)
    (h,) = run("FloatToHalf", {"X": x}, ["H"])
    assert h.dtype == np.float16 and h.shape == x.shape
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h, x.astype(np.float16))
    (y,) = run("HalfToFloat", {"H": h}, ["Y"])
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, h.astype(np.float32))
    (c,) = run("FloatToHalf", {"X": x}, ["C"], clip=True)
    np.testing.assert_array_equal(c, np.clip(x, -65504, 65504).astype(np.float16))
    with pytest.raises(RuntimeError):
        run("HalfToFloat", {"X": x}, ["Z"])


def test_float16_constant_fill():
    (y,) = run("Float16ConstantFill", {}, ["Y"], shape=[2, 3], value=-1.25)
    assert y.dtype == np.float16 and y.shape == (2, 3)
    np.testing.assert_array_equal(y, np.full((2, 3), -1.25, np.float16))
    (z,) = run("Float16ConstantFill", {}, ["Z"], shape=[4])
    np.testing.assert_array_equal(z, np.zeros(4, np.float16))


def momentum_ref(g, m, lr, p, momentum, wd, nesterov):
    g, m, p = (a.astype(np.float64) for a in (g, m, p))
    g = g + wd * p
    m_new = lr * g + momentum * m
    step = (1 + momentum) * m_new - momentum * m if nesterov else m_new
    return step, m_new, p - step


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize(
    "op_type,dtype", [("FP32MomentumSGDUpdate", np.float32), ("FP16MomentumSGDUpdate", np.float16)]
)
def test_momentum_sgd_with_weight_decay(op_type, dtype, nesterov):
    g, m, p = (f32(3, 2).astype(dtype) for _ in range(3))
    lr = np.array([-0.1], np.float32)
    outs = run_named(
        op_type,
        ["g", "m", "lr", "p"],
        {"g": g, "m": m, "lr": lr, "p": p},
        ["g", "m", "p"],
        momentum=0.9,
        weight_decay=0.01,
        nesterov=nesterov,
    )
    want = momentum_ref(g, m, -0.1, p, 0.9, 0.01, nesterov)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    for got, ref in zip(outs, want, strict=True):
        assert got.dtype == dtype and got.shape == (3, 2)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


# -- Lars / LearningRateAdaption ---------------------------------------------------------------


def test_lars():
    x, dx = f32(4, 3), f32(4, 3)
    wd, trust, lr_max = (np.array([v], np.float32) for v in (0.01, 0.8, 5.0))
    ins = {"X": x, "dX": dx, "wd": wd, "trust": trust, "lr_max": lr_max}
    (out,) = run("Lars", ins, ["lr"], offset=0.1, lr_min=0.0)
    ref = 0.8 / (np.linalg.norm(dx) / np.linalg.norm(x) + 0.01 + 0.1)
    assert out.shape == (1,)
    np.testing.assert_allclose(out[0], min(ref, 5.0), rtol=1e-5)
    (out,) = run("Lars", ins, ["lr"])  # defaults: offset 0.5, lr_min 0.02
    np.testing.assert_allclose(
        out[0], 0.8 / (np.linalg.norm(dx) / np.linalg.norm(x) + 0.51), rtol=1e-5
    )
    (out,) = run("Lars", ins, ["lr"], lr_min=2.0)
    assert out[0] == 2.0


@pytest.mark.parametrize("normalized", [True, False])
def test_learning_rate_adaption(normalized):
    lr = np.array([-0.05], np.float32)
    g, e = f32(10), f32(10)
    (out,) = run_named(
        "LearningRateAdaption",
        ["lr", "g", "e"],
        {"lr": lr, "g": g, "e": e},
        ["lr"],
        lr_alpha=0.1,
        normalized_lr_adaption=normalized,
    )
    dot = float(np.dot(g.astype(np.float64), e))
    if normalized:
        ref = -0.05 * (1 - 0.1 * dot / (np.linalg.norm(g) * np.linalg.norm(e)))
    else:
        ref = -0.05 - 0.1 * dot
    np.testing.assert_allclose(out, [ref], rtol=1e-5)


# -- row-wise sparse optimizers ---------------------------------------------------------------


def rowwise_adagrad_ref(p, h, idx, g, lr, eps, wd=0.0, counter=None, halflife=-1):
    p, h = p.astype(np.float64).copy(), h.astype(np.float64).copy()
    rows = g.reshape(idx.size, -1)
    flat = p.reshape(p.shape[0], -1)
    for k, r in enumerate(idx.ravel()):
        freq = halflife / counter[r] if counter is not None and counter[r] > 0 else 1.0
        gk = rows[k] + wd * freq * flat[r]
        h[r] += np.mean(gk**2)
        flat[r] += lr * gk / (np.sqrt(h[r]) + eps)
    return p, h


def test_rowwise_sparse_adagrad():
    p, h = f32(5, 3), f32(5, lo=0.0, hi=1.0)
    idx = np.array([3, 0, 3], np.int64)
    g = f32(3, 3)
    lr = np.array([-0.1], np.float32)
    feeds = {"p": p, "h": h, "i": idx, "g": g, "lr": lr}
    got = run_named(
        "RowWiseSparseAdagrad", ["p", "h", "i", "g", "lr"], feeds, ["p", "h"], epsilon=1e-4
    )
    for a, b in zip(got, rowwise_adagrad_ref(p, h, idx, g, -0.1, 1e-4), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    counter = np.array([0.0, 2.0, 1.0, 4.0, 0.5])
    feeds["c"] = counter
    got = run_named(
        "RowWiseSparseAdagrad",
        ["p", "h", "i", "g", "lr", "c"],
        feeds,
        ["p", "h"],
        epsilon=1e-4,
        weight_decay=0.1,
        counter_halflife=2,
    )
    ref = rowwise_adagrad_ref(p, h, idx, g, -0.1, 1e-4, 0.1, counter, 2)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="out of range"):
        feeds["i"] = np.array([5], np.int32)
        feeds["g"] = f32(1, 3)
        run_named("RowWiseSparseAdagrad", ["p", "h", "i", "g", "lr"], feeds, ["p", "h"])


def rowwise_adam_ref(p, m1, m2, idx, g, lr, it, b1=0.9, b2=0.999, eps=1e-5):
    p, m1, m2 = (a.astype(np.float64).copy() for a in (p, m1, m2))
    t = it + 1
    corr = np.sqrt(1 - b2**t) / (1 - b1**t)
    rows = g.reshape(idx.size, -1)
    eff = np.zeros_like(rows, dtype=np.float64)
    for k, r in enumerate(idx.ravel()):
        m2[r] = b2 * m2[r] + (1 - b2) * np.mean(rows[k].astype(np.float64) ** 2)
        m1[r] = b1 * m1[r] + (1 - b1) * rows[k]
        eff[k] = corr * m1[r] / (np.sqrt(m2[r]) + eps)
        p[r] += lr * eff[k]
    return p, m1, m2, eff.reshape(g.shape)


@pytest.mark.parametrize("with_grad", [False, True])
def test_rowwise_sparse_adam(with_grad):
    p, m1, m2 = f32(4, 2), f32(4, 2), f32(4, lo=0.0, hi=0.5)
    idx = np.array([[1, 2], [1, 0]], np.int32)
    g = f32(2, 2, 2)
    feeds = {
        "p": p,
        "m1": m1,
        "m2": m2,
        "i": idx,
        "g": g,
        "lr": np.array([-0.01], np.float32),
        "it": np.array([4], np.int64),
    }
    outs = ["p", "m1", "m2"] + (["eff"] if with_grad else [])
    got = run_named("RowWiseSparseAdam", ["p", "m1", "m2", "i", "g", "lr", "it"], feeds, outs)
    ref = rowwise_adam_ref(p, m1, m2, idx, g, -0.01, 4)
    for a, b in zip(got, ref, strict=False):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_smart_decay_sparse_adam():
    b1, b2, eps = 0.9, 0.999, 1e-5
    p, m1, m2 = f32(4, 3), f32(4, 3), f32(4, 3, lo=0.0, hi=0.5)
    seen = np.array([0, 5, 9, 2], np.int64)
    idx = np.array([2, 1], np.int64)
    g = f32(2, 3)
    it = 9
    feeds = {
        "p": p,
        "m1": m1,
        "m2": m2,
        "seen": seen,
        "i": idx,
        "g": g,
        "lr": np.array([-0.01], np.float32),
        "it": np.array([it], np.int64),
    }
    got = run_named(
        "SmartDecaySparseAdam",
        ["p", "m1", "m2", "seen", "i", "g", "lr", "it"],
        feeds,
        ["p", "m1", "m2", "seen"],
    )
    rp, rm1, rm2 = (a.astype(np.float64).copy() for a in (p, m1, m2))
    rseen = seen.copy()
    t = it + 1
    for k, r in enumerate(idx):
        steps = t - rseen[r]
        catchup = rm1[r] * b1 * (1 - b1 ** (steps - 1)) / (1 - b1) if steps > 1 else 0.0
        rm1[r] = rm1[r] * b1**steps + g[k] * (1 - b1)
        rm2[r] = rm2[r] * b2**steps + g[k] ** 2 * (1 - b2)
        rp[r] += -0.01 * (rm1[r] + catchup) / (np.sqrt(rm2[r]) + eps)
        rseen[r] = t
    for a, b in zip(got[:3], (rp, rm1, rm2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[3], rseen)


def test_rowwise_counter():
    prev = np.array([0, 3, 7, 10], np.int64)
    cnt = np.array([0.0, 1.0, 2.0, 3.0])
    idx = np.array([1, 2, 2, 3], np.int64)
    feeds = {"prev": prev, "cnt": cnt, "i": idx, "it": np.array([8], np.int64)}
    got = run_named(
        "RowWiseCounter", ["prev", "cnt", "i", "it"], feeds, ["prev", "cnt"], counter_halflife=5
    )
    rp, rc = prev.copy(), cnt.copy()
    for r in idx:
        delta = max(0, 8 - rp[r])
        rc[r] = 1.0 + 0.5 ** (delta / 5) * rc[r]
        rp[r] = max(8, rp[r])
    np.testing.assert_array_equal(got[0], rp)
    np.testing.assert_allclose(got[1], rc, rtol=1e-12)
    assert got[1].dtype == np.float64


# -- GroupNorm ---------------------------------------------------------------------------------


def group_norm_ref(x, gamma, beta, group, eps, order):
    if order == "NHWC":
        x = np.moveaxis(x, -1, 1)
    n, c = x.shape[:2]
    xg = x.reshape(n, group, -1).astype(np.float64)
    mu = xg.mean(axis=2)
    rsig = 1 / np.sqrt(xg.var(axis=2) + eps)
    y = ((xg - mu[..., None]) * rsig[..., None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    y = y * gamma.reshape(shape) + beta.reshape(shape)
    if order == "NHWC":
        y = np.moveaxis(y, 1, -1)
    return y, mu, rsig


@pytest.mark.parametrize(
    "order,shape", [("NCHW", (2, 6, 3, 2)), ("NHWC", (2, 3, 2, 6)), ("NCHW", (1, 6, 2, 2, 2))]
)
def test_group_norm_forward(order, shape):
    x = f32(*shape)
    c = 6
    gamma, beta = f32(c), f32(c)
    y, mu, rsig = run(
        "GroupNorm",
        {"X": x, "gamma": gamma, "beta": beta},
        ["Y", "mu", "rsig"],
        group=3,
        epsilon=1e-3,
        order=order,
        is_test=0,
    )
    ry, rmu, rrsig = group_norm_ref(x, gamma, beta, 3, 1e-3, order)
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mu, rmu, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rsig, rrsig, rtol=1e-4, atol=1e-5)
    assert mu.shape == (shape[0], 3)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_group_norm_gradient(order):
    shape = (2, 4, 3, 2) if order == "NCHW" else (2, 3, 2, 4)
    x = f32(*shape)
    gamma, beta = f32(4, lo=0.5, hi=1.5), f32(4)
    args = dict(group=2, order=order)
    op = core.CreateOperator(
        "GroupNorm", ["X", "gamma", "beta"], ["Y", "mu", "rsig"], is_test=0, **args
    )
    grad = core.CreateOperator(
        "GroupNormGradient",
        ["Y_grad", "X", "gamma", "beta", "mu", "rsig"],
        ["X_grad", "gamma_grad", "beta_grad"],
        **args,
    )
    check_gradient(op, [x, gamma, beta], [grad], check=[0, 1, 2], step=0.005)


# -- Moments -----------------------------------------------------------------------------------


@pytest.mark.parametrize("axes,keepdims", [([1], True), ([0, -1], False), (None, True)])
def test_moments_forward(axes, keepdims):
    x = f32(3, 4, 2)
    args = {"keepdims": keepdims}
    if axes is not None:
        args["axes"] = axes
    mean, var = run("Moments", {"X": x}, ["mean", "var"], **args)
    ax = tuple(axes) if axes is not None else None
    np.testing.assert_allclose(mean, x.mean(axis=ax, keepdims=keepdims), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, x.var(axis=ax, keepdims=keepdims), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axes,keepdims", [([1], True), ([0, 2], False)])
def test_moments_gradient(axes, keepdims):
    x = f32(3, 4, 2)
    op = core.CreateOperator("Moments", ["X"], ["mean", "var"], axes=axes, keepdims=keepdims)
    grad = core.CreateOperator(
        "MomentsGradient",
        ["mean_grad", "var_grad", "X", "mean"],
        ["X_grad"],
        axes=axes,
        keepdims=keepdims,
    )
    check_gradient(op, [x], [grad], check=[0], outputs_with_grads=(0, 1))


# -- PadImage ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_pad_image_forward(mode, order):
    x = f32(2, 3, 5, 4) if order == "NCHW" else f32(2, 5, 4, 3)
    pads = dict(pad_t=1, pad_l=2, pad_b=3, pad_r=0)
    extra = {"value": 0.5} if mode == "constant" else {}
    (y,) = run("PadImage", {"X": x}, ["Y"], mode=mode, order=order, **pads, **extra)
    spatial = ((1, 3), (2, 0))
    width = ((0, 0), (0, 0)) + spatial if order == "NCHW" else ((0, 0),) + spatial + ((0, 0),)
    kw = {"constant_values": 0.5} if mode == "constant" else {}
    np.testing.assert_array_equal(y, np.pad(x, width, mode=mode, **kw))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_image_gradient(mode):
    x = f32(1, 2, 3, 4)
    args = dict(mode=mode, pad_t=2, pad_l=1, pad_b=0, pad_r=3)
    op = core.CreateOperator("PadImage", ["X"], ["Y"], **args)
    grad = core.CreateOperator("PadImageGradient", ["Y_grad"], ["X_grad"], **args)
    check_gradient(op, [x], [grad], check=[0])


def test_pad_image_errors():
    x = f32(1, 1, 2, 2)
    with pytest.raises(RuntimeError, match="Unknown padding mode"):
        run("PadImage", {"X": x}, ["Y"], mode="wrap", pad=1)
    with pytest.raises(RuntimeError, match="reaches past"):
        run("PadImage", {"X": x}, ["Y"], mode="reflect", pad=3)
    with pytest.raises(RuntimeError):
        run("PadImage", {"X": f32(2, 2)}, ["Y"], pad=1)


# -- ArgMax / ArgMin ---------------------------------------------------------------------------


@pytest.mark.parametrize("op_type,fn", [("ArgMax", np.argmax), ("ArgMin", np.argmin)])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_arg_ops(op_type, fn, axis):
    x = RNG.permutation(24).reshape(2, 3, 4).astype(np.float32)
    (y,) = run(op_type, {"X": x}, ["Y"], axis=axis)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, np.expand_dims(fn(x, axis=axis), axis))
    (y,) = run(op_type, {"X": x.astype(np.int32)}, ["Y"], axis=axis, keepdims=False)
    np.testing.assert_array_equal(y, fn(x, axis=axis))


def test_arg_ops_ties():
    x = np.array([[2, 5, 5, 1, 1]], np.float32)
    assert run("ArgMax", {"X": x}, ["Y"])[0].tolist() == [[1]]
    assert run("ArgMax", {"X": x}, ["Y"], select_last_index=True)[0].tolist() == [[2]]
    assert run("ArgMin", {"X": x}, ["Y"], select_last_index=True)[0].tolist() == [[4]]


# -- unary math gradients ----------------------------------------------------------------------

UNARY = [
    # forward, gradient, inputs of the gradient op (Caffe2's order), input generator
    ("Sin", "SinGradient", ["X", "Y_grad"], lambda: f32(3, 4, lo=-2, hi=2)),
    ("Cos", "CosGradient", ["X", "Y_grad"], lambda: f32(3, 4, lo=-2, hi=2)),
    ("Tan", "TanGradient", ["X", "Y_grad"], lambda: f32(3, 4, lo=-1, hi=1)),
    ("Acos", "AcosGradient", ["X", "Y_grad"], lambda: f32(3, 4, lo=-0.8, hi=0.8)),
    ("Asin", "AsinGradient", ["X", "Y_grad"], lambda: f32(3, 4, lo=-0.8, hi=0.8)),
    ("Atan", "AtanGradient", ["X", "Y_grad"], lambda: f32(3, 4, lo=-2, hi=2)),
    ("Cbrt", "CbrtGradient", ["Y_grad", "Y"], lambda: f32(3, 4, lo=0.5, hi=2)),
    ("Reciprocal", "ReciprocalGradient", ["Y", "Y_grad"], lambda: f32(3, 4, lo=0.5, hi=2)),
    ("RSqrt", "RSqrtGradient", ["Y_grad", "Y"], lambda: f32(3, 4, lo=0.5, hi=2)),
    ("Rsqrt", "RsqrtGradient", ["Y_grad", "Y"], lambda: f32(3, 4, lo=0.5, hi=2)),
]


@pytest.mark.parametrize("fwd,grad_type,grad_inputs,make", UNARY, ids=[u[1] for u in UNARY])
def test_unary_gradient_kernels(fwd, grad_type, grad_inputs, make):
    op = core.CreateOperator(fwd, ["X"], ["Y"])
    grad = core.CreateOperator(grad_type, grad_inputs, ["X_grad"])
    check_gradient(op, [make()], [grad], check=[0], step=0.005)


def test_unary_gradient_shape_mismatch():
    with pytest.raises(RuntimeError, match="same shape"):
        run_named("SinGradient", ["X", "dY"], {"X": f32(3), "dY": f32(4)}, ["dX"])


# -- the optimizer builders that emit these ops -----------------------------------------------

BUILDERS = {
    "RowWiseSparseAdagrad": lambda: optimizer.AdagradOptimizer(alpha=0.1, rowWise=True),
    "RowWiseCounter": lambda: optimizer.AdagradOptimizer(
        alpha=0.1, rowWise=True, counter_halflife=5, weight_decay=0.01
    ),
    "RowWiseSparseAdam": lambda: optimizer.AdamOptimizer(alpha=0.01, rowWise=True),
    "SmartDecaySparseAdam": lambda: optimizer.AdamOptimizer(alpha=0.01, use_smart_decay=True),
    "LearningRateAdaption": lambda: optimizer.AdamOptimizer(
        alpha=0.01, rowWise=True, use_lr_adaption=True
    ),
}


@pytest.mark.parametrize("op_type", sorted(BUILDERS))
def test_optimizer_builders_run_on_an_embedding(op_type):
    """The optimizer emits ``op_type`` for a sparse embedding gradient, and three training
    iterations update exactly the rows that were looked up."""
    model = model_helper.ModelHelper(name="emb_" + op_type)
    emb = model.param_init_net.GaussianFill([], "emb", shape=[5, 3], std=0.5)
    model.AddParameter(emb)
    pooled = model.net.SparseLengthsSum([emb, "ids", "lens"], "pooled")
    fc = brew.fc(model, pooled, "fc", dim_in=3, dim_out=1)
    dist = model.net.SquaredL2Distance([fc, "target"], "dist")
    model.AddGradientOperators([model.net.AveragedLoss(dist, "loss")])
    (info,) = [i for i in model.GetOptimizationParamInfo() if str(i.blob) == "emb"]
    BUILDERS[op_type]()(model.net, model.param_init_net, info)
    assert op_type in {op.type for op in model.net.Proto().op}
    workspace.FeedBlob("ids", np.array([0, 3, 3, 1], np.int32))
    workspace.FeedBlob("lens", np.array([2, 2], np.int32))
    workspace.FeedBlob("target", np.array([[1.0], [-1.0]], np.float32))
    workspace.RunNetOnce(model.param_init_net)
    before = workspace.FetchBlob("emb").copy()
    workspace.CreateNet(model.net)
    for _ in range(3):
        workspace.RunNet(model.net.Proto().name)
    changed = np.any(workspace.FetchBlob("emb") != before, axis=1)
    assert np.flatnonzero(changed).tolist() == [0, 1, 3]
