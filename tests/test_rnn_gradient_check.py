"""Numerical gradient checks through RecurrentNetwork / RecurrentNetworkGradient: a 2-layer
LSTM and a GRU (rnn_cell / gru_cell builders, partial sequence lengths, the step executor on
and off), every input and parameter against central differences; plus the gradient checker
itself on single ops."""

import numpy as np
import pytest

from ferrocaffe import core, gru_cell, rnn_cell, workspace
from ferrocaffe.gradient_checker import GradientChecker, NetGradientChecker
from ferrocaffe.model_helper import ModelHelper

T, N, D, H = 4, 2, 3, 3
STEP = 1e-2
THRESHOLD = 1e-2


@pytest.fixture(autouse=True)
def fresh():
    core.Net._net_names_used = set()
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _set_executor(net, enabled):
    for op in net.Proto().op:
        if op.type.startswith("RecurrentNetwork"):
            for a in op.arg:
                if a.name == "enable_rnn_executor":
                    a.i = int(enabled)


def _build(kind, layers):
    model = ModelHelper(name=f"{kind}_check")
    states = []
    for i in range(layers):
        states += [f"h{i}"] + ([f"c{i}"] if kind == "lstm" else [])
    builder = rnn_cell.LSTM if kind == "lstm" else gru_cell.GRU
    outputs = builder(
        model,
        "input",
        "seq_lengths",
        states,
        D,
        [H] * layers if layers > 1 else H,
        scope=kind,
    )
    # loss = sum(hidden_all * R): gradients of order one, so the check is not vacuous.
    weighted = model.net.Mul([outputs[0], "R"], "weighted")
    model.net.SumElements(weighted, "loss")
    return model, states


def _values(model, states, seed):
    rng = np.random.default_rng(seed)
    workspace.RunNetOnce(model.param_init_net)
    values = {
        str(p): (rng.standard_normal(workspace.FetchBlob(str(p)).shape) * 0.5).astype(np.float32)
        for p in model.params
    }
    values["input"] = rng.standard_normal((T, N, D)).astype(np.float32)
    values["seq_lengths"] = np.array([T, T - 2], dtype=np.int32)
    values["R"] = rng.standard_normal((T, N, H)).astype(np.float32)
    for s in states:
        values[s] = (rng.standard_normal((1, N, H)) * 0.5).astype(np.float32)
    return values


@pytest.mark.parametrize("executor", [1, 0])
@pytest.mark.parametrize("kind,layers", [("lstm", 2), ("gru", 1)])
def test_recurrent_network_gradients_match_central_differences(kind, layers, executor):
    model, states = _build(kind, layers)
    _set_executor(model.net, executor)
    values = _values(model, states, seed=layers)
    to_check = ["input"] + states + [str(p) for p in model.params]
    assert len(to_check) == 1 + len(states) + (8 if kind == "lstm" else 8)
    worst = 0.0
    for name in to_check:
        _, largest = NetGradientChecker.Check(
            model.net,
            ["loss"],
            values,
            name,
            step_size=STEP,
            threshold=THRESHOLD,
            print_net=False,
        )
        worst = max(worst, largest)
    # Not vacuous: the gradients are far from zero and the estimates close to them.
    grads = workspace.FetchBlob(f"{kind}/i2h_w_grad")
    assert np.abs(grads).max() > 0.1
    assert worst < THRESHOLD


def test_checkers_reject_wrong_gradients():
    """Given gradient ops that compute twice the true gradient, the op checker reports failure;
    a net check passes on a correct net and fails when the values it was given disagree."""
    x = np.array([[1.0, -2.0, 0.5]], np.float32)
    op = core.CreateOperator("Sqr", ["x"], ["y"])
    checker = GradientChecker(stepsize=1e-2, threshold=1e-3)
    ok, grad, estimate = checker.CheckSimple(op, [x], 0, [0])
    assert ok
    np.testing.assert_allclose(grad, 2 * x**3, rtol=1e-5)  # d/dx (x^2)^2 / 2
    wrong = [core.CreateOperator("Mul", ["y_grad", "x"], ["x_grad"])]  # missing the factor 2
    ok, grad, estimate = checker.CheckSimple(op, [x], 0, [0], grad_ops=wrong)
    assert not ok
    np.testing.assert_allclose(grad * 2, estimate, rtol=1e-3)

    net = core.Net("sqr_sum")
    net.Sqr("x", "y")
    net.SumElements("y", "loss")
    mean, largest = NetGradientChecker.Check(
        net, ["loss"], {"x": x}, "x", step_size=1e-2, threshold=1e-3, print_net=False
    )
    assert largest < 1e-3
    doubled = core.Net("sqr_sum_doubled")
    doubled.Sqr("x", "y")
    doubled.SumElements("y", "s")
    doubled.Scale("s", "loss2", scale=2.0)
    NetGradientChecker.CompareNets([net, net], [["loss"], ["loss"]], [0], ["x"], {"x": x})
    with pytest.raises(AssertionError):
        NetGradientChecker.CompareNets(
            [net, doubled], [["loss"], ["loss2"]], [0], ["x"], input_values={"x": x}
        )


def test_compare_nets_executor_on_and_off():
    model, states = _build("lstm", 2)
    values = _values(model, states, seed=5)
    on = model.net.Clone("lstm_on")
    off = model.net.Clone("lstm_off")
    _set_executor(on, 1)
    _set_executor(off, 0)
    NetGradientChecker.CompareNets(
        [on, off],
        [["loss"]] * 2,
        [0],
        ["input", "h0", "c1"] + [str(p) for p in model.params],
        input_values=values,
        threshold=0.0,
    )


def test_single_op_checker_on_lstm_unit():
    rng = np.random.default_rng(3)
    op = core.CreateOperator(
        "LSTMUnit",
        ["h_prev", "c_prev", "gates", "seq_lengths", "t"],
        ["h", "c"],
    )
    inputs = [
        rng.standard_normal((1, 2, 3)).astype(np.float32),
        rng.standard_normal((1, 2, 3)).astype(np.float32),
        rng.standard_normal((1, 2, 12)).astype(np.float32),
        np.array([2, 1], np.int32),
        np.array([1], np.int32),
    ]
    checker = GradientChecker(stepsize=1e-2, threshold=1e-2)
    for idx in (0, 1, 2):
        ok, grad, estimate = checker.CheckSimple(op, inputs, idx, [0, 1])
        assert ok, (idx, grad, estimate)
        assert np.abs(grad).max() > 0.05
        if idx == 1:
            # The second row's sequence ended (t = 1 >= 1): its cell passes through
            # unchanged, so the gradient of (h^2 + c^2) / 2 is the cell itself.
            np.testing.assert_allclose(grad[0, 1], inputs[1][0, 1], rtol=1e-6)
