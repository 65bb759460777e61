"""Replay of the ``ops`` corpus: one OperatorDef run on recorded inputs.

A case either names an error, raised when the op is created (``CreateNet`` of a net holding
it) or when it runs (``RunNet``); or the op runs with ``RunOperatorOnce`` and its outputs must
match the record (random fills: the statistics of the ``stats`` block). For differentiable ops,
``core.GradientRegistry.GetGradientForOp(op, g_output)`` must return exactly the recorded
gradient ops and input gradients, and running those ops after feeding the recorded output
gradients, in the workspace the forward run left, must give the recorded values."""

from __future__ import annotations

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

from .blob_checks import compare_blob, feed, fetch
from .common import error_diffs, fresh_state, parse
from .nets import diff_nets, grad_arg, grad_json, net_of_ops

CORPUS = "ops"
ERROR_NET = "golden_error_net"


def _compare_blobs(role: str, specs) -> list[str]:
    diffs = []
    for spec in specs or []:
        diffs += compare_blob(CORPUS, f"{role}[{spec['name']}]", spec)
    return diffs


def _error_diffs(op, spec: dict) -> list[str]:
    """The op inside a one-op net: ``CreateNet`` must raise for stage ``create``, else
    ``RunNet`` must raise; the exception must match the record."""
    net = caffe2_pb2.NetDef()
    net.name = ERROR_NET
    net.op.add().CopyFrom(op)
    stage, exc = None, None
    try:
        workspace.CreateNet(net)
    except Exception as e:  # the error under test
        stage, exc = "create", e
    if exc is None:
        try:
            workspace.RunNet(ERROR_NET)
        except Exception as e:  # the error under test
            stage, exc = "run", e
    if exc is None:
        return [
            f"error: CreateNet and RunNet succeeded; expected {spec['type']} "
            f"({spec['match']!r}) at stage {spec['stage']}"
        ]
    diffs = error_diffs("error", exc, spec)
    if stage != spec["stage"]:
        diffs.append(
            f"error: raised at stage {stage} ({type(exc).__name__}: {exc}), "
            f"Caffe2 raises it at stage {spec['stage']}"
        )
    return diffs


def _stats_diffs(what: str, value, stats: dict) -> list[str]:
    """A random fill against the ``expect`` block: dtype and shape exactly, mean and std
    within their tolerances, the hard bounds, and integral values where asked."""
    y = np.asarray(value)
    if str(y.dtype) != stats["dtype"]:
        return [f"{what}: dtype {y.dtype}, expected {stats['dtype']}"]
    if list(y.shape) != list(stats["shape"]):
        return [f"{what}: shape {list(y.shape)}, expected {stats['shape']}"]
    if y.size == 0:
        return [f"{what}: no values"]
    values = y.astype(np.float64)
    expect = stats["expect"]
    diffs = []
    for name, observed in (("mean", values.mean()), ("std", values.std())):
        if name in expect and f"{name}_tol" in expect:
            want, tol = expect[name], expect[f"{name}_tol"]
            if not abs(observed - want) <= tol:
                diffs.append(f"{what}: {name} {observed:.6g}, expected {want:.6g} +- {tol:.3g}")
    if "min_ge" in expect and not values.min() >= expect["min_ge"]:
        diffs.append(f"{what}: min {values.min():.6g} below {expect['min_ge']:.6g}")
    if "max_le" in expect and not values.max() <= expect["max_le"]:
        diffs.append(f"{what}: max {values.max():.6g} above {expect['max_le']:.6g}")
    if expect.get("integer") and not np.array_equal(values, np.round(values)):
        diffs.append(f"{what}: not every value is an integer")
    return diffs


def _gradient_diffs(op, grad: dict) -> list[str]:
    expected_net = parse("NetDef", grad["grad_ops_b64"])
    g_output = grad["g_output"]
    if g_output is not None:
        g_output = [grad_arg(g) for g in g_output]
    diffs = []
    try:
        grad_ops, g_input = core.GradientRegistry.GetGradientForOp(op, g_output)
        grad_ops = list(grad_ops)
        actual_net = net_of_ops(grad_ops)
    except Exception as e:  # reported as a difference
        diffs.append(f"GetGradientForOp({op.type}, {g_output}) raised {type(e).__name__}: {e}")
        # Still check the values, running the recorded gradient ops.
        grad_ops = list(expected_net.op)
    else:
        diffs += diff_nets("gradient ops", expected_net, actual_net)
        actual_g_input = [grad_json(g) for g in g_input]
        if actual_g_input != grad["g_input"]:
            diffs.append(f"g_input: expected {grad['g_input']}, got {actual_g_input}")
    feed(CORPUS, grad["output_grads_fed"])
    for k, grad_op in enumerate(grad_ops):
        try:
            workspace.RunOperatorOnce(grad_op)
        except Exception as e:  # reported as a difference
            diffs.append(f"gradient op[{k}] ({grad_op.type}) raised {type(e).__name__}: {e}")
            return diffs
    return diffs + _compare_blobs("gradient", grad["grad_op_outputs"])


def replay(case: dict) -> list[str]:
    """The differences between ferrocaffe and Caffe2's record of one ``ops`` case."""
    fresh_state()
    op = parse("OperatorDef", case["op_b64"])
    feed(CORPUS, case["inputs"])
    if "error" in case:
        return _error_diffs(op, case["error"])
    try:
        workspace.RunOperatorOnce(op)
    except Exception as e:  # reported as a difference
        return [f"RunOperatorOnce({op.type}) raised {type(e).__name__}: {e}"]
    diffs = []
    if "stats" in case:
        what = f"stats[{op.output[0]}]"
        value, problem = fetch(op.output[0])
        diffs += [f"{what}: {problem}"] if problem else _stats_diffs(what, value, case["stats"])
    diffs += _compare_blobs("outputs", case.get("outputs"))
    if case.get("gradient"):
        diffs += _gradient_diffs(op, case["gradient"])
    return diffs
