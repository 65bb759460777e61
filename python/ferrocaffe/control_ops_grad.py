"""Caffe2's ``control_ops_grad``: gradients of the ``Do``, ``If`` and ``While`` operators.

The gradient makers themselves are ferrocaffe's built-in ones (the Rust autodiff pass builds
the gradient subnets); this module names them as Caffe2 did and adds the helper that renames
an output of an ``If`` gradient op inside its branch nets too.
"""

from ferrocaffe.core.gradients import gen_do_gradient, gen_if_gradient, gen_while_gradient

__all__ = [
    "gen_do_gradient",
    "gen_if_gradient",
    "gen_while_gradient",
    "getNetArgument",
    "disambiguate_grad_if_op_output",
]


def _net_argument(op, name):
    """The NetDef held by argument ``name`` of ``op`` (None when there is none)."""
    for arg in op.arg:
        if arg.name == name:
            assert arg.HasField("n"), f"Expected {name} to be a net argument of {op.type}"
            return arg.n
    return None


def getNetArgument(op, net_name):
    """The NetDef argument ``net_name`` of ``op``, or None."""
    return _net_argument(op, net_name)


def disambiguate_grad_if_op_output(grad_op, idx, new_grad_output):
    """Rename output ``idx`` of the ``If`` gradient op ``grad_op`` to ``new_grad_output``,
    in the op and wherever the ops of its ``then_net`` / ``else_net`` write the old name
    (gradient accumulation gives a gradient written twice distinct names)."""
    old = grad_op.output[idx]
    for branch in ("then_net", "else_net"):
        net = _net_argument(grad_op, branch)
        if net is None:
            continue
        for op in net.op:
            for i, name in enumerate(op.output):
                if name == old:
                    op.output[i] = new_grad_output
    grad_op.output[idx] = new_grad_output
