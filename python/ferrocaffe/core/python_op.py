"""Python operators: ``CreatePythonOperator`` and the gradient of ``Python`` ops.

A ``Python`` op calls a Python function each time it runs (see ``ferrocaffe._python_op``); its
gradient op, ``PythonGradient``, calls the function registered as its gradient. The gradient
op reads the forward op's inputs, outputs and output gradients (all of them, or those
``grad_output_indices`` names) and writes input gradients (all, or those of
``grad_input_indices``); it carries the forward op's arguments (its token among them).
"""

import pickle

from ferrocaffe import _python_op
from ferrocaffe.core.gradients import GradientRegistry, GradientSlice
from ferrocaffe.core.operator import CreateOperator
from ferrocaffe.proto import caffe2_pb2

__all__ = ["CreatePythonOperator", "_RegisterPythonImpl"]


def _RegisterPythonImpl(f, grad_f=None, python_func_type=None, pass_workspace=False):
    """Registers ``f`` (and ``grad_f``) and returns the token a ``Python`` op names them by.
    ``python_func_type(f)`` makes an object whose ``forward``/``backward`` are used instead; a
    ``(builder, args, kwargs)`` tuple is built here, once."""
    if python_func_type:
        obj = python_func_type(f)
        f, grad_f = obj.forward, obj.backward
    else:
        if isinstance(f, tuple):
            f = f[0](*f[1], **f[2])
        if isinstance(grad_f, tuple):
            grad_f = grad_f[0](*grad_f[1], **grad_f[2])
    token = _python_op.register_python_op(f, pass_workspace, "")
    if grad_f:
        _python_op.register_python_gradient_op(token, grad_f)
    return token


def CreatePythonOperator(
    f, inputs, outputs, grad_f=None, pass_workspace=False, python_func_type=None, *args, **kwargs
):
    """A ``Python`` operator calling ``f(inputs, outputs)`` (``f(inputs, outputs, workspace)``
    with ``pass_workspace``) when it runs, with ``grad_f`` as its gradient's function.
    ``inputs`` and ``outputs`` are lists of ``TensorCPU`` handles on the op's blobs."""
    kwargs["token"] = _RegisterPythonImpl(
        f, grad_f, python_func_type, pass_workspace=pass_workspace
    )
    return CreateOperator("Python", inputs, outputs, *args, **kwargs)


def _net_python(
    net, f, grad_f, python_func_type, pass_workspace, grad_output_indices, grad_input_indices
):
    """``Net.Python``: a function adding ``Python`` ops to ``net``."""

    def pickled(t):
        if not isinstance(t, tuple):
            return b""
        if len(t) != 3:
            raise ValueError("a builder is a (func, args, kwargs) tuple, got %d items" % len(t))
        return pickle.dumps((t[0], tuple(t[1]), dict(t[2])))

    f_builder = pickled(f)
    grad_builder = pickled(grad_f)
    if grad_f and bool(f_builder) != bool(grad_builder):
        raise ValueError("pass builder tuples as both f and grad_f, or as neither")
    extra = {}
    if f_builder:
        extra["pickled_builder"] = f_builder
        extra["pickled_grad_builder"] = grad_builder
        extra["pass_workspace"] = pass_workspace
    else:
        extra["token"] = _RegisterPythonImpl(
            f, grad_f, python_func_type, pass_workspace=pass_workspace
        )
    out_idx = list(grad_output_indices or [])
    in_idx = list(grad_input_indices or [])

    def add(*args, **kwargs):
        kwargs.update(extra)
        return net._CreateAndAddToSelf(
            "Python", *args, grad_output_indices=out_idx, grad_input_indices=in_idx, **kwargs
        )

    return add


def _indices(op, name, count):
    for a in op.arg:
        if a.name == name and len(a.ints) > 0:
            return [int(i) for i in a.ints]
    return list(range(count))


@GradientRegistry.RegisterGradient("Python")
def _python_gradient(op, g_output):
    out_idx = _indices(op, "grad_output_indices", len(op.output))
    in_idx = _indices(op, "grad_input_indices", len(op.input))
    grad_outputs = []
    for i in out_idx:
        g = g_output[i] if i < len(g_output) else None
        if g is None or isinstance(g, GradientSlice):
            raise ValueError(
                "Python operator %r: output %d (%s) needs a dense gradient, got %r"
                % (op.name, i, op.output[i], g)
            )
        grad_outputs.append(str(g))
    g_input = [None] * len(op.input)
    for i in in_idx:
        g_input[i] = str(op.input[i]) + "_grad"
    grad_op = caffe2_pb2.OperatorDef(
        type="PythonGradient",
        name=op.name,
        input=list(op.input) + list(op.output) + grad_outputs,
        output=[g_input[i] for i in in_idx],
        arg=op.arg,
    )
    if op.HasField("device_option"):
        grad_op.device_option.CopyFrom(op.device_option)
    if op.engine:
        grad_op.engine = op.engine
    return [grad_op], g_input
