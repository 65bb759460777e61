"""Properties of the backward pass on random DAGs of operators with simple gradient functions
(registered from Python, so the IR is tested apart from the built-in makers)."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrocaffe import core
from ferrocaffe.proto import caffe2_pb2

TAG = "is_auto_gen_sum_ops:1"


def _prop_op_gradient(op, g_output):
    """``PropOp``: one gradient op reading the inputs and the output gradients, writing
    ``<input>_grad`` for every input."""
    ins = list(op.input)
    grad = caffe2_pb2.OperatorDef(
        type="PropOpGradient",
        input=ins + [g for g in g_output if g is not None],
        output=[i + "_grad" for i in ins],
    )
    return [grad], [i + "_grad" for i in ins]


def _prop_pass_gradient(op, g_output):
    """``PropPass`` (like ``Sum``): every input gets the output gradient, no op."""
    return [], [g_output[0]] * len(op.input)


@pytest.fixture(autouse=True)
def prop_makers():
    reg = core.GradientRegistry.gradient_registry_
    saved = dict(reg)
    core.GradientRegistry.RegisterGradient("PropOp")(_prop_op_gradient)
    core.GradientRegistry.RegisterGradient("PropPass")(_prop_pass_gradient)
    yield
    reg.clear()
    reg.update(saved)


@st.composite
def dags(draw):
    """A forward net in SSA form (every blob written once) whose sinks all feed ``loss``."""
    blobs = [f"in{i}" for i in range(draw(st.integers(1, 3)))]
    ops = []
    for k in range(draw(st.integers(1, 18))):
        kind = draw(st.sampled_from(["PropOp", "PropPass"]))
        ins = draw(st.lists(st.sampled_from(blobs), min_size=1, max_size=3))
        n_out = 1 if kind == "PropPass" else draw(st.integers(1, 2))
        outs = [f"b{k}_{j}" for j in range(n_out)]
        ops.append(caffe2_pb2.OperatorDef(type=kind, input=ins, output=outs, name=""))
        blobs.extend(outs)
    used = {i for op in ops for i in op.input}
    sinks = [o for op in ops for o in op.output if o not in used]
    ops.append(caffe2_pb2.OperatorDef(type="PropOp", input=sinks, output=["loss"], name=""))
    return ops


def _uses(ops):
    return Counter(i for op in ops for i in op.input)


def _check(ops, grad_ops, grad_map, given_grads):
    forward_blobs = {b for op in ops for b in list(op.input) + list(op.output)}
    is_acc = [TAG in op.device_option.extra_info for op in grad_ops]

    # Every blob is written once, except that an accumulating Sum may overwrite its first
    # input in place.
    writers = {}
    for k, op in enumerate(grad_ops):
        for o in op.output:
            writers.setdefault(o, []).append(k)
    for name, ks in writers.items():
        plain = [k for k in ks if not is_acc[k]]
        acc = [k for k in ks if is_acc[k]]
        assert len(plain) <= 1 and len(acc) <= 1, (name, ks)
        if plain and acc:
            assert acc[0] > plain[0] and grad_ops[acc[0]].input[0] == name, (name, ks)

    # Accumulation happens exactly for the blobs read more than once.
    uses = _uses(ops)
    multi = {b for b, n in uses.items() if n >= 2}
    sums = [op for op, acc in zip(grad_ops, is_acc, strict=True) if acc]
    assert all(op.type == "Sum" for op in sums)
    assert len(sums) == len(multi)
    assert {op.output[0] for op in sums} == {str(grad_map[b]) for b in multi}

    # The backward net reads only forward blobs, given gradients and what it wrote before.
    written = set()
    for op in grad_ops:
        for i in op.input:
            assert i in forward_blobs or i in given_grads or i in written, (i, op)
        written.update(op.output)

    # Every forward blob reaches the loss, so every one has a gradient that exists.
    assert set(map(str, grad_map)) == forward_blobs
    for g in grad_map.values():
        assert str(g) in written or str(g) in given_grads


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_list_ys(ops):
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, ["loss"])
    assert grad_ops[0].type == "ConstantFill"
    _check(ops, grad_ops, grad_map, set())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_given_gradient(ops):
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"loss": "loss_seed"})
    assert all(op.type != "ConstantFill" for op in grad_ops)
    assert grad_map["loss"] == "loss_seed"
    _check(ops, grad_ops, grad_map, {"loss_seed"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_ir_state_is_consistent_with_the_pass(ops):
    ir = core.IR(ops)
    grad_ops, grad_map = ir.GetBackwardPass(["loss"])
    assert len(ir.ssa) == len(ops)
    for (op, ins, outs), fwd in zip(ir.ssa, ops, strict=True):
        assert op is fwd
        assert set(ins) == set(fwd.input) and set(outs) == set(fwd.output)
        assert all(v == 0 for v in list(ins.values()) + list(outs.values()))
    uses = _uses(ops)
    for blob, n in uses.items():
        assert len(ir.input_usages[blob][0]) == n
    assert ir.input_usages["loss"][0] == [len(ops)]
    for versions in ir.gradient_generators.values():
        for gens in versions.values():
            for g in gens:
                assert g.grad_op is None or any(g.grad_op is o for o in grad_ops)
    assert set(ir.gradient_frontier) == set(map(str, grad_map))
