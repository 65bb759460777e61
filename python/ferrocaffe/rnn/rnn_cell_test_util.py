"""Caffe2's ``rnn.rnn_cell_test_util``: NumPy activations and the net set-up that the RNN
cell tests share."""

import numpy as np

from ferrocaffe import scope, workspace
from ferrocaffe.model_helper import ModelHelper

__all__ = ["_prepare_rnn", "sigmoid", "tanh"]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def tanh(x):
    # written through the sigmoid, as the tests' references expect
    return 2.0 * sigmoid(2.0 * x) - 1


def _prepare_rnn(
    t,
    n,
    dim_in,
    create_rnn,
    outputs_with_grads,
    forget_bias,
    memory_optim=False,
    forward_only=False,
    drop_states=False,
    T=None,
    two_d_initial_states=None,
    dim_out=None,
    num_states=2,
    **kwargs,
):
    """Builds an RNN with ``create_rnn`` in a ModelHelper named ``external``.

    ``num_states`` initial states per layer (``dim_out``, default ``[dim_in]``) are fed as
    external inputs ``state_<i>/layer_<l>``, shaped ``(n, d)`` or ``(1, n, d)``
    (``two_d_initial_states``, drawn at random when None). The sequence input and lengths
    are scoped external inputs under the name scope ``test_name_scope``; the lengths
    (``n`` values in ``[1, t]``) are fed and the parameter init net is run.

    Returns ``(outputs of create_rnn, the net, states + [input blob])``.
    """
    dim_out = [dim_in] if dim_out is None else dim_out
    print("Dims: ", t, n, dim_in, dim_out)
    model = ModelHelper(name="external")
    if two_d_initial_states is None:
        two_d_initial_states = np.random.randint(2)

    def initial_state(d):
        shape = (n, d) if two_d_initial_states else (1, n, d)
        return np.random.randn(*shape).astype(np.float32)

    states = []
    for layer, d in enumerate(dim_out):
        for i in range(num_states):
            state = model.net.AddExternalInput(f"state_{i}/layer_{layer}")
            states.append(state)
            workspace.FeedBlob(state, initial_state(d))

    # the RNN must work from inside a name scope
    with scope.NameScope("test_name_scope"):
        input_blob, seq_lengths = model.net.AddScopedExternalInputs("input_blob", "seq_lengths")
        outputs = create_rnn(
            model,
            input_blob,
            seq_lengths,
            states,
            dim_in=dim_in,
            dim_out=dim_out,
            scope="external/recurrent",
            outputs_with_grads=outputs_with_grads,
            memory_optimization=memory_optim,
            forget_bias=forget_bias,
            forward_only=forward_only,
            drop_states=drop_states,
            static_rnn_unroll_size=T,
            **kwargs,
        )

    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob(seq_lengths, np.random.randint(1, t + 1, size=(n,)).astype(np.int32))
    return outputs, model.net, states + [input_blob]
