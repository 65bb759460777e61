"""Numerical gradient checks of every differentiable CPU operator.

An op type is in scope when it has a CPU kernel, ``GetGradientForOp`` succeeds on a typical
def of it (the catalog's ``typical_def``, the defs of tests/gradcheck_specs.py, or a def with
generic input/output names), at least one input gets a gradient, and every op type of the
gradient has a kernel. Every in-scope op type must have cases in ``SPECS`` or a reasoned entry
in ``EXCLUDED``: a new differentiable kernel without one fails ``test_every_op_is_covered``.

Each case runs ``GradientChecker.CheckSimple`` (central differences, every element) on each
float input that gets a gradient. Sparse gradients (GradientSlice: Gather, SparseLengths*)
are densified by the checker.
"""

import base64
import json
import zlib

import numpy as np
import pytest
from conftest import side_file
from gradcheck_specs import EXCLUDED, GRADIENT_KERNELS_WITHOUT_MAKER, SPECS

from ferrocaffe import _native, core, gradient_checker, workspace
from ferrocaffe.proto import caffe2_pb2

KERNELS = frozenset(_native.kernel_types())


def _catalog_ops():
    path = side_file("op-catalog.json")
    if not path.is_file():
        pytest.fail(f"op catalog not found at {path} (it sits beside the golden corpus)")
    return json.loads(path.read_text())["ops"]


def _catalog_def(entry):
    g = (entry or {}).get("gradient") or {}
    if not g.get("typical_def_b64"):
        return None
    op = caffe2_pb2.OperatorDef()
    op.ParseFromString(base64.b64decode(g["typical_def_b64"]))
    g_out = g.get("g_output") or [o + "_grad" for o in op.output]
    return op, g_out


def _generic_defs(op_type):
    for n_in in range(1, 7):
        for n_out in range(1, 4):
            op = core.CreateOperator(
                op_type, [f"X{i}" for i in range(n_in)], [f"Y{i}" for i in range(n_out)]
            )
            yield op, [o + "_grad" for o in op.output]


def gradient_status(op, g_out):
    """(differentiable, gradient op types, missing kernels) of one def; None when the
    registry refuses it."""
    try:
        grad_ops, g_in = core.GradientRegistry.GetGradientForOp(op, g_out)
    except Exception:
        return None
    types = [g.type for g in grad_ops]
    missing = sorted({t for t in types if t not in KERNELS})
    return any(g is not None for g in g_in), types, missing


def _scope_of(op_type, defs):
    """'in' (checkable now), 'pending' (differentiable, some gradient kernel missing) or
    None (no gradient)."""
    if op_type not in KERNELS:
        return None
    pending = False
    for op, g_out in defs:
        status = gradient_status(op, g_out)
        if status is None or not status[0]:
            continue
        if not status[2]:
            return "in"
        pending = True
    return "pending" if pending else None


def _probe_defs(op_type, catalog):
    found = _catalog_def(catalog.get(op_type))
    if found is not None:
        yield found
    yield from _generic_defs(op_type)


def _case_op(case):
    return core.CreateOperator(
        case.op_type, [n for n, _ in case.inputs], list(case.outputs), **case.args
    )


# Every case runs: a case whose forward or gradient op has no kernel fails, as it should.
CASES = [c for cases in SPECS.values() for c in cases]


def test_every_op_is_covered():
    catalog = _catalog_ops()
    all_types = sorted(KERNELS | set(_native.registered_operators()) | set(catalog))
    uncovered = [
        t
        for t in all_types
        if t not in SPECS and t not in EXCLUDED and _scope_of(t, _probe_defs(t, catalog)) == "in"
    ]
    assert not uncovered, (
        "differentiable op types with kernels but no gradient-check cases in "
        "tests/gradcheck_specs.py (add cases to SPECS, or a reason to EXCLUDED): %s" % uncovered
    )


def test_exclusions_and_specs_are_disjoint():
    both = sorted(set(SPECS) & set(EXCLUDED))
    assert not both, both
    assert all(len(reason) > 30 for reason in EXCLUDED.values())


def test_scope_is_not_trivial():
    """The checks below cover the core differentiable ops (guards the scope logic itself)."""
    checked = {c.op_type for c in CASES}
    core_ops = {"FC", "Conv", "Relu", "Softmax", "SoftmaxWithLoss", "MaxPool", "Gather", "Add"}
    assert core_ops <= checked, sorted(core_ops - checked)
    assert len(checked) >= 60, len(checked)


def _rng(case):
    return np.random.default_rng(zlib.crc32(case.id.encode()))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gradient_matches_finite_differences(case):
    rng = _rng(case)
    arrays = [make(rng) for _, make in case.inputs]
    op = _case_op(case)
    _, g_input = gradient_checker.getGradientForOp(op)
    check = case.check
    if check is None:
        check = [
            i
            for i, g in enumerate(g_input)
            if g is not None and i < len(arrays) and arrays[i].dtype.kind == "f"
        ]
    assert check or case.zero_grad_ok, f"{case.id}: no input gets a gradient"
    if not check:
        check = [0]
    checker = gradient_checker.GradientChecker(
        stepsize=case.stepsize,
        threshold=case.threshold,
        workspace_name="gradcheck_ops",
        full_check=True,
    )
    failures = []
    for i in check:
        if g_input[i] is None:
            assert case.zero_grad_ok, f"{case.id}: input {i} has no gradient"
            continue
        ok, grad, estimate = checker.CheckSimple(op, [a.copy() for a in arrays], i, case.grads)
        if not case.zero_grad_ok:
            assert np.any(estimate != 0), f"{case.id}: input {op.input[i]}: loss is flat"
        if not ok:
            bad = np.flatnonzero(
                ~np.isclose(grad, estimate, atol=case.threshold, rtol=case.threshold)
            )
            failures.append(
                "input %d (%s): %d/%d elements differ, max |diff| %.4g; first: %s"
                % (
                    i,
                    op.input[i],
                    bad.size,
                    grad.size,
                    float(np.max(np.abs(grad.astype(np.float64) - estimate))),
                    [(int(k), float(grad.flat[k]), float(estimate.flat[k])) for k in bad[:4]],
                )
            )
    assert not failures, f"{case.id}: gradient differs from central differences:\n" + "\n".join(
        failures
    )
    assert workspace.CurrentWorkspace() != "gradcheck_ops"


def _explicit_grad_ops(case):
    return [core.CreateOperator(t, ins, outs, **args) for t, ins, outs, args in case.grad_ops]


NO_MAKER_CASES = list(GRADIENT_KERNELS_WITHOUT_MAKER)


@pytest.mark.parametrize("case", NO_MAKER_CASES, ids=[c.id for c in NO_MAKER_CASES])
def test_gradient_kernels_without_maker(case):
    """Gradient kernels that no maker emits yet, checked with explicit gradient ops."""
    rng = _rng(case)
    arrays = [make(rng) for _, make in case.inputs]
    op = _case_op(case)
    grad_ops = _explicit_grad_ops(case)
    produced = {o for g in grad_ops for o in g.output}
    check = [i for i, name in enumerate(op.input) if name + "_grad" in produced]
    assert check, case.id
    checker = gradient_checker.GradientChecker(
        case.stepsize, case.threshold, workspace_name="gradcheck_ops", full_check=True
    )
    for i in check:
        ok, grad, estimate = checker.CheckSimple(
            op, [a.copy() for a in arrays], i, case.grads, grad_ops=grad_ops
        )
        assert np.any(estimate != 0), (case.id, op.input[i])
        assert ok, "%s: input %s: max |diff| %.4g\ngrad %s\nestimate %s" % (
            case.id,
            op.input[i],
            float(np.max(np.abs(grad - estimate))),
            grad.ravel()[:8],
            estimate.ravel()[:8],
        )


def test_checker_catches_a_wrong_gradient():
    """A gradient op that is off by a factor must be reported (the checker is not vacuous)."""
    op = core.CreateOperator("Sqr", ["X"], ["Y"])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    wrong = [core.CreateOperator("Scale", ["Y_grad"], ["X_grad"], scale=3.0)]
    checker = gradient_checker.GradientChecker(0.01, 0.01, full_check=True)
    ok, grad, estimate = checker.CheckSimple(op, [x], 0, [0], grad_ops=wrong)
    assert not ok
    np.testing.assert_allclose(estimate, 2 * x**3, rtol=1e-3, atol=1e-4)
    ok, _, _ = checker.CheckSimple(op, [x], 0, [0])
    assert ok


def test_checker_densifies_gradient_slices():
    op = core.CreateOperator("Gather", ["DATA", "INDICES"], ["Y"])
    data = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    idx = np.array([3, 1, 3], dtype=np.int32)
    checker = gradient_checker.GradientChecker(0.01, 0.01, full_check=True)
    ok, grad, estimate = checker.CheckSimple(op, [data, idx], 0, [0])
    assert ok
    expected = np.zeros_like(data)
    expected[1] = data[1]
    expected[3] = 2 * data[3]
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


def test_checker_restores_the_callers_workspace_and_inputs():
    workspace.SwitchWorkspace("gradcheck_caller", True)
    workspace.FeedBlob("keep", np.ones(2, np.float32))
    x = np.array([[0.5, -0.3]], dtype=np.float32)
    before = x.copy()
    try:
        ok, _, _ = gradient_checker.GradientChecker(0.01, 0.01).CheckSimple(
            core.CreateOperator("Tanh", ["X"], ["Y"]), [x], 0, [0]
        )
        assert ok
        assert workspace.CurrentWorkspace() == "gradcheck_caller"
        assert workspace.HasBlob("keep") and not workspace.HasBlob("X")
        np.testing.assert_array_equal(x, before)
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace("default")


# -- control flow: Do and If take workspace blobs, so they are checked at the net level -------


def _do(subnet, inner, outer_inputs, outer_outputs, ws, outer_idx=None):
    """A Do op running ``subnet`` in workspace blob ``ws``; ``inner[k]`` is bound to the k-th
    outer blob (inputs then outputs, the workspace blob left out) unless ``outer_idx``."""
    idx = list(range(len(inner))) if outer_idx is None else outer_idx
    return core.CreateOperator(
        "Do",
        list(outer_inputs) + [ws],
        list(outer_outputs) + [ws],
        net=subnet,
        inner_blobs=list(inner),
        outer_blobs_idx=idx,
    )


def _if_branch(name, build):
    """A then/else net made of one Do op (the form Caffe2's control-flow builders emit)."""
    inner = core.Net(name)
    build(inner)
    ws = "ws_" + name
    branch = core.Net("do_" + name)
    branch.Proto().op.extend(
        [_do(inner.Proto(), ["y", "w", "x"], ["w", "x"], ["y"], ws, [2, 0, 1])]
    )
    branch.Proto().external_input.extend(["w", "x", ws])
    branch.Proto().external_output.extend(["y", ws])
    return branch.Proto()


def _check_net(net, values, names, expect_nonzero=True):
    for name in names:
        mean, worst = gradient_checker.NetGradientChecker.Check(
            net, ["y"], values, name, step_size=0.01, threshold=0.01, print_net=False
        )
        assert worst < 0.01, (name, worst)
    if expect_nonzero:
        _, grads, _ = gradient_checker._get_grad(net, [], ["y"], values, names)
        assert all(np.any(g != 0) for g in grads.values())


def test_control_flow_gradients_do():
    rng = np.random.default_rng(7)
    sub = core.Net("do_sub")
    sub.Tanh(sub.FC(["in_x", "in_w", "in_b"], "in_h"), "in_y")
    net = core.Net("cf_do")
    net.CreateScope([], "ws")
    net.Proto().op.extend(
        [_do(sub.Proto(), ["in_x", "in_w", "in_b", "in_y"], ["x", "w", "b"], ["y"], "ws")]
    )
    values = {
        "x": rng.uniform(-1, 1, (3, 4)).astype(np.float32),
        "w": rng.uniform(-1, 1, (2, 4)).astype(np.float32),
        "b": rng.uniform(-1, 1, (2,)).astype(np.float32),
    }
    workspace.SwitchWorkspace("gradcheck_cf", True)
    try:
        _check_net(net, values, ["x", "w", "b"])
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace("default")


@pytest.mark.parametrize("cond", [True, False])
def test_control_flow_gradients_if(cond):
    rng = np.random.default_rng(8)
    then_net = _if_branch("then", lambda n: n.Tanh(n.Mul(["x", "w"], "t"), "y"))
    else_net = _if_branch("else", lambda n: n.Sqr(n.Add(["x", "w"], "t"), "y"))
    net = core.Net("cf_if")
    net.CreateScope([], "ws_then")
    net.CreateScope([], "ws_else")
    net.Proto().op.extend(
        [
            core.CreateOperator(
                "If",
                ["cond", "w", "x", "ws_then", "ws_else"],
                ["y", "ws_then", "ws_else"],
                then_net=then_net,
                else_net=else_net,
            )
        ]
    )
    values = {
        "cond": np.array(cond),
        "x": rng.uniform(-1, 1, (2, 3)).astype(np.float32),
        "w": rng.uniform(-1, 1, (2, 3)).astype(np.float32),
    }
    workspace.SwitchWorkspace("gradcheck_cf", True)
    try:
        _check_net(net, values, ["x", "w"])
        # the branch taken decides the gradient: tanh(x*w) vs (x+w)^2
        _, grads, _ = gradient_checker._get_grad(net, [], ["y"], values, ["x"])
        x, w = values["x"], values["w"]
        want = (1 - np.tanh(x * w) ** 2) * w if cond else 2 * (x + w)
        np.testing.assert_allclose(grads["x"], want, rtol=1e-4, atol=1e-5)
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace("default")


def test_checker_estimates_the_edges_only_unless_asked(monkeypatch, capsys):
    """Caffe2's default: only the first and last three elements are estimated (the others
    copy the analytic value); CAFFE2_FULL_GRAD_CHECK=1 or full_check=True estimates all."""
    monkeypatch.delenv("CAFFE2_FULL_GRAD_CHECK", raising=False)
    monkeypatch.delenv("FERROCAFFE_FULL_GRAD_CHECK", raising=False)
    op = core.CreateOperator("Sqr", ["X"], ["Y"])
    x = np.linspace(0.1, 1.0, 10, dtype=np.float32)
    wrong = [core.CreateOperator("Scale", ["Y_grad"], ["X_grad"], scale=3.0)]
    ok, grad, estimate = gradient_checker.GradientChecker(0.01, 0.01).CheckSimple(
        op, [x], 0, [0], grad_ops=wrong
    )
    assert not ok
    assert "Failed. [idx, grad, grad_estimate] are:" in capsys.readouterr().out
    differs = np.flatnonzero(grad != estimate)
    assert set(differs) == {0, 1, 2, 7, 8, 9}
    monkeypatch.setenv("CAFFE2_FULL_GRAD_CHECK", "1")
    _, grad, estimate = gradient_checker.GradientChecker(0.01, 0.01).CheckSimple(
        op, [x], 0, [0], grad_ops=wrong
    )
    assert np.flatnonzero(grad != estimate).size == 10


def test_checker_argument_errors_and_inferred_outputs():
    caller = workspace.CurrentWorkspace()
    checker = gradient_checker.GradientChecker(0.01, 0.01, full_check=True)
    fc = core.CreateOperator("FC", ["X", "W", "b"], ["Y"])
    x, w, b = (np.full(s, 0.5, np.float32) for s in [(2, 3), (4, 3), (4,)])
    ok, grad, _ = checker.CheckSimple(fc, [x, w, b], 1, [0], ensure_outputs_are_inferred=True)
    assert ok and grad.shape == w.shape
    with pytest.raises(ValueError, match="FC has 3 inputs, 4 arrays were given"):
        checker.CheckSimple(fc, [x, w, b, b], 0, [0])
    # Fewer arrays feed the first inputs only, as in Caffe2: b is not in the checker's
    # workspace, so running FC fails.
    with pytest.raises(RuntimeError, match="b"):
        checker.CheckSimple(fc, [x, w], 0, [0])
    xent = core.CreateOperator("LabelCrossEntropy", ["P", "label"], ["Y"])
    with pytest.raises(ValueError, match=r"input 1 \(label\) of LabelCrossEntropy has no gradient"):
        checker.CheckSimple(xent, [np.full((2, 3), 0.3, np.float32), np.zeros(2, np.int32)], 1, [0])
    assert workspace.CurrentWorkspace() == caller
