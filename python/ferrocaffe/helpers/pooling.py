"""Pooling: ``max_pool`` (``MaxPool``), ``average_pool`` (``AveragePool``) and
``max_pool_with_index`` (``MaxPoolWithIndex``, whose second output ``<blob_out>_index`` holds
the argmax positions)."""

__all__ = ["max_pool", "average_pool", "max_pool_with_index"]


def max_pool(model, blob_in, blob_out, use_cudnn=False, order="NCHW", **kwargs):
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.MaxPool(blob_in, blob_out, order=order, **kwargs)


def average_pool(model, blob_in, blob_out, use_cudnn=False, order="NCHW", **kwargs):
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.AveragePool(blob_in, blob_out, order=order, **kwargs)


def max_pool_with_index(model, blob_in, blob_out, order="NCHW", **kwargs):
    return model.net.MaxPoolWithIndex(
        blob_in, [blob_out, blob_out + "_index"], order=order, **kwargs
    )[0]
