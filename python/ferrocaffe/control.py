"""Caffe2's ``control`` module: control flow built from execution steps.

``Do``, ``DoParallel``, ``For``, ``While``, ``Until``, ``DoWhile``, ``DoUntil``, ``Switch``,
``SwitchNot``, ``If`` and ``IfNot`` return execution steps that run nets or steps in
sequence, in parallel, repeatedly or conditionally. Conditions are a scalar bool blob or a
*condition net* whose last external output is that blob (the net runs first, each time the
condition is needed). Steps stop through ``should_stop_blob``; "run once if" steps also set
``only_once``.
"""

from ferrocaffe import core

__all__ = [
    "GetConditionBlobFromNet",
    "BoolNet",
    "NotNet",
    "MergeConditionNets",
    "CombineConditions",
    "Do",
    "DoParallel",
    "For",
    "While",
    "Until",
    "DoWhile",
    "DoUntil",
    "Switch",
    "SwitchNot",
    "If",
    "IfNot",
]

_next_suffix = 1
_used_step_names = set()


def _get_next_step_name(control_name, base_name):
    """``<base_name>/<control_name>``, with a process-wide counter appended when taken."""
    global _next_suffix
    base = f"{base_name}/{control_name}"
    name = base
    while name in _used_step_names:
        name = f"{base}_{_next_suffix}"
        _next_suffix += 1
    _used_step_names.add(name)
    return name


def _MakeList(items):
    """A list from the ``*args`` tuple of a control function: ``(a, b)`` gives ``[a, b]``,
    ``(a,)`` gives ``[a]`` and ``([a, b],)`` gives ``[a, b]``."""
    if not items:
        raise ValueError("input cannot be empty.")
    if len(items) > 1:
        return list(items)
    only = items[0]
    return only if isinstance(only, list) else [only]


def _IsNets(nets_or_steps):
    if isinstance(nets_or_steps, list):
        return all(isinstance(n, core.Net) for n in nets_or_steps)
    return isinstance(nets_or_steps, core.Net)


def _PrependNets(nets_or_steps, *nets):
    body = _MakeList((nets_or_steps,))
    nets = _MakeList(nets)
    if _IsNets(body):
        return nets + body
    return [Do("prepend", nets)] + body


def _AppendNets(nets_or_steps, *nets):
    body = _MakeList((nets_or_steps,))
    nets = _MakeList(nets)
    if _IsNets(body):
        return body + nets
    return body + [Do("append", nets)]


def GetConditionBlobFromNet(condition_net):
    """The condition blob of a condition net: its last external output (a scalar bool)."""
    outputs = condition_net.Proto().external_output
    assert len(outputs) > 0, (
        f"Condition net {condition_net.Proto().name} must has at least one external output"
    )
    return core.BlobReference(outputs[-1])


def BoolNet(*blobs_with_bool_value):
    """A net (``bool_net``) setting each ``(blob, value)`` pair's blob to the scalar bool
    ``value``; the blobs are its external outputs."""
    pairs = _MakeList(blobs_with_bool_value)
    net = core.Net("bool_net")
    for blob, value in pairs:
        out = net.ConstantFill([], [blob], shape=[], value=value, dtype=core.DataType.BOOL)
        net.AddExternalOutput(out)
    return net


def NotNet(condition_blob_or_net):
    """``(not_net, out)``: a net computing ``out = Not(condition)``, ``out`` its external
    output. A condition net gives its condition blob (the net itself is not included)."""
    if isinstance(condition_blob_or_net, core.Net):
        cond = GetConditionBlobFromNet(condition_blob_or_net)
    else:
        cond = condition_blob_or_net
    net = core.Net("not_net")
    out = net.Not(cond)
    net.AddExternalOutput(out)
    return net, out


def _CopyConditionBlobNet(condition_blob):
    """``(net, out)``: a net copying the scalar bool ``condition_blob`` into ``out``."""
    net = core.Net("copy_condition_blob_net")
    out = net.Copy(condition_blob)
    net.AddExternalOutput(out)
    return net, out


def MergeConditionNets(name, condition_nets, relation):
    """One condition net with the ops of every net of ``condition_nets`` followed by their
    conditions combined with ``relation`` (``'And'`` or ``'Or'``); a single net (or a
    non-list) is returned as is."""
    if not isinstance(condition_nets, list):
        return condition_nets
    if len(condition_nets) <= 1:
        return condition_nets[0] if condition_nets else None
    merged = core.Net(name)
    merged_proto = merged.Proto()
    combined = None
    for net in condition_nets:
        proto = net.Proto()
        assert proto.device_option == merged_proto.device_option
        assert proto.type == merged_proto.type
        merged_proto.op.extend(proto.op)
        merged_proto.external_input.extend(proto.external_input)
        cond = GetConditionBlobFromNet(net)
        combined = cond if combined is None else getattr(merged, relation)([combined, cond])
        for key, values in net._attr_dict.items():
            merged._attr_dict[key] += values
    merged.AddExternalOutput(combined)
    return merged


def CombineConditions(name, condition_nets, relation):
    """A condition net combining the conditions of ``condition_nets`` with ``relation``
    (``'And'`` or ``'Or'``) without their ops: the nets must have run before."""
    if not condition_nets:
        return None
    if not isinstance(condition_nets, list):
        raise ValueError("condition_nets must be a list of nets.")
    if len(condition_nets) == 1:
        net, _ = _CopyConditionBlobNet(GetConditionBlobFromNet(condition_nets[0]))
        return net
    combined_net = core.Net(name)
    combined = None
    for net in condition_nets:
        cond = GetConditionBlobFromNet(net)
        combined = cond if combined is None else getattr(combined_net, relation)([combined, cond])
    combined_net.AddExternalOutput(combined)
    return combined_net


def Do(name, *nets_or_steps):
    """A step running the nets or steps once, in order (a single step is returned as is)."""
    items = _MakeList(nets_or_steps)
    if len(items) == 1 and isinstance(items[0], core.ExecutionStep):
        return items[0]
    return core.scoped_execution_step(_get_next_step_name("Do", name), items)


def DoParallel(name, *nets_or_steps):
    """A step running the nets or steps concurrently, finishing when all have."""
    items = _MakeList(nets_or_steps)
    if len(items) == 1 and isinstance(items[0], core.ExecutionStep):
        return items[0]
    return core.scoped_execution_step(
        _get_next_step_name("DoParallel", name), items, concurrent_substeps=True
    )


def _RunOnceIf(name, condition_blob_or_net, nets_or_steps):
    """Run ``nets_or_steps`` once if the condition holds (a condition net runs first)."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, core.Net):
        body = _PrependNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        body = _PrependNets(nets_or_steps, not_net)

    def step(control_name):
        return core.scoped_execution_step(
            _get_next_step_name(control_name, name),
            body,
            should_stop_blob=stop_blob,
            only_once=True,
        )

    if _IsNets(body):
        # A step of nets checks its stop blob before the first net too: start it false.
        return Do(name + "/_RunOnceIf", BoolNet((stop_blob, False)), step("_RunOnceIf-inner"))
    return step("_RunOnceIf")


def _RunOnceIfNot(name, condition_blob_or_net, nets_or_steps):
    """Run ``nets_or_steps`` once if the condition does not hold."""
    if isinstance(condition_blob_or_net, core.Net):
        cond = GetConditionBlobFromNet(condition_blob_or_net)
        body = _PrependNets(nets_or_steps, condition_blob_or_net)
    else:
        copy_net, cond = _CopyConditionBlobNet(condition_blob_or_net)
        body = _PrependNets(nets_or_steps, copy_net)
    return core.scoped_execution_step(
        _get_next_step_name("_RunOnceIfNot", name),
        body,
        should_stop_blob=cond,
        only_once=True,
    )


def For(name, nets_or_steps, iter_num):
    """A step running ``nets_or_steps`` ``iter_num`` times (a counter counted down)."""
    init_net = core.Net("init-net")
    counter = init_net.CreateCounter([], init_count=iter_num)
    iter_net = core.Net("For-iter")
    done = iter_net.CountDown([counter])
    loop = core.scoped_execution_step(
        _get_next_step_name("For-inner", name),
        _PrependNets(nets_or_steps, iter_net),
        should_stop_blob=done,
    )
    return Do(name + "/For", Do(name + "/For-init-net", init_net), loop)


def While(name, condition_blob_or_net, nets_or_steps):
    """A step running ``nets_or_steps`` while the condition holds (checked before each
    iteration; a condition net runs each time)."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, core.Net):
        body = _PrependNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        body = _PrependNets(nets_or_steps, not_net)

    def step(control_name):
        return core.scoped_execution_step(
            _get_next_step_name(control_name, name), body, should_stop_blob=stop_blob
        )

    if _IsNets(body):
        return Do(name + "/While", BoolNet((stop_blob, False)), step("While-inner"))
    return step("While")


def Until(name, condition_blob_or_net, nets_or_steps):
    """A step running ``nets_or_steps`` until the condition holds."""
    if isinstance(condition_blob_or_net, core.Net):
        stop_blob = GetConditionBlobFromNet(condition_blob_or_net)
        body = _PrependNets(nets_or_steps, condition_blob_or_net)
    else:
        stop_blob = core.BlobReference(str(condition_blob_or_net))
        body = nets_or_steps
    return core.scoped_execution_step(
        _get_next_step_name("Until", name), body, should_stop_blob=stop_blob
    )


def DoWhile(name, condition_blob_or_net, nets_or_steps):
    """Like :func:`While`, with the condition checked after each iteration."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, core.Net):
        body = _AppendNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        body = _AppendNets(nets_or_steps, not_net)
    loop = core.scoped_execution_step(
        _get_next_step_name("DoWhile-inner", name), body, should_stop_blob=stop_blob
    )
    return Do(name + "/DoWhile", BoolNet((stop_blob, False)), loop)


def DoUntil(name, condition_blob_or_net, nets_or_steps):
    """Like :func:`Until`, with the condition checked after each iteration. With a blob
    already true, only the first net or step runs."""
    if not isinstance(condition_blob_or_net, core.Net):
        return core.scoped_execution_step(
            _get_next_step_name("DoUntil", name),
            nets_or_steps,
            should_stop_blob=core.BlobReference(condition_blob_or_net),
        )
    body = _AppendNets(nets_or_steps, condition_blob_or_net)
    stop_blob = GetConditionBlobFromNet(condition_blob_or_net)
    loop = core.scoped_execution_step(
        _get_next_step_name("DoUntil-inner", name), body, should_stop_blob=stop_blob
    )
    return Do(name + "/DoUntil", BoolNet((stop_blob, False)), loop)


def Switch(name, *conditions):
    """A step running, in order, each ``(condition, nets_or_steps)`` whose condition holds
    (every condition net runs once)."""
    pairs = _MakeList(conditions)
    return core.scoped_execution_step(
        _get_next_step_name("Switch", name),
        [_RunOnceIf(name + "/Switch", cond, body) for cond, body in pairs],
    )


def SwitchNot(name, *conditions):
    """Like :func:`Switch`, running the pairs whose condition does not hold."""
    pairs = _MakeList(conditions)
    return core.scoped_execution_step(
        _get_next_step_name("SwitchNot", name),
        [_RunOnceIfNot(name + "/SwitchNot", cond, body) for cond, body in pairs],
    )


def If(name, condition_blob_or_net, true_nets_or_steps, false_nets_or_steps=None):
    """Run ``true_nets_or_steps`` if the condition holds, else ``false_nets_or_steps``
    (a condition net runs once, first)."""
    if not false_nets_or_steps:
        return _RunOnceIf(name + "/If", condition_blob_or_net, true_nets_or_steps)
    if isinstance(condition_blob_or_net, core.Net):
        cond = GetConditionBlobFromNet(condition_blob_or_net)
    else:
        cond = condition_blob_or_net
    return Do(
        name + "/If",
        _RunOnceIf(name + "/If-true", condition_blob_or_net, true_nets_or_steps),
        _RunOnceIfNot(name + "/If-false", cond, false_nets_or_steps),
    )


def IfNot(name, condition_blob_or_net, true_nets_or_steps, false_nets_or_steps=None):
    """Run ``true_nets_or_steps`` if the condition does not hold, else
    ``false_nets_or_steps``."""
    if not false_nets_or_steps:
        return _RunOnceIfNot(name + "/IfNot", condition_blob_or_net, true_nets_or_steps)
    if isinstance(condition_blob_or_net, core.Net):
        cond = GetConditionBlobFromNet(condition_blob_or_net)
    else:
        cond = condition_blob_or_net
    return Do(
        name + "/IfNot",
        _RunOnceIfNot(name + "/IfNot-true", condition_blob_or_net, true_nets_or_steps),
        _RunOnceIf(name + "/IfNot-false", cond, false_nets_or_steps),
    )
