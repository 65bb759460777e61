"""One-call builders of (multi-layer) recurrent networks: ``LSTM``, ``MILSTM``, ``BasicRNN``,
``LayerNormLSTM``, ``LayerNormMILSTM`` (all ``_LSTM`` with a cell class), ``layered_LSTM``,
and the helpers that name and load LSTM parameters."""

import functools

import numpy as np

from ferrocaffe import workspace
from ferrocaffe.rnn_cell.basic import BasicRNNCell
from ferrocaffe.rnn_cell.lstm import (
    LayerNormLSTMCell,
    LayerNormMILSTMCell,
    LSTMCell,
    MILSTMCell,
)
from ferrocaffe.rnn_cell.wrappers import MultiRNNCell, UnrolledCell

__all__ = [
    "_LSTM",
    "LSTM",
    "BasicRNN",
    "MILSTM",
    "LayerNormLSTM",
    "LayerNormMILSTM",
    "GetLSTMParamNames",
    "InitFromLSTMParams",
    "_layered_LSTM",
    "layered_LSTM",
]


def _LSTM(
    cell_class,
    model,
    input_blob,
    seq_lengths,
    initial_states,
    dim_in,
    dim_out,
    scope=None,
    outputs_with_grads=(0,),
    return_params=False,
    memory_optimization=False,
    forget_bias=0.0,
    forward_only=False,
    drop_states=False,
    return_last_layer_only=True,
    static_rnn_unroll_size=None,
    **cell_kwargs,
):
    """Add a recurrent network of ``cell_class`` layers to ``model``.

    input_blob: the input sequence, T x N x dim_in.
    seq_lengths: the sequence lengths blob passed to the unit ops (or None).
    initial_states: the initial states, (hidden, cell) per layer for LSTMs (2 * layers blobs);
        None creates them as parameters.
    dim_out: units of the layer (an int) or of each layer (a list / tuple).
    scope: the name of the network (the cell name; with several layers the MultiRNNCell name).
    outputs_with_grads: which outputs of the LAST layer get an outside gradient, as indices
        into (hidden_all, hidden_last, cell_all, cell_last).
    return_params: also return {'input': ..., 'recurrent': ...} parameter names.
    memory_optimization: recompute the gates on the backward pass.
    forward_only: no backward step.
    drop_states: passed to the unit ops.
    return_last_layer_only: return the last layer's 4 outputs only (else every layer's).
    static_rnn_unroll_size: unroll that many steps into the net instead of a RecurrentNetwork.
    cell_kwargs: passed to every cell.

    Returns a tuple: (hidden_all, hidden_last, cell_all, cell_last) for each returned layer,
    plus the parameter dict if asked.
    """
    if not isinstance(dim_out, list | tuple):
        dim_out = [dim_out]
    num_layers = len(dim_out)

    cells = []
    for i in range(num_layers):
        cells.append(
            cell_class(
                input_size=(dim_in if i == 0 else dim_out[i - 1]),
                hidden_size=dim_out[i],
                forget_bias=forget_bias,
                memory_optimization=memory_optimization,
                name=scope if num_layers == 1 else None,
                forward_only=forward_only,
                drop_states=drop_states,
                **cell_kwargs,
            )
        )
    cell = (
        MultiRNNCell(cells, name=scope, forward_only=forward_only) if num_layers > 1 else cells[0]
    )
    if static_rnn_unroll_size is not None:
        cell = UnrolledCell(cell, static_rnn_unroll_size)

    # Indices into the outputs of all layers (4 per layer).
    outputs_with_grads = [4 * (num_layers - 1) + i for i in outputs_with_grads]
    _, result = cell.apply_over_sequence(
        model=model,
        inputs=input_blob,
        seq_lengths=seq_lengths,
        initial_states=initial_states,
        outputs_with_grads=outputs_with_grads,
    )

    if return_last_layer_only:
        result = result[4 * (num_layers - 1) :]
    if return_params:
        result = list(result) + [
            {"input": cell.get_input_params(), "recurrent": cell.get_recurrent_params()}
        ]
    return tuple(result)


LSTM = functools.partial(_LSTM, LSTMCell)
BasicRNN = functools.partial(_LSTM, BasicRNNCell)
MILSTM = functools.partial(_LSTM, MILSTMCell)
LayerNormLSTM = functools.partial(_LSTM, LayerNormLSTMCell)
LayerNormMILSTM = functools.partial(_LSTM, LayerNormMILSTMCell)


def GetLSTMParamNames():
    """The names of the per-gate LSTM weights and biases, in the order their values are packed
    into the i2h / gates_t parameters."""
    weight_params = ["input_gate_w", "forget_gate_w", "output_gate_w", "cell_w"]
    bias_params = ["input_gate_b", "forget_gate_b", "output_gate_b", "cell_b"]
    return {"weights": weight_params, "biases": bias_params}


def InitFromLSTMParams(lstm_pblobs, param_values):
    """Set LSTM parameters in the workspace from per-gate values.

    lstm_pblobs: {'input'|'recurrent': {'weights': blob, 'biases': blob}} (as LSTM's
        ``return_params`` gives).
    param_values: {'input'|'recurrent': {per-gate name (GetLSTMParamNames): array}}; the gate
        values are concatenated in that order and reshaped to the blob's current shape.
    """
    names = GetLSTMParamNames()
    for input_type in param_values.keys():
        weights = np.concatenate(
            [np.asarray(param_values[input_type][w]).flatten() for w in names["weights"]]
        )
        biases = np.concatenate(
            [np.asarray(param_values[input_type][b]).flatten() for b in names["biases"]]
        )
        weights_blob = lstm_pblobs[input_type]["weights"]
        bias_blob = lstm_pblobs[input_type]["biases"]
        cur_weight = workspace.FetchBlob(weights_blob)
        cur_biases = workspace.FetchBlob(bias_blob)
        workspace.FeedBlob(weights_blob, weights.reshape(cur_weight.shape).astype(np.float32))
        workspace.FeedBlob(bias_blob, biases.reshape(cur_biases.shape).astype(np.float32))


def _layered_LSTM(
    model,
    input_blob,
    seq_lengths,
    initial_states,
    dim_in,
    dim_out,
    scope,
    outputs_with_grads=(0,),
    return_params=False,
    memory_optimization=False,
    forget_bias=0.0,
    forward_only=False,
    drop_states=False,
    create_lstm=None,
):
    """Stack single-layer networks made by ``create_lstm`` (one RecurrentNetwork op per
    layer): layer i > 0 reads the previous output, starts from its last states, and is scoped
    ``<scope>_layer_<i>``. Returns the last layer's (output, last output, all states,
    last state)."""
    params = {
        "model": model,
        "input_blob": input_blob,
        "seq_lengths": seq_lengths,
        "initial_states": initial_states,
        "dim_in": dim_in,
        "dim_out": dim_out,
        "scope": scope,
        "outputs_with_grads": outputs_with_grads,
        "return_params": return_params,
        "memory_optimization": memory_optimization,
        "forget_bias": forget_bias,
        "forward_only": forward_only,
        "drop_states": drop_states,
    }
    if not isinstance(dim_out, list):
        return create_lstm(**params)
    if len(dim_out) == 1:
        params["dim_out"] = dim_out[0]
        return create_lstm(**params)

    assert len(dim_out) != 0, "dim_out list can't be empty"
    assert return_params is False, "return_params not supported for layering"
    for i, output_dim in enumerate(dim_out):
        params.update({"dim_out": output_dim})
        output, last_output, all_states, last_state = create_lstm(**params)
        params.update(
            {
                "input_blob": output,
                "dim_in": output_dim,
                "initial_states": (last_output, last_state),
                "scope": scope + f"_layer_{i + 1}",
            }
        )
    return output, last_output, all_states, last_state


layered_LSTM = functools.partial(_layered_LSTM, create_lstm=LSTM)
