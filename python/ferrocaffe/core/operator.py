"""Operator creation and the operator registry queries of Caffe2's ``core``.

``CreateOperator`` builds an ``OperatorDef`` from blob names/references and keyword arguments,
applying the current name scope to string blob names and the current device scope when no
``device_option`` is given. ``IsOperator`` asks the engine's registry
(``ferrocaffe._native.registered_operators()``).
"""

import os
import sys
import traceback

from ferrocaffe import _native, scope, utils
from ferrocaffe.core.blob import BlobReference, ScopedBlobReference
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "CreateOperator",
    "IsOperator",
    "IsOperatorWithEngine",
    "RefreshRegisteredOperators",
    "TriggerLazyImport",
    "_GetRegisteredOperators",
    "_RectifyInputOutput",
    "_REGISTERED_OPERATORS",
]

# The registry keys of every operator the engine provides (op type, or
# `<type>_ENGINE_<engine>` for engine-specific implementations).
_REGISTERED_OPERATORS = set(_native.registered_operators())

# Caffe2 suggests registered names within this many edits (insertions, deletions,
# substitutions, adjacent transpositions) of an unknown name.
_NEARBY_EDIT_TOLERANCE = 3


def RefreshRegisteredOperators():
    """Re-read the registry (after the engine registered more operators)."""
    _REGISTERED_OPERATORS.clear()
    _REGISTERED_OPERATORS.update(_native.registered_operators())


def _GetRegisteredOperators():
    return _REGISTERED_OPERATORS


def TriggerLazyImport():
    """Caffe2 imported optional operator modules here; every ferrocaffe operator is built in."""


def _op_registry_key(op_type, engine):
    if not engine or engine == "DEFAULT":
        return op_type
    return op_type + "_ENGINE_" + engine


def IsOperatorWithEngine(op_type, engine):
    """Whether ``op_type`` has an implementation for ``engine`` ('DEFAULT' for the default one)."""
    return _op_registry_key(op_type, engine) in _REGISTERED_OPERATORS


def IsOperator(op_type):
    """Whether ``op_type`` is a registered operator type (default engine)."""
    return IsOperatorWithEngine(op_type, engine="DEFAULT")


def _edit_distance(s1, s2, max_distance):
    """Caffe2's edit distance (insertions, deletions, substitutions, adjacent transpositions),
    with its early exit: ``max_distance + 1`` as soon as the lengths differ by more than
    ``max_distance`` or a whole row of the table (its first cell aside) exceeds it."""
    n1 = len(s1)
    if max_distance and abs(n1 - len(s2)) > max_distance:
        return max_distance + 1
    current = list(range(n1 + 1))
    previous = [0] * (n1 + 1)
    previous1 = [0] * (n1 + 1)
    prev2 = None
    for i, c2 in enumerate(s2, start=1):
        previous1, previous, current = previous, current, previous1
        current[0] = i
        prev1 = None
        current_min = n1
        for j, c1 in enumerate(s1, start=1):
            insertion = previous[j] + 1
            deletion = current[j - 1] + 1
            substitution = previous[j - 1] + (0 if c1 == c2 else 1)
            transposition = insertion
            if prev1 == c2 and prev2 == c1 and j > 1 and i > 1:
                transposition = previous1[j - 2] + 1
            prev1 = c1
            current[j] = min(insertion, deletion, substitution, transposition)
            current_min = min(current_min, current[j])
        if max_distance and current_min > max_distance:
            return max_distance + 1
        prev2 = c2
    return current[n1]


def _nearby_opnames(op_type):
    """Registered operator names close to ``op_type`` (sorted)."""
    return sorted(
        name
        for name in _REGISTERED_OPERATORS
        if _edit_distance(name, op_type, _NEARBY_EDIT_TOLERANCE) < _NEARBY_EDIT_TOLERANCE + 1
    )


def _not_registered_message(op_type):
    return (
        "Method "
        + op_type
        + " is not a registered operator. Did you mean: ["
        + ",".join(_nearby_opnames(op_type))
        + "]"
    )


def _RectifyInputOutput(blobs, net=None):
    """Normalise operator inputs/outputs to a list of BlobReferences.

    A string (or bytes) is one scoped name; a BlobReference is kept as is; a list or tuple may
    mix both. Anything else is a TypeError.
    """
    if isinstance(blobs, str | bytes):
        return [ScopedBlobReference(blobs, net=net)]
    if type(blobs) is BlobReference:
        return [blobs]
    if type(blobs) in (list, tuple):
        rectified = []
        for blob in blobs:
            if isinstance(blob, str | bytes):
                rectified.append(ScopedBlobReference(blob, net=net))
            elif type(blob) is BlobReference:
                rectified.append(blob)
            else:
                raise TypeError(
                    f"I/O blob #{len(rectified)} of unsupported type: {blob} of type {type(blob)}"
                )
        return rectified
    raise TypeError(f"Unknown input/output type: {blobs} of type {type(blobs)}.")


def CreateOperator(
    operator_type,
    inputs,
    outputs,
    name="",
    control_input=None,
    device_option=None,
    arg=None,
    engine=None,
    debug_info=None,
    **kwargs,
):
    """Build an OperatorDef.

    ``inputs``/``outputs``: a name, a BlobReference or a list of them (names get the current name
    scope). ``device_option`` is copied; without it the current DeviceScope is used. A
    ``random_seed`` keyword goes into the device option. ``arg`` is a list of ready Arguments;
    every other keyword whose value is not None becomes an Argument (``utils.MakeArgument``), in
    the order given. The type is not checked against the registry.
    """
    operator = caffe2_pb2.OperatorDef()
    if os.environ.get("CAFFE2_DEBUG"):
        operator.debug_info = "".join(traceback.format_stack()[:-1])

    operator.type = operator_type
    operator.name = name
    inputs = _RectifyInputOutput(inputs)
    outputs = _RectifyInputOutput(outputs)
    operator.input.extend(str(b) for b in inputs)
    operator.output.extend(str(b) for b in outputs)
    if control_input:
        control_input = _RectifyInputOutput(control_input)
        operator.control_input.extend(str(b) for b in control_input)
    if device_option is not None:
        operator.device_option.CopyFrom(device_option)
    elif scope.CurrentDeviceScope() is not None:
        operator.device_option.CopyFrom(scope.CurrentDeviceScope())
    if engine is not None:
        operator.engine = engine
    if debug_info is not None:
        operator.debug_info = debug_info
    if "random_seed" in kwargs:
        operator.device_option.random_seed = kwargs.pop("random_seed")
    if arg is not None:
        operator.arg.extend(arg)
    for key, value in kwargs.items():
        if value is not None:
            operator.arg.add().CopyFrom(utils.MakeArgument(key, value))
    # Caffe2's immediate mode (workspace.StartImmediate) runs each op as it is created.
    ws_module = sys.modules.get("ferrocaffe.workspace")
    if ws_module is not None and ws_module.IsImmediate():
        ws_module.RunOperatorImmediate(operator)
    return operator
