"""``ParameterInfo``: what a model knows about one trainable (or computed) parameter blob."""

import numpy as np

from ferrocaffe.core.blob import BlobReference, GradientSlice

__all__ = ["ParameterTags", "ParameterType", "ParameterInfo"]


class ParameterTags:
    """Tags given to ``create_param`` / ``AddParameter``: they sort a parameter into the model's
    ``weights``, ``biases`` or computed (not optimized) parameters."""

    BIAS = "BIAS"
    WEIGHT = "WEIGHT"
    COMPUTED_PARAM = "COMPUTED_PARAM"


class ParameterType:
    """Kind of gradient a parameter receives."""

    DENSE = "dense"
    SPARSE = "sparse"


class ParameterInfo:
    """A parameter blob with its shape, gradient, optional copies in other precisions
    (``blob_copy``: ``DataType`` -> BlobReference) and the optimizer chosen for it."""

    def __init__(
        self, param_id, param, key=None, shape=None, length=None, grad=None, blob_copy=None
    ):
        assert isinstance(param, BlobReference)
        self.param_id = param_id
        self.name = str(param)
        self.blob = param
        self.key = key
        self.shape = shape
        self.size = None if shape is None else np.prod(shape)
        self.length = max(1, length if length is not None else 1)
        self.grad = grad
        self._cloned_init_net = None
        self.blob_copy = blob_copy
        self._optimizer = None
        self.regularizer = None

    @property
    def parameter(self):
        return self.blob

    @property
    def optimizer(self):
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value):
        assert self._optimizer is None, "optimizer has already been set"
        self._optimizer = value

    def grad_type(self):
        """``ParameterType.SPARSE`` for a GradientSlice gradient, ``DENSE`` for a blob, None
        without a gradient."""
        if self.grad is None:
            return None
        if isinstance(self.grad, GradientSlice):
            return ParameterType.SPARSE
        return ParameterType.DENSE

    def cloned_init_net(self):
        """(net holding only the ops that initialize this parameter, the cloned blob)."""
        if not self._cloned_init_net:
            init_net, outputs = self.blob.Net().ClonePartial(
                f"param_{self.param_id}_{self.name}_init", inputs=[], outputs=[self.blob]
            )
            self._cloned_init_net = (init_net, outputs[0])
        return self._cloned_init_net

    def __str__(self):
        return self.name
