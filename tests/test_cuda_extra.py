"""CUDA kernels of the extra family against the CPU kernels: GivenTensor*Fill, NCHW2NHWC,
NHWC2NCHW, InstanceNorm, LRN, PRelu, StopGradient, Max / Min, DotProduct and Tile, with their
gradients."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

GPU = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)


def randn(*shape, seed=0, scale=1.0):
    return np.asarray(np.random.RandomState(seed).randn(*shape) * scale, dtype=np.float32)


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
    if device is not None:
        for o in outputs:
            assert workspace._ws().blob_device(o) == 0, o
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


def errors(op_type, inputs, outputs, **args):
    """Both devices refuse the op with the same error kind."""
    kinds = []
    for device in (None, GPU):
        with pytest.raises(Exception) as e:
            run(op_type, inputs, outputs, device, **args)
        kinds.append(type(e.value))
    workspace.ResetWorkspace()
    assert kinds[0] == kinds[1], kinds


# ---- GivenTensor*Fill -----------------------------------------------------------------------

GIVEN_CASES = [
    ("GivenTensorFill", {"shape": [2, 3], "values": [float(v) for v in range(6)]}),
    ("GivenTensorFill", {"shape": [0, 3], "values": []}),
    ("GivenTensorFill", {"values": [2.5]}),
    ("GivenTensorFill", {"shape": [4], "values": [1, 2, 3, 4], "dtype": 10}),
    ("GivenTensorFill", {"shape": [2], "values": [1.5, -2.0], "dtype": 13}),
    ("GivenTensorIntFill", {"shape": [3, 1], "values": [1, -2, 3]}),
    ("GivenTensorInt64Fill", {"shape": [2, 2], "values": [1, 2**40, -3, 4]}),
    ("GivenTensorBoolFill", {"shape": [3], "values": [1, 0, 1]}),
    ("GivenTensorInt64Fill", {"shape": [0], "values": []}),
]


@pytest.mark.parametrize("op_type,args", GIVEN_CASES, ids=[f"{t}-{a}" for t, a in GIVEN_CASES])
def test_given_fill(op_type, args):
    compare(op_type, [], ["y"], **args)


def test_given_fill_runs_twice():
    workspace.ResetWorkspace()
    op = core.CreateOperator(
        "GivenTensorFill", [], ["y"], device_option=GPU, shape=[3], values=[1.0, 2.0, 3.0]
    )
    workspace.RunOperatorOnce(op)
    workspace.RunOperatorOnce(op)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), np.array([1, 2, 3], np.float32))
    assert workspace._ws().blob_device("y") == 0
    workspace.ResetWorkspace()


def test_given_fill_with_input():
    compare("GivenTensorFill", [("x", randn(2, 2))], ["y"], values=[1.0, 2.0, 3.0, 4.0])
    compare(
        "GivenTensorFill",
        [("x", randn(2))],
        ["y"],
        values=[float(v) for v in range(6)],
        extra_shape=[3],
    )
    compare(
        "GivenTensorIntFill",
        [("s", np.array([2, 3], np.int64))],
        ["y"],
        values=list(range(6)),
        input_as_shape=1,
    )


def test_given_fill_size_mismatch():
    errors("GivenTensorFill", [], ["y"], shape=[2, 2], values=[1.0, 2.0])


# ---- NCHW2NHWC, NHWC2NCHW -------------------------------------------------------------------

# Any rank from 3 (N, C and one spatial axis), as Caffe2's order switch takes.
LAYOUT_SHAPES = [
    (2, 3, 4, 5),
    (1, 1, 1, 1),
    (0, 3, 4, 5),
    (2, 0, 3, 3),
    (3, 7, 1, 9),
    (2, 3, 4),
    (2, 3, 2, 4, 5),
]


@pytest.mark.parametrize("shape", LAYOUT_SHAPES)
@pytest.mark.parametrize("op_type", ["NCHW2NHWC", "NHWC2NCHW"])
def test_layout(op_type, shape):
    compare(op_type, [("x", randn(*shape))], ["y"])


@pytest.mark.parametrize(
    "dtype", [np.float64, np.int32, np.int64, np.uint8, np.bool_, np.int16, np.float16]
)
def test_layout_dtypes(dtype):
    x = (np.arange(2 * 3 * 4 * 5) % 7).reshape(2, 3, 4, 5).astype(dtype)
    compare("NCHW2NHWC", [("x", x)], ["y"])
    compare("NHWC2NCHW", [("x", x)], ["y"])


@pytest.mark.parametrize("op_type", ["NCHW2NHWC", "NHWC2NCHW"])
def test_layout_needs_3d(op_type):
    errors(op_type, [("x", randn(2, 3))], ["y"])


# ---- InstanceNorm ---------------------------------------------------------------------------

IN_CASES = [
    ((2, 3, 4, 5), "NCHW", 1e-5),
    ((2, 4, 5, 3), "NHWC", 1e-5),
    ((1, 2, 33, 40), "NCHW", 1e-3),
    ((3, 5), "NCHW", 1e-5),
    ((0, 3, 4, 4), "NCHW", 1e-5),
    ((2, 3, 0), "NCHW", 1e-5),
    ((2, 0, 3), "NHWC", 1e-5),
]


@pytest.mark.parametrize("shape,order,eps", IN_CASES, ids=[str(c) for c in IN_CASES])
def test_instance_norm(shape, order, eps):
    c = shape[-1] if order == "NHWC" else shape[1]
    inputs = [
        ("X", randn(*shape, scale=2.0) + 0.5),
        ("scale", randn(c, seed=1)),
        ("bias", randn(c, seed=2)),
    ]
    compare(
        "InstanceNorm", inputs, ["Y", "mean", "inv"], rtol=1e-3, atol=1e-4, order=order, epsilon=eps
    )
    compare("InstanceNorm", inputs, ["Y"], rtol=1e-3, atol=1e-4, order=order, epsilon=eps)


def test_instance_norm_bad_scale():
    inputs = [("X", randn(2, 3, 4)), ("scale", randn(2)), ("bias", randn(3))]
    errors("InstanceNorm", inputs, ["Y"])


# ---- LRN ------------------------------------------------------------------------------------

LRN_CASES = [
    ((2, 5, 4, 3), "NCHW", 3),
    ((2, 4, 3, 5), "NHWC", 3),
    ((1, 7, 2, 2), "NCHW", 5),
    ((1, 2, 3, 3), "NCHW", 9),
    ((0, 3, 2, 2), "NCHW", 3),
    ((2, 3, 0, 2), "NHWC", 1),
]


@pytest.mark.parametrize("shape,order,size", LRN_CASES, ids=[str(c) for c in LRN_CASES])
def test_lrn(shape, order, size):
    args = {"size": size, "alpha": 1e-2, "beta": 0.75, "bias": 1.5, "order": order}
    x = randn(*shape)
    compare("LRN", [("X", x)], ["Y", "S"], rtol=1e-4, atol=1e-5, **args)
    compare("LRN", [("X", x)], ["Y"], rtol=1e-4, atol=1e-5, **args)
    y = run("LRN", [("X", x)], ["Y"], None, **args)[0]
    grad_in = [("X", x), ("Y", y), ("dY", randn(*shape, seed=3))]
    compare("LRNGradient", grad_in, ["dX"], rtol=1e-4, atol=1e-5, **args)


def test_lrn_bad_size():
    errors("LRN", [("X", randn(1, 3, 2, 2))], ["Y"], size=2)


# ---- PRelu ----------------------------------------------------------------------------------

PRELU_CASES = [
    ((2, 3, 4, 5), "NCHW", 3),
    ((2, 3, 4, 5), "NCHW", 1),
    ((2, 4, 5, 3), "NHWC", 3),
    ((4, 6), "NCHW", 6),
    ((7,), "NCHW", 1),
    ((0, 3, 2), "NCHW", 3),
    ((2, 3, 0), "NCHW", 3),
]


@pytest.mark.parametrize("shape,order,k", PRELU_CASES, ids=[str(c) for c in PRELU_CASES])
def test_prelu(shape, order, k):
    x = randn(*shape)
    w = np.abs(randn(k, seed=1)) * 0.3
    compare("PRelu", [("X", x), ("W", w)], ["Y"], order=order)
    y = run("PRelu", [("X", x), ("W", w)], ["Y"], None, order=order)[0]
    grad_in = [("Y", y), ("dY", randn(*shape, seed=2)), ("X", x), ("W", w)]
    compare("PReluGradient", grad_in, ["dX", "dW"], rtol=1e-4, atol=1e-4, order=order)


def test_prelu_bad_slope():
    errors("PRelu", [("X", randn(2, 3, 4)), ("W", randn(2))], ["Y"])


# ---- StopGradient ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3), (0,), ()])
def test_stop_gradient(shape):
    compare("StopGradient", [("x", randn(*shape))], ["y"])
    compare("StopGradient", [("x", np.arange(6, dtype=np.int64))], ["y"])


def test_stop_gradient_in_place():
    x = randn(4)
    out = run("StopGradient", [("x", x)], ["x"], GPU)[0]
    np.testing.assert_array_equal(out, x)


# ---- Max, Min -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 4), (0, 2), (5,)])
@pytest.mark.parametrize("op_type", ["Max", "Min"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_minmax(op_type, shape, n):
    xs = [randn(*shape, seed=i) for i in range(n)]
    if n > 1 and xs[0].size:
        xs[1].reshape(-1)[0] = xs[0].reshape(-1)[0]  # a tie
    inputs = [(f"x{i}", x) for i, x in enumerate(xs)]
    y = compare(op_type, inputs, ["y"])[0]
    grad_in = [("y", y), ("dy", randn(*shape, seed=9))] + inputs
    compare(f"{op_type}Gradient", grad_in, [f"dx{i}" for i in range(n)])


def test_minmax_int():
    a = np.array([1, 5, 3], np.int32)
    b = np.array([4, 2, 3], np.int32)
    compare("Max", [("a", a), ("b", b)], ["y"])
    compare("Min", [("a", a), ("b", b)], ["y"])


def test_minmax_shape_mismatch():
    errors("Max", [("a", randn(2, 3)), ("b", randn(3, 2))], ["y"])


# ---- DotProduct -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 10), (3,), (0, 5), (2, 0), (5, 1000), (2, 3, 4)])
def test_dot_product(shape):
    x, y = randn(*shape), randn(*shape, seed=1)
    compare("DotProduct", [("X", x), ("Y", y)], ["Z"], rtol=1e-4, atol=1e-4)
    n = shape[0] if shape else 1
    dz = randn(n, seed=2)
    compare("DotProductGradient", [("X", x), ("Y", y), ("dZ", dz)], ["dX", "dY"])


def test_dot_product_shape_mismatch():
    errors("DotProduct", [("X", randn(2, 3)), ("Y", randn(3, 2))], ["Z"])


# ---- Tile -----------------------------------------------------------------------------------

TILE_CASES = [
    ((2, 3), 3, 0),
    ((2, 3), 2, 1),
    ((2, 3, 4), 2, -1),
    ((2, 3), 0, 1),
    ((0, 3), 2, 1),
    ((2, 3), 1, 0),
]


@pytest.mark.parametrize("shape,tiles,axis", TILE_CASES, ids=[str(c) for c in TILE_CASES])
def test_tile(shape, tiles, axis):
    x = randn(*shape)
    y = compare("Tile", [("x", x)], ["y"], tiles=tiles, axis=axis)[0]
    compare("Tile", [("x", x.astype(np.int64))], ["y"], tiles=tiles, axis=axis)
    compare("Tile", [("x", x > 0)], ["y"], tiles=tiles, axis=axis)
    dy = randn(*y.shape, seed=4)
    compare("TileGradient", [("dy", dy)], ["dx"], tiles=tiles, axis=axis)


def test_tile_from_inputs():
    x = randn(3, 2)
    inputs = [("x", x), ("t", np.array([2], np.int64)), ("a", np.array([1], np.int64))]
    y = compare("Tile", inputs, ["y"])[0]
    compare("TileGradient", [("dy", y)] + inputs[1:], ["dx"])


def test_tile_bad_axis():
    errors("Tile", [("x", randn(2, 3))], ["y"], tiles=2, axis=2)
