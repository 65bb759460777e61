"""Fully connected layers: ``fc`` (``FC``) and ``packed_fc`` (``PackedFC``).

``fc`` creates ``<blob_out>_w`` (shape ``[dim_out, dim_in]``, XavierFill by default) and
``<blob_out>_b`` (``[dim_out]``, ConstantFill), then ``FC([blob_in, w, b], blob_out,
**kwargs)`` where kwargs includes the model's arg_scope (order, use_cudnn, ...).
"""

from ferrocaffe.modeling import initializers
from ferrocaffe.modeling.parameter_info import ParameterTags

__all__ = ["fc", "packed_fc"]


def _weight_and_bias_initializers(
    model, weight_init, bias_init, WeightInitializer, BiasInitializer
):
    if not model.init_params:
        return initializers.ExternalInitializer(), initializers.ExternalInitializer()
    return (
        initializers.update_initializer(WeightInitializer, weight_init, ("XavierFill", {})),
        initializers.update_initializer(BiasInitializer, bias_init, ("ConstantFill", {})),
    )


def _FC_or_packed_FC(
    model,
    op_call,
    blob_in,
    blob_out,
    dim_in,
    dim_out,
    weight_init=None,
    bias_init=None,
    WeightInitializer=None,
    BiasInitializer=None,
    enable_tensor_core=False,
    float16_compute=False,
    **kwargs,
):
    WeightInitializer, BiasInitializer = _weight_and_bias_initializers(
        model, weight_init, bias_init, WeightInitializer, BiasInitializer
    )
    blob_out = blob_out or model.net.NextName()
    bias_tags = [ParameterTags.BIAS]
    if "freeze_bias" in kwargs:
        bias_tags.append(ParameterTags.COMPUTED_PARAM)

    weight = model.create_param(
        param_name=blob_out + "_w",
        shape=[dim_out, dim_in],
        initializer=WeightInitializer,
        tags=ParameterTags.WEIGHT,
    )
    bias = model.create_param(
        param_name=blob_out + "_b",
        shape=[dim_out],
        initializer=BiasInitializer,
        tags=bias_tags,
    )
    if enable_tensor_core:
        kwargs["engine"] = "TENSORCORE"
    if float16_compute:
        kwargs["float16_compute"] = True
    return op_call([blob_in, weight, bias], blob_out, **kwargs)


def fc(model, *args, **kwargs):
    return _FC_or_packed_FC(model, model.net.FC, *args, **kwargs)


def packed_fc(model, *args, **kwargs):
    return _FC_or_packed_FC(model, model.net.PackedFC, *args, **kwargs)
