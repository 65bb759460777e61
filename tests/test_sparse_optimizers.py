"""SparseAdam and SparseMomentumSGDUpdate against numpy versions of Caffe2's update formulas:
one index after another (a repeated index is updated twice), GRAD's rows following the shape
of INDICES, the state updated in place; then the same updates driven by optimizer.build_adam
and optimizer.build_sgd(momentum) on a model with an embedding table."""

import numpy as np
import pytest

from ferrocaffe import brew, core, model_helper, optimizer, workspace
from ferrocaffe.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def fresh_workspace():
    old = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace("test_sparse_optimizers", True)
    workspace.ResetWorkspace()
    optimizer.reset_optimizer_instance_count()
    yield
    workspace.ResetWorkspace()
    workspace.SwitchWorkspace(old)


def feed(**blobs):
    for name, value in blobs.items():
        workspace.FeedBlob(name, value)


def fetch(*names):
    return [workspace.FetchBlob(n) for n in names]


# -- numpy references ---------------------------------------------------------------------


def momentum_ref(grad, moment, lr, param, indices, momentum, nesterov):
    param, moment = param.astype(np.float64), moment.astype(np.float64)
    rows = grad.reshape(indices.size, -1).astype(np.float64)
    flat_p = param.reshape(param.shape[0], -1)
    flat_m = moment.reshape(moment.shape[0], -1)
    out = np.empty_like(rows)
    for k, i in enumerate(indices.ravel()):
        m = flat_m[i].copy()
        if nesterov:
            m_new = momentum * m + lr * rows[k]
            step = (1 + momentum) * m_new - momentum * m
        else:
            m_new = lr * rows[k] + momentum * m
            step = m_new
        flat_m[i] = m_new
        flat_p[i] -= step
        out[k] = step
    return out.reshape(grad.shape), moment, param


def radam_factor(beta1, beta2, t):
    """None while RAdam keeps to momentum only (rho_t < 5), else its rectification r_t."""
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    if rho_t < 5:
        return None
    return np.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))


def adam_ref(param, m1, m2, indices, grad, lr, it, beta1, beta2, eps, radam=False):
    """(param, m1, m2, effective gradient) after one SparseAdam step at iteration ``it``."""
    t = it + 1
    correction = np.sqrt(1 - beta2**t) / (1 - beta1**t)
    r_t = radam_factor(beta1, beta2, t) if radam else 1.0
    param, m1, m2 = (a.astype(np.float64).reshape(a.shape[0], -1) for a in (param, m1, m2))
    rows = grad.reshape(indices.size, -1).astype(np.float64)
    eff = np.empty_like(rows)
    for k, i in enumerate(indices.ravel()):
        m1[i] = beta1 * m1[i] + (1 - beta1) * rows[k]
        m2[i] = beta2 * m2[i] + (1 - beta2) * rows[k] ** 2
        if r_t is None:
            eff[k] = m1[i] / (1 - beta1**t)
        else:
            eff[k] = r_t * correction * m1[i] / (np.sqrt(m2[i]) + eps)
        param[i] += lr * eff[k]
    return param, m1, m2, eff.reshape(grad.shape)


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got.reshape(np.shape(want)), want, rtol=rtol, atol=atol)


# -- SparseMomentumSGDUpdate --------------------------------------------------------------


@pytest.mark.parametrize("nesterov", [0, 1])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize(
    "indices",
    [[4, 1, 3], [2, 2, 0], [[0, 3], [3, 1]]],
    ids=["distinct", "repeated", "2d"],
)
def test_sparse_momentum_matches_numpy(nesterov, index_dtype, indices):
    rng = np.random.default_rng(7)
    indices = np.array(indices, dtype=index_dtype)
    param = rng.normal(size=(5, 2, 3)).astype(np.float32)
    moment = rng.normal(size=(5, 2, 3)).astype(np.float32)
    grad = rng.normal(size=indices.shape + (2, 3)).astype(np.float32)
    lr = np.array([0.3], dtype=np.float32)
    feed(grad=grad, moment=moment, lr=lr, param=param, indices=indices)
    op = core.CreateOperator(
        "SparseMomentumSGDUpdate",
        ["grad", "moment", "lr", "param", "indices"],
        ["grad", "moment", "param"],
        momentum=0.8,
        nesterov=nesterov,
    )
    workspace.RunOperatorOnce(op)
    want = momentum_ref(grad, moment, 0.3, param, indices, 0.8, nesterov)
    for got, w in zip(fetch("grad", "moment", "param"), want, strict=True):
        close(got, w)
    # Rows that no index names are left alone.
    untouched = sorted(set(range(5)) - set(indices.ravel().tolist()))
    np.testing.assert_array_equal(workspace.FetchBlob("param")[untouched], param[untouched])


def test_sparse_momentum_defaults_and_separate_grad_output():
    """momentum defaults to 0 and nesterov to off: the step is lr * grad; the grad output may
    be a new blob."""
    param = np.arange(6, dtype=np.float32).reshape(3, 2)
    feed(
        g=np.array([[1.0, -2.0]], np.float32),
        m=np.ones((3, 2), np.float32),
        lr=np.array([0.5], np.float32),
        p=param,
        i=np.array([1], np.int64),
    )
    op = core.CreateOperator(
        "SparseMomentumSGDUpdate", ["g", "m", "lr", "p", "i"], ["step", "m", "p"]
    )
    workspace.RunOperatorOnce(op)
    step, m, p = fetch("step", "m", "p")
    np.testing.assert_allclose(step, [[0.5, -1.0]])
    np.testing.assert_allclose(m, [[1, 1], [0.5, -1.0], [1, 1]])
    np.testing.assert_allclose(p, [[0, 1], [1.5, 4.0], [4, 5]])


def test_sparse_momentum_errors():
    feed(
        g=np.ones((2, 2), np.float32),
        m=np.zeros((3, 2), np.float32),
        lr=np.array([0.1], np.float32),
        p=np.zeros((3, 2), np.float32),
        i=np.array([0, 5], np.int32),
    )
    op = core.CreateOperator("SparseMomentumSGDUpdate", ["g", "m", "lr", "p", "i"], ["g", "m", "p"])
    with pytest.raises(RuntimeError, match="index 5 of 'i' out of range"):
        workspace.RunOperatorOnce(op)
    feed(i=np.array([0, 1], np.int32), m=np.zeros((2, 2), np.float32))
    with pytest.raises(RuntimeError, match="'m'"):
        workspace.RunOperatorOnce(op)
    # The moment must be updated in place (Caffe2's schema enforces it).
    bad = core.CreateOperator(
        "SparseMomentumSGDUpdate", ["g", "m", "lr", "p", "i"], ["g", "m2", "p"]
    )
    with pytest.raises(RuntimeError):
        workspace.RunOperatorOnce(bad)


# -- SparseAdam -------------------------------------------------------------------------------


def _adam_inputs(indices, block=(3,), seed=3):
    rng = np.random.default_rng(seed)
    shape = (6,) + block
    return dict(
        param=rng.normal(size=shape).astype(np.float32),
        m1=rng.normal(scale=0.1, size=shape).astype(np.float32),
        m2=rng.uniform(0.0, 0.1, size=shape).astype(np.float32),
        indices=np.asarray(indices),
        grad=rng.normal(size=np.shape(indices) + block).astype(np.float32),
        lr=np.array([-0.05], np.float32),
    )


def _run_adam(inputs, it, outputs=("param", "m1", "m2"), **args):
    feed(**inputs, it=np.array([it], np.int64))
    op = core.CreateOperator(
        "SparseAdam",
        ["param", "m1", "m2", "indices", "grad", "lr", "it"],
        list(outputs),
        **args,
    )
    workspace.RunOperatorOnce(op)
    return fetch(*outputs)


@pytest.mark.parametrize("block", [(), (3,), (2, 2)], ids=["scalar_rows", "rows", "matrix_rows"])
@pytest.mark.parametrize("it", [0, 9])
def test_sparse_adam_matches_numpy(block, it):
    inputs = _adam_inputs(np.array([5, 0, 2], np.int64), block=block)
    got = _run_adam(inputs, it, beta1=0.8, beta2=0.95, epsilon=1e-4)
    want = adam_ref(
        inputs["param"],
        inputs["m1"],
        inputs["m2"],
        inputs["indices"],
        inputs["grad"],
        -0.05,
        it,
        0.8,
        0.95,
        1e-4,
    )
    for g, w in zip(got, want[:3], strict=True):
        close(g, w)


def test_sparse_adam_defaults_repeated_indices_and_int32():
    """beta1 0.9, beta2 0.999, epsilon 1e-5 by default; a repeated index is stepped twice."""
    inputs = _adam_inputs(np.array([[1, 4], [1, 1]], np.int32))
    got = _run_adam(inputs, 3)
    want = adam_ref(
        inputs["param"],
        inputs["m1"],
        inputs["m2"],
        inputs["indices"],
        inputs["grad"],
        -0.05,
        3,
        0.9,
        0.999,
        1e-5,
    )
    for g, w in zip(got, want[:3], strict=True):
        close(g, w)
    # Row 1 moved three times, rows 0, 2, 3, 5 not at all.
    np.testing.assert_array_equal(got[0][[0, 2, 3, 5]], inputs["param"][[0, 2, 3, 5]])


def test_sparse_adam_effective_gradient_output():
    inputs = _adam_inputs(np.array([3, 1], np.int64))
    got = _run_adam(inputs, 4, outputs=("param", "m1", "m2", "eff"), beta1=0.7, epsilon=1e-3)
    want = adam_ref(
        inputs["param"],
        inputs["m1"],
        inputs["m2"],
        inputs["indices"],
        inputs["grad"],
        -0.05,
        4,
        0.7,
        0.999,
        1e-3,
    )
    for g, w in zip(got, want, strict=True):
        close(g, w)
    assert got[3].shape == inputs["grad"].shape


@pytest.mark.parametrize("it", [0, 3, 50])
@pytest.mark.parametrize("with_grad", [False, True])
def test_sparse_radam(it, with_grad):
    """beta2 = 0.9: rho_t < 5 for the first iterations (bias-corrected momentum only), then
    the rectified Adam step."""
    inputs = _adam_inputs(np.array([0, 4, 2], np.int64))
    assert (radam_factor(0.9, 0.9, it + 1) is None) == (it < 5)
    outputs = ("param", "m1", "m2", "eff") if with_grad else ("param", "m1", "m2")
    got = _run_adam(inputs, it, outputs=outputs, beta2=0.9, enableRAdam=1)
    want = adam_ref(
        inputs["param"],
        inputs["m1"],
        inputs["m2"],
        inputs["indices"],
        inputs["grad"],
        -0.05,
        it,
        0.9,
        0.9,
        1e-5,
        radam=True,
    )
    for g, w in zip(got, want, strict=False):
        close(g, w)


def test_sparse_adam_shape_errors():
    inputs = _adam_inputs(np.array([0, 1], np.int64))
    inputs["grad"] = np.ones((2, 4), np.float32)
    with pytest.raises(RuntimeError, match=r"'grad' \[2, 4\] must be the rows of 'param'"):
        _run_adam(inputs, 0)
    inputs = _adam_inputs(np.array([0, 6], np.int64))
    with pytest.raises(RuntimeError, match="index 6 of 'indices' out of range"):
        _run_adam(inputs, 0)
    inputs = _adam_inputs(np.array([0], np.int64))
    inputs["m2"] = np.zeros((5, 3), np.float32)
    with pytest.raises(RuntimeError, match=r"'m2'\) has 15 values, expected 18"):
        _run_adam(inputs, 0)


# -- through the optimizer builders ---------------------------------------------------------


def _run_one_step(build):
    """An embedding table pooled by SparseLengthsSum (a repeated id included), an FC and a
    squared loss; ``build`` adds the optimizer. Returns the update op, the table before the
    step, and the gradient slice (indices, values) the backward pass fed to the update, read
    by running the net's forward and backward ops alone first."""
    model = model_helper.ModelHelper(name="emb")
    emb = model.param_init_net.GaussianFill([], "emb", shape=[5, 3], std=0.5)
    model.AddParameter(emb)
    pooled = model.net.SparseLengthsSum([emb, "ids", "lens"], "pooled")
    fc = brew.fc(model, pooled, "fc", dim_in=3, dim_out=1)
    dist = model.net.SquaredL2Distance([fc, "target"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    model.AddGradientOperators([loss])
    n_backward = len(model.net.Proto().op)
    build(model)
    feed(
        ids=np.array([0, 3, 3, 1], np.int32),
        lens=np.array([2, 2], np.int32),
        target=np.array([[1.0], [-1.0]], np.float32),
    )
    workspace.RunNetOnce(model.param_init_net)
    backward = caffe2_pb2.NetDef()
    backward.CopyFrom(model.net.Proto())
    del backward.op[n_backward:]
    backward.name = "backward_only"
    workspace.RunNetOnce(backward)
    grad = model.param_to_grad["emb"]
    assert isinstance(grad, core.GradientSlice)
    indices, values = fetch(str(grad.indices), str(grad.values))
    assert np.any(values != 0)
    before = workspace.FetchBlob("emb").copy()
    workspace.RunNetOnce(model.net)
    updates = [op for op in model.net.Proto().op[n_backward:] if op.type.startswith("Sparse")]
    assert len(updates) == 1, [op.type for op in updates]
    return updates[0], before, indices, values


def test_build_sgd_momentum_updates_the_embedding_rows():
    op, before, indices, values = _run_one_step(
        lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9, nesterov=True)
    )
    assert op.type == "SparseMomentumSGDUpdate"
    lr = float(workspace.FetchBlob(op.input[2]).ravel()[0])
    assert lr == pytest.approx(0.1)
    zeros = np.zeros_like(before)
    steps, moment, param = momentum_ref(values, zeros, lr, before, indices, 0.9, True)
    close(workspace.FetchBlob("emb"), param)
    close(workspace.FetchBlob("emb_momentum"), moment)
    close(workspace.FetchBlob(op.output[0]), steps)


def test_build_adam_updates_the_embedding_rows():
    op, before, indices, values = _run_one_step(lambda m: optimizer.build_adam(m, 0.01))
    assert op.type == "SparseAdam"
    beta1, beta2, eps = (
        next(a.f for a in op.arg if a.name == n) for n in ("beta1", "beta2", "epsilon")
    )
    lr = float(workspace.FetchBlob(op.input[5]).ravel()[0])
    assert lr == pytest.approx(-0.01)
    zeros = np.zeros_like(before)
    # The counter as the update read it (Iter ran earlier in the same net).
    it = int(workspace.FetchBlob(op.input[6]).ravel()[0])
    assert it == 1
    want = adam_ref(before, zeros, zeros, indices, values, lr, it, beta1, beta2, eps)
    emb, m1, m2 = fetch("emb", "emb_first_moment", "emb_second_moment")
    close(emb, want[0], rtol=1e-4)
    close(m1, want[1])
    close(m2, want[2])
    untouched = [2, 4]
    np.testing.assert_array_equal(emb[untouched], before[untouched])
