"""Caffe2's ``control_ops_util``: helpers that add ``If`` and ``While`` operators to a net.

Each branch or loop body runs through a ``Do`` op in a workspace of its own (a scope blob
created by ``CreateScope``). Which of its blobs are the outer workspace's is decided from a
*lexical scope*, the outer blob names visible at that point: a blob of the subnet is outer
when its name is in the scope; every blob the subnet reads before writing it must be in the
scope. Outer blobs are forwarded to the inner workspace (``inner_blobs`` /
``outer_blobs_idx`` of ``Do``); all others stay local to the subnet.
"""

from ferrocaffe import core

__all__ = ["get_external_blob_names", "add_if_op", "add_while_op"]


def _read_before_written(net_proto):
    """Blobs of ``net_proto`` read before any of its ops writes them, in order of first read
    (the version-0 inputs of its SSA form)."""
    ssa, _ = core.get_ssa(net_proto)
    undefined = core.get_undefined_blobs(ssa)
    ordered = []
    for op in net_proto.op:
        for name in op.input:
            if name in undefined and name not in ordered:
                ordered.append(name)
    for name in sorted(undefined):
        if name not in ordered:
            ordered.append(name)
    return ordered


class _OrderedNames(dict):
    """An insertion-ordered set of names (dict keys) with the set operators used here."""

    def __init__(self, names=()):
        super().__init__((str(n), None) for n in names)

    def add(self, name):
        self[str(name)] = None

    def __or__(self, other):
        merged = _OrderedNames(self)
        for name in other:
            merged.add(name)
        return merged

    def __ior__(self, other):
        for name in other:
            self.add(name)
        return self

    def __repr__(self):
        return "{" + ", ".join(repr(n) for n in self) + "}"


def get_external_blob_names(net, lexical_scope):
    """``(inputs, outputs)`` of ``net`` seen from outside: the blobs it reads before writing
    (each must be in ``lexical_scope``) and the blobs it writes that are in the scope."""
    proto = net.Proto()
    inputs = _OrderedNames(_read_before_written(proto))
    for name in inputs:
        assert name in lexical_scope, "Input blob " + name + " is undefined"
    outputs = _OrderedNames()
    for op in proto.op:
        for name in op.output:
            if name in lexical_scope:
                outputs.add(name)
    return inputs, outputs


def _refs(names):
    return [core.BlobReference(name=str(n), net=None) for n in names]


def _do_net(name, subnet, inputs, outputs, scope_blob, copy_external_blobs=False):
    """A net ``name`` with one ``Do`` op running ``subnet`` in the workspace held by
    ``scope_blob``; ``inputs``/``outputs`` are its outer blobs (the scope blob appended to
    both)."""
    do_inputs = _refs(inputs) + [scope_blob]
    do_outputs = _refs(outputs) + [scope_blob]
    # Positions index the Do op's inputs followed by its outputs.
    positions = [str(b) for b in do_inputs[:-1]] + [str(b) for b in do_outputs[:-1]]
    outer = list(_OrderedNames(inputs) | outputs)
    kwargs = {}
    if copy_external_blobs:
        kwargs["copy_external_blobs"] = True
    net = core.Net(name)
    net.Do(
        do_inputs,
        do_outputs,
        net=subnet.Proto(),
        inner_blobs=outer,
        outer_blobs_idx=[positions.index(n) for n in outer],
        **kwargs,
    )
    net.AddExternalOutput(*do_outputs)
    return net, do_inputs, do_outputs


def add_if_op(if_net, cond_blob, lexical_scope, then_net, else_net=None):
    """Append to ``if_net`` the ops that run ``then_net`` when the scalar bool ``cond_blob``
    is true and ``else_net`` (optional) when it is false: a ``CreateScope`` per branch, then
    an ``If`` whose branches are ``Do`` nets. Branch blobs named in ``lexical_scope`` (and
    those read before written) are the outer workspace's; the rest are local to the branch.
    """
    then_in, then_out = get_external_blob_names(then_net, lexical_scope)
    else_in, else_out = _OrderedNames(), _OrderedNames()
    if else_net:
        else_in, else_out = get_external_blob_names(else_net, lexical_scope)

    if_inputs = [cond_blob] + _refs(then_in | else_in)
    if_outputs = _refs(then_out | else_out)
    if_args = {}

    then_scope = if_net.NextScopedBlob(if_net.Name() + "/workspace_if_then")
    do_then, _, _ = _do_net("do_then_net", then_net, then_in, then_out, then_scope)
    if_inputs.append(then_scope)
    if_outputs.append(then_scope)
    if_args["then_net"] = do_then.Proto()

    else_scope = None
    if else_net:
        else_scope = if_net.NextScopedBlob(if_net.Name() + "/workspace_if_else")
        do_else, _, _ = _do_net("do_else_net", else_net, else_in, else_out, else_scope)
        if_inputs.append(else_scope)
        if_outputs.append(else_scope)
        if_args["else_net"] = do_else.Proto()

    if_net.CreateScope([], [then_scope])
    if else_scope:
        if_net.CreateScope([], [else_scope])
    if_net.If(if_inputs, if_outputs, **if_args)
    if_net.AddExternalOutput(*if_outputs)


def add_while_op(while_net, cond_blob, lexical_scope, loop_body_net, condition_body_net=None):
    """Append to ``while_net`` the ops that run ``loop_body_net`` while the scalar bool
    ``cond_blob`` is true. With ``condition_body_net`` the condition is computed by that net
    (whose ops must write ``cond_blob``) in its own workspace before the first and after
    every iteration; ``cond_blob`` starts false when it is not in ``lexical_scope``. Outer
    and local blobs are chosen as in :func:`add_if_op`; the body's outer blobs are copied
    into its workspace on each iteration (``copy_external_blobs``).
    """
    body_in, body_out = get_external_blob_names(loop_body_net, lexical_scope)
    body_in |= body_out

    body_scope = while_net.NextScopedBlob(while_net.Name() + "/workspace_loop_body")
    do_body, body_do_in, body_do_out = _do_net(
        "do_loop_body_net", loop_body_net, body_in, body_out, body_scope, True
    )
    while_inputs = [cond_blob] + body_do_in
    while_outputs = list(body_do_out)
    while_args = {"loop_net": do_body.Proto()}

    cond_scope = None
    if condition_body_net:
        cond_in, cond_out = get_external_blob_names(condition_body_net, lexical_scope)
        writes_cond = any(str(cond_blob) in op.output for op in condition_body_net.Proto().op)
        assert writes_cond, "Condition net does not write into condition blob"
        cond_out.add(str(cond_blob))

        cond_scope = while_net.NextScopedBlob(while_net.Name() + "/workspace_loop_cond")
        do_cond, cond_do_in, cond_do_out = _do_net(
            "do_loop_condition_net", condition_body_net, cond_in, cond_out, cond_scope
        )
        while_args["cond_net"] = do_cond.Proto()
        while_inputs += [b for b in cond_do_in if str(b) not in body_in]
        while_outputs += [b for b in cond_do_out if str(b) not in body_out]

        if str(cond_blob) not in lexical_scope:
            while_net.ConstantFill([], cond_blob, dtype=core.DataType.BOOL, value=False)

    while_net.CreateScope([], [body_scope])
    if cond_scope:
        while_net.CreateScope([], [cond_scope])
    while_net.While(while_inputs, while_outputs, **while_args)
    while_net.AddExternalOutput(*while_outputs)
