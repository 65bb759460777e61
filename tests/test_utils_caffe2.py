"""Caffe2's ``utils`` helpers: tensor/proto conversions, reading protobufs as text or binary,
``OpAlmostEqual``, ``EnumClassKeyVals``, ``debug``/``DebugMode`` and ``raiseIfNotEqual``."""

import types

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from ferrocaffe import core, utils
from ferrocaffe.proto import caffe2_pb2

T = caffe2_pb2.TensorProto


@pytest.mark.parametrize(
    "dtype,data_type,field",
    [
        (np.float32, T.FLOAT, "float_data"),
        (np.float64, T.DOUBLE, "double_data"),
        (np.int64, T.INT64, "int64_data"),
        (np.int32, T.INT32, "int32_data"),
        (np.int16, T.INT16, "int32_data"),
        (np.uint16, T.UINT16, "int32_data"),
        (np.int8, T.INT8, "int32_data"),
        (np.uint8, T.UINT8, "int32_data"),
    ],
)
def test_numpy_tensor_proto_round_trip(dtype, data_type, field):
    arr = (np.arange(6) - 2).reshape(2, 3).astype(dtype)
    tensor = utils.NumpyArrayToCaffe2Tensor(arr, "t")
    assert tensor.name == "t" and list(tensor.dims) == [2, 3]
    assert tensor.data_type == data_type
    assert list(getattr(tensor, field)) == arr.ravel().tolist()
    back = utils.Caffe2TensorToNumpyArray(tensor)
    np.testing.assert_array_equal(back, arr)
    assert back.shape == (2, 3)


def test_unsupported_types_raise():
    with pytest.raises(RuntimeError, match="Numpy data type not supported yet: bool"):
        utils.NumpyArrayToCaffe2Tensor(np.zeros(2, dtype=bool))
    with pytest.raises(RuntimeError, match="Tensor data type not supported yet"):
        utils.Caffe2TensorToNumpyArray(T(data_type=T.STRING))


def test_caffe_blob_to_numpy_array_both_layouts():
    old = types.SimpleNamespace(num=1, channels=2, height=1, width=2, data=[1, 2, 3, 4])
    assert utils.CaffeBlobToNumpyArray(old).shape == (1, 2, 1, 2)
    new = types.SimpleNamespace(num=0, shape=types.SimpleNamespace(dim=[4]), data=[1, 2, 3, 4])
    out = utils.CaffeBlobToNumpyArray(new)
    assert out.dtype == np.float32 and out.tolist() == [1, 2, 3, 4]


def test_read_proto_text_or_binary(tmp_path):
    net = caffe2_pb2.NetDef(name="n", external_input=["x"])
    assert utils.TryReadProtoWithClass(caffe2_pb2.NetDef, str(net)) == net
    assert utils.TryReadProtoWithClass(caffe2_pb2.NetDef, net.SerializeToString()) == net
    with pytest.raises(DecodeError):
        utils.TryReadProtoWithClass(caffe2_pb2.NetDef, b"\xff\xff\xff")
    fmap = {caffe2_pb2.PlanDef: lambda p: "plan", caffe2_pb2.NetDef: lambda n: n.name}
    assert utils.GetContentFromProto(net, fmap) == "n"
    assert utils.GetContentFromProto(caffe2_pb2.OperatorDef(), fmap) is None
    assert utils.GetContentFromProtoString(str(net), {caffe2_pb2.NetDef: lambda n: n.name}) == "n"
    with pytest.raises(DecodeError, match="Cannot find a fit protobuffer class"):
        utils.GetContentFromProtoString(b"\xff\xff\xff", {caffe2_pb2.NetDef: lambda n: n})
    src, dst = tmp_path / "net.pbtxt", tmp_path / "net.pb"
    src.write_text(str(net))
    utils.ConvertProtoToBinary(caffe2_pb2.NetDef, str(src), str(dst))
    assert caffe2_pb2.NetDef.FromString(dst.read_bytes()) == net


def test_op_almost_equal_ignores_named_fields():
    a = core.CreateOperator("Relu", ["x"], ["y"], name="a")
    b = core.CreateOperator("Relu", ["x"], ["y"], name="b")
    assert not utils.OpAlmostEqual(a, b)
    assert utils.OpAlmostEqual(a, b, "name")
    assert utils.OpAlmostEqual(a, b, ["name"])
    with pytest.raises(AssertionError, match="text type"):
        utils.OpAlmostEqual(a, b, [1])


def test_enum_class_key_vals():
    class Colors:
        RED = "red"
        BLUE = "blue"
        lower = "ignored"
        NUMBER = 3

    assert utils.EnumClassKeyVals(Colors) == {"RED": "red", "BLUE": "blue"}

    class Dup:
        A = "x"
        B = "x"

    with pytest.raises(AssertionError, match="duplicate entries"):
        utils.EnumClassKeyVals(Dup)
    with pytest.raises(AssertionError):
        utils.EnumClassKeyVals(Colors())


def test_debug_passes_results_and_raise_if_not_equal():
    @utils.debug
    def add(a, b=1):
        return a + b

    assert add(2, b=3) == 5
    assert add.__name__ == "add"
    assert utils.DebugMode.run(lambda: 7) == 7
    with pytest.raises(KeyboardInterrupt):
        utils.DebugMode.run(lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    utils.raiseIfNotEqual(1, 1, "same")
    with pytest.raises(Exception, match=r"sizes differ\. 1 != 2"):
        utils.raiseIfNotEqual(1, 2, "sizes differ")
