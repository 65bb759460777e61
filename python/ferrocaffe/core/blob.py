"""Blob references and blob-name helpers of Caffe2's ``core``.

A ``BlobReference`` is a blob name plus, optionally, the ``Net`` it came from; with a net it can
create operators on it (``b.Relu([], 'y')`` adds ``Relu([b], 'y')`` to that net). It compares and
hashes like its name string.
"""

from collections import namedtuple

from ferrocaffe import _native, scope
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "BlobReference",
    "ScopedName",
    "ScopedBlobReference",
    "GradientSlice",
    "DataType",
    "GetIndexFromGradientList",
    "output_to_list",
    "_get_blob_ref",
]

# A sparse gradient: the indices blob and the values blob of the rows that are set.
GradientSlice = namedtuple("GradientSlice", ["indices", "values"])


class DataType:
    """The values of ``TensorProto.DataType`` as class attributes (``DataType.FLOAT`` == 1)."""


for _name, _value in caffe2_pb2.TensorProto.DataType.items():
    setattr(DataType, _name, _value)
del _name, _value


class BlobReference(_native.BlobName):
    """A reference to a blob by name, optionally tied to the net that defines or uses it.

    The name (``_name``), hashing, comparison (equal to a str, bytes or reference holding the
    same name) and ``str()`` live in the native base ``BlobName``, so that dicts keyed by
    references cost what dicts keyed by strings do.

    ``meta`` is free-form metadata that helper code may attach to a reference: a dict of its
    own, created when first used (most references never use it, and the gradient map of a
    large net holds many thousands of references).
    """

    # A reference without a net: the instance sets its own only when it has one, so that a
    # plain reference holds nothing but its name.
    _from_net = None

    def __init__(self, name, net=None):
        # The name was taken by BlobName.__new__.
        if net is not None:
            self._from_net = net

    def __repr__(self):
        return f'BlobReference("{self._name}")'

    def __add__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add BlobReference to a non-string.")
        return BlobReference(self._name + other, self._from_net)

    def __radd__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add a non-string to BlobReference.")
        return BlobReference(other + self._name, self._from_net)

    def Net(self):
        """The net this reference was created from, or None."""
        return self._from_net

    def GetNameScope(self):
        """The name scope part of the name, up to and including the last '/'."""
        return self._name[: self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1]

    def GetUnscopedName(self):
        """The name without its name scope (after the last '/')."""
        return self._name[self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1 :]

    def _CreateAndAddToNet(self, op_type, inputs=None, *args, **kwargs):
        """Create ``op_type`` on the source net with this blob as the first input.

        ``inputs`` (a name, a reference or a list) are the remaining inputs; a list given by the
        caller gets this reference inserted at its front, as in Caffe2.
        """
        inputs = [] if inputs is None else inputs
        if isinstance(inputs, BlobReference | str):
            inputs = [inputs]
        inputs.insert(0, self)
        return self._from_net.__getattr__(op_type)(inputs, *args, **kwargs)

    def __getattr__(self, op_type):
        """``b.OpType(...)`` creates that operator on the net ``b`` came from."""
        if op_type.startswith("__"):
            raise AttributeError(f"Attribute {op_type} not found.")
        if op_type == "meta":
            # Created on first use (see the class doc).
            meta = self.__dict__["meta"] = {}
            return meta
        # Read through __dict__: during copy/unpickling the attributes may not exist yet.
        if self.__dict__.get("_from_net") is None:
            raise AttributeError(
                "You cannot use a blob reference that does not have a net "
                "source to create operators. Create the operator from an "
                "explicit net object."
            )
        from ferrocaffe.core import operator as _operator

        if not _operator.IsOperator(op_type):
            raise AttributeError(_operator._not_registered_message(op_type))
        return lambda *args, **kwargs: self._CreateAndAddToNet(op_type, *args, **kwargs)

    def __dir__(self):
        from ferrocaffe.core import operator as _operator

        additional = [
            op
            for op in _operator._GetRegisteredOperators()
            if "_ENGINE_" not in op or "_ENGINE_CUDNN" in op
        ]
        return sorted(set(dir(type(self))) | set(self.__dict__) | set(additional))


def ScopedName(name):
    """``name`` prefixed with the current name scope."""
    if isinstance(name, bytes):
        name = name.decode("ascii")
    return scope.CurrentNameScope() + name


def ScopedBlobReference(name, *args, **kwargs):
    """A BlobReference whose name is prefixed with the current name scope."""
    return BlobReference(ScopedName(name), *args, **kwargs)


def _get_blob_ref(blob_name_or_ref):
    """A fresh net-less BlobReference for a name (or for another reference's name)."""
    return BlobReference(blob_name_or_ref)


def GetIndexFromGradientList(g_list, name):
    """Index of the entry of ``g_list`` equal to ``name`` (for a GradientSlice: whose indices or
    values equal it), or None."""
    for i, g in enumerate(g_list):
        if g == name:
            return i
        if type(g) is GradientSlice and (g.indices == name or g.values == name):
            return i
    return None


def output_to_list(op_output):
    """The outputs of an operator call (one reference, or a list/tuple of them) as a list."""
    assert type(op_output) in (list, tuple, BlobReference)
    return [op_output] if isinstance(op_output, BlobReference) else list(op_output)
