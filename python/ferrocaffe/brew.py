"""Caffe2's ``brew``: model-building helpers called with the model first.

    brew.fc(model, "data", "fc1", dim_in=10, dim_out=16)
    brew.relu(model, "fc1", "relu1")

Each call passes the model's ``arg_scope`` (``order``, ``use_cudnn``,
``cudnn_exhaustive_search`` by default) as keyword arguments (only the ones a helper names
when it takes no ``**kwargs``), then what ``brew.arg_scope`` sets for that helper, then the
caller's own keyword arguments; later ones win. Helpers are looked up by name in a registry
(``brew.Register(func)`` adds one; ``brew.has_helper(name_or_func)`` asks).
"""

import copy
import inspect

from ferrocaffe.helpers import algebra as _algebra
from ferrocaffe.helpers import arg_scope as _arg_scope
from ferrocaffe.helpers import array_helpers as _array_helpers
from ferrocaffe.helpers import control_ops as _control_ops
from ferrocaffe.helpers import conv as _conv
from ferrocaffe.helpers import db_input as _db_input
from ferrocaffe.helpers import dropout as _dropout
from ferrocaffe.helpers import elementwise_linear as _elementwise_linear
from ferrocaffe.helpers import fc as _fc
from ferrocaffe.helpers import nonlinearity as _nonlinearity
from ferrocaffe.helpers import normalization as _normalization
from ferrocaffe.helpers import pooling as _pooling
from ferrocaffe.helpers import train as _train

__all__ = ["Register", "has_helper"]

_registry = {
    "arg_scope": _arg_scope.arg_scope,
    "fc": _fc.fc,
    "packed_fc": _fc.packed_fc,
    "dropout": _dropout.dropout,
    "max_pool": _pooling.max_pool,
    "average_pool": _pooling.average_pool,
    "max_pool_with_index": _pooling.max_pool_with_index,
    "lrn": _normalization.lrn,
    "softmax": _normalization.softmax,
    "instance_norm": _normalization.instance_norm,
    "spatial_bn": _normalization.spatial_bn,
    "spatial_gn": _normalization.spatial_gn,
    "moments_with_running_stats": _normalization.moments_with_running_stats,
    "relu": _nonlinearity.relu,
    "prelu": _nonlinearity.prelu,
    "tanh": _nonlinearity.tanh,
    "concat": _array_helpers.concat,
    "depth_concat": _array_helpers.depth_concat,
    "sum": _algebra.sum,
    "reduce_sum": _algebra.reduce_sum,
    "sub": _algebra.sub,
    "arg_min": _algebra.arg_min,
    "transpose": _algebra.transpose,
    "iter": _train.iter,
    "accuracy": _train.accuracy,
    "conv": _conv.conv,
    "conv_nd": _conv.conv_nd,
    "conv_transpose": _conv.conv_transpose,
    "group_conv": _conv.group_conv,
    "add_weight_decay": _train.add_weight_decay,
    "elementwise_linear": _elementwise_linear.elementwise_linear,
    "layer_norm": _normalization.layer_norm,
    "mat_mul": _algebra.mat_mul,
    "batch_mat_mul": _algebra.batch_mat_mul,
    "db_input": _db_input.db_input,
    "cond": _control_ops.cond,
    "loop": _control_ops.loop,
}


def _model_of(args, kwargs):
    from ferrocaffe.model_helper import ModelHelper

    if args and isinstance(args[0], ModelHelper):
        return args[0]
    if "model" in kwargs:
        return kwargs["model"]
    raise RuntimeError(
        "The first input of helper function should be model. "
        "Or you can provide it in kwargs as model=<your_model>."
    )


def _wrap(helper_name):
    func = _registry[helper_name]

    def scope_wrapper(*args, **kwargs):
        new_kwargs = {}
        if helper_name != "arg_scope":
            new_kwargs = copy.deepcopy(_model_of(args, kwargs).arg_scope)
        spec = inspect.getfullargspec(func)
        if spec.varkw is None:
            # A helper without **kwargs only gets the scope values it names.
            named = spec.args + spec.kwonlyargs
            new_kwargs = {name: new_kwargs[name] for name in named if name in new_kwargs}
        new_kwargs.update(_arg_scope.get_current_scope().get(helper_name, {}))
        new_kwargs.update(kwargs)
        return func(*args, **new_kwargs)

    scope_wrapper.__name__ = helper_name
    scope_wrapper.__qualname__ = helper_name
    scope_wrapper.__doc__ = func.__doc__
    return scope_wrapper


def __getattr__(helper_name):
    if helper_name.startswith("__") or helper_name not in _registry:
        raise AttributeError(f"Helper function {helper_name} not registered.")
    return _wrap(helper_name)


def __dir__():
    return sorted(set(globals()) | set(_registry))


def Register(helper):
    """Add ``helper`` (a function taking the model first) under its ``__name__``."""
    name = helper.__name__
    if name in _registry:
        raise AttributeError(f"Helper {name} already exists. Please change your helper name.")
    _registry[name] = helper


def has_helper(helper_or_helper_name):
    name = (
        helper_or_helper_name
        if isinstance(helper_or_helper_name, str)
        else helper_or_helper_name.__name__
    )
    return name in _registry
