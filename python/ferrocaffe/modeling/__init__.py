"""Caffe2's ``modeling`` package: parameter descriptions, initializers and parameter sharing,
used by ``model_helper.ModelHelper.create_param`` and the ``brew`` helpers."""
