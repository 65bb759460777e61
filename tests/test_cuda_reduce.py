"""The CUDA kernels of the reduce family against the CPU kernels of the same types.

Each case runs an op on the CPU (host blobs, no device option) and on CUDA (blobs fed to the
device, the op's device option CUDA) and compares the outputs: allclose for floats, exact for
ints and bools. Random fills are checked by shape, dtype and statistics, and by determinism
under one ``random_seed``.
"""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

CUDA = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)
RNG = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32):
    if np.issubdtype(dtype, np.integer):
        return np.asarray(RNG.integers(-50, 50, size=shape)).astype(dtype)
    if dtype == np.bool_:
        return np.asarray(RNG.integers(0, 2, size=shape)).astype(np.bool_)
    return np.asarray(RNG.standard_normal(shape)).astype(dtype)


def run(op_type, inputs, n_out, on_cuda, device_extra=None, **kwargs):
    """Runs `op_type` on fresh blobs in0.. and returns outputs out0.. as numpy arrays."""
    workspace.ResetWorkspace()
    names = [f"in{i}" for i in range(len(inputs))]
    outs = [f"out{j}" for j in range(n_out)]
    for name, arr in zip(names, inputs, strict=True):
        if on_cuda:
            workspace.FeedBlob(name, arr, CUDA)
        else:
            workspace.FeedBlob(name, arr)
    if on_cuda:
        opt = caffe2_pb2.DeviceOption()
        opt.CopyFrom(CUDA)
        if device_extra is not None:
            opt.random_seed = device_extra
        op = core.CreateOperator(op_type, names, outs, device_option=opt, **kwargs)
    else:
        op = core.CreateOperator(op_type, names, outs, **kwargs)
    workspace.RunOperatorOnce(op)
    return [np.asarray(workspace.FetchBlob(o)) for o in outs]


def compare(op_type, inputs, n_out=1, **kwargs):
    want = run(op_type, inputs, n_out, False, **kwargs)
    got = run(op_type, inputs, n_out, True, **kwargs)
    workspace.ResetWorkspace()
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


# ----------------------------------------------------------------------------------------------
# Whole-tensor sums and their gradients.

WHOLE = [
    ("SumElements", (3, 4), np.float32, {}),
    ("SumElements", (1000, 37), np.float32, {"average": 1}),
    ("SumElements", (0,), np.float32, {"average": 1}),
    ("SumElements", (), np.float32, {}),
    ("SumElements", (7, 9), np.float64, {"average": 1}),
    ("SumElements", (300, 11), np.int32, {}),
    ("SumElements", (5, 7), np.int32, {"average": 1}),
    ("SumElements", (6, 5), np.int64, {"average": 1}),
    ("SumSqrElements", (3, 4), np.float32, {}),
    ("SumSqrElements", (5000, 3), np.float32, {"average": 1}),
    ("SumSqrElements", (0, 3), np.float32, {"average": 1}),
    ("AveragedLoss", (8, 5), np.float32, {}),
    ("AveragedLoss", (70000,), np.float32, {}),
    ("AveragedLoss", (0,), np.float32, {}),
]


@pytest.mark.parametrize(
    "op_type,shape,dtype,kw",
    WHOLE,
    ids=[f"{t}-{s}-{np.dtype(d).name}-{k}" for t, s, d, k in WHOLE],
)
def test_whole_sums(op_type, shape, dtype, kw):
    compare(op_type, [rand(*shape, dtype=dtype)], **kw)


SCALAR_GRADS = [
    ("SumElementsGradient", (3, 4), {}),
    ("SumElementsGradient", (3, 4), {"average": 1}),
    ("SumElementsGradient", (0, 4), {"average": 1}),
    ("AveragedLossGradient", (5, 6), {}),
    ("AveragedLossGradient", (0,), {}),
]


@pytest.mark.parametrize(
    "op_type,shape,kw", SCALAR_GRADS, ids=[f"{t}-{s}-{k}" for t, s, k in SCALAR_GRADS]
)
def test_scalar_gradients(op_type, shape, kw):
    dy = np.array(2.5, dtype=np.float32)
    compare(op_type, [rand(*shape), dy], **kw)


# ----------------------------------------------------------------------------------------------
# ReduceSum / Mean / Max / Min and their gradients.

REDUCE_CASES = [
    ((3, 4, 5), [1], 1),  # few values per output: one thread each
    ((4, 300), [1], 0),  # one block per output
    ((200, 50), [0], 1),
    ((100, 5000), [0], 0),  # outputs adjacent in memory: one thread each, long loops
    ((2, 3, 4, 5), [0, 2], 1),
    ((2, 3, 4, 5), [3, 1], 0),
    ((2, 3, 4, 5), None, 0),
    ((2, 1, 3), [-1], 1),
    ((6,), [0], 0),
    ((3, 0, 4), [1], 1),  # empty reduced axis: the identity of the reduction
    ((0, 4), [1], 0),  # empty output
]
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]


def reduce_kwargs(axes, keepdims):
    kw = {"keepdims": keepdims}
    if axes is not None:
        kw["axes"] = axes
    return kw


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize(
    "shape,axes,keepdims",
    REDUCE_CASES,
    ids=[f"{s}-axes{a}-keep{k}" for s, a, k in REDUCE_CASES],
)
def test_reduce(op_type, shape, axes, keepdims):
    compare(op_type, [rand(*shape)], **reduce_kwargs(axes, keepdims))


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize(
    "shape,axes,keepdims",
    REDUCE_CASES,
    ids=[f"{s}-axes{a}-keep{k}" for s, a, k in REDUCE_CASES],
)
def test_reduce_gradient(op_type, shape, axes, keepdims):
    kw = reduce_kwargs(axes, keepdims)
    x = rand(*shape)
    (y,) = run(op_type, [x], 1, False, **kw)
    dy = rand(*y.shape)
    compare(op_type + "Gradient", [dy, x, y], **kw)


# ----------------------------------------------------------------------------------------------
# Transpose.

TRANSPOSE_CASES = [
    ((3, 4), None),
    ((2, 3, 4), [1, 0, 2]),
    ((2, 3, 4), [0, 1, 2]),  # identity: a plain copy
    ((2, 3, 4, 5), [0, 3, 1, 2]),
    ((2, 3, 4, 5), [0, 2, 3, 1]),
    ((1, 5, 1), [2, 1, 0]),
    ((2, 1, 3, 1, 2, 2, 1, 2), [7, 3, 0, 5, 1, 4, 6, 2]),
    ((3, 2, 2, 3, 2, 2, 2, 3), [1, 0, 3, 2, 5, 4, 7, 6]),
    ((0, 3), None),
    ((), None),
]
TRANSPOSE_DTYPES = [np.float32, np.int32, np.int64, np.float64, np.bool_, np.float16]


@pytest.mark.parametrize(
    "dtype", TRANSPOSE_DTYPES, ids=[np.dtype(d).name for d in TRANSPOSE_DTYPES]
)
@pytest.mark.parametrize(
    "shape,axes", TRANSPOSE_CASES, ids=[f"{s}-axes{a}" for s, a in TRANSPOSE_CASES]
)
def test_transpose(shape, axes, dtype):
    kw = {} if axes is None else {"axes": axes}
    compare("Transpose", [rand(*shape, dtype=dtype)], **kw)


# ----------------------------------------------------------------------------------------------
# Concat and Split.

CONCAT_CASES = [
    ([(2, 3), (2, 5)], {"axis": 1}),
    ([(2, 3), (4, 3), (1, 3)], {"axis": 0}),
    ([(2, 3, 4), (2, 1, 4), (2, 0, 4)], {}),  # default axis 1, an empty part
    ([(2, 3, 4), (2, 3, 4)], {"axis": -1}),
    ([(2, 3, 4), (2, 3, 4)], {"order": "NHWC", "axis": 2}),
    ([(2, 3), (2, 3), (2, 3)], {"axis": 1, "add_axis": 1}),
    ([(2, 3), (2, 3)], {"axis": 0, "add_axis": 1}),
    ([(0, 3), (0, 2)], {"axis": 1}),
    ([(3, 7)], {"axis": 1}),
]
CONCAT_DTYPES = [np.float32, np.int64, np.int32, np.bool_, np.float16]


@pytest.mark.parametrize("dtype", CONCAT_DTYPES, ids=[np.dtype(d).name for d in CONCAT_DTYPES])
@pytest.mark.parametrize(
    "shapes,kw", CONCAT_CASES, ids=[f"{'+'.join(map(str, s))}-{k}" for s, k in CONCAT_CASES]
)
def test_concat(shapes, kw, dtype):
    compare("Concat", [rand(*s, dtype=dtype) for s in shapes], n_out=2, **kw)


SPLIT_CASES = [
    ((4, 6), 2, {"axis": 1}, None),
    ((4, 6), 3, {"axis": 1, "split": [1, 2, 3]}, None),
    ((6, 4), 3, {"axis": 0, "split": [0, 4, 2]}, None),
    ((2, 5, 3), 2, {}, [2, 3]),  # sizes from the second input, default axis 1
    ((2, 3, 4), 3, {"axis": 1, "add_axis": 1}, None),
    ((2, 3, 4), 2, {"axis": -1}, None),
    ((0, 4), 2, {"axis": 1}, None),
    ((3, 5), 1, {"axis": 1}, None),
]
SPLIT_DTYPES = [np.float32, np.int64, np.uint8]


@pytest.mark.parametrize("dtype", SPLIT_DTYPES, ids=[np.dtype(d).name for d in SPLIT_DTYPES])
@pytest.mark.parametrize(
    "shape,n_out,kw,sizes",
    SPLIT_CASES,
    ids=[f"{s}-{n}way-{k}-input{z}" for s, n, k, z in SPLIT_CASES],
)
def test_split(shape, n_out, kw, sizes, dtype):
    inputs = [rand(*shape, dtype=dtype)]
    if sizes is not None:
        inputs.append(np.array(sizes, dtype=np.int32))
    compare("Split", inputs, n_out=n_out, **kw)


# ----------------------------------------------------------------------------------------------
# ConstantFill.

CONSTANT_CASES = [
    ("float", [], {"shape": [2, 3], "value": 1.5}),
    ("scalar", [], {"value": 2.0}),
    ("empty", [], {"shape": [0, 3], "value": 1.0}),
    ("int32", [], {"shape": [4], "value": -7, "dtype": caffe2_pb2.TensorProto.INT32}),
    ("int64-inferred", [], {"shape": [2, 2], "value": 1 << 40}),
    ("bool", [], {"shape": [3], "value": 1, "dtype": caffe2_pb2.TensorProto.BOOL}),
    ("double", [], {"shape": [2], "value": 0.25, "dtype": caffe2_pb2.TensorProto.DOUBLE}),
    ("int16", [], {"shape": [3], "value": -300, "dtype": caffe2_pb2.TensorProto.INT16}),
    ("uint8", [], {"shape": [5], "value": 200, "dtype": caffe2_pb2.TensorProto.UINT8}),
    ("like-input", [(3, 4)], {"value": 3.0}),
    ("like-input-extra", [(3, 4)], {"value": 3.0, "extra_shape": [2]}),
    ("input-as-shape", ["shape"], {"value": 4.0, "input_as_shape": 1}),
]


@pytest.mark.parametrize(
    "inputs,kw", [c[1:] for c in CONSTANT_CASES], ids=[c[0] for c in CONSTANT_CASES]
)
def test_constant_fill(inputs, kw):
    arrs = [np.array([2, 3, 2], dtype=np.int64) if i == "shape" else rand(*i) for i in inputs]
    compare("ConstantFill", arrs, **kw)


def test_constant_fill_string_runs_on_the_host():
    kw = {"shape": [2], "value": "ab", "dtype": caffe2_pb2.TensorProto.STRING}
    want = run("ConstantFill", [], 1, False, **kw)[0]
    got = run("ConstantFill", [], 1, True, **kw)[0]
    workspace.ResetWorkspace()
    assert list(got.ravel()) == list(want.ravel())


# ----------------------------------------------------------------------------------------------
# Random fills: statistics and determinism.


def fill(op_type, seed=None, inputs=(), **kw):
    return run(op_type, list(inputs), 1, True, device_extra=seed, **kw)[0]


def test_uniform_fill():
    y = fill("UniformFill", shape=[1000, 200], min=-2.0, max=3.0)
    assert y.shape == (1000, 200) and y.dtype == np.float32
    assert y.min() >= -2.0 and y.max() <= 3.0
    assert abs(y.mean() - 0.5) < 0.02
    assert abs(y.std() - 5.0 / np.sqrt(12.0)) < 0.02
    workspace.ResetWorkspace()


def test_uniform_fill_min_max_inputs_and_double():
    lo, hi = np.array(1.0, dtype=np.float32), np.array(2.0, dtype=np.float32)
    shape_src = rand(100, 50)
    y = fill("UniformFill", inputs=[shape_src, lo, hi])
    assert y.shape == (100, 50) and y.dtype == np.float32
    assert y.min() >= 1.0 and y.max() <= 2.0
    d = fill("UniformFill", shape=[4000], dtype=caffe2_pb2.TensorProto.DOUBLE)
    assert d.dtype == np.float64 and d.min() >= 0.0 and d.max() <= 1.0
    assert abs(d.mean() - 0.5) < 0.03
    h = fill("UniformFill", shape=[4000], dtype=caffe2_pb2.TensorProto.FLOAT16)
    assert h.dtype == np.float16 and h.min() >= 0.0 and h.max() <= 1.0
    assert abs(h.astype(np.float64).mean() - 0.5) < 0.03
    workspace.ResetWorkspace()


def test_gaussian_fill():
    y = fill("GaussianFill", shape=[500, 400], mean=2.0, std=3.0)
    assert y.shape == (500, 400) and y.dtype == np.float32
    assert np.isfinite(y).all()
    assert abs(y.mean() - 2.0) < 0.03
    assert abs(y.std() - 3.0) < 0.03
    # Roughly normal: about 68% within one std.
    assert abs(np.mean(np.abs(y - 2.0) < 3.0) - 0.6827) < 0.01
    workspace.ResetWorkspace()


def test_xavier_fill():
    y = fill("XavierFill", shape=[300, 200])
    scale = np.sqrt(3.0 / 200)
    assert y.shape == (300, 200) and y.dtype == np.float32
    assert y.min() >= -scale and y.max() <= scale
    assert abs(y.std() - scale / np.sqrt(3.0)) < 0.02 * scale
    workspace.ResetWorkspace()


def test_msra_fill():
    y = fill("MSRAFill", shape=[64, 32, 3, 3])
    std = np.sqrt(2.0 / (64 * 9))
    assert y.shape == (64, 32, 3, 3) and y.dtype == np.float32
    assert abs(y.mean()) < 0.05 * std
    assert abs(y.std() - std) < 0.03 * std
    workspace.ResetWorkspace()


@pytest.mark.parametrize("op_type", ["UniformFill", "GaussianFill", "XavierFill", "MSRAFill"])
def test_random_fill_seed(op_type):
    a = fill(op_type, seed=7, shape=[64, 33])
    b = fill(op_type, seed=7, shape=[64, 33])
    c = fill(op_type, seed=8, shape=[64, 33])
    d = fill(op_type, shape=[64, 33])
    e = fill(op_type, shape=[64, 33])
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(d, e)
    workspace.ResetWorkspace()


@pytest.mark.parametrize("op_type", ["UniformFill", "GaussianFill", "XavierFill", "MSRAFill"])
def test_random_fill_empty(op_type):
    y = fill(op_type, shape=[0, 5])
    assert y.shape == (0, 5) and y.dtype == np.float32
    workspace.ResetWorkspace()
