"""Caffe2's ``scope`` module: the thread-local name scope and device scope.

``NameScope('a')`` makes blob names created through ``ScopedName`` / ``ScopedBlobReference`` and
``CreateOperator`` start with ``a/``; ``DeviceScope(option)`` makes new operators carry that
``DeviceOption``. Both are context managers that restore the previous scope on exit and are
kept per thread.
"""

import contextlib
import threading

from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "CurrentNameScope",
    "CurrentDeviceScope",
    "NameScope",
    "DeviceScope",
    "EmptyNameScope",
    "EmptyDeviceScope",
]

_NAMESCOPE_SEPARATOR = "/"

_threadlocal_scope = threading.local()


def CurrentNameScope():
    """The current name scope prefix ('' or a string ending with '/')."""
    if not hasattr(_threadlocal_scope, "namescope"):
        _threadlocal_scope.namescope = ""
    return _threadlocal_scope.namescope


def CurrentDeviceScope():
    """The current DeviceOption, or None outside any DeviceScope."""
    if not hasattr(_threadlocal_scope, "devicescope"):
        _threadlocal_scope.devicescope = None
    return _threadlocal_scope.devicescope


@contextlib.contextmanager
def NameScope(prefix, reset=False):
    """Append ``prefix + '/'`` to the name scope (or replace it with ``reset=True``).

    An empty or None prefix adds nothing (and with ``reset`` clears the scope).
    """
    assert isinstance(prefix, str | bytes) or prefix is None, (
        "NameScope takes in a string as its argument."
    )
    old_scope = CurrentNameScope()
    # bytes are accepted by the check but fail here, as in Caffe2 (str + bytes).
    prefix = prefix + _NAMESCOPE_SEPARATOR if prefix else ""
    if reset:
        _threadlocal_scope.namescope = prefix
    else:
        _threadlocal_scope.namescope = old_scope + prefix
    try:
        yield
    finally:
        assert _threadlocal_scope.namescope.endswith(prefix), (
            "The namescope variable is changed from outside NameScope() calls."
        )
        _threadlocal_scope.namescope = old_scope


@contextlib.contextmanager
def DeviceScope(scope, node_name=None):
    """Make ``scope`` (a copy of it) the current DeviceOption.

    A nested scope inherits the outer ``node_name`` unless it sets its own, and merges the
    outer ``extra_info`` entries into its own (sorted).
    """
    new_scope = caffe2_pb2.DeviceOption()
    if scope:
        assert isinstance(scope, caffe2_pb2.DeviceOption), (
            "DeviceScope takes in a caffe2_pb2.DeviceOption as its argument."
        )
        new_scope.CopyFrom(scope)
    else:
        assert node_name, "At least one argument should be non-null in DeviceScope"

    if node_name:
        new_scope.node_name = node_name
    old_scope = CurrentDeviceScope()
    if old_scope is not None:
        if old_scope.HasField("node_name") and not new_scope.HasField("node_name"):
            new_scope.node_name = old_scope.node_name
        new_scope.extra_info.extend(old_scope.extra_info)
        new_scope.extra_info.sort()

    _threadlocal_scope.devicescope = new_scope
    try:
        yield
    finally:
        assert _threadlocal_scope.devicescope == new_scope, (
            "The device scope is changed from outside DeviceScope() calls."
        )
        _threadlocal_scope.devicescope = old_scope


@contextlib.contextmanager
def EmptyNameScope():
    """Clear the name scope inside the block."""
    old_scope = CurrentNameScope()
    _threadlocal_scope.namescope = ""
    try:
        yield
    finally:
        _threadlocal_scope.namescope = old_scope


@contextlib.contextmanager
def EmptyDeviceScope():
    """Clear the device scope inside the block (operators get no device option)."""
    old_scope = CurrentDeviceScope()
    _threadlocal_scope.devicescope = None
    try:
        yield
    finally:
        _threadlocal_scope.devicescope = old_scope
