"""Caffe2's engine preferences (``core.SetEnginePref`` and friends).

Caffe2 picked, for an op without an ``engine``, the first preferred engine that had an
implementation of the op on the op's device, else the default implementation. ferrocaffe
registers one (default) implementation per op type and device, so the preferences are
checked and kept but always end in the default implementation, as they did in Caffe2 for
engines a build lacked.
"""

from ferrocaffe.core import operator as _operator

__all__ = ["SetEnginePref", "SetGlobalEnginePref", "SetOpEnginePref", "SetPerOpEnginePref"]

# device type -> op type -> engines; device type -> engines
_per_op_pref: dict = {}
_global_pref: dict = {}


def _engines(value, what):
    if isinstance(value, (str, bytes)) or not all(isinstance(e, str) for e in value):
        raise TypeError(f"{what}: engines must be a list of strings, got {value!r}")
    return list(value)


def _device_type(value):
    if not isinstance(value, int):
        raise TypeError(f"device type must be an int (caffe2_pb2.CPU, ...), got {value!r}")
    return value


def SetPerOpEnginePref(pref):
    """``{device_type: {op_type: [engine, ...]}}``, replacing the per-op preferences of the
    device types named. Every op type must be a registered operator."""
    checked = {}
    for device_type, per_op in pref.items():
        ops = {}
        for op_type, engines in per_op.items():
            if not _operator.IsOperator(op_type):
                raise RuntimeError(
                    f"Operator type {op_type} not registered in {device_type} registry."
                )
            ops[op_type] = _engines(engines, op_type)
        checked[_device_type(device_type)] = ops
    _per_op_pref.update(checked)


def SetGlobalEnginePref(pref):
    """``{device_type: [engine, ...]}``: the engines tried for every op of the device type."""
    checked = {_device_type(d): _engines(e, str(d)) for d, e in pref.items()}
    _global_pref.update(checked)


def SetEnginePref(per_op_pref, global_pref):
    """Sets both preferences; ``SetEnginePref({}, {})`` changes nothing."""
    SetPerOpEnginePref(per_op_pref)
    SetGlobalEnginePref(global_pref)


def SetOpEnginePref(op_type, pref):
    """``{device_type: [engine, ...]}`` for one op type."""
    SetPerOpEnginePref({device_type: {op_type: engines} for device_type, engines in pref.items()})
