"""Caffe2's ``utils`` module: ``MakeArgument`` (Python value -> ``caffe2_pb2.Argument``) and
``ArgsToDict`` (the reverse), conversions between numpy arrays and ``TensorProto``/Caffe
``BlobProto``, reading protobufs given as text or binary, ``OpAlmostEqual``, ``DebugMode`` /
``debug`` (post-mortem debugger on an unhandled exception), ``EnumClassKeyVals``, layout
transposes and the shared iteration counter of optimizers.
"""

import collections.abc
import copy
import functools
import sys

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message

from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "MakeArgument",
    "ArgsToDict",
    "BuildUniqueMutexIter",
    "OPTIMIZER_ITERATION_NAME",
    "OPTIMIZER_ITERATION_LR_NAME",
    "ITERATION_MUTEX_NAME",
    "ITERATION_MUTEX_LR_NAME",
    "NCHW2NHWC",
    "NHWC2NCHW",
    "OpAlmostEqual",
    "CaffeBlobToNumpyArray",
    "Caffe2TensorToNumpyArray",
    "NumpyArrayToCaffe2Tensor",
    "TryReadProtoWithClass",
    "GetContentFromProto",
    "GetContentFromProtoString",
    "ConvertProtoToBinary",
    "GetGPUMemoryUsageStats",
    "ResetBlobs",
    "DebugMode",
    "raiseIfNotEqual",
    "debug",
    "EnumClassKeyVals",
]

# Blob names of the shared iteration counter that optimizers create.
OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
OPTIMIZER_ITERATION_LR_NAME = "optimizer_iteration_lr"
ITERATION_MUTEX_NAME = "iteration_mutex"
ITERATION_MUTEX_LR_NAME = "iteration_mutex_lr"


def _is_float(v):
    return type(v) in (float, np.float64)


def _is_int(v):
    return type(v) in (int, bool, np.int64)


def MakeArgument(key, value):
    """Encode ``value`` as an Argument named ``key``, choosing the field from the value's type.

    Scalars: float -> ``f``; int and bool -> ``i``; bytes/str -> ``s`` (str as UTF-8); a NetDef
    -> ``n``; any other protobuf message -> ``s`` (its serialization). Iterables (lists, tuples,
    dicts by key, numpy arrays flattened): all floats -> ``floats``, all ints/bools -> ``ints``,
    all bytes/str -> ``strings``, all NetDefs -> ``nets``, all messages -> ``strings``. An empty
    iterable sets nothing. numpy scalars are converted to Python values first.
    """
    argument = caffe2_pb2.Argument()
    argument.name = key
    iterable = isinstance(value, collections.abc.Iterable)

    # float32 arrays go straight to `floats` without per-element checks.
    if isinstance(value, np.ndarray) and value.dtype.type is np.float32:
        argument.floats.extend(value.flatten().tolist())
        return argument

    if isinstance(value, np.ndarray):
        value = value.flatten().tolist()
    elif isinstance(value, np.generic):
        value = value.item()

    if type(value) is float:
        argument.f = value
    elif type(value) in (int, bool):
        # bools are stored as 0/1 (the protobuf runtime no longer converts them itself).
        argument.i = int(value)
    elif isinstance(value, bytes):
        argument.s = value
    elif isinstance(value, str):
        argument.s = value.encode("utf-8")
    elif isinstance(value, caffe2_pb2.NetDef):
        argument.n.CopyFrom(value)
    elif isinstance(value, Message):
        argument.s = value.SerializeToString()
    elif iterable and all(_is_float(v) for v in value):
        argument.floats.extend(v.item() if type(v) is np.float64 else v for v in value)
    elif iterable and all(_is_int(v) for v in value):
        argument.ints.extend(int(v) for v in value)
    elif iterable and all(isinstance(v, bytes | str) for v in value):
        argument.strings.extend(v.encode("utf-8") if isinstance(v, str) else v for v in value)
    elif iterable and all(isinstance(v, caffe2_pb2.NetDef) for v in value):
        argument.nets.extend(value)
    elif iterable and all(isinstance(v, Message) for v in value):
        argument.strings.extend(v.SerializeToString() for v in value)
    elif iterable:
        raise ValueError(
            f"Unknown iterable argument type: key={key} value={value}, value type={type(value)}[{ ({type(v) for v in value}) }]"
        )
    else:
        raise ValueError(
            f"Unknown argument type: key={key} value={value}, value type={type(value)}"
        )
    return argument


def ArgsToDict(args):
    """Map each named Argument to its value: the first field (in schema order) that is set, the
    repeated container itself for list fields, or None when no value is set. Arguments without
    a name are skipped."""
    ans = {}
    for arg in args:
        if not arg.HasField("name"):
            continue
        ans[arg.name] = None
        for field in arg.DESCRIPTOR.fields:
            if field.name == "name":
                continue
            if _is_repeated(field):
                values = getattr(arg, field.name)
                if len(values) > 0:
                    ans[arg.name] = values
                    break
            elif arg.HasField(field.name):
                ans[arg.name] = getattr(arg, field.name)
                break
    return ans


def _is_repeated(field):
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == field.LABEL_REPEATED


def BuildUniqueMutexIter(init_net, net, iter=None, iter_mutex=None, iter_val=0):
    """The iteration counter blob ``iter`` (default ``optimizer_iteration``), created once.

    When ``init_net`` does not define it yet: an int64 ``[1]`` ConstantFill of ``iter_val`` and
    a ``CreateMutex`` (``iter_mutex``, default ``iteration_mutex``) in ``init_net``, and an
    ``AtomicIter([mutex, iter], [iter])`` in ``net``; all three on CPU with the extra_info
    ``device_type_override:cpu``. Otherwise the existing blob is returned.
    """
    from ferrocaffe import core, scope

    iter = iter if iter is not None else OPTIMIZER_ITERATION_NAME
    iter_mutex = iter_mutex if iter_mutex is not None else ITERATION_MUTEX_NAME
    if init_net.BlobIsDefined(iter):
        return init_net.GetBlobRef(iter)
    cpu = core.DeviceOption(caffe2_pb2.CPU, extra_info=["device_type_override:cpu"])
    with scope.DeviceScope(cpu):
        iteration = init_net.ConstantFill(
            [], iter, shape=[1], value=iter_val, dtype=core.DataType.INT64
        )
        iter_mutex = init_net.CreateMutex([], [iter_mutex])
        net.AtomicIter([iter_mutex, iteration], [iteration])
    return iteration


def NHWC2NCHW(tensor):
    """The channels-last array ``tensor`` (N, spatial..., C) as channels-first
    (N, C, spatial...): a transposed view."""
    assert tensor.ndim >= 1
    last = tensor.ndim - 1
    return tensor.transpose((0, last, *range(1, last)))


def NCHW2NHWC(tensor):
    """The channels-first array ``tensor`` (N, C, spatial...) as channels-last
    (N, spatial..., C): a transposed view."""
    assert tensor.ndim >= 2
    return tensor.transpose((0, *range(2, tensor.ndim), 1))


def OpAlmostEqual(op_a, op_b, ignore_fields=None):
    """Whether two OperatorDefs are equal once the fields named in ``ignore_fields`` (a name or
    a list of names) are cleared in both."""
    if ignore_fields is None:
        ignore_fields = []
    elif not isinstance(ignore_fields, list):
        ignore_fields = [ignore_fields]
    if not all(isinstance(f, str) for f in ignore_fields):
        raise AssertionError(f"Expect each field is text type, but got {ignore_fields}")

    def cleared(op):
        op = copy.deepcopy(op)
        for field in ignore_fields:
            if op.HasField(field):
                op.ClearField(field)
        return op

    a, b = cleared(op_a), cleared(op_b)
    return a == b or str(a) == str(b)


def CaffeBlobToNumpyArray(blob):
    """A (legacy Caffe) ``BlobProto`` as a float32 array: NCHW from ``num/channels/height/width``
    when ``num`` is set, else shaped by ``shape.dim``."""
    data = np.asarray(blob.data, dtype=np.float32)
    if blob.num != 0:
        return data.reshape(blob.num, blob.channels, blob.height, blob.width)
    return data.reshape(blob.shape.dim)


_T = caffe2_pb2.TensorProto
# TensorProto data type -> (numpy dtype, the repeated field holding the values).
_PROTO_TENSOR_FIELDS = {
    _T.FLOAT: (np.float32, "float_data"),
    _T.DOUBLE: (np.float64, "double_data"),
    _T.INT64: (np.int64, "int64_data"),
    _T.INT32: (np.int64, "int32_data"),  # Caffe2 read INT32 back as numpy's default int
    _T.INT16: (np.int16, "int32_data"),
    _T.UINT16: (np.uint16, "int32_data"),
    _T.INT8: (np.int8, "int32_data"),
    _T.UINT8: (np.uint8, "int32_data"),
}
_NUMPY_TENSOR_TYPES = {
    np.dtype(np.float32): (_T.FLOAT, "float_data", float),
    np.dtype(np.float64): (_T.DOUBLE, "double_data", np.float64),
    np.dtype(np.int64): (_T.INT64, "int64_data", np.int64),
    np.dtype(np.int32): (_T.INT32, "int32_data", int),
    np.dtype(np.int16): (_T.INT16, "int32_data", int),
    np.dtype(np.uint16): (_T.UINT16, "int32_data", int),
    np.dtype(np.int8): (_T.INT8, "int32_data", int),
    np.dtype(np.uint8): (_T.UINT8, "int32_data", int),
}


def Caffe2TensorToNumpyArray(tensor):
    """The values of a ``TensorProto`` as a numpy array of its dims (the numeric types only;
    others raise RuntimeError)."""
    try:
        dtype, field = _PROTO_TENSOR_FIELDS[tensor.data_type]
    except KeyError:
        raise RuntimeError(f"Tensor data type not supported yet: {tensor.data_type}") from None
    return np.asarray(getattr(tensor, field), dtype=dtype).reshape(tensor.dims)


def NumpyArrayToCaffe2Tensor(arr, name=None):
    """A ``TensorProto`` holding ``arr`` (numeric dtypes; the small integer types go to
    ``int32_data`` as in Caffe2), named ``name`` if given."""
    try:
        data_type, field, convert = _NUMPY_TENSOR_TYPES[arr.dtype]
    except KeyError:
        raise RuntimeError(f"Numpy data type not supported yet: {arr.dtype}") from None
    tensor = caffe2_pb2.TensorProto()
    tensor.dims.extend(arr.shape)
    if name:
        tensor.name = name
    tensor.data_type = data_type
    getattr(tensor, field).extend(convert(v) for v in arr.ravel().tolist())
    return tensor


def TryReadProtoWithClass(cls, s):
    """``s`` (text format, or else binary) parsed as a ``cls`` message; raises
    ``DecodeError`` when it is neither."""
    obj = cls()
    try:
        text_format.Parse(s, obj)
    except (text_format.ParseError, UnicodeDecodeError, TypeError):
        obj = cls()
        obj.ParseFromString(s if isinstance(s, bytes) else s.encode("latin-1"))
    return obj


def GetContentFromProto(obj, function_map):
    """``function_map[type(obj)](obj)`` for the class in ``function_map`` that ``obj`` is
    exactly an instance of (None if none)."""
    for cls, func in function_map.items():
        if type(obj) is cls:
            return func(obj)
    return None


def GetContentFromProtoString(s, function_map):
    """Parse ``s`` with the first class of ``function_map`` that decodes it and apply that
    class's function; ``DecodeError`` if none does."""
    for cls, func in function_map.items():
        try:
            obj = TryReadProtoWithClass(cls, s)
        except DecodeError:
            continue
        return func(obj)
    raise DecodeError("Cannot find a fit protobuffer class.")


def ConvertProtoToBinary(proto_class, filename, out_filename):
    """Write the ``proto_class`` message read from the file ``filename`` (text or binary) to
    ``out_filename`` in binary."""
    with open(filename, "rb") as f:
        content = f.read()
    try:
        content = content.decode("utf-8")
    except UnicodeDecodeError:
        pass
    proto = TryReadProtoWithClass(proto_class, content)
    with open(out_filename, "wb") as f:
        f.write(proto.SerializeToString())


def GetGPUMemoryUsageStats():
    """The GPU memory statistics of Caffe2's ``GetGPUMemoryUsage`` operator (per GPU and in
    total, current and peak)."""
    from ferrocaffe import core, workspace

    workspace.RunOperatorOnce(
        core.CreateOperator(
            "GetGPUMemoryUsage",
            [],
            ["____mem____"],
            device_option=core.DeviceOption(workspace.GpuDeviceType, 0),
        )
    )
    stats = workspace.FetchBlob("____mem____")
    return {
        "total_by_gpu": stats[0, :],
        "max_by_gpu": stats[1, :],
        "total": np.sum(stats[0, :]),
        "max_total": np.sum(stats[1, :]),
    }


def ResetBlobs(blobs):
    """Free the contents of ``blobs`` (Caffe2's ``Free`` operator, in place)."""
    from ferrocaffe import core, workspace

    names = list(blobs)
    workspace.RunOperatorOnce(
        core.CreateOperator("Free", names, names, device_option=core.DeviceOption(caffe2_pb2.CPU))
    )


class DebugMode:
    """Runs a function and, if it raises (anything but KeyboardInterrupt), prints the error,
    opens the post-mortem debugger and exits with status 1::

        DebugMode.run(main)
    """

    @classmethod
    def run(cls, func):
        try:
            return func()
        except KeyboardInterrupt:
            raise
        except Exception:
            import pdb  # only when it is needed: a debugger session follows

            print(
                'Entering interactive debugger. Type "bt" to print the full stacktrace. '
                'Type "help" to see command listing.'
            )
            print(sys.exc_info()[1])
            pdb.post_mortem()
            sys.exit(1)


def raiseIfNotEqual(a, b, msg):
    """Raise ``Exception("<msg>. a != b")`` when ``a != b``."""
    if a != b:
        raise Exception(f"{msg}. {a} != {b}")


def debug(f):
    """Decorator: run ``f`` under ``DebugMode`` (a debugger on an unhandled exception)."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return DebugMode.run(lambda: f(*args, **kwargs))

    return wrapper


def EnumClassKeyVals(cls):
    """The string constants of the class ``cls`` whose names are upper case, as a dict;
    two names with the same value are an error."""
    if type(cls) is not type:
        raise AssertionError(f"{cls} is not a class")
    enum = {}
    for key in dir(cls):
        if key != key.upper():
            continue
        value = getattr(cls, key)
        if not isinstance(value, str):
            continue
        for other, seen in enum.items():
            if seen == value:
                raise AssertionError(
                    f"Failed to resolve {cls} as Enum: duplicate entries "
                    f"{key}={value}, {other}={value}"
                )
        enum[key] = value
    return enum
