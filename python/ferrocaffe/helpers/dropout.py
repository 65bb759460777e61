"""``dropout``: ``Dropout(blob_in, [blob_out, _<blob_out>_mask], ...)``; ``is_test`` must be
given."""

__all__ = ["dropout"]


def dropout(model, blob_in, blob_out, use_cudnn=False, **kwargs):
    kwargs["engine"] = "CUDNN" if use_cudnn else "DEFAULT"
    assert "is_test" in kwargs, "Argument 'is_test' is required"
    return model.net.Dropout(blob_in, [blob_out, "_" + blob_out + "_mask"], **kwargs)[0]
