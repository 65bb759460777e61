"""Parameter initializers: each one adds the fill operator(s) that create a parameter to the
init net and returns its ``ParameterInfo``.

``Initializer('XavierFill', **kwargs)`` adds ``XavierFill([], name, shape=shape, **kwargs)``;
``ExternalInitializer`` adds nothing (the blob is expected to be fed); the pseudo-FP16 variants
keep a float32 master copy next to a float16 blob.
"""

from ferrocaffe.core.blob import BlobReference, DataType, ScopedBlobReference
from ferrocaffe.modeling.parameter_info import ParameterInfo

__all__ = [
    "Initializer",
    "ExternalInitializer",
    "PseudoFP16Initializer",
    "ReversePseudoFP16Initializer",
    "update_initializer",
]


class Initializer:
    """Fills a parameter with ``operator_name`` (a fill op type) and its keyword arguments."""

    def __init__(self, operator_name=None, **kwargs):
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def update(self, operator_name, kwargs):
        if self.operator_name is not None:
            raise Exception("Operator name overwrites are not allowed")
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def _fill(self, init_net, name, shape):
        return getattr(init_net, self.operator_name)([], name, shape=shape, **self.operator_kwargs)

    def create_param(self, param_name, init_net, shape):
        param = self._fill(init_net, param_name, shape)
        return ParameterInfo(param_id=None, param=param, shape=shape)


class ExternalInitializer:
    """The parameter is provided from outside (fed or loaded): no operator is added."""

    def create_param(self, param_name, init_net, shape):
        if isinstance(param_name, BlobReference):
            param = BlobReference(str(param_name), init_net)
        elif isinstance(param_name, str):
            param = ScopedBlobReference(param_name, init_net)
        else:
            raise TypeError("Unsupported type for param_name")
        return ParameterInfo(param_id=None, param=param, shape=shape)


class PseudoFP16Initializer(Initializer):
    """A float32 master copy ``<name>_fp32`` filled as usual, and the float16 parameter made
    from it with ``FloatToHalf``."""

    def create_param(self, param_name, init_net, shape):
        master = self._fill(init_net, param_name + "_fp32", shape)
        param = init_net.FloatToHalf(master, param_name)
        return ParameterInfo(
            param_id=None, param=param, shape=shape, blob_copy={DataType.FLOAT: master}
        )


class ReversePseudoFP16Initializer(Initializer):
    """The float16 parameter filled as usual, plus a float32 copy ``<name>_fp32`` made from it
    with ``HalfToFloat``."""

    def create_param(self, param_name, init_net, shape):
        param = self._fill(init_net, param_name, shape)
        copy32 = init_net.HalfToFloat(param, param_name + "_fp32")
        return ParameterInfo(
            param_id=None, param=param, shape=shape, blob_copy={DataType.FLOAT: copy32}
        )


def update_initializer(
    initializer_class, operator_name_and_kwargs, default_operator_name_and_kwargs
):
    """An instance of ``initializer_class`` (``Initializer`` when None) built from
    ``operator_name_and_kwargs`` (``(op_type, kwargs)``), or from the default pair when that is
    None. Lets a caller pass a custom fill op, a custom initializer class, or both."""
    # Only the first two items count (Caffe2 read [0] and [1]; callers pass longer tuples).
    chosen = operator_name_and_kwargs or default_operator_name_and_kwargs
    op_name, op_kwargs = chosen[0], chosen[1]
    cls = initializer_class if initializer_class is not None else Initializer
    return cls(op_name, **op_kwargs)
