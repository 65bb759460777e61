"""Comparing the gradient ops an implementation returns with the ones Caffe2 recorded: the ops
gathered into a NetDef, an op-by-op diff of two NetDefs, gradient values in the JSON form the
corpora use, and the canonical order that ``hash_order_dependent`` gradient cases are compared
in (``tests/golden/README.md``, "gradients/" and "Running the checks")."""

from __future__ import annotations

import difflib

from ferrocaffe import core
from ferrocaffe.proto import caffe2_pb2

AUTO_SUM_TAG = "is_auto_gen_sum_ops:1"
CONTROL_OPS = ("If", "While", "Do")
MAX_OPS_SHOWN = 3


def net_of_ops(ops) -> caffe2_pb2.NetDef:
    """A NetDef holding ``ops`` in order (each one copied through its serialization, so an
    OperatorDef of any generated class compares by content)."""
    net = caffe2_pb2.NetDef()
    for op in ops:
        net.op.add().MergeFromString(op.SerializeToString())
    return net


def grad_json(g):
    """A gradient as the corpora write it: None, a blob name, or ``[indices, values]`` for a
    ``core.GradientSlice``."""
    if g is None:
        return None
    if isinstance(g, core.GradientSlice):
        return [str(g.indices), str(g.values)]
    return str(g)


def grad_arg(g):
    """A gradient read from the corpora (None, a name, or ``[indices, values]``) as the value
    handed to the gradient API."""
    if isinstance(g, list):
        return core.GradientSlice(g[0], g[1])
    return g


def _text(msg) -> list[str]:
    return str(msg).splitlines()


def _udiff(expected, actual, label_e: str, label_a: str, limit: int = 60) -> str:
    lines = list(
        difflib.unified_diff(_text(expected), _text(actual), label_e, label_a, n=2, lineterm="")
    )
    if len(lines) > limit:
        lines = lines[:limit] + [f"... {len(lines) - limit} more diff lines"]
    return "\n".join("    " + line for line in lines)


def _summary(op) -> str:
    return f"{op.type}({', '.join(op.input)}) -> ({', '.join(op.output)})"


def diff_nets(what: str, expected, actual) -> list[str]:
    """Differences between two NetDefs: the op count, the first few ops that differ (as unified
    diffs of their text format), missing or extra ops, and any other NetDef field."""
    if expected == actual:
        return []
    diffs = []
    ne, na = len(expected.op), len(actual.op)
    if ne != na:
        diffs.append(f"{what}: {ne} ops expected, got {na}")
    differing = [i for i in range(min(ne, na)) if expected.op[i] != actual.op[i]]
    for i in differing[:MAX_OPS_SHOWN]:
        body = _udiff(expected.op[i], actual.op[i], f"expected op[{i}]", f"actual op[{i}]")
        diffs.append(f"{what}: op[{i}] ({expected.op[i].type}) differs:\n{body}")
    if len(differing) > MAX_OPS_SHOWN:
        diffs.append(f"{what}: ... {len(differing) - MAX_OPS_SHOWN} more ops differ")
    for start, net, label in ((na, expected, "missing"), (ne, actual, "unexpected")):
        extra = list(range(start, len(net.op)))
        if extra:
            listed = "\n".join(f"    op[{k}] {_summary(net.op[k])}" for k in extra[:8])
            more = f"\n    ... {len(extra) - 8} more" if len(extra) > 8 else ""
            diffs.append(f"{what}: {len(extra)} {label} op(s):\n{listed}{more}")
    if not diffs:
        rest_e, rest_a = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
        rest_e.CopyFrom(expected)
        rest_a.CopyFrom(actual)
        rest_e.ClearField("op")
        rest_a.ClearField("op")
        diffs.append(
            f"{what}: NetDef fields differ:\n{_udiff(rest_e, rest_a, 'expected', 'actual')}"
        )
    return diffs


# -- canonical order for hash-order dependent gradient cases -----------------------------------


def _sub_nets(op):
    """The NetDefs an op holds in its arguments (``n`` and ``nets``)."""
    for arg in op.arg:
        if arg.HasField("n"):
            yield arg.n
        yield from arg.nets


def _replace(container, field: str, values) -> None:
    values = list(values)
    container.ClearField(field)
    getattr(container, field).extend(values)


def _key(ops) -> bytes:
    return b"".join(op.SerializeToString(deterministic=True) for op in ops)


def _sorted_runs(ops, in_run, units):
    """``ops`` with each maximal run of consecutive ops for which ``in_run`` holds split into
    units by ``units`` and the units sorted by their serialization."""
    out, run = [], []
    for op in list(ops) + [None]:
        if op is not None and in_run(op):
            run.append(op)
            continue
        for unit in sorted(units(run), key=_key):
            out.extend(unit)
        run = []
        if op is not None:
            out.append(op)
    return out


def _is_accumulation(op) -> bool:
    return AUTO_SUM_TAG in op.device_option.extra_info


def _accumulation_units(run):
    """A ``Sum`` is a unit of its own; the ``Concat`` of a sparse gradient's indices and the one
    of its values that follows it form one unit."""
    units, i = [], 0
    while i < len(run):
        op = run[i]
        nxt = run[i + 1] if i + 1 < len(run) else None
        if (
            op.type == "Concat"
            and nxt is not None
            and nxt.type == "Concat"
            and op.output
            and nxt.output
            and op.output[0].endswith("_indices_concat")
            and nxt.output[0].endswith("_values_concat")
            and op.output[0][: -len("_indices_concat")] == nxt.output[0][: -len("_values_concat")]
        ):
            units.append([op, nxt])
            i += 2
        else:
            units.append([op])
            i += 1
    return units


def _canon_sum_order(net) -> None:
    for op in net.op:
        for sub in _sub_nets(op):
            _canon_sum_order(sub)
    ops = [_copy(op) for op in net.op]
    _replace(net, "op", _sorted_runs(ops, _is_accumulation, _accumulation_units))


def _copy(op):
    c = caffe2_pb2.OperatorDef()
    c.CopyFrom(op)
    return c


def _canon_do_io(op) -> None:
    """Sort a Do op's inputs and outputs, its workspace blob (the last of each) staying last,
    and rewrite the ``inner_blobs`` / ``outer_blobs_idx`` bindings as the same pairs of inner
    name and outer blob, sorted, indexing the new order."""
    ins, outs = list(op.input), list(op.output)
    if not ins or not outs:
        return
    outer_before = ins[:-1] + outs[:-1]
    new_ins = sorted(ins[:-1]) + ins[-1:]
    new_outs = sorted(outs[:-1]) + outs[-1:]
    _replace(op, "input", new_ins)
    _replace(op, "output", new_outs)
    args = {a.name: a for a in op.arg}
    inner, idx = args.get("inner_blobs"), args.get("outer_blobs_idx")
    if inner is None or idx is None or len(inner.strings) != len(idx.ints):
        return
    if not all(0 <= k < len(outer_before) for k in idx.ints):
        return
    outer_after = new_ins[:-1] + new_outs[:-1]
    bindings = sorted((s, outer_before[k]) for s, k in zip(inner.strings, idx.ints, strict=True))
    _replace(inner, "strings", [s for s, _ in bindings])
    _replace(idx, "ints", [outer_after.index(o) for _, o in bindings])


def _is_zero_init(op) -> bool:
    return op.type in ("ConstantFill", "Copy") and not op.is_gradient_op


def _canon_control_io(net, inside_control: bool = False) -> None:
    for op in net.op:
        for sub in _sub_nets(op):
            _canon_control_io(sub, inside_control=op.type in CONTROL_OPS)
        if op.type in ("If", "While"):
            ins = list(op.input)
            _replace(op, "input", ins[:1] + sorted(ins[1:]))
            _replace(op, "output", sorted(op.output))
        elif op.type == "Do":
            _canon_do_io(op)
        if op.type in CONTROL_OPS:
            for arg in op.arg:
                if arg.name != "inner_blobs" and len(arg.strings):
                    _replace(arg, "strings", sorted(arg.strings))
    if inside_control:
        ops = [_copy(op) for op in net.op]
        _replace(net, "op", _sorted_runs(ops, _is_zero_init, lambda run: [[op] for op in run]))


def canonical(net, affects: str):
    """A copy of ``net`` with the parts whose order Caffe2 took from Python's set iteration in a
    canonical order: ``sum_op_order`` sorts each run of consecutive accumulation ops (a Sum, or
    the indices/values Concat pair); ``control_op_io_order`` sorts the inputs (but the
    condition) and outputs of If/While, those of Do (keeping its workspace blob last and its
    blob bindings), the string-list arguments of these ops, and runs of zero-initialising
    ConstantFill/Copy ops in their sub-nets."""
    out = caffe2_pb2.NetDef()
    out.CopyFrom(net)
    if affects == "sum_op_order":
        _canon_sum_order(out)
    elif affects == "control_op_io_order":
        _canon_control_io(out)
    else:
        raise ValueError(f"unknown hash_order_affects {affects!r}")
    return out
