"""``ferrocaffe.proto.caffe2_pb2`` (built from the schema compiled into the native module) has
exactly the messages, fields and enum values that Caffe2's caffe2.proto had, as recorded in
tests/golden/caffe2-wire-format.json, and the top-level names of Caffe2's caffe2_pb2 module."""

import json

import pytest
from conftest import side_file
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from ferrocaffe import _native
from ferrocaffe.proto import caffe2_pb2

_TYPE_NAMES = {
    getattr(FieldDescriptor, name): name[len("TYPE_") :].lower()
    for name in dir(FieldDescriptor)
    if name.startswith("TYPE_")
}


@pytest.fixture(scope="module")
def spec(golden_dir):
    return json.loads(side_file("caffe2-wire-format.json").read_text())


def _label(f) -> str:
    if f.is_required:
        return "required"
    return "repeated" if f.is_repeated else "optional"


def _default(f):
    if not f.has_default_value:
        return None
    if f.type == FieldDescriptor.TYPE_ENUM:
        return f.enum_type.values_by_number[f.default_value].name
    return f.default_value


def _field(f) -> dict:
    kind = _TYPE_NAMES[f.type]
    if f.message_type is not None:
        type_name = f.message_type.full_name
    elif f.enum_type is not None:
        type_name = f.enum_type.full_name
    else:
        type_name = kind
    return {
        "name": f.name,
        "number": f.number,
        "label": _label(f),
        "type": kind,
        "type_name": type_name,
        "default": _default(f),
        "has_default": f.has_default_value,
        "packed": f.is_packed,
        "oneof": f.containing_oneof.name if f.containing_oneof else None,
        "deprecated": f.GetOptions().deprecated,
    }


def _messages(descs):
    for d in descs:
        yield d
        yield from _messages(d.nested_types)


def _all_messages():
    return list(_messages(caffe2_pb2.DESCRIPTOR.message_types_by_name.values()))


def _all_enums():
    out = list(caffe2_pb2.DESCRIPTOR.enum_types_by_name.values())
    for m in _all_messages():
        out.extend(m.enum_types)
    return out


def test_file_package_and_syntax(spec):
    proto = descriptor_pb2.FileDescriptorProto()
    caffe2_pb2.DESCRIPTOR.CopyToProto(proto)
    assert proto.package == spec["package"] == "caffe2"
    assert (proto.syntax or "proto2") == spec["syntax"]
    assert not proto.dependency, "caffe2.proto imports nothing"


def test_same_messages_in_the_same_order(spec):
    ours = [m.full_name for m in _all_messages()]
    assert ours == [m["message"] for m in spec["messages"]]


def test_every_field_matches(spec):
    by_name = {m.full_name: m for m in _all_messages()}
    for m in spec["messages"]:
        desc = by_name[m["message"]]
        ours = [_field(f) for f in desc.fields]
        assert ours == m["fields"], m["message"]
        assert [e.full_name for e in desc.enum_types] == m["nested_enums"], m["message"]


def test_no_extensions_or_oneofs():
    for m in _all_messages():
        assert not m.extensions, m.full_name
        assert not m.oneofs, m.full_name


def test_every_enum_value_matches(spec):
    ours = {
        e.full_name: [{"name": v.name, "number": v.number} for v in e.values] for e in _all_enums()
    }
    theirs = {e["enum"]: e["values"] for e in spec["enums"]}
    assert ours == theirs


def test_rust_knows_exactly_the_same_messages(spec):
    assert sorted(_native.message_names()) == sorted(m["message"] for m in spec["messages"])


def test_module_has_caffe2s_top_level_names(spec):
    top_messages = [m["message"] for m in spec["messages"] if m["message"].count(".") == 1]
    for full in top_messages:
        cls = getattr(caffe2_pb2, full.split(".")[1])
        assert cls.DESCRIPTOR.full_name == full
    for e in spec["enums"]:
        parts = e["enum"].split(".")
        if len(parts) == 2:  # a top-level enum: the type and each value are module attributes
            wrapper = getattr(caffe2_pb2, parts[1])
            assert wrapper.DESCRIPTOR.full_name == e["enum"]
            assert wrapper.Name(e["values"][0]["number"]) == e["values"][0]["name"]
            for v in e["values"]:
                assert getattr(caffe2_pb2, v["name"]) == v["number"], v["name"]
        else:  # a nested enum: its values are attributes of the message class
            cls = getattr(caffe2_pb2, parts[1])
            for v in e["values"]:
                assert getattr(cls, v["name"]) == v["number"], (e["enum"], v["name"])
    assert caffe2_pb2.TensorProto.Segment.DESCRIPTOR.full_name == "caffe2.TensorProto.Segment"
    assert caffe2_pb2.DESCRIPTOR.package == "caffe2"


def test_device_type_aliases_that_caffe2_python_patched_in():
    # caffe2/python/__init__.py set these on caffe2_pb2; code everywhere uses caffe2_pb2.CPU.
    for short in ["CPU", "CUDA", "MKLDNN", "OPENGL", "OPENCL", "IDEEP", "HIP"]:
        assert getattr(caffe2_pb2, short) == getattr(caffe2_pb2, "PROTO_" + short), short
    assert (
        caffe2_pb2.COMPILE_TIME_MAX_DEVICE_TYPES == caffe2_pb2.PROTO_COMPILE_TIME_MAX_DEVICE_TYPES
    )
    assert caffe2_pb2.CPU == 0 and caffe2_pb2.CUDA == 1


def test_messages_behave_like_caffe2s():
    net = caffe2_pb2.NetDef(name="n")
    op = net.op.add(type="Relu", input=["x"], output=["y"])
    op.device_option.device_type = caffe2_pb2.CUDA
    t = caffe2_pb2.TensorProto()
    assert t.data_type == caffe2_pb2.TensorProto.FLOAT  # the proto2 default
    assert caffe2_pb2.NetDef.FromString(net.SerializeToString()) == net
