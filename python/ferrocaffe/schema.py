"""Caffe2's ``schema`` module: typed, nested record schemas over columns of blobs.

A schema is a tree of fields. Its leaves are :class:`Scalar` fields, each one column (one
tensor) of a dataset; inner nodes are :class:`Struct` (named children sharing one domain) and
:class:`List` (variable-length lists: a ``lengths`` column plus the ``values`` subtree, whose
domain is the concatenation of all lists). :func:`Map` is a list of key/value structs.

Flattening a tree gives its columns in a fixed order: :meth:`Field.field_names` (``a``,
``b:lengths``, ``b:values:x``, ... joined with :data:`FIELD_SEPARATOR`), and in the same order
:meth:`Field.field_types`, :meth:`Field.field_metadata`, :meth:`Field.field_blobs` and
:meth:`Field.all_scalars`. A scalar may carry a blob: a ``core.BlobReference`` (a record of a
net) or a numpy array (a record of values). :func:`NewRecord`, :func:`FetchRecord`,
:func:`FeedRecord` and friends move records between nets, workspaces and numpy.

Fields are built once and treated as immutable: containers clone what they are given, and a
``Struct`` refuses attribute assignment after construction.
"""

import io
import logging
from collections import OrderedDict, namedtuple

import numpy as np

from ferrocaffe import workspace
from ferrocaffe.core import BlobReference, DataType

__all__ = [
    "FIELD_SEPARATOR",
    "FeatureSpec",
    "Metadata",
    "Field",
    "List",
    "ListWithEvicted",
    "Struct",
    "Scalar",
    "Map",
    "MapWithEvicted",
    "NamedTuple",
    "Tuple",
    "RawTuple",
    "from_dtype",
    "from_column_list",
    "from_blob_list",
    "as_record",
    "FetchRecord",
    "FeedRecord",
    "NewRecord",
    "ConstRecord",
    "InitEmptyRecord",
    "is_schema_subset",
    "equal_schemas",
    "schema_check",
    "data_type_for_dtype",
    "dtype_for_core_type",
    "attach_metadata_to_scalars",
]

logger = logging.getLogger(__name__)

# Joins the names of nested fields: the column `values:keys` of a map field.
FIELD_SEPARATOR = ":"


def _join_field_name(prefix, suffix):
    """``prefix:suffix``, or whichever of the two is not empty."""
    return FIELD_SEPARATOR.join(part for part in (prefix, suffix) if part)


def _normalize_field(field_or_type_or_blob, keep_blobs=True):
    """What a container stores for a child given as a field (a clone), a type (an untyped-blob
    Scalar of that dtype) or anything else (a Scalar holding it as its blob)."""
    if isinstance(field_or_type_or_blob, Field):
        return field_or_type_or_blob.clone(keep_blobs=keep_blobs)
    if isinstance(field_or_type_or_blob, type | np.dtype):
        return Scalar(dtype=field_or_type_or_blob)
    return Scalar(blob=field_or_type_or_blob)


# Description of the features a scalar holds (all parts optional).
FeatureSpec = namedtuple(
    "FeatureSpec",
    [
        "feature_type",
        "feature_names",
        "feature_ids",
        "feature_is_request_only",
        "desired_hash_size",
        "feature_to_index",
    ],
    defaults=(None,) * 6,
)


class Metadata(
    namedtuple(
        "Metadata",
        ["categorical_limit", "expected_value", "feature_specs"],
        defaults=(None, None, None),
    )
):
    """Extra facts about a Scalar's values.

    ``categorical_limit``: for non-negative integer values, one more than the largest value
    (typically the size of an embedding table). ``expected_value``: the expected average value
    (typically of a list's lengths). ``feature_specs``: a :class:`FeatureSpec` describing the
    features stored in the field.
    """

    __slots__ = ()


def _slot_names(cls):
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return names


def _abstract():
    """The deliberate error of Field's column methods, which every concrete field overrides:
    Caffe2 raised NotImplementedError with this message (Field can be instantiated, so this is
    not abc.ABC), and code written for Caffe2 may rely on that type."""
    raise NotImplementedError("Field is an abstract class.")


class Field:
    """A node of a schema tree (abstract).

    Every field knows its parent and its index there (``_parent``, ``(None, 0)`` for a root) and
    where each child's columns start among its own (``_field_offsets``: one entry per child
    plus the total), so that :meth:`slice` finds a subtree's columns in the whole record.
    """

    __slots__ = ("_parent", "_field_offsets")

    def __init__(self, children):
        """Called by subclasses once their children exist."""
        self._parent = (None, 0)
        offsets = [0]
        for child in children:
            offsets.append(offsets[-1] + len(child.field_names()))
        self._field_offsets = offsets

    # -- the flattened view (one entry per column) -------------------------------------
    def field_names(self):
        """The column names of this subtree, relative to it (a Scalar's is ``''``)."""
        _abstract()

    def field_types(self):
        """The numpy dtype of each column."""
        _abstract()

    def field_metadata(self):
        """The :class:`Metadata` (or None) of each column."""
        _abstract()

    def field_blobs(self):
        """The blob of each column (BlobReferences or arrays); every scalar must have one."""
        _abstract()

    def all_scalars(self):
        """The Scalar of each column."""
        _abstract()

    def has_blobs(self):
        """Whether every scalar of the subtree holds a blob."""
        _abstract()

    def clone(self, keep_blobs=True):
        """A copy of the subtree (of the same classes), with or without the blobs."""
        _abstract()

    def clone_schema(self):
        """A copy of the subtree without blobs."""
        return self.clone(keep_blobs=False)

    # -- position in the enclosing record ----------------------------------------------
    def _set_parent(self, parent, relative_id):
        self._parent = (parent, relative_id)

    def _child_base_id(self, child_index=None):
        """Index, in the root's columns, of this field's first column (or of child
        ``child_index``'s first column)."""
        parent, index = self._parent
        pos = 0 if child_index is None else self._field_offsets[child_index]
        if parent is not None:
            pos += parent._child_base_id(index)
        return pos

    def slice(self):
        """The slice of the root record's columns that belong to this field, e.g.
        ``column_data[record.b.slice()]``."""
        base = self._child_base_id()
        return slice(base, base + len(self.field_names()))

    # -- comparison, printing, pickling --------------------------------------------------
    def __eq__(self, other):
        """Two schemas are equal when their columns have the same names, dtypes and metadata
        (blobs are not compared)."""
        if not isinstance(other, Field):
            return NotImplemented
        return (
            self.field_names() == other.field_names()
            and self.field_types() == other.field_types()
            and self.field_metadata() == other.field_metadata()
        )

    __hash__ = None

    def _pprint_impl(self, indent, out):
        _abstract()

    def __repr__(self):
        out = io.StringIO()
        self._pprint_impl(0, out)
        return out.getvalue()

    def __getstate__(self):
        state = {}
        for name in _slot_names(type(self)):
            try:
                state[name] = object.__getattribute__(self, name)
            except AttributeError:
                pass
        extra = getattr(self, "__dict__", None)
        if extra:
            state["__dict__"] = dict(extra)
        return state

    def __setstate__(self, state):
        # Bypasses Struct's frozen __setattr__.
        for name, value in state.items():
            if name == "__dict__":
                object.__getattribute__(self, "__dict__").update(value)
            else:
                object.__setattr__(self, name, value)


def _own_attribute(obj, name):
    """An attribute stored on ``obj`` itself, without going through ``__getattr__`` (which a
    half-built or half-unpickled field would recurse into)."""
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return None


class List(Field):
    """A variable-length list: the ``lengths`` column (int32: the size of each list) and the
    ``values`` subtree holding the items of all lists one after another.

    ``values`` may be any field. When it is a Struct, the struct's fields are reachable as
    attributes of the list (``lst.keys`` for a map); otherwise ``lst.items`` / ``lst.value``
    give it.
    """

    __slots__ = ("lengths", "_items")

    def __init__(self, values, lengths_blob=None):
        """``lengths_blob``: a Scalar to use as the lengths field, or the blob of a new int32
        lengths Scalar (None: no blob)."""
        if isinstance(lengths_blob, Field):
            if not isinstance(lengths_blob, Scalar):
                raise TypeError(
                    f"the lengths of a List must be a Scalar, got {type(lengths_blob).__name__}"
                )
            self.lengths = _normalize_field(lengths_blob)
        else:
            self.lengths = Scalar(np.int32, lengths_blob)
        self._items = _normalize_field(values)
        self.lengths._set_parent(self, 0)
        self._items._set_parent(self, 1)
        super().__init__(self._children())

    def _children(self):
        return [self.lengths, self._items]

    def field_names(self):
        return ["lengths"] + [_join_field_name("values", n) for n in self._items.field_names()]

    def field_types(self):
        return [t for c in self._children() for t in c.field_types()]

    def field_metadata(self):
        return [m for c in self._children() for m in c.field_metadata()]

    def field_blobs(self):
        return [b for c in self._children() for b in c.field_blobs()]

    def all_scalars(self):
        return [s for c in self._children() for s in c.all_scalars()]

    def has_blobs(self):
        return all(c.has_blobs() for c in self._children())

    def clone(self, keep_blobs=True):
        return type(self)(
            _normalize_field(self._items, keep_blobs=keep_blobs),
            _normalize_field(self.lengths, keep_blobs=keep_blobs),
        )

    def _pprint_impl(self, indent, out):
        pad = "  " * indent
        out.write(f"{pad}{type(self).__name__}(\n")
        for label, child in zip(self._child_labels(), self._children(), strict=True):
            out.write(f"{pad}  {label}=\n")
            child._pprint_impl(indent + 2, out)
        out.write(f"{pad})\n")

    def _child_labels(self):
        return ["lengths", "_items"]

    def __getattr__(self, item):
        if item.startswith("__") or item in _slot_names(type(self)):
            raise AttributeError(item)
        items = _own_attribute(self, "_items")
        if isinstance(items, Struct):
            return getattr(items, item)
        if item in ("value", "items") and items is not None:
            return items
        raise AttributeError(f"Field not found in list: {item}.")

    def _named_child(self, name):
        if name == "lengths":
            return self.lengths
        if name == "values":
            return self._items
        return None

    def __getitem__(self, item):
        """``'lengths'``, ``'values'`` or ``'values:<nested name>'``; KeyError otherwise."""
        head, sep, rest = item.partition(FIELD_SEPARATOR)
        if not sep:
            child = self._named_child(item)
            if child is not None:
                return child
        elif head == "values":
            return self._items[rest]
        raise KeyError(f"Field not found in list: {item}.")


class ListWithEvicted(List):
    """A List with one more column, ``_evicted_values`` (int64), for LRU-hashed features."""

    __slots__ = ("_evicted_values",)

    def __init__(self, values, lengths_blob=None, evicted_values=None):
        """``evicted_values``: a Scalar to use as that field, or the blob of a new int64 one."""
        if isinstance(evicted_values, Field):
            if not isinstance(evicted_values, Scalar):
                raise TypeError(
                    "the evicted values of a ListWithEvicted must be a Scalar, got "
                    f"{type(evicted_values).__name__}"
                )
            self._evicted_values = _normalize_field(evicted_values)
        else:
            self._evicted_values = Scalar(np.int64, evicted_values)
        self._evicted_values._set_parent(self, 2)
        super().__init__(values, lengths_blob=lengths_blob)

    def _children(self):
        return [self.lengths, self._items, self._evicted_values]

    def _child_labels(self):
        return ["lengths", "_items", "_evicted_values"]

    def field_names(self):
        return super().field_names() + ["_evicted_values"]

    def clone(self, keep_blobs=True):
        return type(self)(
            _normalize_field(self._items, keep_blobs=keep_blobs),
            _normalize_field(self.lengths, keep_blobs=keep_blobs),
            _normalize_field(self._evicted_values, keep_blobs=keep_blobs),
        )

    def _named_child(self, name):
        if name == "_evicted_values":
            return self._evicted_values
        return super()._named_child(name)


class Struct(Field):
    """Named fields sharing one domain, in order.

    ``Struct(('a', f1), ('b:c', f2), ('b', Struct(('d', f3))))`` takes ``(name, field)``
    pairs; a field may be a Field, a type or a blob (see :func:`_normalize_field`). A name with
    separators nests (``'b:c'`` is field ``c`` of a struct ``b``), and two structs given the
    same name are merged as by ``+``; any other repeated name is a ValueError. Fields are
    reachable as attributes (``s.a``), by nested name (``s['b:c']``), by position (``s[0]``) or
    as a sub-struct (``s['b', 'a']``).
    """

    __slots__ = ("fields", "_frozen")

    def __init__(self, *fields):
        for field in fields:
            assert len(field) == 2, f"a Struct field is a (name, field) pair, got {field!r}"
            assert field[0], "Field names cannot be empty"
            assert field[0] != "lengths", "Struct cannot contain a field named `lengths`."
        self.fields = OrderedDict()
        for name, field in fields:
            field = _normalize_field(field)
            if FIELD_SEPARATOR in name:
                name, field = _nest(name, field)
            existing = self.fields.get(name)
            if existing is None:
                self.fields[name] = field
            elif isinstance(existing, Struct) and isinstance(field, Struct):
                self.fields[name] = existing + field
            else:
                raise ValueError(f"Duplicate field name: {name}")
        for index, field in enumerate(self.fields.values()):
            field._set_parent(self, index)
        super().__init__(list(self.fields.values()))
        self._frozen = True

    def __setattr__(self, key, value):
        # Fields cannot be replaced once built; private state (the parent link) can be set.
        if not key.startswith("_") and _own_attribute(self, "_frozen"):
            raise TypeError("Struct.__setattr__() is disabled after __init__()")
        object.__setattr__(self, key, value)

    def get_children(self):
        """The ``(name, field)`` pairs, in order."""
        return list(self.fields.items())

    def field_names(self):
        return [
            _join_field_name(name, sub)
            for name, f in self.fields.items()
            for sub in f.field_names()
        ]

    def field_types(self):
        return [t for f in self.fields.values() for t in f.field_types()]

    def field_metadata(self):
        return [m for f in self.fields.values() for m in f.field_metadata()]

    def field_blobs(self):
        return [b for f in self.fields.values() for b in f.field_blobs()]

    def all_scalars(self):
        return [s for f in self.fields.values() for s in f.all_scalars()]

    def has_blobs(self):
        return all(f.has_blobs() for f in self.fields.values())

    def clone(self, keep_blobs=True):
        return type(self)(
            *[(k, _normalize_field(v, keep_blobs=keep_blobs)) for k, v in self.fields.items()]
        )

    def _get_field_by_nested_name(self, nested_name):
        """The field at ``a:b:c``, or None when there is none."""
        head, sep, rest = nested_name.partition(FIELD_SEPARATOR)
        field = self.fields.get(head)
        if field is None or not sep:
            return field
        try:
            return field[rest]
        except (KeyError, TypeError):
            return None

    def _pprint_impl(self, indent, out):
        pad = "  " * indent
        out.write(f"{pad}Struct( \n")
        for name, field in self.fields.items():
            out.write(f"{pad}  {name}=\n")
            field._pprint_impl(indent + 2, out)
        out.write(f"{pad}) \n")

    def __contains__(self, item):
        return self._get_field_by_nested_name(item) is not None

    def __len__(self):
        return len(self.fields)

    def __iter__(self):
        return iter(list(self.fields.values()))

    def __getitem__(self, item):
        """A nested name gives that field (KeyError if absent), an int the field at that
        position, a list or tuple of names/ints a Struct of those fields in that order."""
        if isinstance(item, list | tuple):
            names = list(self.fields)
            return Struct(*[(names[k] if isinstance(k, int) else k, self[k]) for k in item])
        if isinstance(item, int):
            values = list(self.fields.values())
            if not -len(values) <= item < len(values):
                raise IndexError(f"Struct has {len(values)} fields, no field {item}")
            return values[item]
        field = self._get_field_by_nested_name(item)
        if field is None:
            raise KeyError(f'field "{item}" not found')
        return field

    def get(self, item, default_value):
        """The field named ``item`` (an attribute lookup), or ``default_value``."""
        return getattr(self, item, default_value)

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        fields = _own_attribute(self, "fields")
        if fields is not None and item in fields:
            return fields[item]
        raise AttributeError(item)

    def __add__(self, other):
        """The fields of both structs, ``self``'s first; fields named alike must both be
        Structs and are merged recursively (TypeError otherwise)."""
        if not isinstance(other, Struct):
            return NotImplemented
        merged = OrderedDict(self.fields)
        for name, right in other.fields.items():
            left = merged.get(name)
            if left is None:
                merged[name] = right
            elif isinstance(left, Struct) and isinstance(right, Struct):
                merged[name] = left + right
            else:
                raise TypeError(
                    f"Type of left_field, {type(left)}, and type of right_field, {type(right)}, "
                    f"must both the Struct to allow merging of the field, {name}"
                )
        return Struct(*merged.items())

    def __sub__(self, other):
        """``self`` without the fields ``other`` also has. Fields named alike must be of the
        same class (TypeError otherwise); structs are subtracted recursively and dropped when
        nothing is left of them."""
        if not isinstance(other, Struct):
            return NotImplemented
        remaining = OrderedDict(self.fields)
        for name, right in other.fields.items():
            left = remaining.get(name)
            if left is None:
                continue
            if type(left) is not type(right):
                raise TypeError(
                    f"Type of left_field, {type(left)}, is not the same as that of right_field, "
                    f"{type(right)}, yet they have the same field name, {name}"
                )
            rest = left - right if isinstance(left, Struct) else None
            if rest is not None and rest.fields:
                remaining[name] = rest
            else:
                del remaining[name]
        return Struct(*remaining.items())


def _nest(nested_name, field):
    """``('a:b:c', f)`` -> ``('a', Struct(('b', Struct(('c', f)))))``."""
    head, _, rest = nested_name.partition(FIELD_SEPARATOR)
    for name in reversed(rest.split(FIELD_SEPARATOR)):
        field = Struct((name, field))
    return head, field


class Scalar(Field):
    """A leaf: one column, a tensor whose first dimension runs over the field's domain.

    ``dtype`` is any numpy type; a sub-array type such as ``(np.int32, 5)`` or
    ``(str, (10, 20))`` makes each entry a fixed-shape array (the column is then ``(N, 5)``).
    ``Scalar()`` is untyped (``np.void``). A structured dtype is refused (use
    :func:`from_dtype`).

    The blob, when set, is a ``core.BlobReference`` or the values themselves (converted to a
    numpy array of the dtype; a 0-d value becomes a 1-element column). ``metadata`` is a
    :class:`Metadata`; a ``categorical_limit`` needs an integer dtype.
    """

    __slots__ = ("_metadata", "dtype", "_original_dtype", "_blob")

    def __init__(self, dtype=None, blob=None, metadata=None):
        self._metadata = None
        self.set(dtype, blob, metadata, unsafe=True)
        super().__init__([])

    def field_names(self):
        return [""]

    def field_type(self):
        return self.dtype

    def field_types(self):
        return [self.dtype]

    def field_metadata(self):
        return [self._metadata]

    def has_blobs(self):
        return self._blob is not None

    def field_blobs(self):
        assert self._blob is not None, "Value is not set for this field."
        return [self._blob]

    def all_scalars(self):
        return [self]

    def clone(self, keep_blobs=True):
        return Scalar(
            dtype=self._original_dtype,
            blob=self._blob if keep_blobs else None,
            metadata=self._metadata,
        )

    def get(self):
        """The blob of this scalar (it must have one)."""
        assert self._blob is not None, "Value is not set for this field."
        return self._blob

    def __call__(self):
        return self.get()

    @property
    def metadata(self):
        return self._metadata

    def set_metadata(self, value):
        assert isinstance(value, Metadata), f"metadata must be Metadata, got {type(value)}"
        self._metadata = value
        self._validate_metadata()

    def _validate_metadata(self):
        if self._metadata is None or self._metadata.categorical_limit is None:
            return
        assert self.dtype is None or np.issubdtype(self.dtype, np.integer), (
            f"`categorical_limit` can be specified only in integral fields but got {self.dtype}"
        )

    def set_type(self, dtype):
        """Change the dtype (None: untyped), keeping the blob."""
        self._original_dtype = dtype
        self.dtype = np.dtype(np.void) if dtype is None else np.dtype(dtype)
        self._validate_metadata()

    def set_value(self, blob, throw_on_type_mismatch=False, unsafe=False):
        """Replace the blob, keeping the dtype. With ``throw_on_type_mismatch``, a typed scalar
        accepts only a numpy array of its base dtype."""
        if self.dtype.base != np.void and throw_on_type_mismatch:
            assert isinstance(blob, np.ndarray), f"Got {blob!r}"
            assert blob.dtype.base == self.dtype.base, (
                f"Expected {self.dtype.base}, got {blob.dtype.base}"
            )
        self.set(dtype=self._original_dtype, blob=blob, unsafe=unsafe)

    def set(self, dtype=None, blob=None, metadata=None, unsafe=False):
        """Set the dtype, the blob and (when given) the metadata, as the constructor does.

        A plain ``str`` blob is refused as ambiguous: pass ``core.BlobReference(name)`` or
        ``np.array(text)``. Scalars are meant to be immutable: only code that has just built one
        should call this, with ``unsafe=True`` (otherwise a warning is logged).
        """
        if not unsafe:
            logger.warning(
                "Scalar should be considered immutable. Only call Scalar.set() on newly "
                "created Scalar with unsafe=True. This will become an error soon."
            )
        if isinstance(blob, str) and not isinstance(blob, BlobReference):
            raise ValueError(
                "Passing str blob to Scalar.set() is ambiguous. Do either "
                "set(blob=np.array(blob)) or set(blob=BlobReference(blob))"
            )
        self._original_dtype = dtype
        dtype = _scalar_dtype(dtype, blob)
        if blob is not None and not isinstance(blob, BlobReference):
            blob, dtype = _scalar_values(blob, dtype)
        if dtype is None:
            dtype = np.dtype(np.void)
        assert not dtype.fields, (
            "Cannot create Scalar with a structured dtype. Use from_dtype instead."
        )
        self.dtype = dtype
        self._blob = blob
        if metadata is not None:
            self.set_metadata(metadata)
        self._validate_metadata()

    def _pprint_impl(self, indent, out):
        out.write(f"{'  ' * indent}Scalar({self.dtype!r}, {self._blob!r}, {self._metadata!r})\n")

    def id(self):
        """This scalar's position among the columns of the whole record (the index into the
        blob list a reader returns or a writer takes)."""
        return self._child_base_id()


def _scalar_dtype(dtype, blob):
    """The numpy dtype a Scalar's ``dtype`` argument stands for (None stays None)."""
    if dtype is None:
        return None
    if isinstance(dtype, tuple):
        base, shape = dtype[0], dtype[1]
        if base == np.void:
            raise TypeError(
                f"Cannot set the Scalar with type {dtype} for blob {blob}. If this blob is the "
                "output of some operation, please verify the input of that operation has "
                "proper type."
            )
        # numpy reads a sub-array shape of 1 as no sub-array at all; a Scalar keeps (1,).
        if shape == 1:
            dtype = (base, (1,))
    return np.dtype(dtype)


def _scalar_values(blob, dtype):
    """A Scalar's values as a numpy column, and its dtype completed from their shape."""
    from_array = isinstance(blob, np.ndarray)
    if dtype is not None and dtype != np.void:
        blob = np.array(blob, dtype=dtype.base)
        if blob.size == 0 and not from_array:
            blob = blob.reshape((0,) + dtype.shape)
    elif not from_array:
        raise AssertionError(f"Invalid blob type: {type(blob)}")
    if blob.ndim == 0 and not from_array:
        blob = blob.reshape((1,))
    if blob.ndim > 1 and dtype is not None and dtype.base != np.void:
        dtype = np.dtype((dtype.base, blob.shape[1:]))
    return blob, dtype


def Map(keys, values, keys_name="keys", values_name="values", lengths_blob=None):
    """A List of ``Struct((keys_name, keys), (values_name, values))``."""
    return List(Struct((keys_name, keys), (values_name, values)), lengths_blob=lengths_blob)


def MapWithEvicted(
    keys, values, keys_name="keys", values_name="values", lengths_blob=None, evicted_values=None
):
    """A :func:`Map` with the ``_evicted_values`` column of :class:`ListWithEvicted`."""
    return ListWithEvicted(
        Struct((keys_name, keys), (values_name, values)),
        lengths_blob=lengths_blob,
        evicted_values=evicted_values,
    )


def NamedTuple(name_prefix, *fields):
    """A Struct whose fields are named ``<name_prefix>_0``, ``<name_prefix>_1``, ..."""
    return Struct(*[(f"{name_prefix}_{i}", field) for i, field in enumerate(fields)])


def Tuple(*fields):
    """A Struct of the given fields named ``field_0``, ``field_1``, ..."""
    return NamedTuple("field", *fields)


def RawTuple(num_fields, name_prefix="field"):
    """A tuple of ``num_fields`` untyped scalars."""
    assert isinstance(num_fields, int), f"num_fields must be an int, got {num_fields!r}"
    assert num_fields >= 0, f"num_fields must not be negative, got {num_fields}"
    return NamedTuple(name_prefix, *([np.void] * num_fields))


def from_dtype(dtype, _outer_shape=()):
    """The schema of a numpy dtype: a Scalar, or a Struct for a structured dtype (fields with
    byte offsets are not supported). ``_outer_shape`` is prepended to every sub-array shape."""
    if isinstance(dtype, np.dtype):
        shape = tuple(_outer_shape) + dtype.shape
        if shape != dtype.shape:
            dtype = np.dtype((dtype.base, shape))
    else:
        shape = tuple(_outer_shape)
        dtype = np.dtype((dtype, shape))
    if not dtype.fields:
        return Scalar(dtype)
    struct_fields = []
    for name in dtype.names:
        field_dtype, offset = dtype.fields[name][:2]
        assert offset == 0, "Fields with byte offsets are not supported."
        struct_fields.append((name, from_dtype(field_dtype, _outer_shape=shape)))
    return Struct(*struct_fields)


class _ColumnTree:
    """A node of the tree :func:`from_column_list` builds from column names: its children by
    name, or the Scalar of a column when it is a leaf."""

    __slots__ = ("children", "scalar")

    def __init__(self):
        self.children = OrderedDict()
        self.scalar = None

    def child(self, name):
        return self.children.setdefault(name, _ColumnTree())

    def to_field(self):
        if self.scalar is not None:
            return self.scalar
        if not self.children:
            return Struct()
        fields = {name: node.to_field() for name, node in self.children.items()}
        names = set(fields)
        # Children named as a list's or a map's columns are read back as that list or map.
        if names == {"lengths", "values"}:
            return List(fields["values"], lengths_blob=fields["lengths"])
        if names == {"lengths", "keys", "values"}:
            return Map(fields["keys"], fields["values"], lengths_blob=fields["lengths"])
        return Struct(*fields.items())


def from_column_list(col_names, col_types=None, col_blobs=None, col_metadata=None):
    """The schema whose columns are ``col_names`` (in any order; ``a:lengths`` with
    ``a:values`` becomes a List, with ``a:keys`` too a Map), with the given dtypes, blobs and
    metadata per column."""
    count = len(col_names)
    col_types = [None] * count if col_types is None else col_types
    col_blobs = [None] * count if col_blobs is None else col_blobs
    col_metadata = [None] * count if col_metadata is None else col_metadata
    assert len(col_types) == count, "col_names and col_types must have the same length."
    assert len(col_metadata) == count, "col_names and col_metadata must have the same length."
    assert len(col_blobs) == count, "col_names and col_blobs must have the same length."
    root = _ColumnTree()
    for name, dtype, blob, metadata in zip(
        col_names, col_types, col_blobs, col_metadata, strict=True
    ):
        node = root
        for part in name.split(FIELD_SEPARATOR):
            node = node.child(part)
        node.scalar = Scalar(dtype=dtype, blob=blob, metadata=metadata)
    return root.to_field()


def from_blob_list(schema, values, throw_on_type_mismatch=False):
    """A copy of ``schema`` whose scalars hold ``values`` (one per column, in order)."""
    assert isinstance(schema, Field), "Argument `schema` must be a Field."
    if isinstance(values, BlobReference):
        values = [values]
    record = schema.clone_schema()
    scalars = record.all_scalars()
    assert len(scalars) == len(values), (
        f"Values must have {len(scalars)} elements, got {len(values)}."
    )
    for scalar, value in zip(scalars, values, strict=True):
        scalar.set_value(value, throw_on_type_mismatch, unsafe=True)
    return record


def as_record(value):
    """A Field for ``value``: a Field itself, a Tuple of a list/tuple's items, a Struct of a
    dict's (or a list of ``(name, value)`` pairs') items, else a Scalar (see
    :func:`_normalize_field`)."""
    if isinstance(value, Field):
        return value
    if isinstance(value, list | tuple):
        is_pair_list = bool(value) and all(
            isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value
        )
        if is_pair_list:
            return Struct(*[(k, as_record(v)) for k, v in value])
        return Tuple(*[as_record(v) for v in value])
    if isinstance(value, dict):
        return Struct(*[(k, as_record(v)) for k, v in value.items()])
    return _normalize_field(value)


def FetchRecord(blob_record, ws=None, throw_on_type_mismatch=False):
    """The values of a record of BlobReferences, fetched from ``ws`` (a workspace object; the
    current workspace by default), as a record of arrays with the same schema."""
    assert isinstance(blob_record, Field), "FetchRecord takes a schema.Field"
    field_blobs = blob_record.field_blobs()
    assert all(isinstance(b, BlobReference) for b in field_blobs), (
        "FetchRecord needs a record of BlobReferences"
    )
    if ws is None:
        arrays = [workspace.FetchBlob(str(b)) for b in field_blobs]
    else:
        arrays = [ws.blobs[str(b)].fetch() for b in field_blobs]
    return from_blob_list(blob_record, arrays, throw_on_type_mismatch)


def FeedRecord(blob_record, arrays, ws=None):
    """Feed ``arrays`` (a list of arrays, one per column, or a record of arrays) into the
    blobs of ``blob_record`` in ``ws`` (the current workspace by default)."""
    assert isinstance(blob_record, Field), "FeedRecord takes a schema.Field"
    field_blobs = blob_record.field_blobs()
    assert all(isinstance(b, BlobReference) for b in field_blobs), (
        "FeedRecord needs a record of BlobReferences"
    )
    if isinstance(arrays, Field):
        arrays = arrays.field_blobs()
    assert len(arrays) == len(field_blobs), (
        f"Values must contain exactly {len(field_blobs)} ndarrays."
    )
    for blob, array in zip(field_blobs, arrays, strict=True):
        if ws is None:
            workspace.FeedBlob(str(blob), array)
        else:
            ws.create_blob(str(blob))
            ws.blobs[str(blob)].feed(array)


def NewRecord(net, schema):
    """A copy of ``schema`` whose columns are new blobs of ``net``, named after the columns
    (``net.NextScopedBlob(name)``: unique in the net, under the current name scope)."""
    if isinstance(schema, Scalar):
        record = schema.clone()
        record.set_value(blob=net.NextScopedBlob("unnamed_scalar"), unsafe=True)
        return record
    assert isinstance(schema, Field), "Record must be a schema.Field instance."
    blobs = [net.NextScopedBlob(prefix=name) for name in schema.field_names()]
    return from_blob_list(schema, blobs)


def ConstRecord(net, array_record):
    """A record of new blobs of ``net`` filled (by ``net.Const``) with the arrays of
    ``array_record``."""
    blob_record = NewRecord(net, array_record)
    for blob, array in zip(blob_record.field_blobs(), array_record.field_blobs(), strict=True):
        net.Const(array, blob)
    return blob_record


def InitEmptyRecord(net, schema_or_record, enforce_types=False):
    """Add to ``net`` a ConstantFill per column making each blob an empty tensor (0 rows) of
    the column's type and shape; returns the record (new blobs when the schema has none).
    A column whose dtype has no Caffe2 type gets a float fill, unless ``enforce_types``
    (TypeError)."""
    if schema_or_record.has_blobs():
        record = schema_or_record
    else:
        record = NewRecord(net, schema_or_record)
    for blob_type, blob in zip(record.field_types(), record.field_blobs(), strict=True):
        try:
            data_type = data_type_for_dtype(blob_type)
        except TypeError:
            logger.warning(f"Blob {blob} has type error")
            if enforce_types:
                raise
            net.ConstantFill([], blob, shape=[0])
            continue
        net.ConstantFill([], blob, shape=[0, *blob_type.shape], dtype=data_type)
    return record


# numpy base type <-> Caffe2 TensorProto data type. A dtype matches an entry when it compares
# equal to it: for strings that is numpy's flexible `str` dtype ('<U0', what `Scalar(str)` holds),
# not a fixed-width one.
_DATA_TYPE_FOR_DTYPE = [
    (str, DataType.STRING),
    (np.float16, DataType.FLOAT16),
    (np.float32, DataType.FLOAT),
    (np.float64, DataType.DOUBLE),
    (bool, DataType.BOOL),
    (np.int8, DataType.INT8),
    (np.int16, DataType.INT16),
    (np.int32, DataType.INT32),
    (np.int64, DataType.INT64),
    (np.uint8, DataType.UINT8),
    (np.uint16, DataType.UINT16),
]


def data_type_for_dtype(dtype):
    """The ``core.DataType`` of a numpy dtype's base type; TypeError when it has none."""
    base = np.dtype(dtype).base
    for np_type, data_type in _DATA_TYPE_FOR_DTYPE:
        if base == np_type:
            return data_type
    raise TypeError(f"Unknown dtype: {base}")


def dtype_for_core_type(core_type):
    """The numpy type of a ``core.DataType``; TypeError when there is none."""
    for np_type, data_type in _DATA_TYPE_FOR_DTYPE:
        if data_type == core_type:
            return np_type
    raise TypeError(f"Unknown core type: {core_type}")


def is_schema_subset(schema, original_schema):
    """Whether every column name of ``schema`` is one of ``original_schema``'s."""
    return set(schema.field_names()).issubset(original_schema.field_names())


def equal_schemas(
    schema, original_schema, check_field_names=True, check_field_types=True, check_field_metas=False
):
    """Whether two schemas have the same column names, dtypes and (if asked) metadata."""
    assert isinstance(schema, Field), "equal_schemas takes schema.Field objects"
    assert isinstance(original_schema, Field), "equal_schemas takes schema.Field objects"
    if check_field_names and schema.field_names() != original_schema.field_names():
        return False
    if check_field_types and schema.field_types() != original_schema.field_types():
        return False
    if check_field_metas and schema.field_metadata() != original_schema.field_metadata():
        return False
    return True


def schema_check(schema, previous=None):
    """``as_record(schema)``, asserting it equals ``previous`` when that is given."""
    record = as_record(schema)
    if previous is not None:
        assert equal_schemas(schema, previous), "schema differs from the previous one"
    return record


def attach_metadata_to_scalars(field, metadata):
    """Set ``metadata`` on every scalar of ``field``."""
    for scalar in field.all_scalars():
        scalar.set_metadata(metadata)
