"""Caffe2's ``Python`` and ``PythonGradient`` operators, the Python half.

The Rust runtime runs these ops like any other; when it creates one it asks
:func:`_make_kernel` (installed with ``_native.set_python_op_factory``) for the op's kernel,
and each run calls that kernel with the workspace the op runs in, holding the GIL only for
that call. The function a kernel calls is found by the op's ``token`` argument (functions
registered with :func:`register_python_op`) or built once per op instance from its
``pickled_builder`` argument (``(builder, args, kwargs)``: ``builder(*args, **kwargs)`` returns
the function), as Caffe2 did.

Functions get ``(inputs, outputs)`` (and the workspace when registered with
``pass_workspace``): lists of :class:`ferrocaffe._import_c_extension.TensorCPU`, views of the
op's blobs. An exception they raise ends the run and reaches the caller unchanged, with a note
naming the op.
"""

import itertools
import pickle
import threading

from ferrocaffe import _native
from ferrocaffe.proto import caffe2_pb2

__all__ = ["register_python_op", "register_python_gradient_op"]

_lock = threading.Lock()
_counter = itertools.count()
# token -> [forward function, gradient function or None, pass_workspace]
_functions = {}


def register_python_op(func, pass_workspace=False, name=""):
    """Registers ``func`` as the function of ``Python`` ops whose ``token`` argument is the
    returned token. Registered functions stay alive for the process (ops refer to them by
    token, as in Caffe2)."""
    if not callable(func):
        raise TypeError("a Python operator needs a callable, got %s" % type(func).__name__)
    with _lock:
        token = "python_op:%s:%d" % (name or getattr(func, "__name__", "f"), next(_counter))
        _functions[token] = [func, None, bool(pass_workspace)]
    return token


def register_python_gradient_op(token, func):
    """Registers ``func`` as the function of the ``PythonGradient`` ops of ``token``."""
    if not callable(func):
        raise TypeError("a Python gradient operator needs a callable")
    with _lock:
        if token not in _functions:
            raise KeyError("no Python operator is registered with token %r" % (token,))
        _functions[token][1] = func


def _arg(op, name):
    for a in op.arg:
        if a.name == name:
            return a
    return None


def _built(pickled):
    func, args, kwargs = pickle.loads(pickled)
    return func(*args, **kwargs)


def _function_of(op, gradient):
    token = _arg(op, "token")
    if token is not None:
        key = token.s.decode("utf-8")
        entry = _functions.get(key)
        if entry is None:
            raise RuntimeError(
                "%s operator %r: no Python function is registered with token %r"
                % (op.type, op.name, key)
            )
        func = entry[1] if gradient else entry[0]
        if func is None:
            raise RuntimeError(
                "%s operator %r: the Python operator of token %r has no gradient function"
                % (op.type, op.name, key)
            )
        return func, entry[2]
    builder = _arg(op, "pickled_grad_builder" if gradient else "pickled_builder")
    if builder is None or not builder.s:
        raise RuntimeError(
            "%s operator %r needs a 'token' or a 'pickled_builder' argument" % (op.type, op.name)
        )
    pass_ws = _arg(op, "pass_workspace")
    return _built(builder.s), bool(pass_ws is not None and pass_ws.i)


def _make_kernel(op_type, op_bytes):
    """The kernel of one op instance (called by the runtime when it creates the op)."""
    from ferrocaffe import _import_c_extension as C

    op = caffe2_pb2.OperatorDef.FromString(op_bytes)
    func, pass_workspace = _function_of(op, op_type == "PythonGradient")
    inputs = list(op.input)
    outputs = list(op.output)

    def run(ws):
        ins = [C.TensorCPU(ws, n) for n in inputs]
        outs = [C.TensorCPU(ws, n) for n in outputs]
        if pass_workspace:
            func(ins, outs, C.Workspace._wrap(ws))
        else:
            func(ins, outs)

    return run


_native.set_python_op_factory(_make_kernel)
