"""Replay of the ``gradients`` corpus: a forward NetDef and its ``ys``.

``core.GradientRegistry.GetBackwardPass(ops, ys)`` must return exactly the recorded gradient
ops and gradient map, or raise the recorded error; ``core.get_ssa`` of the forward net must give
the recorded ``ssa`` and ``blob_versions``, and ``core.get_undefined_blobs`` of that ssa the
recorded ``undefined_blobs``. Cases marked ``hash_order_dependent`` (Caffe2 took part of their
order from Python's set iteration) are compared modulo the order that ``hash_order_affects``
names, and in nothing else."""

from __future__ import annotations

import traceback

from ferrocaffe import core
from ferrocaffe.proto import caffe2_pb2

from .common import error_diffs, fresh_state, parse
from .nets import canonical, diff_nets, grad_arg, grad_json, net_of_ops


def _ys(spec: dict):
    """The ``ys`` argument: a list of blobs, or a dict (in the recorded order) from blob to its
    gradient (None, a name, or a GradientSlice)."""
    if spec["kind"] == "list":
        return list(spec["blobs"])
    if spec["kind"] == "dict":
        return {blob: grad_arg(grad) for blob, grad in spec["items"]}
    raise ValueError(f"unknown ys kind {spec['kind']!r}")


def _map_diffs(what: str, expected: dict, actual: dict) -> list[str]:
    if actual == expected:
        return []
    parts = []
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    wrong = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
    if missing:
        parts.append("missing " + str({k: expected[k] for k in missing}))
    if extra:
        parts.append("unexpected " + str({k: actual[k] for k in extra}))
    parts += [f"[{k}]: expected {expected[k]}, got {actual[k]}" for k in wrong[:10]]
    if len(wrong) > 10:
        parts.append(f"... {len(wrong) - 10} more entries differ")
    return [f"{what} differs:\n" + "\n".join("    " + p for p in parts)]


def _backward_diffs(case: dict, forward) -> list[str]:
    operators = []
    for op in forward.op:
        copy = caffe2_pb2.OperatorDef()
        copy.CopyFrom(op)
        operators.append(copy)
    try:
        result, exc = core.GradientRegistry.GetBackwardPass(operators, _ys(case["ys"])), None
    except Exception as e:  # the outcome under test
        result, exc = None, e
    if case["expected"] == "error":
        diffs = error_diffs("GetBackwardPass", exc, case["error"])
        if exc is None:
            diffs.append(f"GetBackwardPass returned {result!r:.300}")
        return diffs
    if exc is not None:
        stack = "".join(traceback.format_exception(exc, limit=-3))
        return [f"GetBackwardPass raised {type(exc).__name__}: {exc}\n{stack}"]
    try:
        grad_ops, grad_map = result
        grad_ops = list(grad_ops)
        actual_net = net_of_ops(grad_ops)
        actual_map = {str(k): grad_json(v) for k, v in grad_map.items()}
    except Exception as e:  # a malformed result
        return [f"GetBackwardPass returned {result!r:.300}: {type(e).__name__}: {e}"]
    diffs = []
    if len(grad_ops) != case["num_grad_ops"]:
        diffs.append(f"{case['num_grad_ops']} gradient ops expected, got {len(grad_ops)}")
    expected_net = parse("NetDef", case["grad_ops_b64"])
    if case["hash_order_dependent"] and expected_net != actual_net:
        how = case["hash_order_affects"]
        diffs += diff_nets(
            f"gradient ops (modulo {how})",
            canonical(expected_net, how),
            canonical(actual_net, how),
        )
    else:
        diffs += diff_nets("gradient ops", expected_net, actual_net)
    return diffs + _map_diffs("grad_map", case["grad_map"], actual_map)


def _ssa_diffs(case: dict, forward) -> list[str]:
    diffs = []
    ssa = None
    try:
        ssa, versions = core.get_ssa(forward)
        actual = [[[list(b) for b in ins], [list(b) for b in outs]] for ins, outs in ssa]
        if actual != case["ssa"]:
            expected = case["ssa"]
            bad = [i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a]
            msg = f"get_ssa: {len(expected)} ops expected, got {len(actual)}"
            if bad:
                i = bad[0]
                msg += (
                    f"; {len(bad)} op(s) differ, first op[{i}]:\n"
                    f"    expected {expected[i]}\n    actual   {actual[i]}"
                )
            diffs.append(msg)
        diffs += _map_diffs("get_ssa: blob_versions", case["blob_versions"], dict(versions))
    except Exception as e:  # reported as a difference
        diffs.append(f"get_ssa raised {type(e).__name__}: {e}")
    if ssa is None:
        # Still check get_undefined_blobs, on the recorded ssa.
        ssa = [([tuple(b) for b in ins], [tuple(b) for b in outs]) for ins, outs in case["ssa"]]
    try:
        undefined = sorted(core.get_undefined_blobs(ssa))
        if undefined != case["undefined_blobs"]:
            diffs.append(
                f"get_undefined_blobs: expected {case['undefined_blobs']}, got {undefined}"
            )
    except Exception as e:  # reported as a difference
        diffs.append(f"get_undefined_blobs raised {type(e).__name__}: {e}")
    return diffs


def replay(case: dict) -> list[str]:
    """The differences between ferrocaffe and Caffe2's record of one ``gradients`` case."""
    fresh_state()
    forward = parse("NetDef", case["forward_b64"])
    return _backward_diffs(case, forward) + _ssa_diffs(case, forward)
