"""Caffe2's ``helpers`` package: the functions behind ``brew`` (``brew.fc`` is
``helpers.fc.fc`` with the model's ``arg_scope`` applied). Each takes the model first and adds
parameter fills to ``model.param_init_net`` and operators to ``model.net``."""
