"""Wire-format behaviour (README, "Wire format"), checked from Python: the protobuf runtime
keeps unknown fields, a trip through Rust drops them; malformed bytes raise
``ferrocaffe._native.DecodeError`` (a ValueError) naming the message, never crash."""

import pytest
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError as ProtobufDecodeError

from ferrocaffe import _native
from ferrocaffe.proto import caffe2_pb2


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


# One unknown field of each wire type, numbered beyond caffe2.proto's.
UNKNOWN = (
    _key(1000, 0)
    + _varint(300)
    + _len_field(1001, b"kept by Python, dropped by Rust")
    + _key(1002, 5)
    + bytes(4)
    + _key(1003, 1)
    + bytes(8)
)


def _net():
    net = caffe2_pb2.NetDef(name="net", external_input=["x"], external_output=["y"])
    net.op.add(type="Relu", input=["x"], output=["y"], name="relu")
    return net


def test_python_keeps_unknown_fields():
    data = _net().SerializeToString() + UNKNOWN
    msg = caffe2_pb2.NetDef.FromString(data)
    numbers = [f.field_number for f in unknown_fields.UnknownFieldSet(msg)]
    assert numbers == [1000, 1001, 1002, 1003]
    assert msg.SerializeToString() == data
    assert msg != _net()  # unknown fields take part in ==


def test_rust_drops_unknown_fields():
    data = _net().SerializeToString() + UNKNOWN
    through_rust = _native.roundtrip("NetDef", data)
    assert through_rust == _net().SerializeToString()
    back = caffe2_pb2.NetDef.FromString(through_rust)
    assert back == _net()
    assert len(unknown_fields.UnknownFieldSet(back)) == 0


def test_rust_drops_unknown_fields_of_nested_messages():
    net = _net()
    op_bytes = net.op[0].SerializeToString() + UNKNOWN
    data = _len_field(1, b"net") + _len_field(2, op_bytes)
    in_python = caffe2_pb2.NetDef.FromString(data)
    assert len(unknown_fields.UnknownFieldSet(in_python.op[0])) == 4
    back = caffe2_pb2.NetDef.FromString(_native.roundtrip("NetDef", data))
    assert back.op[0] == net.op[0]


def test_a_mistyped_field_is_unknown_to_both():
    # OperatorDef.type (4, a string) sent as a varint: protobuf keeps it as an unknown field,
    # Rust skips it; the rest of the message survives in both.
    data = _len_field(1, b"x") + _key(4, 0) + _varint(5)
    in_python = caffe2_pb2.OperatorDef.FromString(data)
    assert list(in_python.input) == ["x"] and not in_python.HasField("type")
    in_python.DiscardUnknownFields()
    assert caffe2_pb2.OperatorDef.FromString(_native.roundtrip("OperatorDef", data)) == in_python


def test_an_enum_value_outside_the_schema_survives_both():
    data = bytes([0x10, 11])  # TensorProto.data_type = 11: no DataType has that number
    assert caffe2_pb2.TensorProto.FromString(data).SerializeToString() == data
    assert _native.roundtrip("TensorProto", data) == data


def test_decode_error_is_a_value_error():
    assert issubclass(_native.DecodeError, ValueError)


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05ne",  # NetDef.name: 5 bytes announced, 2 given
        b"\x12\xff\xff\xff\xff\x0f\x0a\x01x",  # NetDef.op with a 4 GiB length
        b"\x18" + b"\xff" * 11,  # a varint longer than ten bytes
        b"\x00\x00",  # field number 0
        b"\x0e\x00",  # wire type 6
        b"\x0c",  # end of a group that never started
        b"\x0a\x02\xff\xfe",  # a string that is not UTF-8
    ],
)
def test_malformed_bytes_raise_decode_error_naming_the_message(data):
    with pytest.raises(_native.DecodeError, match=r"malformed caffe2\.NetDef protobuf: "):
        _native.roundtrip("NetDef", data)


def test_every_truncation_decodes_or_raises_decode_error():
    data = _net().SerializeToString()
    errors = 0
    for n in range(len(data)):
        try:
            caffe2_pb2.NetDef.FromString(_native.roundtrip("NetDef", data[:n]))
        except _native.DecodeError:
            errors += 1
    assert errors > len(data) // 2


def test_non_utf8_strings_python_accepts_rust_rejects():
    # proto2 does not require UTF-8; Python's runtime hands the bytes back, prost refuses.
    data = _len_field(1, b"\xff\xfe")
    assert caffe2_pb2.NetDef.FromString(data).name == b"\xff\xfe"
    with pytest.raises(_native.DecodeError, match="UTF-8"):
        _native.roundtrip("NetDef", data)


def test_overlong_field_keys_rust_accepts_python_rejects():
    # NetDef.name's key (0x0a) written in six bytes. No encoder writes this; protobuf's
    # runtimes limit a key to five bytes, prost reads up to ten.
    data = b"\x8a\x80\x80\x80\x80\x00\x01x"
    assert caffe2_pb2.NetDef.FromString(_native.roundtrip("NetDef", data)).name == "x"
    with pytest.raises(ProtobufDecodeError):
        caffe2_pb2.NetDef.FromString(data)
    # In five bytes both read it.
    five = b"\x8a\x80\x80\x80\x00\x01x"
    assert _native.roundtrip("NetDef", five) == b"\x0a\x01x"
    assert caffe2_pb2.NetDef.FromString(five).name == "x"


def test_keys_beyond_32_bits_are_rejected_by_both():
    # A five-byte key whose value needs 35 bits, then a mistyped field (something for the
    # lenient pass to drop): still an error.
    data = b"\x9d\xb6\xa6\xee\x12\x01\x48\x01"
    with pytest.raises(_native.DecodeError, match="invalid key"):
        _native.roundtrip("NetDef", data)
    with pytest.raises(ProtobufDecodeError):
        caffe2_pb2.NetDef.FromString(data)


def _nested_argument(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = _len_field(8, _len_field(2, _len_field(5, inner)))  # Argument.n.op.arg
    return inner


def test_deep_nesting_raises_decode_error():
    data = _len_field(5, _nested_argument(3000))
    with pytest.raises(_native.DecodeError, match="recursion"):
        _native.roundtrip("OperatorDef", data)
    with pytest.raises(ProtobufDecodeError):
        caffe2_pb2.OperatorDef.FromString(data)
    shallow = _len_field(5, _nested_argument(10))
    assert _native.roundtrip("OperatorDef", shallow) == shallow


def test_unknown_kind_is_a_value_error_not_a_decode_error():
    with pytest.raises(ValueError, match="unknown message type 'Bogus'") as info:
        _native.roundtrip("Bogus", b"")
    assert not isinstance(info.value, _native.DecodeError)


def test_roundtrip_takes_bytes_only():
    with pytest.raises(TypeError):
        _native.roundtrip("NetDef", "not bytes")
