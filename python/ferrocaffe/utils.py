"""Helpers of Caffe2's ``utils`` module that the builder API uses: ``MakeArgument`` (Python value
-> ``caffe2_pb2.Argument``) and ``ArgsToDict`` (the reverse, for a list of Arguments).
"""

import collections.abc

import numpy as np
from google.protobuf.message import Message

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
