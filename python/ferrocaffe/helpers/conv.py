"""Convolutions: ``conv`` (2-D), ``conv_nd``, ``conv_transpose``, ``group_conv``.

The weight ``<blob_out>_w`` has shape ``[dim_out, dim_in / group, *kernel]`` in NCHW order and
``[dim_out, *kernel, dim_in / group]`` in NHWC; the bias ``<blob_out>_b`` is ``[dim_out]``
(left out with ``no_bias=True``). With ``use_cudnn`` (on in the model's default arg_scope) the
op gets ``engine='CUDNN'`` and an ``exhaustive_search`` argument.
"""

from ferrocaffe import core
from ferrocaffe.modeling import initializers
from ferrocaffe.modeling.parameter_info import ParameterTags

__all__ = ["conv", "conv_nd", "conv_transpose", "group_conv"]


def _ConvBase(
    model,
    is_nd,
    blob_in,
    blob_out,
    dim_in,
    dim_out,
    kernel,
    weight_init=None,
    bias_init=None,
    WeightInitializer=None,
    BiasInitializer=None,
    group=1,
    transform_inputs=None,
    use_cudnn=False,
    order="NCHW",
    cudnn_exhaustive_search=False,
    ws_nbytes_limit=None,
    float16_compute=False,
    **kwargs,
):
    if is_nd:
        kernels = kernel if isinstance(kernel, list) else [kernel]
    elif isinstance(kernel, list):
        assert len(kernel) == 2, "Conv support only a 2D kernel."
        kernels = kernel
    else:
        kernels = [kernel] * 2

    requested_engine = kwargs.get("engine")
    if requested_engine is not None:
        if use_cudnn and requested_engine != "CUDNN":
            raise ValueError('When use_cudnn=True, the only engine you can specify is "CUDNN"')
        if not use_cudnn and requested_engine == "CUDNN":
            raise ValueError('When use_cudnn=False, the only engine you can specify is ""')

    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit

    use_bias = not kwargs.get("no_bias", False)
    blob_out = blob_out or model.net.NextName()
    channels = int(dim_in / group)
    if order == "NCHW":
        weight_shape = [dim_out, channels, *kernels]
    else:
        weight_shape = [dim_out, *kernels, channels]

    WeightInitializer = initializers.update_initializer(
        WeightInitializer, weight_init, ("XavierFill", {})
    )
    BiasInitializer = initializers.update_initializer(
        BiasInitializer, bias_init, ("ConstantFill", {})
    )
    if not model.init_params:
        WeightInitializer = initializers.ExternalInitializer()
        BiasInitializer = initializers.ExternalInitializer()

    weight = model.create_param(
        param_name=blob_out + "_w",
        shape=weight_shape,
        initializer=WeightInitializer,
        tags=ParameterTags.WEIGHT,
    )
    inputs = [blob_in, weight]
    if use_bias:
        inputs.append(
            model.create_param(
                param_name=blob_out + "_b",
                shape=[dim_out],
                initializer=BiasInitializer,
                tags=ParameterTags.BIAS,
            )
        )
    if transform_inputs is not None:
        transform_inputs(model, blob_out, inputs)
    if float16_compute:
        kwargs["float16_compute"] = True
    # The op tells a missing bias from its input count.
    kwargs.pop("no_bias", None)
    if group != 1:
        kwargs["group"] = group

    if is_nd:
        return model.net.Conv(inputs, blob_out, kernels=kernels, order=order, **kwargs)
    if isinstance(kernel, list):
        return model.net.Conv(
            inputs, blob_out, kernel_h=kernel[0], kernel_w=kernel[1], order=order, **kwargs
        )
    return model.net.Conv(inputs, blob_out, kernel=kernel, order=order, **kwargs)


def conv_nd(
    model,
    blob_in,
    blob_out,
    dim_in,
    dim_out,
    kernel,
    weight_init=None,
    bias_init=None,
    WeightInitializer=None,
    BiasInitializer=None,
    group=1,
    transform_inputs=None,
    order="NCHW",
    **kwargs,
):
    """N-d convolution: ``kernel`` is a list with one size per spatial axis (``kernels``)."""
    return _ConvBase(
        model,
        True,
        blob_in,
        blob_out,
        dim_in,
        dim_out,
        kernel,
        weight_init,
        bias_init,
        WeightInitializer,
        BiasInitializer,
        group,
        transform_inputs,
        order=order,
        **kwargs,
    )


def conv(
    model,
    blob_in,
    blob_out,
    dim_in,
    dim_out,
    kernel,
    weight_init=None,
    bias_init=None,
    WeightInitializer=None,
    BiasInitializer=None,
    group=1,
    transform_inputs=None,
    **kwargs,
):
    """2-D convolution: ``kernel`` is one size (``kernel`` argument) or ``[h, w]``
    (``kernel_h``/``kernel_w``)."""
    return _ConvBase(
        model,
        False,
        blob_in,
        blob_out,
        dim_in,
        dim_out,
        kernel,
        weight_init,
        bias_init,
        WeightInitializer,
        BiasInitializer,
        group,
        transform_inputs,
        **kwargs,
    )


def conv_transpose(
    model,
    blob_in,
    blob_out,
    dim_in,
    dim_out,
    kernel,
    weight_init=None,
    bias_init=None,
    use_cudnn=False,
    order="NCHW",
    cudnn_exhaustive_search=False,
    ws_nbytes_limit=None,
    **kwargs,
):
    """Transposed convolution; the weight is ``[dim_in, dim_out, k, k]`` (NCHW) or
    ``[dim_in, k, k, dim_out]`` (NHWC)."""
    weight_init = weight_init if weight_init else ("XavierFill", {})
    bias_init = bias_init if bias_init else ("ConstantFill", {})
    blob_out = blob_out or model.net.NextName()
    if order == "NCHW":
        weight_shape = [dim_in, dim_out, kernel, kernel]
    else:
        weight_shape = [dim_in, kernel, kernel, dim_out]
    if model.init_params:
        weight = getattr(model.param_init_net, weight_init[0])(
            [], blob_out + "_w", shape=weight_shape, **weight_init[1]
        )
        bias = getattr(model.param_init_net, bias_init[0])(
            [], blob_out + "_b", shape=[dim_out], **bias_init[1]
        )
    else:
        weight = core.ScopedBlobReference(blob_out + "_w", model.param_init_net)
        bias = core.ScopedBlobReference(blob_out + "_b", model.param_init_net)
    model.AddParameter(weight, ParameterTags.WEIGHT)
    model.AddParameter(bias, ParameterTags.BIAS)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    return model.net.ConvTranspose(
        [blob_in, weight, bias], blob_out, kernel=kernel, order=order, **kwargs
    )


def group_conv(
    model,
    blob_in,
    blob_out,
    dim_in,
    dim_out,
    kernel,
    weight_init=None,
    bias_init=None,
    group=1,
    **kwargs,
):
    """``conv`` with ``group`` (kept for older code)."""
    return conv(
        model,
        blob_in,
        blob_out,
        dim_in,
        dim_out,
        kernel,
        weight_init=weight_init,
        bias_init=bias_init,
        group=group,
        **kwargs,
    )
