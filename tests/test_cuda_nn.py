"""CUDA kernels of the nn family against the CPU kernels: Softmax, SoftmaxWithLoss, the
cross-entropy losses, SigmoidCrossEntropyWithLogits, SquaredL2Distance, LayerNorm, SpatialBN
and Dropout, with their gradients."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

GPU = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)


def rng(seed=0):
    return np.random.RandomState(seed)


def randn(*shape, seed=0, scale=1.0):
    return np.asarray(rng(seed).randn(*shape) * scale, dtype=np.float32)


def probs(*shape, seed=0):
    p = rng(seed).rand(*shape).astype(np.float32)
    if p.size:
        p.reshape(-1)[0] = 0.0  # below the log threshold
    return p


def softmax(x, axis=1):
    n, d = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))
    if x.size == 0:
        return x.copy()
    x2 = x.reshape(n, d)
    e = np.exp(x2 - x2.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape).astype(np.float32)


def run(op_type, inputs, outputs, device, **args):
    workspace.ResetWorkspace()
    for name, arr in inputs:
        if device is None:
            workspace.FeedBlob(name, arr)
        else:
            workspace.FeedBlob(name, arr, device)
    op = core.CreateOperator(op_type, [n for n, _ in inputs], outputs, device_option=device, **args)
    workspace.RunOperatorOnce(op)
    out = [workspace.FetchBlob(o) for o in outputs]
    workspace.ResetWorkspace()
    return out


def compare(op_type, inputs, outputs, rtol=1e-4, atol=1e-5, **args):
    cpu = run(op_type, inputs, outputs, None, **args)
    gpu = run(op_type, inputs, outputs, GPU, **args)
    for name, c, g in zip(outputs, cpu, gpu, strict=True):
        c, g = np.asarray(c), np.asarray(g)
        assert g.shape == c.shape, (name, g.shape, c.shape)
        assert g.dtype == c.dtype, (name, g.dtype, c.dtype)
        if c.dtype.kind == "f":
            np.testing.assert_allclose(g, c, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(g, c, err_msg=name)
    return gpu


# ---- Softmax ----------------------------------------------------------------------------

SOFTMAX_CASES = [
    ((4, 10), {}),
    ((0, 10), {}),
    ((2, 3, 5), {}),
    ((2, 3, 5), {"axis": 2}),
    ((2, 3, 5), {"axis": -1}),
    ((3, 1000), {}),
    ((700, 3), {}),
]


@pytest.mark.parametrize("shape,args", SOFTMAX_CASES, ids=[f"{s}-{a}" for s, a in SOFTMAX_CASES])
def test_softmax(shape, args):
    compare("Softmax", [("X", randn(*shape, scale=3.0))], ["Y"], **args)


@pytest.mark.parametrize("shape,args", SOFTMAX_CASES, ids=[f"{s}-{a}" for s, a in SOFTMAX_CASES])
def test_softmax_gradient(shape, args):
    y = softmax(randn(*shape, scale=3.0), args.get("axis", 1) % len(shape))
    compare("SoftmaxGradient", [("Y", y), ("dY", randn(*shape, seed=1))], ["dX"], **args)


# ---- SoftmaxWithLoss ----------------------------------------------------------------------

SWL_CASES = [
    ("plain", 8, 10, np.int32, {}),
    ("int64", 8, 10, np.int64, {}),
    ("weighted", 8, 10, np.int32, {"weight": True}),
    ("scale", 8, 10, np.int32, {"scale": 0.5}),
    ("label_prob", 8, 10, None, {"label_prob": 1}),
    ("label_prob_weighted", 6, 7, None, {"label_prob": 1, "weight": True}),
    ("wide", 4, 1000, np.int32, {}),
    ("empty", 0, 10, np.int32, {}),
    ("empty_weighted", 0, 10, np.int32, {"weight": True}),
]


def swl_inputs(n, d, label_dtype, weight, label_prob):
    x = randn(n, d, scale=2.0)
    if label_prob:
        t = rng(2).rand(n, d).astype(np.float32)
        t /= np.maximum(t.sum(axis=1, keepdims=True), 1e-6)
        lab = t.astype(np.float32)
    else:
        lab = rng(2).randint(0, d, size=n).astype(label_dtype)
    ins = [("X", x), ("label", lab)]
    if weight:
        ins.append(("w", rng(3).rand(n).astype(np.float32)))
    return ins


@pytest.mark.parametrize("case", SWL_CASES, ids=[c[0] for c in SWL_CASES])
def test_softmax_with_loss(case):
    _, n, d, dt, args = case
    args = dict(args)
    weight = args.pop("weight", False)
    ins = swl_inputs(n, d, dt, weight, args.get("label_prob", 0))
    compare("SoftmaxWithLoss", ins, ["P", "loss"], rtol=1e-4, atol=1e-5, **args)


@pytest.mark.parametrize("case", SWL_CASES, ids=[c[0] for c in SWL_CASES])
def test_softmax_with_loss_gradient(case):
    _, n, d, dt, args = case
    args = dict(args)
    weight = args.pop("weight", False)
    ins = swl_inputs(n, d, dt, weight, args.get("label_prob", 0))
    p = softmax(ins[0][1])
    ins += [("P", p), ("dloss", np.array(1.5, dtype=np.float32))]
    compare("SoftmaxWithLossGradient", ins, ["dX"], **args)


def test_softmax_with_loss_axis_and_rejects_bad_labels():
    x = randn(2, 3, 4)
    lab = np.array([1, 11], dtype=np.int32)
    compare("SoftmaxWithLoss", [("X", x), ("label", lab)], ["P", "loss"])
    bad = [("X", randn(3, 4)), ("label", np.array([0, 4, 1], dtype=np.int32))]
    with pytest.raises(Exception, match="outside of supported range"):
        run("SoftmaxWithLoss", bad, ["P", "loss"], GPU)


# ---- LabelCrossEntropy, CrossEntropy ------------------------------------------------------

XENT_SHAPES = [(5, 7), (0, 7), (7,), (3, 2, 4)]


@pytest.mark.parametrize("dt", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("shape", XENT_SHAPES, ids=[str(s) for s in XENT_SHAPES])
def test_label_cross_entropy(shape, dt):
    x = probs(*shape)
    n = 1 if len(shape) == 1 else shape[0]
    d = x.size // n if n else 0
    lab = rng(4).randint(0, max(d, 1), size=n).astype(dt)
    compare("LabelCrossEntropy", [("X", x), ("label", lab)], ["Y"])
    dy = randn(n, seed=5)
    compare("LabelCrossEntropyGradient", [("X", x), ("label", lab), ("dY", dy)], ["dX"])


@pytest.mark.parametrize("shape", XENT_SHAPES, ids=[str(s) for s in XENT_SHAPES])
def test_cross_entropy(shape):
    x = probs(*shape)
    t = rng(6).rand(*shape).astype(np.float32)
    n = 1 if len(shape) == 1 else shape[0]
    compare("CrossEntropy", [("X", x), ("label", t)], ["Y"])
    dy = randn(n, seed=7)
    compare("CrossEntropyGradient", [("X", x), ("label", t), ("dY", dy)], ["dX"])


# ---- SigmoidCrossEntropyWithLogits --------------------------------------------------------

SX_SHAPES = [(4, 6), (0, 6), (3, 2, 5), (), (2, 700)]
SX_VARIANTS = [{}, {"log_D_trick": 1}, {"unjoined_lr_loss": 1}]


@pytest.mark.parametrize("args", SX_VARIANTS, ids=["plain", "log_D_trick", "unjoined_lr_loss"])
@pytest.mark.parametrize("shape", SX_SHAPES, ids=[str(s) for s in SX_SHAPES])
def test_sigmoid_cross_entropy_with_logits(shape, args):
    x = randn(*shape, scale=4.0)
    t = np.asarray(rng(8).rand(*shape) > 0.5, dtype=np.float32)
    if t.size:
        t.reshape(-1)[0] = 0.3
    compare("SigmoidCrossEntropyWithLogits", [("x", x), ("t", t)], ["y"], **args)
    dy = randn(*shape[:-1], seed=9) if shape else np.array(0.7, dtype=np.float32)
    compare(
        "SigmoidCrossEntropyWithLogitsGradient",
        [("dy", dy), ("x", x), ("t", t)],
        ["dx"],
        **args,
    )


# ---- SquaredL2Distance --------------------------------------------------------------------

L2_SHAPES = [(5, 8), (0, 8), (6,), (3, 2, 300)]


@pytest.mark.parametrize("shape", L2_SHAPES, ids=[str(s) for s in L2_SHAPES])
def test_squared_l2_distance(shape):
    x, y = randn(*shape), randn(*shape, seed=1)
    compare("SquaredL2Distance", [("X", x), ("Y", y)], ["Z"], rtol=1e-3)
    n = shape[0]
    dz = randn(n, seed=2)
    compare(
        "SquaredL2DistanceGradient",
        [("X", x), ("Y", y), ("dZ", dz)],
        ["dX", "dY"],
    )


# ---- LayerNorm ----------------------------------------------------------------------------

LN_CASES = [
    ((4, 10), {}),
    ((2, 3, 4), {"axis": 2}),
    ((2, 3, 4), {"axis": -1, "epsilon": 1e-3}),
    ((2, 3, 4), {"axis": 0}),
    ((0, 5), {}),
    ((3, 1000), {}),
    ((4, 10), {"elementwise_affine": 1}),
    ((2, 3, 4), {"axis": 1, "elementwise_affine": 1}),
]


def ln_params(shape, args):
    axis = args.get("axis", 1) % len(shape)
    return shape[axis:], axis


@pytest.mark.parametrize("shape,args", LN_CASES, ids=[f"{s}-{a}" for s, a in LN_CASES])
def test_layer_norm(shape, args):
    x = randn(*shape, scale=2.0) + 0.5
    ins = [("X", x)]
    pshape, _ = ln_params(shape, args)
    if args.get("elementwise_affine"):
        ins += [("gamma", randn(*pshape, seed=1)), ("beta", randn(*pshape, seed=2))]
    compare("LayerNorm", ins, ["Y", "mean", "std"], rtol=1e-3, atol=1e-4, **args)


@pytest.mark.parametrize("shape,args", LN_CASES, ids=[f"{s}-{a}" for s, a in LN_CASES])
def test_layer_norm_gradient(shape, args):
    x = randn(*shape, scale=2.0) + 0.5
    pshape, axis = ln_params(shape, args)
    ins = [("X", x)]
    affine = bool(args.get("elementwise_affine"))
    if affine:
        ins += [("gamma", randn(*pshape, seed=1)), ("beta", randn(*pshape, seed=2))]
    y, mean, std = run("LayerNorm", ins, ["Y", "mean", "std"], None, **args)
    gins = [("dY", randn(*shape, seed=3)), ("Y", y), ("mean", mean), ("std", std), ("X", x)]
    outs = ["dX"]
    if affine:
        gins.append(("gamma", ins[1][1]))
        outs += ["dgamma", "dbeta"]
    compare("LayerNormGradient", gins, outs, rtol=1e-3, atol=1e-4, **args)


# ---- SpatialBN ----------------------------------------------------------------------------

BN_CASES = [
    ("nchw", (2, 3, 4, 5), "NCHW"),
    ("nhwc", (2, 4, 5, 3), "NHWC"),
    ("2d", (6, 3), "NCHW"),
    ("big", (4, 8, 16, 16), "NCHW"),
    ("empty_nchw", (0, 3, 4, 5), "NCHW"),
    ("empty_nhwc", (0, 4, 5, 3), "NHWC"),
]


def bn_params(c):
    return [
        ("scale", randn(c, seed=1) + 1.0),
        ("bias", randn(c, seed=2)),
        ("rm", randn(c, seed=3)),
        ("rv", rng(4).rand(c).astype(np.float32) + 0.5),
    ]


@pytest.mark.parametrize("case", BN_CASES, ids=[c[0] for c in BN_CASES])
def test_spatial_bn_inference(case):
    _, shape, order = case
    c = shape[-1] if order == "NHWC" else shape[1]
    ins = [("X", randn(*shape, scale=2.0) + 1.0)] + bn_params(c)
    compare("SpatialBN", ins, ["Y"], is_test=1, order=order, epsilon=1e-3)


@pytest.mark.parametrize("case", BN_CASES, ids=[c[0] for c in BN_CASES])
def test_spatial_bn_training(case):
    _, shape, order = case
    c = shape[-1] if order == "NHWC" else shape[1]
    ins = [("X", randn(*shape, scale=2.0) + 1.0)] + bn_params(c)
    compare(
        "SpatialBN",
        ins,
        ["Y", "rm", "rv", "saved_mean", "saved_inv_std"],
        rtol=1e-3,
        atol=1e-4,
        order=order,
        momentum=0.7,
        epsilon=1e-4,
    )


@pytest.mark.parametrize("case", BN_CASES, ids=[c[0] for c in BN_CASES])
def test_spatial_bn_gradient(case):
    _, shape, order = case
    c = shape[-1] if order == "NHWC" else shape[1]
    x = randn(*shape, scale=2.0) + 1.0
    ins = [("X", x)] + bn_params(c)
    _, _, _, sm, siv = run("SpatialBN", ins, ["Y", "rm", "rv", "sm", "siv"], None, order=order)
    gins = [("X", x), ("scale", ins[1][1]), ("dY", randn(*shape, seed=5)), ("sm", sm), ("siv", siv)]
    compare(
        "SpatialBNGradient",
        gins,
        ["dX", "dscale", "dbias"],
        rtol=1e-3,
        atol=1e-4,
        order=order,
    )


def test_spatial_bn_gradient_num_batches_falls_back():
    shape, c = (2, 3, 4, 5), 3
    x = randn(*shape)
    gins = [
        ("X", x),
        ("scale", randn(c, seed=1)),
        ("dY", randn(*shape, seed=2)),
        ("sm", randn(c, seed=3)),
        ("siv", rng(4).rand(c).astype(np.float32) + 0.5),
        ("ds", randn(c, seed=5)),
        ("db", randn(c, seed=6)),
    ]
    compare("SpatialBNGradient", gins, ["dX", "dscale", "dbias"], num_batches=2)


# ---- Dropout ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 5), (0, 5)], ids=["4x5", "empty"])
def test_dropout_test_mode_copies(shape):
    x = randn(*shape)
    (y,) = compare("Dropout", [("X", x)], ["Y"], is_test=1, ratio=0.3)
    np.testing.assert_array_equal(y, x)
    (dx,) = compare("DropoutGrad", [("dY", x)], ["dX"], is_test=1, ratio=0.3)
    np.testing.assert_array_equal(dx, x)


def run_dropout(x, ratio, seed):
    dev = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA, random_seed=seed)
    workspace.ResetWorkspace()
    workspace.FeedBlob("X", x, dev)
    op = core.CreateOperator("Dropout", ["X"], ["Y", "mask"], device_option=dev, ratio=ratio)
    workspace.RunOperatorOnce(op)
    y, mask = workspace.FetchBlob("Y"), workspace.FetchBlob("mask")
    workspace.ResetWorkspace()
    return y, mask


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_dropout_training(ratio):
    x = randn(200, 500) + 3.0
    y, mask = run_dropout(x, ratio, 7)
    assert mask.dtype == np.bool_ and mask.shape == x.shape
    assert y.dtype == np.float32 and y.shape == x.shape
    scale = 1.0 / (1.0 - ratio) if ratio < 1.0 else 0.0
    np.testing.assert_allclose(y, np.where(mask, x * np.float32(scale), 0.0), rtol=1e-6)
    kept = mask.mean()
    assert abs(kept - (1.0 - ratio)) < 0.01, kept
    # Reproducible for one seed, different for another.
    y2, mask2 = run_dropout(x, ratio, 7)
    np.testing.assert_array_equal(mask2, mask)
    np.testing.assert_array_equal(y2, y)
    if 0.0 < ratio < 1.0:
        _, mask3 = run_dropout(x, ratio, 8)
        assert (mask3 != mask).any()


def test_dropout_training_empty():
    y, mask = run_dropout(np.zeros((0, 5), np.float32), 0.5, 1)
    assert y.shape == (0, 5) and mask.shape == (0, 5) and mask.dtype == np.bool_


@pytest.mark.parametrize("shape", [(30, 40), (0, 4)], ids=["30x40", "empty"])
def test_dropout_grad(shape):
    dy = randn(*shape)
    mask = rng(3).rand(*shape) > 0.4
    compare("DropoutGrad", [("dY", dy), ("mask", mask)], ["dX"], ratio=0.4)
