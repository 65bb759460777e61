"""Graph surgery on Caffe2 nets, for deployment and export code.

Every function takes ``caffe2_pb2.NetDef`` messages (or objects whose ``Proto()`` returns one)
and returns new messages; the inputs are never modified. Blobs are versioned as in
``core.get_ssa``: ``(name, version)``, the first write of a blob being version 1. When an init
net is given, the predict net's versions continue from the init net's (a parameter filled by
the init net is read at version 1).

The work runs in the Rust core on the serialized nets; untouched ops are copied byte for byte.

Example::

    from ferrocaffe import graph
    net = graph.rename_op_output(net, op_id=3, output_id=0, new_name="features")
    net, removed = graph.remove_dead_end_ops(net)
"""

from collections import defaultdict

from ferrocaffe import _native
from ferrocaffe._gc import gc_paused

__all__ = [
    "IllegalGraphTransformError",
    "producer_map",
    "consumer_map",
    "versioned_external_outputs",
    "rename_op_input",
    "rename_op_output",
    "remove_ops",
    "remove_dead_end_ops",
    "sub_graph_external_io",
    "find_chains",
]

#: Raised when an edit would change what the net computes (a ``ValueError``).
IllegalGraphTransformError = _native.IllegalGraphTransformError


def _proto(net, what="net"):
    proto = net.Proto() if hasattr(net, "Proto") else net
    descriptor = getattr(proto, "DESCRIPTOR", None)
    if getattr(descriptor, "full_name", None) != "caffe2.NetDef":
        raise TypeError(
            "%s must be a caffe2_pb2.NetDef or a Net, got %s" % (what, type(net).__name__)
        )
    return proto


def _serialize(net, what="net"):
    proto = _proto(net, what)
    return type(proto), proto.SerializePartialToString()


def _parse(cls, data):
    out = cls()
    out.ParseFromString(data)
    return out


def producer_map(net):
    """``{(name, version): (op_index, output_index)}`` for every blob version an op writes."""
    data = _serialize(net)[1]
    with gc_paused():
        return _native.graph_producer_map(data)


def consumer_map(net):
    """``{(name, version): [(op_index, input_index), ...]}`` for every blob version ops read,
    as a ``defaultdict(list)`` (a version nothing reads maps to ``[]``)."""
    data = _serialize(net)[1]
    with gc_paused():
        return defaultdict(list, _native.graph_consumer_map(data))


def versioned_external_outputs(net):
    """``[(name, version), ...]``: the final version of each external output some op touches."""
    return _native.graph_versioned_external_outputs(_serialize(net)[1])


def rename_op_input(net, op_id, input_id, new_name, init_net=None, from_producer=False):
    """Rename input ``input_id`` of op ``op_id`` to ``new_name``.

    The blob version is renamed wherever it occurs: at its producer (an op of ``net``, or of
    ``init_net`` when the version is the one ``net`` starts with), in every op that reads it,
    and in ``external_input`` / ``external_output`` (and the init net's ``external_output``)
    where they stand for that version. Unless ``from_producer`` is true, the rename is refused
    with :class:`IllegalGraphTransformError` when other ops read the same version.

    Returns ``(net, init_net)``: new messages (``init_net`` is ``None`` if none was given).
    """
    cls, data = _serialize(net)
    init_cls, init_data = (None, None) if init_net is None else _serialize(init_net, "init_net")
    out, init_out = _native.graph_rename_op_input(
        data, init_data, op_id, input_id, str(new_name), bool(from_producer)
    )
    return _parse(cls, out), (None if init_out is None else _parse(init_cls, init_out))


def rename_op_output(net, op_id, output_id, new_name):
    """Rename output ``output_id`` of op ``op_id`` to ``new_name``, together with every op that
    reads that version and the ``external_output`` entry if it is the net's final version.
    Returns the new net."""
    cls, data = _serialize(net)
    return _parse(cls, _native.graph_rename_op_output(data, op_id, output_id, str(new_name)))


def remove_ops(net, op_ids):
    """A copy of ``net`` without the ops at ``op_ids``."""
    cls, data = _serialize(net)
    return _parse(cls, _native.graph_remove_ops(data, [int(i) for i in op_ids]))


def remove_dead_end_ops(net):
    """Remove the ops none of whose outputs reach the net's external outputs.

    Returns ``(net, removed)``: the new net and the (ascending) indices of the removed ops in
    the original net. Ops without outputs are removed too; a net without external outputs
    loses every op.
    """
    cls, data = _serialize(net)
    out, removed = _native.graph_remove_dead_end_ops(data)
    return _parse(cls, out), removed


def sub_graph_external_io(net, op_ids):
    """The boundary of the sub-graph made of the ops ``op_ids``.

    Returns ``(inputs, outputs)``, lists of ``(name, version)`` tuples: the versions the
    sub-graph reads but does not produce (in order of first read), and the versions it produces
    that ops outside it read or that are final external outputs of the net.
    """
    inputs, outputs = _native.graph_sub_graph_io(_serialize(net)[1], [int(i) for i in op_ids])
    return inputs, outputs


def find_chains(net, op_type, min_length=2):
    """Maximal chains of ``op_type`` ops in which each op feeds only the next one.

    An op links to the next when everything that reads its outputs is that one op (of the same
    type), none of its outputs is a final external output, and the next op has no other such
    predecessor. Returns lists of op indices, ordered by first op; chains shorter than
    ``min_length`` are left out.
    """
    return _native.graph_find_chains(_serialize(net)[1], str(op_type), int(min_length))
