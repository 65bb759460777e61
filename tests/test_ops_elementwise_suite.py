"""Activations, unary math, bitwise ops, distances and losses that Caffe2's elementwise and
activation test files use (Elu, Gelu, HardSigmoid, Mish, ReluN, Swish, Sinh, Cosh, Sign,
BitwiseAnd/Or/Xor, IsMemberOf, ScaleBlobs, CosineSimilarity, L1Distance,
WeightedSigmoidCrossEntropyWithLogits, SpatialSoftmaxWithLoss), against numpy versions of
Caffe2's definitions; their gradients are checked numerically by test_gradient_checker_ops.py
(cases in gradcheck_specs.py). Also: arithmetic gradient ops written over their dC input,
DivGradient's three-input form, and unique net names after many nets."""

import math

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import core, workspace

RNG = np.random.default_rng(15)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf)

UNARY = [
    ("Elu", {}, lambda x: np.where(x > 0, x, np.expm1(x))),
    ("Elu", {"alpha": 0.5}, lambda x: np.where(x > 0, x, 0.5 * np.expm1(x))),
    ("Gelu", {}, lambda x: x * 0.5 * (1 + _erf(x / np.sqrt(2)))),
    (
        "Gelu",
        {"fast_gelu": 1},
        lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ),
    ("HardSigmoid", {}, lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
    ("HardSigmoid", {"alpha": -1.5, "beta": 0.25}, lambda x: np.clip(-1.5 * x + 0.25, 0, 1)),
    ("Mish", {}, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    ("ReluN", {}, lambda x: np.clip(x, 0, 6)),
    ("ReluN", {"n": 1.5}, lambda x: np.clip(x, 0, 1.5)),
    ("Swish", {}, lambda x: x * _sigmoid(x)),
    ("Sinh", {}, np.sinh),
    ("Cosh", {}, np.cosh),
    ("Sign", {}, np.sign),
]


@pytest.mark.parametrize("op_type, args, ref", UNARY, ids=[f"{u[0]}{u[1]}" for u in UNARY])
@pytest.mark.parametrize("in_place", [False, True])
def test_unary_matches_numpy(op_type, args, ref, in_place):
    x = (RNG.standard_normal((3, 5)) * 4).astype(np.float32)
    x[0, :3] = [0.0, 6.0, -40.0]
    out = "X" if in_place and op_type in ("Elu", "HardSigmoid", "ReluN") else "Y"
    (y,) = run(op_type, {"X": x}, [out], **args)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_sign_keeps_every_numeric_type(dtype):
    # Caffe2 registers Sign for its NumericTypes (int32, int64, float, double).
    x = np.array([[-7, 0, 3], [np.iinfo(np.int32).min, 1, -1]]).astype(dtype)
    (y,) = run("Sign", {"X": x}, ["Y"])
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, np.sign(x))


def test_relu_n_needs_positive_n():
    workspace.FeedBlob("X", np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match="n > 0"):
        workspace.RunOperatorOnce(core.CreateOperator("ReluN", ["X"], ["Y"], n=-1.0))


@pytest.mark.parametrize(
    "op_type, ref",
    [
        ("BitwiseAnd", np.bitwise_and),
        ("BitwiseOr", np.bitwise_or),
        ("BitwiseXor", np.bitwise_xor),
    ],
)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((3, 1), (2, 1, 4)), ((1,), (5,))])
def test_bitwise_broadcasts_like_numpy(op_type, ref, dtype, shapes):
    a = RNG.integers(0, 128, size=shapes[0]).astype(dtype)
    b = RNG.integers(0, 128, size=shapes[1]).astype(dtype)
    (c,) = run(op_type, {"A": a, "B": b}, ["C"])
    assert c.dtype == dtype
    np.testing.assert_array_equal(c, ref(a, b))
    (c,) = run(op_type, {"A": b, "B": a}, ["C"])
    np.testing.assert_array_equal(c, ref(b, a))


def test_bitwise_rejects_floats():
    with pytest.raises(RuntimeError, match="Unsupported input type"):
        run("BitwiseOr", {"A": np.ones(2, np.float32), "B": np.ones(2, np.float32)}, ["C"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_is_member_of(dtype):
    x = RNG.integers(0, 10, size=(3, 4)).astype(dtype)
    (y,) = run("IsMemberOf", {"X": x}, ["Y"], value=np.array([0, 3, 4, 6, 8]))
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, np.isin(x, [0, 3, 4, 6, 8]))


def test_is_member_of_strings():
    x = np.array([b"a", b"bc", b"d"], dtype=object)
    (y,) = run("IsMemberOf", {"X": x}, ["Y"], value=["bc", "d"])
    np.testing.assert_array_equal(y, [False, True, True])


def test_scale_blobs_matches_scale():
    xs = {f"X{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate([(3,), (2, 4)])}
    outs = run("ScaleBlobs", xs, ["O0", "X1"], scale=2.5)
    for o, x in zip(outs, xs.values(), strict=True):
        np.testing.assert_allclose(o, x * 2.5, rtol=1e-6)
    with pytest.raises(RuntimeError, match="as many outputs as inputs"):
        run("ScaleBlobs", {"X0": xs["X0"], "X1": xs["X1"]}, ["O0"])


@pytest.mark.parametrize("shape", [(3, 7), (4,), (2, 3, 2)])
def test_cosine_similarity_and_l1_distance(shape):
    x = RNG.uniform(-1, 1, shape).astype(np.float32)
    y = RNG.uniform(-1, 1, shape).astype(np.float32)
    n = shape[0]
    xf, yf = x.reshape(n, -1).astype(np.float64), y.reshape(n, -1).astype(np.float64)
    cos_ref = (xf * yf).sum(1) / (np.linalg.norm(xf, axis=1) * np.linalg.norm(yf, axis=1))
    (cos,) = run("CosineSimilarity", {"X": x, "Y": y}, ["C"])
    np.testing.assert_allclose(cos, cos_ref, rtol=1e-5, atol=1e-6)
    (l1,) = run("L1Distance", {"X": x, "Y": y}, ["D"])
    np.testing.assert_allclose(l1, np.abs(xf - yf).sum(1), rtol=1e-5)
    g = RNG.uniform(0.5, 1.5, n).astype(np.float32)
    dx, dy = run("L1DistanceGradient", {"X": x, "Y": y, "G": g}, ["dX", "dY"])
    sign = np.sign(x - y).reshape(n, -1) * g[:, None]
    np.testing.assert_allclose(dx.reshape(n, -1), sign)
    np.testing.assert_allclose(dy.reshape(n, -1), -sign)


def test_weighted_sigmoid_cross_entropy_matches_numpy():
    x = RNG.uniform(-2, 2, (3, 4)).astype(np.float32)
    t = RNG.integers(0, 2, (3, 4)).astype(np.float32)
    w = RNG.uniform(0.1, 1, (3, 4)).astype(np.float32)
    xf = x.astype(np.float64)
    per = t * np.log(_sigmoid(xf)) + (1 - t) * np.log(1 - _sigmoid(xf))
    (y,) = run("WeightedSigmoidCrossEntropyWithLogits", {"L": x, "T": t, "W": w}, ["Y"])
    np.testing.assert_allclose(y, -(per * w).mean(1), rtol=1e-5)
    g = RNG.standard_normal(3).astype(np.float32)
    (dx,) = run(
        "WeightedSigmoidCrossEntropyWithLogitsGradient",
        {"G": g, "L": x, "T": t, "W": w},
        ["dX"],
    )
    np.testing.assert_allclose(dx, -g[:, None] * w * (t - _sigmoid(xf)) / 4, rtol=1e-5)
    with pytest.raises(RuntimeError, match="weights"):
        run("WeightedSigmoidCrossEntropyWithLogits", {"L": x, "T": t, "W": w[:2]}, ["Y"])


@pytest.mark.parametrize("weighted", [False, True])
def test_spatial_softmax_with_loss(weighted):
    n, c, h, w = 2, 3, 2, 4
    x = RNG.uniform(0, 1, (n, c, h, w)).astype(np.float32)
    labels = RNG.integers(-1, c, (n, h, w)).astype(np.int32)
    inputs = {"X": x, "L": labels}
    wts = np.ones((n, h, w))
    if weighted:
        wts = RNG.uniform(0.1, 1, (n, h, w)).astype(np.float32)
        inputs["W"] = wts
    p, loss = run("SpatialSoftmaxWithLoss", inputs, ["P", "loss"])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p_ref = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(p, p_ref, rtol=1e-5)
    keep = labels != -1
    picked = np.take_along_axis(p_ref, np.maximum(labels, 0)[:, None], axis=1)[:, 0]
    ref = -(np.log(picked) * wts)[keep].sum() / wts[keep].sum()
    assert loss.shape == ()
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    # The gradient op: (P - onehot) * weight / total weight; ignored pixels get zero.
    grad_in = dict(inputs, P=p, dL=np.array(2.0, np.float32))
    (dx,) = run("SpatialSoftmaxWithLossGradient", grad_in, ["dX"])
    onehot = np.zeros_like(p_ref)
    np.put_along_axis(onehot, np.maximum(labels, 0)[:, None], 1.0, axis=1)
    ref_dx = (p_ref - onehot) * (wts * keep)[:, None] * 2.0 / wts[keep].sum()
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-6)


def test_spatial_softmax_with_loss_all_ignored_and_bad_label():
    x = RNG.uniform(0, 1, (1, 2, 2, 2)).astype(np.float32)
    _, loss = run(
        "SpatialSoftmaxWithLoss", {"X": x, "L": -np.ones((1, 2, 2), np.int32)}, ["P", "l"]
    )
    assert loss == 0.0
    with pytest.raises(RuntimeError, match="Label seems incorrect"):
        run("SpatialSoftmaxWithLoss", {"X": x, "L": np.full((1, 2, 2), 2, np.int32)}, ["P", "l"])


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic_gradient_written_over_dc(op_type):
    """Add(A, B) -> A makes AddGradient(A_grad, A, B) -> (A_grad, B_grad): dA over dC."""
    a = RNG.uniform(1, 2, (3, 4)).astype(np.float32)
    b = RNG.uniform(1, 2, (4,)).astype(np.float32)
    fwd = core.CreateOperator(op_type, ["A", "B"], ["A"])
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(fwd, ["A_grad"])
    dc = RNG.standard_normal((3, 4)).astype(np.float32)
    for name, v in {"A": a, "B": b, "A_grad": dc}.items():
        workspace.FeedBlob(name, v)
    if op_type == "Div":
        workspace.FeedBlob("A", a / b)  # the forward output, which Div's gradient reads
    workspace.RunOperatorsOnce(grad_ops)
    da, db = workspace.FetchBlob("A_grad"), workspace.FetchBlob("B_grad")
    c = a / b
    want_da, want_db = {
        "Add": (dc, dc.sum(0)),
        "Sub": (dc, -dc.sum(0)),
        "Mul": (dc * b, (dc * a).sum(0)),
        "Div": (dc / b, (-dc * c / b).sum(0)),
    }[op_type]
    np.testing.assert_allclose(da, want_da, rtol=1e-5)
    np.testing.assert_allclose(db, want_db, rtol=1e-5)


@pytest.mark.parametrize("broadcast", [False, True])
def test_div_gradient_three_input_form(broadcast):
    b = RNG.uniform(1, 2, (4,) if broadcast else (3, 4)).astype(np.float32)
    c = RNG.standard_normal((3, 4)).astype(np.float32)
    dc = RNG.standard_normal((3, 4)).astype(np.float32)
    da, db = run("DivGradient", {"B": b, "C": c, "dC": dc}, ["dA", "dB"])
    np.testing.assert_allclose(da, dc / b, rtol=1e-5)
    want_db = -dc * c / b
    np.testing.assert_allclose(db, want_db.sum(0) if broadcast else want_db, rtol=1e-5)


def test_net_names_stay_unique_and_in_caffe2_order():
    old = core.Net._net_names_used
    core.Net._net_names_used = set()
    try:
        names = [core.Net("opnet").Name() for _ in range(500)]
        assert names[:3] == ["opnet", "opnet_1", "opnet_2"]
        assert len(set(names)) == 500 and names[-1] == "opnet_499"
        # A name taken by other means is skipped, as Caffe2 does.
        core.Net._net_names_used.add("opnet_500")
        assert core.Net("opnet").Name() == "opnet_501"
        # A replaced registry starts over.
        core.Net._net_names_used = set()
        assert core.Net("opnet").Name() == "opnet"
    finally:
        core.Net._net_names_used = old


def test_c_workspace_is_separate_with_blob_handles():
    """Caffe2's test cases use ``self.ws = workspace.C.Workspace()`` this way."""
    ws = workspace.C.Workspace()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert ws.create_blob("X").feed(x)
    assert not workspace.HasBlob("X")
    ws.run(core.CreateOperator("Relu", ["X"], ["Y"]))
    np.testing.assert_array_equal(ws.blobs["Y"].fetch(), x)
    net = core.Net("c_ws_net")
    net.Sqr(["X"], ["Z"])
    ws.create_net(net).run()
    np.testing.assert_array_equal(ws.blobs["Z"].fetch(), x * x)
    assert sorted(ws.blobs) == ["X", "Y", "Z"]
    with pytest.raises(TypeError):
        ws.run("not a proto")
    assert workspace.C.kernel_types() == sorted(workspace.C.kernel_types())


@pytest.mark.parametrize("shape", [(8, 5), (3, 64), (2, 3, 40), (4, 131), (1, 1), (5, 0)])
def test_softmax_matches_float64_on_every_row_length(shape):
    # Rows shorter than, equal to and longer than a vector, with a tail; the values span a
    # wide range so that the max subtraction matters.
    x = (RNG.standard_normal(shape) * 30).astype(np.float32)
    (y,) = run("Softmax", {"X": x}, ["Y"], axis=len(shape) - 1)
    z = x.astype(np.float64)
    want = np.exp(z - z.max(axis=-1, keepdims=True)) if x.size else z
    want = want / want.sum(axis=-1, keepdims=True) if x.size else z
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("d", [1, 3, 7, 8, 9, 15, 16, 17])
def test_softmax_rows_get_the_same_bits_alone_and_in_a_batch(d):
    # Short rows go 8 at a time (one per vector lane), the rest of the batch one row at a
    # time: 19 rows give two groups and three single rows. Each row's values must not depend
    # on which way it went, and must match float64.
    x = (RNG.standard_normal((19, d)) * 20).astype(np.float32)
    x[4, 0] = -np.inf  # a row of only -inf (d = 1) gives NaN, as in numpy
    (y,) = run("Softmax", {"X": x}, ["Y"])
    for i in range(len(x)):
        (alone,) = run("Softmax", {"X": x[i : i + 1]}, ["Y"])
        np.testing.assert_array_equal(y[i], alone[0], err_msg=f"row {i}")
    z = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = np.exp(z - z.max(axis=1, keepdims=True))
    with np.errstate(invalid="ignore"):
        want = want / want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)
    assert y[4, 0] == 0.0 if d > 1 else np.isnan(y[4, 0])


def test_sigmoid_float32_matches_float64_in_place_too():
    x = np.concatenate(
        [
            (RNG.standard_normal(61) * 8).astype(np.float32),
            np.array([0.0, -0.0, 88.0, -88.0, 100.0, -100.0, np.inf, -np.inf], np.float32),
        ]
    )
    want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    (y,) = run("Sigmoid", {"X": x}, ["Y"])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-30)
    (z,) = run("Sigmoid", {"Y": x}, ["Y"])
    np.testing.assert_array_equal(z, y)
    (n,) = run("Sigmoid", {"X": np.array([np.nan, 1.0], np.float32)}, ["Y"])
    assert np.isnan(n[0]) and abs(n[1] - 1.0 / (1.0 + np.exp(-1.0))) < 1e-7


def test_softmax_of_minus_infinity_is_zero_and_nan_propagates():
    x = np.array([[0.0, -np.inf, 1.0, -200.0], [np.nan, 0.0, 1.0, 2.0]], np.float32)
    (y,) = run("Softmax", {"X": x}, ["Y"])
    e = np.exp([0.0, 1.0])
    np.testing.assert_allclose(y[0], [e[0] / e.sum(), 0.0, e[1] / e.sum(), 0.0], rtol=1e-6)
    assert y[0, 1] == 0.0 and y[0, 3] == 0.0
    assert np.isnan(y[1]).all()


# Element-wise ops on large inputs cut their values in parts shared out to the team of
# compute threads (from about 16k values). Each value is computed alone, so a large input
# must give the bits of the same op run on small pieces of it (which run in one part), in
# place and not, with every value written once: NaN and infinities included.
LARGE = 200_003  # odd: the parts and the 32-value blocks of Sum end unevenly


def _large(seed):
    x = np.random.default_rng(seed).standard_normal(LARGE).astype(np.float32) * 4
    x[::997] = np.nan
    x[5::1009] = np.inf
    x[7::1013] = -np.inf
    return x


def _by_pieces(op_type, xs, piece=4096):
    out = []
    for lo in range(0, LARGE, piece):
        (y,) = run(op_type, {f"p{i}": x[lo : lo + piece] for i, x in enumerate(xs)}, ["py"])
        out.append(y)
    return np.concatenate(out)


@pytest.mark.parametrize("op_type", ["Relu", "Tanh", "Sigmoid", "Sum", "Max"])
@pytest.mark.parametrize("in_place", [False, True])
def test_large_elementwise_inputs_in_parts_give_the_bits_of_small_pieces(op_type, in_place):
    unary = op_type in ("Relu", "Tanh", "Sigmoid")
    xs = [_large(1)] if unary else [_large(2), _large(3), _large(4)]
    want = _by_pieces(op_type, xs)
    names = [f"x{i}" for i in range(len(xs))]
    out = names[0] if in_place else "y"
    (y,) = run(op_type, dict(zip(names, xs, strict=True)), [out])
    assert y.shape == (LARGE,)
    assert y.tobytes() == want.tobytes()
    if op_type == "Relu":
        np.testing.assert_array_equal(y, np.where(xs[0] > 0, xs[0], 0))
    elif op_type == "Sum":
        np.testing.assert_array_equal(y, xs[0] + xs[1] + xs[2])
