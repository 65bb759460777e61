"""ferrocaffe.schema: record schemas as Caffe2 defined them (column order and names, nesting,
indexing, merging, cloning, metadata, records over nets and workspaces)."""

import pickle
import random

import numpy as np
import pytest

from ferrocaffe import core, schema, workspace


def setup_function(_):
    workspace.ResetWorkspace()


def nested():
    return schema.Struct(
        ("a", schema.Scalar(np.float32)),
        ("b", schema.List(schema.Scalar(np.int64))),
        ("c", schema.Map(schema.Scalar(np.int32), schema.Scalar(np.float32))),
        ("d", schema.Struct(("e", schema.Scalar(str)))),
    )


def test_columns_are_flattened_in_order_with_joined_names():
    s = nested()
    assert s.field_names() == [
        "a",
        "b:lengths",
        "b:values",
        "c:lengths",
        "c:values:keys",
        "c:values:values",
        "d:e",
    ]
    assert s.field_types() == [
        np.dtype(np.float32),
        np.dtype(np.int32),
        np.dtype(np.int64),
        np.dtype(np.int32),
        np.dtype(np.int32),
        np.dtype(np.float32),
        np.dtype(str),
    ]
    assert s.field_metadata() == [None] * 7
    assert [x.field_type() for x in s.all_scalars()] == s.field_types()
    assert not s.has_blobs()
    with pytest.raises(AssertionError, match="Value is not set"):
        s.field_blobs()


def test_offsets_parents_and_slices_locate_each_subtree():
    f = schema.Field([])
    assert f._parent == (None, 0) and f._field_offsets == [0]
    s = nested()
    assert s._field_offsets == [0, 1, 3, 6, 7]
    assert s.c._parent == (s, 2)
    assert s.c.slice() == slice(3, 6)
    assert s.c.keys.id() == 4
    assert s.d.e.id() == 6
    columns = s.field_names()
    assert columns[s.b.slice()] == ["b:lengths", "b:values"]


def test_struct_indexing_by_name_nested_name_position_and_subsets():
    s = nested()
    assert s["a"] is s.a and s[0] is s.a
    assert s["c:values:keys"] is s.c.keys
    assert s["b:values"] is s.b.items and s.b.value is s.b.items
    assert s["b:lengths"] is s.b.lengths
    sub = s["d", 0]
    assert sub.field_names() == ["d:e", "a"]
    assert isinstance(sub, schema.Struct)
    for bad in ["", "x", "a:x", "b:items", "c:values:x", "d:e:f"]:
        with pytest.raises(KeyError):
            s[bad]
        assert bad not in s
    assert "c:values" in s and "d:e" in s
    assert len(s) == 4
    assert [f.field_names() for f in s][:1] == [[""]]
    assert s.get("a", None) is s.a and s.get("zz", 7) == 7
    with pytest.raises(AttributeError):
        _ = s.zz
    with pytest.raises(AttributeError, match="Field not found in list"):
        _ = s.b.nope


def test_list_and_evicted_list_columns():
    lst = schema.ListWithEvicted(schema.Scalar(str))
    assert lst.field_names() == ["lengths", "values", "_evicted_values"]
    assert lst.field_types()[2] == np.dtype(np.int64)
    assert lst["_evicted_values"] is lst._evicted_values
    assert lst._evicted_values.id() == 2
    m = schema.MapWithEvicted(np.int32, np.float32)
    assert m.field_names() == ["lengths", "values:keys", "values:values", "_evicted_values"]
    with pytest.raises(TypeError, match="must be a Scalar"):
        schema.List(schema.Scalar(), lengths_blob=schema.Struct())


def test_nested_names_build_and_merge_structs():
    blob = core.BlobReference
    f_b = schema.Struct(("c", schema.Struct(("d", schema.Scalar(blob=blob("b2"))))))
    f_x = schema.Struct(("x", schema.Scalar(blob=blob("b3"))))
    st = schema.Struct(("a", schema.Scalar(blob=blob("b1"))), ("b:c:e", f_x), ("b", f_b))
    assert st.field_names() == ["a", "b:c:e:x", "b:c:d"]
    assert st.field_blobs() == ["b1", "b3", "b2"]
    with pytest.raises(TypeError):
        schema.Struct(("b", f_b), ("b:c:d", f_x))
    with pytest.raises(ValueError, match="Duplicate field name: a"):
        schema.Struct(("a", schema.Scalar()), ("a", schema.Scalar()))
    with pytest.raises(AssertionError, match="lengths"):
        schema.Struct(("lengths", schema.Scalar()))


def test_struct_is_frozen_but_private_state_can_be_set():
    s = schema.Struct(("a", schema.Scalar()))
    with pytest.raises(TypeError, match="disabled after __init__"):
        s.a = schema.Scalar()
    s._parent = (None, 0)


def test_addition_and_subtraction_are_recursive():
    s1 = schema.Struct(("a", schema.Scalar()), ("b", schema.Struct(("c", schema.Scalar()))))
    s2 = schema.Struct(("b", schema.Struct(("d", schema.Scalar()))))
    assert (s1 + s2).field_names() == ["a", "b:c", "b:d"]
    with pytest.raises(TypeError):
        s1 + s1
    with pytest.raises(TypeError):
        s1 + schema.Scalar()
    big = schema.Struct(
        ("a", schema.Scalar()),
        ("b", schema.Struct(("c", schema.Scalar()), ("d", schema.Scalar()))),
    )
    assert (big - schema.Struct(("b", schema.Struct(("d", schema.Scalar()))))).field_names() == [
        "a",
        "b:c",
    ]
    # A struct left empty disappears.
    assert (big - s1).field_names() == ["b:d"]
    assert (big - schema.Struct(("b", big.b))).field_names() == ["a"]
    with pytest.raises(TypeError, match="same field name, b"):
        big - schema.Struct(("b", schema.Scalar()))
    with pytest.raises(TypeError):
        big - schema.Scalar()


def test_equality_compares_names_types_and_metadata_not_blobs():
    assert schema.Struct(("x", np.int32), ("y", str)) == schema.Struct(
        ("x", schema.Scalar(np.int32)), ("y", schema.Scalar(str))
    )
    # numpy dtype objects are types too (numpy 2 gives each its own class).
    assert schema.Struct(("x", np.dtype(np.int16))) == schema.Struct(("x", np.int16))
    assert schema.Scalar(np.int32, blob=core.BlobReference("q")) == schema.Scalar(np.int32)
    assert schema.Scalar(np.int32) != schema.Scalar(np.int64)
    limited = schema.Scalar(np.int32, metadata=schema.Metadata(categorical_limit=3))
    assert limited != schema.Scalar(np.int32)
    assert schema.Scalar(np.void) == schema.Scalar(None) == schema.Scalar()
    assert schema.Scalar() != "x"


def test_tuples():
    t = schema.Tuple(np.int32, str)
    assert t.field_names() == ["field_0", "field_1"]
    assert t[1] == schema.Scalar(str)
    assert list(t) == [schema.Scalar(np.int32), schema.Scalar(str)]
    raw = schema.RawTuple(2, name_prefix="p")
    assert raw.field_names() == ["p_0", "p_1"]
    assert raw.field_types() == [np.dtype(np.void)] * 2
    with pytest.raises(AssertionError):
        schema.RawTuple(-1)


def test_clone_keeps_subclass_metadata_and_empty_structs():
    class MyList(schema.List):
        pass

    class MyStruct(schema.Struct):
        pass

    lst = MyList(schema.Scalar(np.int32, metadata=schema.Metadata(categorical_limit=4)))
    lst.lengths.set_metadata(schema.Metadata(expected_value=2.0))
    c = lst.clone()
    assert type(c) is MyList and c == lst and c is not lst
    assert c.value.metadata.categorical_limit == 4
    assert c.lengths.metadata.expected_value == 2.0
    st = MyStruct(("a", schema.Scalar(blob=core.BlobReference("x"))), ("e", schema.Struct()))
    c = st.clone()
    assert type(c) is MyStruct and "e" in c.fields and c.field_blobs() == ["x"]
    assert not st.clone_schema().has_blobs()


def test_pickling_round_trips():
    s = nested()
    s2 = pickle.loads(pickle.dumps(s))
    assert s2 == s
    assert isinstance(s2.b, schema.List) and isinstance(s2.c.keys, schema.Scalar)
    assert s2.c.keys.id() == 4
    assert getattr(s2, "missing", None) is None
    with pytest.raises(TypeError):
        s2.a = schema.Scalar()


def test_scalar_dtypes_shapes_and_values():
    assert schema.Scalar(np.int32).field_type().shape == ()
    assert schema.Scalar((np.int32, 1)).field_type().shape == (1,)
    assert schema.Scalar((np.int32, (2, 3))).field_type().shape == (2, 3)
    with pytest.raises(ValueError):
        schema.Scalar((np.int32, -1))
    with pytest.raises(TypeError):
        schema.Scalar((np.void, (2,)))
    assert schema.Scalar((None, (2,))).field_type() == np.dtype((np.float64, (2,)))
    with pytest.raises(ValueError, match="ambiguous"):
        schema.Scalar(blob="name")
    # Values are converted to the dtype; a 0-d value becomes one row.
    s = schema.Scalar(np.float32, blob=3)
    assert s().dtype == np.float32 and s().shape == (1,)
    # The inner shape is taken from a 2-d value.
    s = schema.Scalar(np.int64, blob=np.zeros((4, 3)))
    assert s.field_type() == np.dtype((np.int64, (3,)))
    # Empty values get the dtype's inner shape.
    assert schema.Scalar((np.float32, 2), blob=[]).get().shape == (0, 2)
    # Untyped scalars take arrays only, and do not infer a type from them.
    assert schema.Scalar(blob=np.array([1, 2])).field_type() == np.dtype(np.void)
    with pytest.raises(AssertionError, match="Invalid blob type"):
        schema.Scalar(blob=[1, 2])
    with pytest.raises(AssertionError, match="structured dtype"):
        schema.Scalar(np.dtype([("x", np.int32), ("y", np.float32)]))
    with pytest.raises(AssertionError, match="categorical_limit"):
        schema.Scalar(np.float32, metadata=schema.Metadata(categorical_limit=3))


def test_set_value_checks_types_on_request():
    s = schema.Scalar(np.int32)
    s.set_value(np.array([1], dtype=np.int32), throw_on_type_mismatch=True, unsafe=True)
    with pytest.raises(AssertionError, match="Expected int32"):
        s.set_value(np.array([1.0]), throw_on_type_mismatch=True, unsafe=True)
    s.set_type(np.int64)
    assert s.field_type() == np.dtype(np.int64)


def test_from_dtype():
    assert schema.from_dtype(np.dtype(np.float32)) == schema.Scalar(np.float32)
    st = schema.from_dtype(np.dtype([("x", np.int32)]))
    assert st.field_names() == ["x"] and st.field_types() == [np.dtype(np.int32)]


def test_from_column_list_rebuilds_lists_and_maps_in_any_order():
    st = schema.Struct(
        ("a", schema.Scalar()),
        ("b", schema.List(schema.Scalar())),
        ("c", schema.Map(schema.Scalar(), schema.Scalar())),
    )
    assert schema.from_column_list([]) == schema.Struct()
    columns = st.field_names()
    rng = random.Random(4)
    for _ in range(5):
        blobs = [core.BlobReference("blob:" + c) for c in columns]
        rec = schema.from_column_list(columns, col_blobs=blobs)
        assert rec.has_blobs()
        assert sorted(rec.field_names()) == sorted(columns)
        assert [str(b) for b in rec.field_blobs()] == ["blob:" + n for n in rec.field_names()]
        assert isinstance(rec.b, schema.List) and isinstance(rec.c, schema.List)
        assert isinstance(rec.c.keys, schema.Scalar)
        rng.shuffle(columns)
    typed = schema.from_column_list(
        ["x", "y:z"],
        col_types=[np.int32, np.float32],
        col_metadata=[schema.Metadata(categorical_limit=2), None],
    )
    assert typed.x.metadata.categorical_limit == 2
    assert typed.field_types() == [np.dtype(np.int32), np.dtype(np.float32)]
    with pytest.raises(AssertionError, match="same length"):
        schema.from_column_list(["x"], col_types=[])


def test_from_blob_list_keeps_schema_and_metadata():
    s = schema.Struct(
        ("a", schema.Scalar(np.float32)),
        ("b", schema.Scalar(np.int32, metadata=schema.Metadata(categorical_limit=5))),
        ("e", schema.Struct()),
    )
    rec = schema.from_blob_list(s, [np.array([3.4]), np.array([2])])
    assert rec.b.metadata.categorical_limit == 5
    assert rec.a().dtype == np.float32
    assert "e" in rec.fields and len(rec.e.fields) == 0
    assert not s.has_blobs()
    with pytest.raises(AssertionError, match="Values must have 2 elements, got 1"):
        schema.from_blob_list(s, [np.array([1.0])])


def test_as_record():
    assert schema.as_record(np.int32) == schema.Scalar(np.int32)
    rec = schema.as_record({"x": np.int32, "y": [np.float32, str]})
    assert rec.field_names() == ["x", "y:field_0", "y:field_1"]
    pairs = schema.as_record([("p", np.int32), ("q", np.int64)])
    assert pairs.field_names() == ["p", "q"]
    assert schema.schema_check(pairs, previous=pairs) is pairs
    with pytest.raises(AssertionError):
        schema.schema_check(pairs, previous=schema.Struct(("p", np.int32)))


def test_dtype_and_core_type_mapping():
    assert schema.data_type_for_dtype(np.dtype(np.float32)) == core.DataType.FLOAT
    assert schema.data_type_for_dtype(np.dtype((np.int64, 3))) == core.DataType.INT64
    assert schema.data_type_for_dtype(np.dtype(str)) == core.DataType.STRING
    assert schema.data_type_for_dtype(np.dtype(bool)) == core.DataType.BOOL
    with pytest.raises(TypeError, match="Unknown dtype"):
        schema.data_type_for_dtype(np.dtype(np.void))
    assert schema.dtype_for_core_type(core.DataType.FLOAT16) == np.float16
    with pytest.raises(TypeError, match="Unknown core type"):
        schema.dtype_for_core_type(100)


def test_schema_comparisons_and_metadata_helpers():
    s = nested()
    assert schema.is_schema_subset(schema.Struct(("a", np.float32)), s)
    assert not schema.is_schema_subset(schema.Struct(("z", np.float32)), s)
    assert schema.equal_schemas(s, s.clone())
    other = s.clone()
    schema.attach_metadata_to_scalars(other.b, schema.Metadata(expected_value=1.0))
    assert schema.equal_schemas(s, other)
    assert not schema.equal_schemas(s, other, check_field_metas=True)
    assert not schema.equal_schemas(s, schema.Struct(("a", np.float64)))
    assert schema.equal_schemas(
        schema.Struct(("a", np.float32)), schema.Struct(("a", np.int8)), check_field_types=False
    )


def test_records_over_a_net_and_the_workspace():
    net = core.Net("schema_records")
    rec = schema.NewRecord(net, schema.Struct(("x", np.float32), ("y", schema.List(np.int32))))
    assert [str(b) for b in rec.field_blobs()] == ["x", "y:lengths", "y:values"]
    again = schema.NewRecord(net, schema.Struct(("x", np.float32)))
    assert str(again.x()) != "x"
    scalar = schema.NewRecord(net, schema.Scalar(np.float32))
    assert str(scalar()).startswith("unnamed_scalar")
    values = [np.array([1.5], dtype=np.float32), np.array([2], dtype=np.int32)]
    values.append(np.array([4, 5], dtype=np.int32))
    schema.FeedRecord(rec, values)
    fetched = schema.FetchRecord(rec)
    assert fetched.y.lengths().tolist() == [2]
    assert fetched.y.items().tolist() == [4, 5]
    with pytest.raises(AssertionError, match="exactly 3"):
        schema.FeedRecord(rec, values[:1])
    # A record of arrays feeds too.
    schema.FeedRecord(rec, schema.from_blob_list(rec, [v * 2 for v in values]))
    assert schema.FetchRecord(rec).x().tolist() == [3.0]


def test_const_and_empty_records_build_fill_ops():
    net = core.Net("schema_const")
    arrays = schema.from_blob_list(
        schema.Struct(("v", np.float32), ("i", np.int32)),
        [np.array([1.0, 2.0], dtype=np.float32), np.array([7], dtype=np.int32)],
    )
    const = schema.ConstRecord(net, arrays)
    empty = schema.InitEmptyRecord(
        net, schema.Struct(("s", schema.Scalar((np.float32, 3))), ("u", schema.Scalar()))
    )
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob(str(const.v())).tolist() == [1.0, 2.0]
    assert workspace.FetchBlob(str(const.i())).tolist() == [7]
    assert workspace.FetchBlob(str(empty.s())).shape == (0, 3)
    assert workspace.FetchBlob(str(empty.u())).shape == (0,)
    with pytest.raises(TypeError):
        schema.InitEmptyRecord(core.Net("strict"), schema.Struct(("u", np.void)), True)


def test_repr_shows_the_tree():
    text = repr(schema.Struct(("a", schema.List(np.int32))))
    assert "Struct(" in text and "List(" in text and "a=" in text and "int32" in text


def test_field_column_methods_are_abstract():
    field = schema.Field([])
    for method in ("field_names", "field_types", "field_metadata", "field_blobs", "all_scalars"):
        with pytest.raises(NotImplementedError, match="Field is an abstract class"):
            getattr(field, method)()
