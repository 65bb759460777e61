"""Static single assignment view of nets: Caffe2's ``core.get_ssa``, ``get_undefined_blobs``,
``get_output_producers`` and ``get_op_ids_in_path``.

The versioning runs in the Rust core (``ferrocaffe.graph`` in the crate) on the serialized
NetDef; ``get_undefined_blobs`` and ``get_output_producers`` are plain loops over the Python
objects of an ``ssa`` list (reading such a list into native code costs more than their work),
``get_op_ids_in_path`` walks it natively. They return exactly what Caffe2's did: ``ssa`` is a list with one
``(inputs, outputs)`` tuple per op, each a list of ``(blob_name, version)`` tuples, and
``blob_versions`` is a dict from blob name to its latest version. The first write of a blob is
version 1; external inputs (and, when a net declares none, every input read before it is
written) start at version 0.
"""

from ferrocaffe import _native
from ferrocaffe._gc import gc_paused

__all__ = ["get_ssa", "get_undefined_blobs", "get_output_producers", "get_op_ids_in_path"]


def _netdef(net):
    """The NetDef behind ``net`` (a NetDef, or anything whose ``Proto()`` returns one)."""
    proto = net.Proto() if hasattr(net, "Proto") else net
    descriptor = getattr(proto, "DESCRIPTOR", None)
    if getattr(descriptor, "full_name", None) != "caffe2.NetDef":
        raise AssertionError(
            "get_ssa expects a Net or a caffe2_pb2.NetDef, got %s" % type(net).__name__
        )
    return proto


def get_ssa(net, blob_versions=None):
    """The versions of the inputs and outputs of each op of ``net``.

    Args:
        net: a ``core.Net`` or a ``caffe2_pb2.NetDef``.
        blob_versions: optional dict of starting versions; it is updated in place and returned.

    Returns:
        ``(ssa, blob_versions)``: ``ssa[i]`` is ``(versioned_inputs, versioned_outputs)`` of
        op ``i``, each a list of ``(name, version)`` tuples; ``blob_versions`` maps every blob
        seen to its latest version.
    """
    proto = _netdef(net)
    start = None
    if blob_versions:
        start = [(str(name), version) for name, version in blob_versions.items()]
    data = proto.SerializePartialToString()
    with gc_paused():
        ssa, versions = _native.ssa_get_ssa(data, start)
    if blob_versions is None:
        return ssa, versions
    blob_versions.update(versions)
    return ssa, blob_versions


def get_undefined_blobs(ssa):
    """The set of blobs read before any op of the net writes them (inputs at version 0)."""
    # A plain loop over the Python objects: reading 100k-op lists into native code costs more
    # than the work itself.
    return {name for inputs, _outputs in ssa for name, version in inputs if version == 0}


def get_output_producers(ssa):
    """A dict from each versioned output ``(name, version)`` to the index of its op."""
    return {versioned: i for i, (_inputs, outputs) in enumerate(ssa) for versioned in outputs}


def get_op_ids_in_path(ssa, blob_versions, inputs, outputs):
    """The sorted indices of the ops needed to compute ``outputs`` from ``inputs``, both taken
    at their latest version in ``blob_versions`` (a missing name raises ``KeyError``)."""
    versioned_inputs = [(str(i), blob_versions[str(i)]) for i in inputs]
    versioned_outputs = [(str(o), blob_versions[str(o)]) for o in outputs]
    return _native.ssa_get_op_ids_in_path(ssa, versioned_inputs, versioned_outputs)
