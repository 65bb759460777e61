"""Test-only stand-ins for the modules rnn_cell builds on, used until the real ones exist:
``ferrocaffe.model_helper`` (ModelHelper), ``ferrocaffe.brew`` (fc, sum, concat, dropout,
layer_norm), ``ferrocaffe.modeling.initializers`` (Initializer) and
``ferrocaffe.modeling.parameter_sharing`` (ParameterSharing).

``install()`` registers a stand-in only for a module that cannot be imported, so once the real
modules are in the package the RNN tests run against them. Only the parts of Caffe2's
interfaces that the RNN builders use are here, with Caffe2's emitted ops and argument order.
"""

import contextlib
import copy
import importlib
import sys
import types

from ferrocaffe import core, scope

# ----------------------------------------------------------------------------- parameter sharing
_scope_overrides = []


def _resolved_scope():
    """The current name scope after the innermost matching ParameterSharing override."""
    current = scope.CurrentNameScope()
    for overrides in reversed(_scope_overrides):
        best = None
        for prefix in overrides:
            if current.startswith(prefix) and (best is None or len(prefix) > len(best)):
                best = prefix
        if best is not None:
            return overrides[best] + current[len(best) :]
    return current


def _normalize(namescope):
    return namescope + "/" if namescope and not namescope.endswith("/") else namescope


@contextlib.contextmanager
def ParameterSharing(shared_scopes):
    current = scope.CurrentNameScope()
    _scope_overrides.append(
        {_normalize(current + k): _normalize(current + v) for k, v in shared_scopes.items()}
    )
    try:
        yield
    finally:
        _scope_overrides.pop()


# ---------------------------------------------------------------------------------- initializers
class ParameterInfo:
    def __init__(self, blob, shape):
        self.blob = blob
        self.shape = shape


class Initializer:
    def __init__(self, operator_name=None, **kwargs):
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def create_param(self, param_name, init_net, shape):
        blob = getattr(init_net, self.operator_name)(
            [], param_name, shape=shape, **self.operator_kwargs
        )
        return ParameterInfo(blob, shape)


# ---------------------------------------------------------------------------------- model helper
class ModelHelper:
    def __init__(self, name=None, init_params=True, param_model=None, arg_scope=None):
        self.name = name or "model"
        self.net = core.Net(self.name)
        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.params = param_model.params
            self._parameters_info = param_model._parameters_info
        else:
            self.param_init_net = core.Net(self.name + "_init")
            self.params = []
            self._parameters_info = {}
        self.init_params = init_params
        self._arg_scope = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}
        if arg_scope is not None:
            self._arg_scope.update(arg_scope)

    @property
    def arg_scope(self):
        return self._arg_scope

    def create_param(self, param_name, shape, initializer, tags=None):
        if isinstance(param_name, core.BlobReference):
            param_name = str(param_name)
        else:
            param_name = _resolved_scope() + param_name
        if param_name in self._parameters_info:
            return self._parameters_info[param_name].blob
        info = initializer.create_param(
            param_name=core.BlobReference(param_name), init_net=self.param_init_net, shape=shape
        )
        self._parameters_info[param_name] = info
        self.params.append(info.blob)
        return info.blob

    def AddGradientOperators(self, *args, **kwargs):
        return self.net.AddGradientOperators(*args, **kwargs)


# ------------------------------------------------------------------------------------------ brew
def _with_arg_scope(helper):
    def wrapper(model, *args, **kwargs):
        merged = copy.deepcopy(model.arg_scope)
        merged.update(kwargs)
        return helper(model, *args, **merged)

    wrapper.__name__ = helper.__name__
    return wrapper


def _fc(model, blob_in, blob_out, dim_in, dim_out, weight_init=None, bias_init=None, **kwargs):
    weight_init = weight_init or ("XavierFill", {})
    bias_init = bias_init or ("ConstantFill", {})
    weight = model.create_param(
        param_name=blob_out + "_w",
        shape=[dim_out, dim_in],
        initializer=Initializer(weight_init[0], **weight_init[1]),
    )
    bias = model.create_param(
        param_name=blob_out + "_b",
        shape=[dim_out],
        initializer=Initializer(bias_init[0], **bias_init[1]),
    )
    return model.net.FC([blob_in, weight, bias], blob_out, **kwargs)


def _sum(model, blob_in, blob_out, **kwargs):
    return model.net.Sum(blob_in, blob_out, **kwargs)


def _concat(model, blobs_in, blob_out, **kwargs):
    if kwargs.get("order") and kwargs.get("axis"):
        kwargs.pop("order")
    return model.net.Concat(blobs_in, [blob_out, "_" + blob_out + "_concat_dims"], **kwargs)[0]


def _dropout(model, blob_in, blob_out, use_cudnn=False, **kwargs):
    kwargs["engine"] = "CUDNN" if use_cudnn else "DEFAULT"
    assert "is_test" in kwargs, "Argument 'is_test' is required"
    return model.net.Dropout(blob_in, [blob_out, "_" + blob_out + "_mask"], **kwargs)[0]


def _layer_norm(
    model, blob_in, blob_out, dim_in, axis=1, epsilon=1e-4, initial_scale=1.0, initial_bias=0.0
):
    normalized, mean, std = model.net.LayerNorm(
        [blob_in], [blob_out, blob_out + "_mean", blob_out + "_std"], axis=axis, epsilon=epsilon
    )
    shape = [dim_in] if isinstance(dim_in, int) else dim_in
    scale = model.create_param(
        param_name=f"{blob_out}_scale",
        shape=shape,
        initializer=Initializer("ConstantFill", value=initial_scale),
    )
    bias = model.create_param(
        param_name=f"{blob_out}_bias",
        shape=shape,
        initializer=Initializer("ConstantFill", value=initial_bias),
    )
    scaled = model.net.Mul([normalized, scale], [f"{blob_out}_scaled"], broadcast=1, axis=axis)
    biased = model.net.Add([scaled, bias], [f"{blob_out}_biased"], broadcast=1, axis=axis)
    return biased, mean, std


# ---------------------------------------------------------------------------------- installation
def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _importable(name):
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


STANDINS = {
    "ferrocaffe.model_helper": lambda: _module("ferrocaffe.model_helper", ModelHelper=ModelHelper),
    "ferrocaffe.brew": lambda: _module(
        "ferrocaffe.brew",
        fc=_with_arg_scope(_fc),
        sum=_with_arg_scope(_sum),
        concat=_with_arg_scope(_concat),
        dropout=_with_arg_scope(_dropout),
        layer_norm=_layer_norm,
    ),
    "ferrocaffe.modeling": lambda: _module("ferrocaffe.modeling", __path__=[]),
    "ferrocaffe.modeling.initializers": lambda: _module(
        "ferrocaffe.modeling.initializers", Initializer=Initializer
    ),
    "ferrocaffe.modeling.parameter_sharing": lambda: _module(
        "ferrocaffe.modeling.parameter_sharing", ParameterSharing=ParameterSharing
    ),
}


def install():
    """Register the stand-ins for the modules that are missing; returns their names."""
    installed = []
    for name, make in STANDINS.items():
        if not _importable(name):
            sys.modules[name] = make()
            installed.append(name)
    return installed
