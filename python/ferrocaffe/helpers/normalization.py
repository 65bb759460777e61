"""Normalization layers: ``lrn``, ``softmax``, ``instance_norm``, ``spatial_bn``,
``spatial_gn``, ``layer_norm``, ``moments_with_running_stats``.

Parameters are named after the output blob: ``_s`` / ``_b`` (scale / bias), ``_rm`` / ``_riv``
(running mean / running inverse variance, computed parameters); training-mode outputs
``_sm`` / ``_siv`` hold the saved batch statistics.
"""

from ferrocaffe import scope
from ferrocaffe.modeling import initializers
from ferrocaffe.modeling.parameter_info import ParameterTags
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "lrn",
    "softmax",
    "instance_norm",
    "spatial_bn",
    "spatial_gn",
    "layer_norm",
    "moments_with_running_stats",
]


def _runs_on_cpu(kwargs):
    dev = kwargs["device_option"] if "device_option" in kwargs else scope.CurrentDeviceScope()
    return dev is None or dev.device_type == caffe2_pb2.CPU


def lrn(model, blob_in, blob_out, order="NCHW", use_cudnn=False, **kwargs):
    """``LRN``: on CPU with a second output ``_<blob_out>_scale``; cuDNN (GPU only) has one."""
    cudnn = use_cudnn and not _runs_on_cpu(kwargs)
    if cudnn:
        kwargs["engine"] = "CUDNN"
        blobs_out = blob_out
    else:
        blobs_out = [blob_out, "_" + blob_out + "_scale"]
    result = model.net.LRN(blob_in, blobs_out, order=order, **kwargs)
    return result if cudnn else result[0]


def softmax(model, blob_in, blob_out=None, use_cudnn=False, **kwargs):
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    if blob_out is not None:
        return model.net.Softmax(blob_in, blob_out, **kwargs)
    return model.net.Softmax(blob_in, **kwargs)


def _is_test(kwargs):
    return "is_test" in kwargs and kwargs["is_test"]


def instance_norm(model, blob_in, blob_out, dim_in, order="NCHW", **kwargs):
    """``InstanceNorm([blob_in, <out>_s, <out>_b], ...)`` with scale 1 and bias 0 fills; with
    ``is_test`` only the output, else also ``_sm`` / ``_siv``. Returns the output (a 1-tuple
    form with is_test, as Caffe2: the op's single output reference)."""
    blob_out = blob_out or model.net.NextName()
    scale = model.param_init_net.ConstantFill([], blob_out + "_s", shape=[dim_in], value=1.0)
    bias = model.param_init_net.ConstantFill([], blob_out + "_b", shape=[dim_in], value=0.0)
    model.AddParameter(scale, ParameterTags.WEIGHT)
    model.AddParameter(bias, ParameterTags.BIAS)
    if _is_test(kwargs):
        return model.net.InstanceNorm([blob_in, scale, bias], [blob_out], order=order, **kwargs)
    outputs = [blob_out, blob_out + "_sm", blob_out + "_siv"]
    return model.net.InstanceNorm([blob_in, scale, bias], outputs, order=order, **kwargs)[0]


def _constant_initializers(model, custom_and_values):
    """Per (custom initializer, fill value): an Initializer (ConstantFill with that value) or an
    ExternalInitializer without init_params."""
    if not model.init_params:
        return [initializers.ExternalInitializer() for _ in custom_and_values]
    return [
        initializers.update_initializer(
            custom, ("ConstantFill", {"value": value}), ("ConstantFill", {})
        )
        for custom, value in custom_and_values
    ]


def spatial_bn(
    model,
    blob_in,
    blob_out,
    dim_in,
    init_scale=1.0,
    init_bias=0.0,
    ScaleInitializer=None,
    BiasInitializer=None,
    RunningMeanInitializer=None,
    RunningVarianceInitializer=None,
    order="NCHW",
    **kwargs,
):
    """``SpatialBN`` with parameters ``_s`` (init_scale), ``_b`` (init_bias) and computed
    parameters ``_rm`` (0) / ``_riv`` (1). Training mode writes the running statistics in
    place and the saved ones to ``_sm`` / ``_siv``."""
    blob_out = blob_out or model.net.NextName()
    scale_i, bias_i, rm_i, riv_i = _constant_initializers(
        model,
        [
            (ScaleInitializer, init_scale),
            (BiasInitializer, init_bias),
            (RunningMeanInitializer, 0.0),
            (RunningVarianceInitializer, 1.0),
        ],
    )
    scale = model.create_param(
        param_name=blob_out + "_s", shape=[dim_in], initializer=scale_i, tags=ParameterTags.WEIGHT
    )
    bias = model.create_param(
        param_name=blob_out + "_b", shape=[dim_in], initializer=bias_i, tags=ParameterTags.BIAS
    )
    running_mean = model.create_param(
        param_name=blob_out + "_rm",
        shape=[dim_in],
        initializer=rm_i,
        tags=ParameterTags.COMPUTED_PARAM,
    )
    running_inv_var = model.create_param(
        param_name=blob_out + "_riv",
        shape=[dim_in],
        initializer=riv_i,
        tags=ParameterTags.COMPUTED_PARAM,
    )
    inputs = [blob_in, scale, bias, running_mean, running_inv_var]
    if _is_test(kwargs):
        return model.net.SpatialBN(inputs, [blob_out], order=order, **kwargs)
    outputs = [blob_out, running_mean, running_inv_var, blob_out + "_sm", blob_out + "_siv"]
    return model.net.SpatialBN(inputs, outputs, order=order, **kwargs)[0]


def spatial_gn(
    model,
    blob_in,
    blob_out,
    dim_in,
    init_scale=1.0,
    init_bias=0.0,
    ScaleInitializer=None,
    BiasInitializer=None,
    RunningMeanInitializer=None,
    RunningVarianceInitializer=None,
    order="NCHW",
    **kwargs,
):
    """Group normalization (``GroupNorm``), outputs ``blob_out``, ``_mean``, ``_std``."""
    blob_out = blob_out or model.net.NextName()
    scale_i, bias_i = _constant_initializers(
        model, [(ScaleInitializer, init_scale), (BiasInitializer, init_bias)]
    )
    scale = model.create_param(
        param_name=blob_out + "_s", shape=[dim_in], initializer=scale_i, tags=ParameterTags.WEIGHT
    )
    bias = model.create_param(
        param_name=blob_out + "_b", shape=[dim_in], initializer=bias_i, tags=ParameterTags.BIAS
    )
    outputs = [blob_out, blob_out + "_mean", blob_out + "_std"]
    return model.net.GroupNorm([blob_in, scale, bias], outputs, **kwargs)[0]


def layer_norm(
    model,
    blob_in,
    blob_out,
    dim_in,
    axis=1,
    epsilon=1e-4,
    initial_scale=1.0,
    initial_bias=0.0,
):
    """``LayerNorm([blob_in, <out>_scale, <out>_bias], [out, out_mean, out_std])`` with the
    affine transform done by the op (``elementwise_affine=True``); ``dim_in`` is an int or a
    shape. Returns (output, mean, std)."""
    shape = [dim_in] if isinstance(dim_in, int) else dim_in
    scale = model.create_param(
        param_name=f"{blob_out}_scale",
        shape=shape,
        initializer=initializers.Initializer("ConstantFill", value=initial_scale),
        tags=ParameterTags.WEIGHT,
    )
    bias = model.create_param(
        param_name=f"{blob_out}_bias",
        shape=shape,
        initializer=initializers.Initializer("ConstantFill", value=initial_bias),
        tags=ParameterTags.BIAS,
    )
    normalized, mean, std = model.net.LayerNorm(
        [blob_in, scale, bias],
        [blob_out, blob_out + "_mean", blob_out + "_std"],
        axis=axis,
        epsilon=epsilon,
        elementwise_affine=True,
    )
    return normalized, mean, std


def moments_with_running_stats(
    model,
    blob_in,
    blob_out,
    dim_in,
    RunningMeanInitializer=None,
    RunningVarianceInitializer=None,
    order="NCHW",
    **kwargs,
):
    """Batch mean and variance over the non-channel axes (``Moments``, outputs ``_sm`` and
    ``_sv``), with running-statistics parameters ``_rm`` / ``_riv`` created alongside."""
    rm_i, riv_i = _constant_initializers(
        model, [(RunningMeanInitializer, 0.0), (RunningVarianceInitializer, 1.0)]
    )
    model.create_param(
        param_name=blob_out + "_rm",
        shape=[dim_in],
        initializer=rm_i,
        tags=ParameterTags.COMPUTED_PARAM,
    )
    model.create_param(
        param_name=blob_out + "_riv",
        shape=[dim_in],
        initializer=riv_i,
        tags=ParameterTags.COMPUTED_PARAM,
    )
    outputs = [blob_out + "_sm", blob_out + "_sv"]
    axes = {"NCHW": [0, 2, 3], "NHWC": [0, 1, 2]}.get(order)
    if axes is None:
        raise ValueError(f"moments_with_running_stats: unknown order {order!r}")
    return model.net.Moments([blob_in], outputs, axes=axes, order=order, keepdims=False, **kwargs)
