"""Cloning nets under new blob names (Caffe2's ``clone_and_bind_net`` and remap helpers).

``Net.Clone`` renames the inputs and outputs of every operator; operators that carry whole
nets or blob names inside their arguments (control flow, recurrent networks) need their
arguments rewritten too. The functions in ``DEFAULT_REMAP_FUNCS`` do that, keyed by op type,
and ``Net.Clone`` applies them (a caller's ``remap_funcs`` override them per type).
"""

from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "remap_input",
    "clone_and_bind_net",
    "remap_proto",
    "recurrent_network_op_remap",
    "control_op_remap",
    "DEFAULT_REMAP_FUNCS",
]


def remap_input(op, blob_name_remapping):
    """Rename the inputs of ``op`` in place; names missing from the mapping are kept."""
    new_list = [blob_name_remapping.get(b, b) for b in op.input]
    del op.input[:]
    op.input.extend(new_list)


def _remap_input_copy(op, blob_name_remapping):
    """A copy of ``op`` with its inputs renamed (``op`` itself is left alone)."""
    new_op = caffe2_pb2.OperatorDef()
    new_op.CopyFrom(op)
    remap_input(new_op, blob_name_remapping)
    return new_op


def _blob_versions_and_undefined(proto):
    """The blob names ``get_ssa`` versions for ``proto`` and the ones read before any write.

    Versioned blobs are the external inputs (or, for a net that declares none, every op
    input) and every op output. Undefined blobs are op inputs still at version 0 when read.
    """
    versions = {}
    for name in proto.external_input:
        versions.setdefault(str(name), 0)
    declares_inputs = len(proto.external_input) > 0
    undefined = set()
    for op in proto.op:
        for name in op.input:
            if not declares_inputs:
                versions.setdefault(name, 0)
            if versions.get(name, 0) == 0:
                undefined.add(name)
        for name in op.output:
            versions[name] = versions.get(name, 0) + 1
    return versions, undefined


def clone_and_bind_net(net, name, prefix, blob_remap=None, inputs=None, keep_schema=True):
    """Clone ``net`` as ``name``, prefixing every blob the net defines with ``prefix``.

    Blobs read before being written (the net's inputs) keep their names unless
    ``blob_remap`` says otherwise. ``blob_remap`` is updated in place and returned along
    with the clone: ``(cloned_net, blob_remap)``. When ``inputs`` (a schema record with
    ``field_names()``/``field_blobs()``) is given, the net's input record fields are bound
    to the blobs of ``inputs``.
    """
    from ferrocaffe.core.net import Net

    assert isinstance(net, Net)
    if blob_remap is None:
        blob_remap = {}
    if inputs is not None:
        original = net.input_record()
        assert original is not None
        diff = set(original.field_names()) ^ set(inputs.field_names())
        assert len(diff) == 0, (
            f"Schemas don't match, extra fields {diff} found in the net {net.Name()}. "
            f"original: {original.field_names()}; inputs: {inputs.field_names()}"
        )
        original_mapping = dict(zip(original.field_names(), original.field_blobs(), strict=False))
        for fn, fb in zip(inputs.field_names(), inputs.field_blobs(), strict=False):
            if fn in original_mapping:
                blob_remap[str(original_mapping[fn])] = str(fb)

    versions, undefined = _blob_versions_and_undefined(net.Proto())
    for blob in versions:
        if blob in blob_remap:
            continue
        blob_remap[blob] = blob if blob in undefined else prefix + blob

    cloned_net = net.Clone(name, blob_remap, keep_schema=keep_schema)
    if not keep_schema and inputs:
        cloned_net.set_input_record(inputs)
    return cloned_net, blob_remap


def remap_proto(argument, blob_remap):
    """Replace the net held by ``argument.n`` with a clone of it under ``blob_remap``."""
    from ferrocaffe.core.net import Net

    cloned = Net(argument.n).Clone("cloned_sub_net", blob_remap)
    argument.n.CopyFrom(cloned.Proto())


def recurrent_network_op_remap(op, prefix, blob_remap):
    """Rename the blobs named inside the arguments of a ``RecurrentNetwork`` (or its
    gradient) op: every string-list argument, the ``timestep`` blob, and the step nets
    (arguments whose name ends in ``step_net``). ``prefix`` is accepted and unused.
    """

    def remapped(blob):
        if isinstance(blob, bytes):
            blob = blob.decode("utf-8")
        return blob_remap.get(blob, blob).encode("utf-8")

    for argument in op.arg:
        if len(argument.strings) > 0:
            for i in range(len(argument.strings)):
                argument.strings[i] = remapped(argument.strings[i])
        elif argument.name == "timestep":
            argument.s = remapped(argument.s)
        elif argument.name.endswith("step_net"):
            remap_proto(argument, blob_remap)


_CONTROL_NET_ARGS = {
    "If": ("then_net", "else_net"),
    "AsyncIf": ("then_net", "else_net"),
}
_LOOP_NET_ARGS = ("loop_net", "cond_net")


def control_op_remap(op, prefix, blob_remap):
    """Clone the nets held by a control op's arguments (``then_net``/``else_net`` of
    ``If``/``AsyncIf``, ``loop_net``/``cond_net`` otherwise) under ``blob_remap``; each
    clone is named after its net with ``_remapped`` appended.
    """
    from ferrocaffe.core.net import Net

    net_arg_names = _CONTROL_NET_ARGS.get(op.type, _LOOP_NET_ARGS)
    for argument in op.arg:
        if argument.name not in net_arg_names:
            continue
        subnet = Net(argument.n)
        remapped_subnet = subnet.Clone(
            name=subnet.Proto().name + "_remapped", blob_remap=blob_remap
        )
        argument.n.CopyFrom(remapped_subnet.Proto())


DEFAULT_REMAP_FUNCS = {
    "RecurrentNetwork": recurrent_network_op_remap,
    "RecurrentNetworkGradient": recurrent_network_op_remap,
    "If": control_op_remap,
    "While": control_op_remap,
    "AsyncIf": control_op_remap,
}
