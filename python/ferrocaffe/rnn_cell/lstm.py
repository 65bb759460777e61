"""LSTM cells: ``LSTMCell`` (``LSTMUnit``), its layer-normalised variant, and the
multiplicative-integration variants (``MILSTMCell``, ``LayerNormMILSTMCell``).

Every LSTM cell projects the whole input sequence once (``<name>/i2h``, an FC to 4 * hidden)
in ``prepare_input``; each step adds the recurrent projection of the previous hidden state and
runs ``LSTMUnit`` on the gates.
"""

from ferrocaffe import brew
from ferrocaffe.modeling.initializers import Initializer
from ferrocaffe.rnn_cell.base import RNNCell

__all__ = ["LSTMInitializer", "LSTMCell", "LayerNormLSTMCell", "MILSTMCell", "LayerNormMILSTMCell"]


class LSTMInitializer:
    """Creates the initial hidden and cell states as zero-filled parameters
    ``initial_hidden_state`` / ``initial_cell_state`` (in the current name scope)."""

    def __init__(self, hidden_size):
        self.hidden_size = hidden_size

    def create_states(self, model):
        return [
            model.create_param(
                param_name="initial_hidden_state",
                initializer=Initializer(operator_name="ConstantFill", value=0.0),
                shape=[self.hidden_size],
            ),
            model.create_param(
                param_name="initial_cell_state",
                initializer=Initializer(operator_name="ConstantFill", value=0.0),
                shape=[self.hidden_size],
            ),
        ]


def _gates_input(cell, model, hidden_t_prev, extra_inputs, concat_name):
    """The blob the recurrent FC reads and its width: the previous hidden state, or its
    concatenation (on axis 2) with the extra inputs."""
    if extra_inputs is None:
        return hidden_t_prev, cell.hidden_size
    extra_input_blobs, extra_input_sizes = zip(*extra_inputs, strict=True)
    fc_input = brew.concat(model, [hidden_t_prev] + list(extra_input_blobs), concat_name, axis=2)
    return fc_input, cell.hidden_size + sum(extra_input_sizes)


def _input_projection(cell, model, input_blob):
    return brew.fc(
        model,
        input_blob,
        cell.scope("i2h"),
        dim_in=cell.input_size,
        dim_out=cell.gates_size,
        axis=2,
    )


def _layer_norm_gates(cell, model):
    """LayerNorm over the gates (``<name>/gates_t`` -> ``<name>/gates_t_norm``, learned scale
    and bias); returns the normalised gates."""
    gates_t, _, _ = brew.layer_norm(
        model,
        cell.scope("gates_t"),
        cell.scope("gates_t_norm"),
        dim_in=cell.gates_size,
        axis=-1,
    )
    return gates_t


class LSTMCell(RNNCell):
    """The standard LSTM step: ``gates_t = FC(hidden_t_prev) + input_t`` then ``LSTMUnit``
    producing ``<name>/hidden_state`` and ``<name>/cell_state``.

    memory_optimization: recompute the gates on the backward pass instead of keeping them.
    drop_states: passed to LSTMUnit (zero the states past each sequence's end).
    """

    def __init__(
        self,
        input_size,
        hidden_size,
        forget_bias,
        memory_optimization,
        drop_states=False,
        initializer=None,
        **kwargs,
    ):
        super().__init__(initializer=initializer, **kwargs)
        self.initializer = initializer or LSTMInitializer(hidden_size=hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.gates_size = 4 * self.hidden_size

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = _gates_input(
            self, model, hidden_t_prev, extra_inputs, "gates_concatenated_input_t"
        )
        gates_t = brew.fc(
            model, fc_input, "gates_t", dim_in=fc_input_dim, dim_out=self.gates_size, axis=2
        )
        brew.sum(model, [gates_t, input_t], gates_t)

        if seq_lengths is not None:
            inputs = [hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep]
        else:
            inputs = [hidden_t_prev, cell_t_prev, gates_t, timestep]
        hidden_t, cell_t = model.net.LSTMUnit(
            inputs,
            ["hidden_state", "cell_state"],
            forget_bias=self.forget_bias,
            drop_states=self.drop_states,
            sequence_lengths=(seq_lengths is not None),
        )
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_input_params(self):
        return {"weights": self.scope("i2h") + "_w", "biases": self.scope("i2h") + "_b"}

    def get_recurrent_params(self):
        return {"weights": self.scope("gates_t") + "_w", "biases": self.scope("gates_t") + "_b"}

    def prepare_input(self, model, input_blob):
        return _input_projection(self, model, input_blob)

    def get_state_names_override(self):
        return ["hidden_t", "cell_t"]

    def get_output_dim(self):
        return self.hidden_size


class LayerNormLSTMCell(RNNCell):
    """LSTMCell with LayerNorm on the gates before ``LSTMUnit``. Its states are
    ``<name>/hidden_t`` and ``<name>/cell_t``; it always passes ``seq_lengths`` to LSTMUnit."""

    def __init__(
        self,
        input_size,
        hidden_size,
        forget_bias,
        memory_optimization,
        drop_states=False,
        initializer=None,
        **kwargs,
    ):
        super().__init__(initializer=initializer, **kwargs)
        self.initializer = initializer or LSTMInitializer(hidden_size=hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.gates_size = 4 * self.hidden_size

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = _gates_input(
            self, model, hidden_t_prev, extra_inputs, self.scope("gates_concatenated_input_t")
        )
        gates_t = brew.fc(
            model,
            fc_input,
            self.scope("gates_t"),
            dim_in=fc_input_dim,
            dim_out=self.gates_size,
            axis=2,
        )
        brew.sum(model, [gates_t, input_t], gates_t)
        gates_t = _layer_norm_gates(self, model)

        hidden_t, cell_t = model.net.LSTMUnit(
            [hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep],
            self.get_state_names(),
            forget_bias=self.forget_bias,
            drop_states=self.drop_states,
        )
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_input_params(self):
        return {"weights": self.scope("i2h") + "_w", "biases": self.scope("i2h") + "_b"}

    def prepare_input(self, model, input_blob):
        return _input_projection(self, model, input_blob)

    def get_state_names(self):
        return (self.scope("hidden_t"), self.scope("cell_t"))


def _mi_gates(cell, model, input_t, hidden_t_prev, extra_inputs):
    """Multiplicative-integration gates:
    ``(alpha * input_t + beta1) * FC(hidden_t_prev) + (beta2 * input_t + b)``, with the
    per-gate parameters ``<name>/alpha``, ``beta1``, ``beta2`` (ones) and ``b`` (zeros)."""
    fc_input, fc_input_dim = _gates_input(
        cell, model, hidden_t_prev, extra_inputs, cell.scope("gates_concatenated_input_t")
    )
    prev_t = brew.fc(
        model, fc_input, cell.scope("prev_t"), dim_in=fc_input_dim, dim_out=cell.gates_size, axis=2
    )
    alpha, beta_h, beta_i, b = (
        model.create_param(
            cell.scope(name),
            shape=[cell.gates_size],
            initializer=Initializer("ConstantFill", value=value),
        )
        for name, value in (("alpha", 1.0), ("beta1", 1.0), ("beta2", 1.0), ("b", 0.0))
    )
    alpha_by_input_t_plus_beta_h = model.net.ElementwiseLinear(
        [input_t, alpha, beta_h], cell.scope("alpha_by_input_t_plus_beta_h"), axis=2
    )
    alpha_by_input_t_plus_beta_h_by_prev_t = model.net.Mul(
        [alpha_by_input_t_plus_beta_h, prev_t],
        cell.scope("alpha_by_input_t_plus_beta_h_by_prev_t"),
    )
    beta_i_by_input_t_plus_b = model.net.ElementwiseLinear(
        [input_t, beta_i, b], cell.scope("beta_i_by_input_t_plus_b"), axis=2
    )
    return brew.sum(
        model,
        [alpha_by_input_t_plus_beta_h_by_prev_t, beta_i_by_input_t_plus_b],
        cell.scope("gates_t"),
    )


def _mi_unit(cell, model, gates_t, hidden_t_prev, cell_t_prev, seq_lengths, timestep):
    hidden_t, cell_t = model.net.LSTMUnit(
        [hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep],
        [cell.scope("hidden_t_intermediate"), cell.scope("cell_t")],
        forget_bias=cell.forget_bias,
        drop_states=cell.drop_states,
    )
    model.net.AddExternalOutputs(cell_t, hidden_t)
    if cell.memory_optimization:
        cell.recompute_blobs = [gates_t]
    return hidden_t, cell_t


class MILSTMCell(LSTMCell):
    """LSTM with multiplicative integration (https://arxiv.org/abs/1606.06630): the input and
    recurrent projections are combined by ``_mi_gates`` before ``LSTMUnit``; the recurrent FC
    is ``<name>/prev_t``."""

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        gates_t = _mi_gates(self, model, input_t, hidden_t_prev, extra_inputs)
        return _mi_unit(self, model, gates_t, hidden_t_prev, cell_t_prev, seq_lengths, timestep)


class LayerNormMILSTMCell(LSTMCell):
    """MILSTMCell with LayerNorm on the gates before ``LSTMUnit``."""

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        _mi_gates(self, model, input_t, hidden_t_prev, extra_inputs)
        gates_t = _layer_norm_gates(self, model)
        return _mi_unit(self, model, gates_t, hidden_t_prev, cell_t_prev, seq_lengths, timestep)
