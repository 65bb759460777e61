"""``BasicRNNCell``: ``hidden_t = activation(FC(hidden_t_prev) + input_t)``, the Elman RNN of
torch.nn.RNNCell, with tanh or relu."""

from ferrocaffe import brew
from ferrocaffe.rnn_cell.base import RNNCell

__all__ = ["BasicRNNCell"]

_ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu"}


def _unknown_activation(activation):
    return RuntimeError(f"BasicRNNCell with unknown activation function ({activation})")


class BasicRNNCell(RNNCell):
    """One state, ``<name>/hidden_t``. With sequence lengths, steps past a sequence's end keep
    the previous state (or a zero state with ``drop_states``), computed with comparison, Cast,
    Mul and Add ops. ``forget_bias`` and ``memory_optimization`` are accepted and unused."""

    def __init__(
        self,
        input_size,
        hidden_size,
        forget_bias,
        memory_optimization,
        drop_states=False,
        initializer=None,
        activation=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.drop_states = drop_states
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.activation = activation
        if self.activation not in _ACTIVATIONS:
            raise _unknown_activation(self.activation)

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev = states[0]
        gates_t = brew.fc(
            model,
            hidden_t_prev,
            "gates_t",
            dim_in=self.hidden_size,
            dim_out=self.hidden_size,
            axis=2,
        )
        brew.sum(model, [gates_t, input_t], gates_t)
        if self.activation not in _ACTIVATIONS:
            raise _unknown_activation(self.activation)
        hidden_t = getattr(model.net, _ACTIVATIONS[self.activation])(gates_t, "hidden_t")

        if seq_lengths is not None:
            timestep = model.net.CopyFromCPUInput(timestep, "timestep_gpu")
            valid_b = model.net.GT([seq_lengths, timestep], "valid_b", broadcast=1)
            invalid_b = model.net.LE([seq_lengths, timestep], "invalid_b", broadcast=1)
            valid = model.net.Cast(valid_b, "valid", to="float")
            invalid = model.net.Cast(invalid_b, "invalid", to="float")
            hidden_valid = model.net.Mul([hidden_t, valid], "hidden_valid", broadcast=1, axis=1)
            if self.drop_states:
                hidden_t = hidden_valid
            else:
                hidden_invalid = model.net.Mul(
                    [hidden_t_prev, invalid], "hidden_invalid", broadcast=1, axis=1
                )
                hidden_t = model.net.Add([hidden_valid, hidden_invalid], hidden_t)
        return (hidden_t,)

    def prepare_input(self, model, input_blob):
        return brew.fc(
            model,
            input_blob,
            self.scope("i2h"),
            dim_in=self.input_size,
            dim_out=self.hidden_size,
            axis=2,
        )

    def get_state_names(self):
        return (self.scope("hidden_t"),)

    def get_output_dim(self):
        return self.hidden_size
