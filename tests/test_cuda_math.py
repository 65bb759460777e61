"""The CUDA kernels of the math family (rust/ferrocaffe/src/cuda/ops/math.rs) against the
same ops on the CPU: element-wise unary math and its gradients, Add/Sub/Mul/Div, Pow,
comparisons and logic with numpy and legacy broadcasting, the broadcast ops' gradients,
SumReduceLike, Sum, WeightedSum, Scale, Clip and Cast."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

CUDA = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)

F32, I32, I64, BOOL = np.float32, np.int32, np.int64, np.bool_

SHAPES = [(3, 4), (2, 3, 5), (0, 4), (1031,)]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _run(op_type, inputs, outputs, args, device_option):
    workspace.ResetWorkspace()
    for name, arr in inputs:
        if device_option is None:
            workspace.FeedBlob(name, arr)
        else:
            workspace.FeedBlob(name, arr, device_option)
    op = core.CreateOperator(
        op_type, [n for n, _ in inputs], list(outputs), device_option=device_option, **args
    )
    workspace.RunOperatorOnce(op)
    out = [np.asarray(workspace.FetchBlob(o)) for o in outputs]
    workspace.ResetWorkspace()
    return out


def check(op_type, inputs, outputs=("Y",), device=CUDA, **args):
    """Runs the op on the CPU and on `device` and compares every output."""
    ref = _run(op_type, inputs, outputs, args, None)
    got = _run(op_type, inputs, outputs, args, device)
    for name, r, g in zip(outputs, ref, got, strict=True):
        assert g.dtype == r.dtype, f"{op_type} {name}: dtype {g.dtype} vs CPU {r.dtype}"
        assert g.shape == r.shape, f"{op_type} {name}: shape {g.shape} vs CPU {r.shape}"
        if r.dtype.kind == "f":
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5, err_msg=f"{op_type} {name}")
        else:
            np.testing.assert_array_equal(g, r, err_msg=f"{op_type} {name}")


def _shape_id(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


# ---- unary ---------------------------------------------------------------------------------


def _uniform(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape).astype(F32)


def _away_from_zero(rng, shape):
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(F32)


FLOAT_UNARY = [
    ("Sigmoid", _uniform(-6, 6)),
    ("Tanh", _uniform(-3, 3)),
    ("Exp", _uniform(-4, 4)),
    ("Log", _uniform(0.1, 5)),
    ("Sqrt", _uniform(0.0, 5)),
    ("Rsqrt", _uniform(0.1, 5)),
    ("RSqrt", _uniform(0.1, 5)),
    ("Reciprocal", _away_from_zero),
    ("Cos", _uniform(-4, 4)),
    ("Sin", _uniform(-4, 4)),
    ("Tan", _uniform(-1.2, 1.2)),
    ("Acos", _uniform(-0.95, 0.95)),
    ("Asin", _uniform(-0.95, 0.95)),
    ("Atan", _uniform(-4, 4)),
    ("Softsign", _uniform(-4, 4)),
    ("Log1p", _uniform(-0.9, 4)),
    ("Cbrt", _uniform(-4, 4)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("op_type,gen", FLOAT_UNARY, ids=[o for o, _ in FLOAT_UNARY])
def test_float_unary(op_type, gen, shape):
    check(op_type, [("X", gen(_rng(), shape))])


def _ints(dtype, lo=-1000, hi=1000):
    return lambda rng, shape: rng.integers(lo, hi, shape).astype(dtype)


DTYPES = [("f32", _uniform(-3, 3)), ("i32", _ints(I32)), ("i64", _ints(I64))]


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype,gen", DTYPES, ids=[d for d, _ in DTYPES])
@pytest.mark.parametrize("op_type", ["Negative", "Abs", "Sqr", "Sign", "Cube"])
def test_signed_unary(op_type, dtype, gen, shape):
    x = gen(_rng(), shape)
    if x.size and dtype != "f32":
        x.flat[0] = np.iinfo(x.dtype).min  # wraps as on the CPU
    check(op_type, [("X", x)])


@pytest.mark.parametrize(
    "op_type,args,gen",
    [
        pytest.param("LeakyRelu", {}, _uniform(-3, 3), id="LeakyRelu-default"),
        pytest.param("LeakyRelu", {"alpha": 0.3}, _uniform(-3, 3), id="LeakyRelu-alpha"),
        pytest.param("Clip", {}, _uniform(-3, 3), id="Clip-default"),
        pytest.param("Clip", {"min": -0.5}, _uniform(-3, 3), id="Clip-min"),
        pytest.param("Clip", {"max": 1.5}, _uniform(-3, 3), id="Clip-max"),
        pytest.param("Clip", {"min": -1.0, "max": 0.25}, _uniform(-3, 3), id="Clip-both"),
        pytest.param("Scale", {}, _uniform(-3, 3), id="Scale-default"),
        pytest.param("Scale", {"scale": -2.5}, _uniform(-3, 3), id="Scale-arg"),
        pytest.param("Pow", {"exponent": 2.0}, _uniform(-3, 3), id="Pow-2"),
        pytest.param("Pow", {"exponent": 0.5}, _uniform(0, 3), id="Pow-half"),
        pytest.param("Pow", {"exponent": -1.5}, _uniform(0.2, 3), id="Pow-neg"),
    ],
)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_param_unary(op_type, args, gen, shape):
    check(op_type, [("X", gen(_rng(), shape))], **args)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_not(shape):
    check("Not", [("X", _rng().random(shape) < 0.5)])


def test_clip_nan():
    x = np.array([np.nan, -np.inf, np.inf, 0.5, -7.0], dtype=F32)
    check("Clip", [("X", x)], min=-1.0, max=1.0)


# ---- gradients of unary ops ----------------------------------------------------------------

PAIRS = [
    # (type, args, first input, second input)
    ("SigmoidGradient", {}, _uniform(0.01, 0.99), _uniform(-2, 2)),
    ("TanhGradient", {}, _uniform(-0.99, 0.99), _uniform(-2, 2)),
    ("LeakyReluGradient", {}, _uniform(-2, 2), _uniform(-2, 2)),
    ("LeakyReluGradient", {"alpha": 0.2}, _uniform(-2, 2), _uniform(-2, 2)),
    ("ClipGradient", {}, _uniform(-2, 2), _uniform(-2, 2)),
    ("ClipGradient", {"min": -0.5, "max": 1.0}, _uniform(-2, 2), _uniform(-2, 2)),
    ("SoftsignGradient", {}, _uniform(-3, 3), _uniform(-2, 2)),
    ("AbsGradient", {}, _uniform(-3, 3), _uniform(-2, 2)),
    ("SinGradient", {}, _uniform(-3, 3), _uniform(-2, 2)),
    ("CosGradient", {}, _uniform(-3, 3), _uniform(-2, 2)),
    ("TanGradient", {}, _uniform(-1.2, 1.2), _uniform(-2, 2)),
    ("AcosGradient", {}, _uniform(-0.9, 0.9), _uniform(-2, 2)),
    ("AsinGradient", {}, _uniform(-0.9, 0.9), _uniform(-2, 2)),
    ("AtanGradient", {}, _uniform(-3, 3), _uniform(-2, 2)),
    ("CbrtGradient", {}, _uniform(-2, 2), _away_from_zero),
    ("RSqrtGradient", {}, _uniform(-2, 2), _uniform(0.2, 3)),
    ("RsqrtGradient", {}, _uniform(-2, 2), _uniform(0.2, 3)),
    ("ReciprocalGradient", {}, _away_from_zero, _uniform(-2, 2)),
]


def _pair_id(p):
    op_type, args = p[0], p[1]
    return op_type + "".join(f"-{k}" for k in args)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("op_type,args,gen0,gen1", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_unary_gradient(op_type, args, gen0, gen1, shape):
    rng = _rng()
    check(op_type, [("A", gen0(rng, shape)), ("B", gen1(rng, shape))], ("dX",), **args)


# ---- binary ops with broadcasting ----------------------------------------------------------

# (id, A shape, B shape, args)
BROADCASTS = [
    ("same", (2, 3, 4), (2, 3, 4), {}),
    ("same-1d", (1031,), (1031,), {}),
    ("np-trailing", (2, 3, 4), (4,), {}),
    ("np-both", (2, 1, 4), (3, 1), {}),
    ("np-scalar", (2, 3, 4), (1,), {}),
    ("np-scalar-a", (1,), (3, 4), {}),
    ("np-lead1", (1, 6), (6,), {}),
    ("np-many", (2, 1, 2, 1, 2, 1, 2, 1, 3), (2, 1, 2, 1, 2, 1, 2, 1), {}),
    ("np-empty", (0, 3), (3,), {}),
    ("np-empty-b", (1, 3), (0, 1), {}),
    ("legacy-axis", (2, 3, 4, 5), (3, 4), {"broadcast": 1, "axis": 1}),
    ("legacy-tail", (2, 3, 4, 5), (4, 5), {"broadcast": 1}),
    ("legacy-scalar", (2, 3, 4), (1,), {"broadcast": 1}),
    ("legacy-ones", (2, 3, 4, 5), (1, 4, 1), {"broadcast": 1, "axis": 1}),
    ("legacy-axis-str", (2, 3, 4, 5), (3,), {"broadcast": 1, "axis_str": "C"}),
    ("legacy-nhwc", (2, 3, 4, 5), (5,), {"broadcast": 1, "axis_str": "C", "order": "NHWC"}),
    ("legacy-empty", (0, 3, 4), (3, 4), {"broadcast": 1}),
]
BC_IDS = [b[0] for b in BROADCASTS]


def _operands(gen, a_shape, b_shape, seed=0):
    rng = _rng(seed)
    return gen(rng, a_shape), gen(rng, b_shape)


@pytest.mark.parametrize("name,a_shape,b_shape,args", BROADCASTS, ids=BC_IDS)
@pytest.mark.parametrize("dtype,gen", DTYPES, ids=[d for d, _ in DTYPES])
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_arith(op_type, dtype, gen, name, a_shape, b_shape, args):
    a, b = _operands(gen, a_shape, b_shape)
    if op_type == "Div" and dtype == "f32":
        b = _away_from_zero(_rng(1), b_shape)
    if op_type == "Div" and dtype != "f32":
        b = _ints(b.dtype, -6, 6)(_rng(1), b_shape)  # zeros divide to 0, as on the CPU
        if a.size and b.size and a_shape == b_shape:
            a.flat[0], b.flat[0] = np.iinfo(a.dtype).min, -1
    check(op_type, [("A", a), ("B", b)], ("C",), **args)


def test_int_overflow_wraps():
    big = np.array([2**31 - 1, -(2**31), 123456789, -987654321], dtype=I32)
    for op_type in ["Add", "Sub", "Mul"]:
        check(op_type, [("A", big), ("B", big[::-1].copy())], ("C",))


COMPARISONS = ["EQ", "NE", "LT", "LE", "GT", "GE"]
CMP_DTYPES = [
    ("f32", lambda rng, s: rng.integers(-2, 3, s).astype(F32)),
    ("i32", _ints(I32, -2, 3)),
    ("i64", _ints(I64, -2, 3)),
    ("bool", lambda rng, s: rng.random(s) < 0.5),
]


CMP_CASES = [
    b
    for b in BROADCASTS
    if b[0] in ("same", "np-both", "np-scalar", "np-empty", "legacy-axis", "legacy-scalar")
]


@pytest.mark.parametrize("name,a_shape,b_shape,args", CMP_CASES, ids=[c[0] for c in CMP_CASES])
@pytest.mark.parametrize("dtype,gen", CMP_DTYPES, ids=[d for d, _ in CMP_DTYPES])
@pytest.mark.parametrize("op_type", COMPARISONS)
def test_compare(op_type, dtype, gen, name, a_shape, b_shape, args):
    a, b = _operands(gen, a_shape, b_shape)
    if dtype == "f32" and a.size:
        a.flat[0] = np.nan  # unordered: only NE holds
    check(op_type, [("A", a), ("B", b)], ("C",), **args)


@pytest.mark.parametrize("name,a_shape,b_shape,args", CMP_CASES, ids=[c[0] for c in CMP_CASES])
@pytest.mark.parametrize("op_type", ["And", "Or", "Xor"])
def test_logic(op_type, name, a_shape, b_shape, args):
    a, b = _operands(CMP_DTYPES[3][1], a_shape, b_shape)
    check(op_type, [("A", a), ("B", b)], ("C",), **args)


@pytest.mark.parametrize(
    "a_shape,b_shape,args",
    [
        pytest.param((3, 4), (3, 4), {}, id="same"),
        pytest.param((0, 4), (0, 4), {}, id="empty"),
        pytest.param((2, 3, 4), (3, 4), {"broadcast": 1}, id="legacy"),
        pytest.param((2, 3, 4), (3,), {"broadcast": 1, "axis": 1}, id="legacy-axis"),
        pytest.param((2, 3, 4), (1,), {"broadcast": 1}, id="legacy-scalar"),
    ],
)
def test_pow_binary(a_shape, b_shape, args):
    rng = _rng()
    a = rng.uniform(0.1, 3, a_shape).astype(F32)
    b = rng.uniform(-2, 2, b_shape).astype(F32)
    check("Pow", [("A", a), ("B", b)], ("C",), **args)


# ---- gradients of the broadcast ops --------------------------------------------------------

GRAD_CASES = BROADCASTS + [
    ("np-reduce-rows", (512, 3), (3,), {}),
    ("legacy-scalar-big", (2, 300), (1,), {"broadcast": 1}),
    ("np-outer", (300, 1), (1, 7), {}),
]


def _forward_dims(a_shape, b_shape, args):
    if args.get("broadcast"):
        return a_shape
    return np.broadcast_shapes(a_shape, b_shape)


@pytest.mark.parametrize("name,a_shape,b_shape,args", GRAD_CASES, ids=[g[0] for g in GRAD_CASES])
@pytest.mark.parametrize("op_type", ["AddGradient", "SubGradient", "MulGradient", "DivGradient"])
def test_arith_gradient(op_type, name, a_shape, b_shape, args):
    rng = _rng()
    c_shape = _forward_dims(a_shape, b_shape, args)
    dc = rng.uniform(-1, 1, c_shape).astype(F32)
    a = rng.uniform(-2, 2, a_shape).astype(F32)
    b = _away_from_zero(rng, b_shape)
    inputs = [("dC", dc), ("A", a), ("B", b)]
    if op_type == "DivGradient":
        inputs.append(("C", rng.uniform(-2, 2, c_shape).astype(F32)))
    check(op_type, inputs, ("dA", "dB"), **args)


@pytest.mark.parametrize(
    "a_shape,b_shape,args",
    [
        pytest.param((2, 3, 4, 5), (3, 4), {"axis": 1}, id="axis"),
        pytest.param((2, 3, 4, 5), (4, 5), {}, id="tail"),
        pytest.param((2, 3, 4, 5), (1,), {}, id="scalar"),
        pytest.param((2, 3, 4, 5), (1, 4, 1), {"axis": 1}, id="ones"),
        pytest.param((2, 3, 4, 5), (3,), {"axis_str": "C"}, id="axis-str"),
        pytest.param((300, 2), (1,), {}, id="scalar-big"),
        pytest.param((700, 3), (3,), {}, id="rows-big"),
        pytest.param((0, 3), (3,), {}, id="empty"),
        pytest.param((0, 3), (1,), {}, id="empty-scalar"),
    ],
)
def test_sum_reduce_like(a_shape, b_shape, args):
    rng = _rng()
    a = rng.uniform(-1, 1, a_shape).astype(F32)
    b = rng.uniform(-1, 1, b_shape).astype(F32)
    check("SumReduceLike", [("A", a), ("B", b)], ("C",), **args)


# ---- n-ary sums, Cast ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype,gen", DTYPES, ids=[d for d, _ in DTYPES])
@pytest.mark.parametrize("n_inputs", [1, 2, 4])
def test_sum(n_inputs, dtype, gen, shape):
    rng = _rng()
    check("Sum", [(f"X{i}", gen(rng, shape)) for i in range(n_inputs)])


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("pairs", [1, 3])
def test_weighted_sum(pairs, shape):
    rng = _rng()
    inputs = []
    for i in range(pairs):
        inputs.append((f"X{i}", rng.uniform(-2, 2, shape).astype(F32)))
        inputs.append((f"w{i}", rng.uniform(-2, 2, (1,)).astype(F32)))
    check("WeightedSum", inputs)


CAST_SOURCES = {
    "f32": np.array(
        [0.0, -0.0, 1.5, -1.5, 2.7, -2.7, 1e10, -1e10, np.nan, np.inf, -np.inf, 3e38, 123456.78],
        dtype=F32,
    ),
    "i32": np.array([0, 1, -1, 7, -(2**31), 2**31 - 1, 16777217], dtype=I32),
    "i64": np.array(
        [0, 1, -1, 2**40, -(2**40), 2**62 + 1, -(2**63), 2**63 - 1, 9007199254740993], dtype=I64
    ),
    "bool": np.array([True, False, True], dtype=BOOL),
}


@pytest.mark.parametrize(
    "to", [1, 2, 10, 5, "FLOAT", "int32", "INT64", "BOOL", 13], ids=lambda t: f"to-{t}"
)
@pytest.mark.parametrize("src", list(CAST_SOURCES))
def test_cast(src, to):
    check("Cast", [("X", CAST_SOURCES[src])], to=to)


@pytest.mark.parametrize("src", list(CAST_SOURCES))
def test_cast_empty(src):
    x = CAST_SOURCES[src][:0].reshape(0, 2)
    check("Cast", [("X", x)], to=1)
