"""``concat`` and ``depth_concat``: ``Concat(blobs_in, [blob_out, _<blob_out>_concat_dims])``
(the second output holds the split sizes)."""

__all__ = ["concat", "depth_concat"]


def concat(model, blobs_in, blob_out, **kwargs):
    # The op rejects `order` together with `axis`: keep the explicit axis.
    if kwargs.get("order") and kwargs.get("axis"):
        kwargs.pop("order")
    return model.net.Concat(blobs_in, [blob_out, "_" + blob_out + "_concat_dims"], **kwargs)[0]


def depth_concat(model, blobs_in, blob_out, **kwargs):
    """The old name of ``concat``."""
    print("DepthConcat is deprecated. use Concat instead.")
    return concat(model, blobs_in, blob_out, **kwargs)
