"""Caffe2's ``helpers.control_ops``: ``brew.cond`` and ``brew.loop``, which add ``If`` and
``While`` operators (see :mod:`ferrocaffe.control_ops_util`) to a model's net."""

from ferrocaffe.control_ops_util import add_if_op, add_while_op

__all__ = ["cond", "loop"]


def cond(model, cond_blob, external_blobs, then_model, else_model=None):
    """Run ``then_model``'s net when ``cond_blob`` is true, else ``else_model``'s (if
    given). ``external_blobs`` are the names the branches share with ``model``."""
    else_net = else_model.net if else_model else None
    add_if_op(model.net, cond_blob, external_blobs, then_model.net, else_net)


def loop(model, cond_blob, external_blobs, loop_model, cond_model=None):
    """Run ``loop_model``'s net while ``cond_blob`` is true; ``cond_model``'s net (if given)
    computes ``cond_blob`` before each iteration."""
    cond_net = cond_model.net if cond_model else None
    add_while_op(model.net, cond_blob, external_blobs, loop_model.net, cond_net)
