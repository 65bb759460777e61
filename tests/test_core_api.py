"""core.Net's schema records (input/output records), its lookup-table check, op names from
creation tracebacks, and Caffe2's `[enforce fail at ...]` marker on enforced op failures."""

import inspect

import numpy as np
import pytest

from ferrocaffe import core, schema, workspace


def setup_function(_):
    workspace.ResetWorkspace()


def test_input_record_without_blobs_gets_scoped_external_inputs():
    net = core.Net("rec_in")
    rec = net.set_input_record(schema.Struct(("x", schema.Scalar(np.float32))))
    assert rec.has_blobs()
    assert str(rec.x()) == net.Name() + "/x"
    assert net.BlobIsDefined(rec.x())
    assert rec.x() in net.external_inputs
    assert net.input_record() is rec
    # Setting it again to the same blobs is allowed; to other blobs it is not.
    assert net.set_input_record(rec) is rec
    assert list(net.Proto().external_input) == [str(rec.x())]
    with pytest.raises(AssertionError, match="Input schema cannot be reset"):
        net.set_input_record(schema.Struct(("y", schema.Scalar())))


def test_input_record_with_blobs_keeps_them():
    net = core.Net("rec_in_blobs")
    rec = schema.NewRecord(net, schema.Struct(("x", np.float32), ("l", schema.List(np.int32))))
    net.AddExternalInput(rec.x())
    assert net.set_input_record(rec) is rec
    assert list(net.Proto().external_input) == ["x", "l:lengths", "l:values"]


def test_output_record_must_be_defined_and_becomes_external_outputs():
    net = core.Net("rec_out")
    y = net.ConstantFill([], "y", shape=[1], value=1.0)
    with pytest.raises(AssertionError, match="is not defined"):
        net.set_output_record(schema.Struct(("z", schema.Scalar(blob=core.BlobReference("z")))))
    out = schema.Struct(("y", schema.Scalar(blob=y)))
    net.set_output_record(out)
    assert net.output_record() is out
    assert list(net.Proto().external_output) == ["y"]
    w = net.ConstantFill([], "w", shape=[1], value=2.0)
    net.AppendOutputRecordField("extra", schema.Scalar(blob=w))
    assert net.output_record().field_names() == ["y", "extra"]
    assert list(net.Proto().external_output) == ["y", "w"]
    with pytest.raises(AssertionError, match="Output schema cannot be reset"):
        net.set_output_record(schema.Struct(("w", schema.Scalar(blob=w))))
    with pytest.raises(AssertionError, match="missing output record"):
        core.Net("no_out").AppendOutputRecordField("f", schema.Scalar(blob=w))


def test_records_recovered_from_prefixed_external_blobs():
    net = core.Net("rec_recover")
    net.AddExternalInput("in:a", "in:b:lengths", "in:b:values", "other")
    net.recover_input_record_by_prefix("in:")
    rec = net.input_record()
    assert rec.field_names() == ["a", "b:lengths", "b:values"]
    assert isinstance(rec.b, schema.List)
    assert [str(b) for b in rec.field_blobs()] == ["in:a", "in:b:lengths", "in:b:values"]
    net.recover_output_record_by_prefix("none:")
    assert net.output_record() is None
    net.ConstantFill([], "out:v", shape=[1])
    net.Proto().external_output.append("out:v")
    net.recover_output_record_by_prefix("out:")
    assert net.output_record().field_blobs() == ["out:v"]


def test_check_lookup_tables_catches_ops_added_behind_the_nets_back():
    net = core.Net("lookup")
    net.Sum(["a", "b"], ["c"])
    net._CheckLookupTables()
    net.Proto().op.extend([core.CreateOperator("Relu", ["c"], ["d"])])
    with pytest.raises(AssertionError, match="d"):
        net._CheckLookupTables()
    # Reading through the net rebuilds the tables.
    assert net.BlobIsDefined("d")
    net._CheckLookupTables()
    net.Proto().external_input.append("late")
    with pytest.raises(AssertionError, match="late"):
        net._CheckLookupTables()


def test_populate_proto_with_file_name_names_ops_after_their_creation_site():
    net = core.Net("traceback_names")
    a = net.AddExternalInput("a")
    net.Relu(a, "b")
    frame = inspect.currentframe()
    line = frame.f_lineno - 2
    op = core.CreateOperator("Relu", ["b"], ["c"])
    net.Proto().op.extend([op])  # not added through the net: no traceback recorded
    net.PopulateProtoWithFileName()
    assert net.Proto().op[0].name == f"{__file__}:{line}:{frame.f_code.co_name}"
    assert net.Proto().op[1].name == ""
    # A net without recorded tracebacks is left as it is.
    other = core.Net(net.Proto())
    other.Proto().op[0].name = "kept"
    other.PopulateProtoWithFileName()
    assert other.Proto().op[0].name == "kept"


@pytest.mark.parametrize("net_type", ["simple", "dag"])
def test_enforced_op_failures_carry_caffe2s_marker(net_type):
    net = core.Net("enforce_" + net_type)
    net.Proto().type = net_type
    a = net.AddExternalInput("a")
    net.Split(a, ["b", "c"], axis=0)
    workspace.FeedBlob(a, np.array([1, 2, 3], dtype=np.float32))
    with pytest.raises(RuntimeError) as info:
        workspace.RunNetOnce(net)
    text = str(info.value)
    assert text.startswith("[enforce fail at Split operator] If you did not specify split"), text
    assert "(Error from operator: type Split" in text
