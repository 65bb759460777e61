"""The sparse family's CUDA kernels against their CPU kernels: Gather, the (Sparse)Lengths
reductions and their gradients, ScatterAssign, ScatterWeightedSum, the optimizers and the
recurrent units. Each case runs the op on the CPU and on CUDA from the same inputs and compares
every output (floats to 1e-4, integers exactly)."""

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

pytestmark = pytest.mark.skipif(workspace.NumCudaDevices() == 0, reason="no CUDA device")

CUDA = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA)
CPU = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU)


def _rand(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def _run(op_type, inputs, outputs, host, on_cuda, args):
    workspace.ResetWorkspace()
    for name, arr in inputs:
        dev = CUDA if on_cuda and name not in host else CPU
        workspace.FeedBlob(name, arr, dev)
    kw = {"device_option": CUDA} if on_cuda else {}
    op = core.CreateOperator(op_type, [n for n, _ in inputs], outputs, **kw, **args)
    workspace.RunOperatorOnce(op)
    res = [np.asarray(workspace.FetchBlob(o)) for o in outputs]
    workspace.ResetWorkspace()
    return res


def check(op_type, inputs, outputs, host=(), **args):
    """Runs the op on both devices and compares the outputs."""
    want = _run(op_type, inputs, outputs, host, False, args)
    got = _run(op_type, inputs, outputs, host, True, args)
    for name, w, g in zip(outputs, want, got, strict=True):
        assert w.shape == g.shape, (name, w.shape, g.shape)
        assert w.dtype == g.dtype, (name, w.dtype, g.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def check_fails(op_type, inputs, outputs, host=(), **args):
    """Both devices refuse the op with the same kind of error."""
    kinds = []
    for on_cuda in (False, True):
        with pytest.raises(RuntimeError) as info:
            _run(op_type, inputs, outputs, host, on_cuda, args)
        kinds.append(type(info.value))
    assert kinds[0] is kinds[1], kinds


ITYPES = [pytest.param(np.int32, id="i32"), pytest.param(np.int64, id="i64")]

# -- Gather ----------------------------------------------------------------------------------


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize(
    "idx",
    [
        pytest.param([0, 4, 4, 1], id="repeated"),
        pytest.param([], id="empty"),
        pytest.param([[3, 2], [0, 0]], id="2d"),
    ],
)
def test_gather_axis0(idx, itype):
    data = _rand(5, 3, 2)
    check("Gather", [("D", data), ("I", np.array(idx, dtype=itype))], ["Y"])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16], ids=str)
def test_gather_axis1_dtypes(dtype):
    data = (np.arange(2 * 4 * 3) % 7).reshape(2, 4, 3).astype(dtype)
    idx = np.array([[3, 0], [1, 3]], dtype=np.int32)
    check("Gather", [("D", data), ("I", idx)], ["Y"], axis=1)


def test_gather_out_of_range():
    check_fails("Gather", [("D", _rand(3, 2)), ("I", np.array([0, 3], np.int32))], ["Y"])


# -- Lengths reductions ----------------------------------------------------------------------

REDUCE_CASES = [
    pytest.param([0, 5, 5, 2, 3], [2, 0, 3], id="repeated"),
    pytest.param([], [0, 0], id="empty"),
    pytest.param([1], [1], id="one"),
]


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("idx,lens", REDUCE_CASES)
@pytest.mark.parametrize("op", ["SparseLengthsSum", "SparseLengthsMean"])
def test_sparse_lengths(op, idx, lens, itype):
    ins = [
        ("D", _rand(6, 4)),
        ("I", np.array(idx, dtype=itype)),
        ("L", np.array(lens, dtype=np.int32)),
    ]
    check(op, ins, ["Y"])


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("idx,lens", REDUCE_CASES)
def test_sparse_lengths_weighted_sum(idx, lens, itype):
    ins = [
        ("D", _rand(6, 2, 3)),
        ("W", _rand(len(idx), seed=1)),
        ("I", np.array(idx, dtype=itype)),
        ("L", np.array(lens, dtype=np.int64)),
    ]
    check("SparseLengthsWeightedSum", ins, ["Y"])


def test_sparse_lengths_bad_index():
    ins = [("D", _rand(3, 2)), ("I", np.array([0, 3], np.int64)), ("L", np.array([2], np.int32))]
    check_fails("SparseLengthsSum", ins, ["Y"])


@pytest.mark.parametrize("op", ["LengthsSum", "LengthsMean", "LengthsWeightedSum"])
def test_lengths(op):
    ins = [("D", _rand(5, 3))]
    if op == "LengthsWeightedSum":
        ins.append(("W", _rand(5, seed=2)))
    ins.append(("L", np.array([2, 0, 3], np.int32)))
    check(op, ins, ["Y"])


@pytest.mark.parametrize("lens", [[2, 0, 3], [0, 0, 0]], ids=["lens", "zeros"])
@pytest.mark.parametrize(
    "op",
    [
        "SparseLengthsSumGradient",
        "SparseLengthsMeanGradient",
        "LengthsSumGradient",
        "LengthsMeanGradient",
    ],
)
def test_lengths_gradients(op, lens):
    ins = [("dY", _rand(3, 4)), ("L", np.array(lens, np.int32))]
    check(op, ins, ["dX"])


@pytest.mark.parametrize("lens", [[2, 0, 3], [0, 0, 0]], ids=["lens", "zeros"])
def test_weighted_sum_gradient(lens):
    total = sum(lens)
    ins = [("W", _rand(total, seed=3)), ("dY", _rand(3, 2, 2)), ("L", np.array(lens, np.int32))]
    check("SparseLengthsWeightedSumGradient", ins, ["dX"])


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("lens", [[2, 0, 3], [0, 0]], ids=["lens", "zeros"])
def test_weighted_sum_gradient_with_main_input(lens, itype):
    total = sum(lens)
    idx = np.array([4, 0, 4, 1, 2][:total], dtype=itype)
    ins = [
        ("W", _rand(total, seed=4)),
        ("dY", _rand(len(lens), 3, seed=5)),
        ("L", np.array(lens, np.int32)),
        ("D", _rand(5, 3, seed=6)),
        ("I", idx),
    ]
    check(
        "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
        ins,
        ["dD", "dW"],
    )


# -- Scatter ---------------------------------------------------------------------------------


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize(
    "idx", [pytest.param([3, 0, 3, 1, 3], id="repeated"), pytest.param([], id="empty")]
)
def test_scatter_assign(idx, itype):
    ins = [
        ("X", _rand(5, 2)),
        ("I", np.array(idx, dtype=itype)),
        ("S", _rand(len(idx), 2, seed=7)),
    ]
    check("ScatterAssign", ins, ["X"])


def test_scatter_assign_int64_data():
    ins = [
        ("X", np.arange(8, dtype=np.int64).reshape(4, 2)),
        ("I", np.array([2, 2, 0], np.int32)),
        ("S", np.arange(100, 106, dtype=np.int64).reshape(3, 2)),
    ]
    check("ScatterAssign", ins, ["X"])


def test_scatter_assign_bad_index():
    ins = [("X", _rand(3, 2)), ("I", np.array([3], np.int32)), ("S", _rand(1, 2))]
    check_fails("ScatterAssign", ins, ["X"])


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize(
    "idx", [pytest.param([3, 0, 3, 1, 3], id="repeated"), pytest.param([], id="empty")]
)
def test_scatter_weighted_sum(idx, itype):
    n = len(idx)
    ins = [
        ("X0", _rand(5, 3)),
        ("W0", np.array([0.5], np.float32)),
        ("I", np.array(idx, dtype=itype)),
        ("X1", _rand(n, 3, seed=8)),
        ("W1", np.array([2.0], np.float32)),
        ("X2", _rand(n, 3, seed=9)),
        ("W2", np.array([-1.5], np.float32)),
    ]
    check("ScatterWeightedSum", ins, ["X0"])


# -- Dense optimizers ------------------------------------------------------------------------

LR = ("lr", np.array([0.1], np.float32))


@pytest.mark.parametrize("nesterov", [0, 1])
@pytest.mark.parametrize("shape", [(4, 3), (0, 3)], ids=["4x3", "empty"])
def test_momentum_sgd_update(shape, nesterov):
    ins = [("g", _rand(*shape)), ("m", _rand(*shape, seed=1)), LR, ("p", _rand(*shape, seed=2))]
    check("MomentumSGDUpdate", ins, ["g", "m", "p"], momentum=0.9, nesterov=nesterov)


@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd(nesterov):
    ins = [("g", _rand(7)), ("m", _rand(7, seed=1)), LR]
    check("MomentumSGD", ins, ["g", "m"], momentum=0.8, nesterov=nesterov)


@pytest.mark.parametrize("n_out", [2, 4])
def test_adagrad(n_out):
    ins = [("p", _rand(4, 3)), ("h", np.abs(_rand(4, 3, seed=1))), ("g", _rand(4, 3, seed=2)), LR]
    outs = ["p", "h", "eff", "upd"][:n_out]
    check("Adagrad", ins, outs, epsilon=1e-4, decay=0.9)


@pytest.mark.parametrize("n_out", [3, 4])
@pytest.mark.parametrize("it", [0, 7])
def test_adam(n_out, it):
    ins = [
        ("p", _rand(5, 2)),
        ("m1", _rand(5, 2, seed=1)),
        ("m2", np.abs(_rand(5, 2, seed=2))),
        ("g", _rand(5, 2, seed=3)),
        LR,
        ("it", np.array([it], np.int64)),
    ]
    outs = ["p", "m1", "m2", "eg"][:n_out]
    check("Adam", ins, outs, host=("it",), beta1=0.8, beta2=0.99)


# -- Sparse optimizers -----------------------------------------------------------------------

SPARSE_IDX = [
    pytest.param([4, 1, 4, 0, 4], id="repeated"),
    pytest.param([], id="empty"),
    pytest.param([2], id="one"),
]


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("idx", SPARSE_IDX)
def test_sparse_adagrad(idx, itype):
    ins = [
        ("p", _rand(5, 3)),
        ("h", np.abs(_rand(5, 3, seed=1))),
        ("i", np.array(idx, dtype=itype)),
        ("g", _rand(len(idx), 3, seed=2)),
        LR,
    ]
    check("SparseAdagrad", ins, ["p", "h"], epsilon=1e-3)


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("idx", SPARSE_IDX)
@pytest.mark.parametrize("counter", [False, True], ids=["plain", "counter"])
def test_rowwise_sparse_adagrad(idx, itype, counter):
    ins = [
        ("p", _rand(5, 3)),
        ("h", np.abs(_rand(5, seed=1))),
        ("i", np.array(idx, dtype=itype)),
        ("g", _rand(len(idx), 3, seed=2)),
        LR,
    ]
    args = {}
    if counter:
        ins.append(("c", np.array([2.0, 0.0, 1.0, 4.0, 3.0])))
        args = {"weight_decay": 0.1, "counter_halflife": 4}
    check("RowWiseSparseAdagrad", ins, ["p", "h"], epsilon=1e-3, **args)


def test_sparse_adagrad_bad_index():
    ins = [
        ("p", _rand(3, 2)),
        ("h", _rand(3, 2)),
        ("i", np.array([0, -1], np.int64)),
        ("g", _rand(2, 2)),
        LR,
    ]
    check_fails("SparseAdagrad", ins, ["p", "h"])


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("idx", SPARSE_IDX)
@pytest.mark.parametrize("width", [1, 3])
@pytest.mark.parametrize("radam", [0, 1])
@pytest.mark.parametrize("n_out", [3, 4])
def test_sparse_adam(idx, itype, width, radam, n_out):
    ins = [
        ("p", _rand(5, width)),
        ("m1", _rand(5, width, seed=1)),
        ("m2", np.abs(_rand(5, width, seed=2))),
        ("i", np.array(idx, dtype=itype)),
        ("g", _rand(len(idx), width, seed=3)),
        LR,
        ("it", np.array([9], np.int64)),
    ]
    outs = ["p", "m1", "m2", "eg"][:n_out]
    check("SparseAdam", ins, outs, host=("it",), enableRAdam=radam)


@pytest.mark.parametrize("itype", ITYPES)
@pytest.mark.parametrize("idx", SPARSE_IDX)
@pytest.mark.parametrize("nesterov", [0, 1])
def test_sparse_momentum_sgd_update(idx, itype, nesterov):
    ins = [
        ("g", _rand(len(idx), 3)),
        ("m", _rand(5, 3, seed=1)),
        LR,
        ("p", _rand(5, 3, seed=2)),
        ("i", np.array(idx, dtype=itype)),
    ]
    check("SparseMomentumSGDUpdate", ins, ["g", "m", "p"], momentum=0.9, nesterov=nesterov)


# -- Recurrent units -------------------------------------------------------------------------

UNIT_ARGS = [
    pytest.param({}, id="default"),
    pytest.param({"drop_states": 1, "forget_bias": 0.5}, id="drop"),
    pytest.param({"sequence_lengths": 0}, id="noseq"),
]


def _unit_inputs(n, d, gates, args, ltype=np.int32):
    ins = [("h", _rand(1, n, d)), ("c", _rand(1, n, d, seed=1)), ("x", _rand(1, n, gates * d))]
    if gates == 3:
        ins.pop(1)
    if args.get("sequence_lengths", 1):
        ins.append(("len", np.array([3, 1, 2, 5][:n], ltype)))
    ins.append(("t", np.array([2], np.int32)))
    return ins


@pytest.mark.parametrize("ltype", ITYPES)
@pytest.mark.parametrize("args", UNIT_ARGS)
@pytest.mark.parametrize("n", [4, 0])
def test_lstm_unit(n, args, ltype):
    ins = _unit_inputs(n, 3, 4, args, ltype)
    check("LSTMUnit", ins, ["h_t", "c_t"], host=("t",), **args)
    grads = [
        ("h_t", _rand(1, n, 3, seed=5)),
        ("c_t", _rand(1, n, 3, seed=6)),
        ("dh", _rand(1, n, 3, seed=7)),
        ("dc", _rand(1, n, 3, seed=8)),
    ]
    check("LSTMUnitGradient", ins + grads, ["dh_prev", "dc_prev", "dx"], host=("t",), **args)


@pytest.mark.parametrize("ltype", ITYPES)
@pytest.mark.parametrize("args", UNIT_ARGS)
@pytest.mark.parametrize("n", [4, 0])
def test_gru_unit(n, args, ltype):
    args = {k: v for k, v in args.items() if k != "forget_bias"}
    ins = _unit_inputs(n, 3, 3, args, ltype)
    check("GRUUnit", ins, ["h_t"], host=("t",), **args)
    grads = [("h_t", _rand(1, n, 3, seed=5)), ("dh", _rand(1, n, 3, seed=7))]
    check("GRUUnitGradient", ins + grads, ["dh_prev", "dx"], host=("t",), **args)
