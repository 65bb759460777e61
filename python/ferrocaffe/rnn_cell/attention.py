"""Decoder cells with attention: ``AttentionCell`` wraps a decoder cell (an LSTM or MI-LSTM)
and, each step, attends over the encoder outputs with one of ``attention.AttentionType``'s
mechanisms; ``LSTMWithAttention`` runs such a cell over a sequence.

The cell's states are the decoder cell's (its output state renamed ``hidden_t_external``),
then the attention context, then, for soft coverage, the coverage vector. The context of the
previous step is fed to the decoder cell as an extra input.
"""

from ferrocaffe import brew, core, scope
from ferrocaffe.attention import (
    AttentionType,
    apply_dot_attention,
    apply_recurrent_attention,
    apply_regular_attention,
    apply_soft_coverage_attention,
)
from ferrocaffe.rnn_cell.base import RNNCell
from ferrocaffe.rnn_cell.lstm import LSTMCell, MILSTMCell

__all__ = ["AttentionCell", "LSTMWithAttentionCell", "MILSTMWithAttentionCell", "LSTMWithAttention"]

_ATTENTION_TYPES = (
    AttentionType.Regular,
    AttentionType.Recurrent,
    AttentionType.Dot,
    AttentionType.SoftCoverage,
)


class AttentionCell(RNNCell):
    """A decoder cell plus attention over ``encoder_outputs`` (``[T, N, encoder_output_dim]``).

    weighted_encoder_outputs: the encoder outputs as the scores see them; None for an FC of
        ``encoder_outputs`` added by ``prepare_input`` (not used by dot attention).
    encoder_lengths: the encoder sequence lengths (positions past them get no weight), or None.
    attention_memory_optimization: recompute the attention sums on the backward pass.
    """

    def __init__(
        self,
        encoder_output_dim,
        encoder_outputs,
        encoder_lengths,
        decoder_cell,
        decoder_state_dim,
        attention_type,
        weighted_encoder_outputs,
        attention_memory_optimization,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if attention_type not in _ATTENTION_TYPES:
            raise AssertionError(f"unknown attention type {attention_type!r}")
        self.encoder_output_dim = encoder_output_dim
        self.encoder_outputs = encoder_outputs
        self.encoder_lengths = encoder_lengths
        self.decoder_cell = decoder_cell
        self.decoder_state_dim = decoder_state_dim
        self.weighted_encoder_outputs = weighted_encoder_outputs
        self.encoder_outputs_transposed = None
        self.attention_type = attention_type
        self.attention_memory_optimization = attention_memory_optimization

    @property
    def _coverage(self):
        return self.attention_type == AttentionType.SoftCoverage

    def _attend(self, model, context_prev, coverage_prev):
        """This step's attention over the decoder's new hidden state: (context, blobs to
        recompute, new coverage or None). Sets ``attention_weights_3d``."""
        common = dict(
            model=model,
            encoder_output_dim=self.encoder_output_dim,
            encoder_outputs_transposed=self.encoder_outputs_transposed,
            decoder_hidden_state_t=self.hidden_t_intermediate,
            decoder_hidden_state_dim=self.decoder_state_dim,
            scope=self.name,
            encoder_lengths=self.encoder_lengths,
        )
        coverage = None
        kind = self.attention_type
        if kind == AttentionType.Dot:
            context, self.attention_weights_3d, blobs = apply_dot_attention(**common)
        elif kind == AttentionType.Regular:
            context, self.attention_weights_3d, blobs = apply_regular_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs, **common
            )
        elif kind == AttentionType.Recurrent:
            context, self.attention_weights_3d, blobs = apply_recurrent_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs,
                attention_weighted_encoder_context_t_prev=context_prev,
                **common,
            )
        elif kind == AttentionType.SoftCoverage:
            context, self.attention_weights_3d, blobs, coverage = apply_soft_coverage_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs,
                coverage_t_prev=coverage_prev,
                coverage_weights=self.coverage_weights,
                **common,
            )
        else:
            raise Exception(f"Attention type {kind} not implemented")
        return context, blobs, coverage

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        if extra_inputs is not None:
            raise AssertionError("AttentionCell takes no extra inputs")
        n_extra = 2 if self._coverage else 1
        decoder_prev = states[:-n_extra]
        context_prev = states[-n_extra]
        coverage_prev = states[-1] if self._coverage else None

        decoder_states = self.decoder_cell._apply(
            model,
            input_t,
            seq_lengths,
            decoder_prev,
            timestep,
            extra_inputs=[(context_prev, self.encoder_output_dim)],
        )
        self.hidden_t_intermediate = self.decoder_cell._prepare_output(model, decoder_states)
        context, blobs, coverage = self._attend(model, context_prev, coverage_prev)
        if self.attention_memory_optimization:
            self.recompute_blobs.extend(blobs)

        output = [*decoder_states, context]
        if self._coverage:
            output.append(coverage)
        # The step's hidden state leaves the step net under its own name.
        index = self.decoder_cell.get_output_state_index()
        output[index] = model.Copy(output[index], self.scope("hidden_t_external"))
        model.net.AddExternalOutputs(*output)
        return output

    def get_attention_weights(self):
        """The last step's attention weights, ``[N, T, 1]``."""
        return self.attention_weights_3d

    def prepare_input(self, model, input_blob):
        if self.encoder_outputs_transposed is None:
            # [T, N, D] -> [N, D, T]
            self.encoder_outputs_transposed = brew.transpose(
                model,
                self.encoder_outputs,
                self.scope("encoder_outputs_transposed"),
                axes=[1, 2, 0],
            )
        if self.weighted_encoder_outputs is None and self.attention_type != AttentionType.Dot:
            self.weighted_encoder_outputs = brew.fc(
                model,
                self.encoder_outputs,
                self.scope("weighted_encoder_outputs"),
                dim_in=self.encoder_output_dim,
                dim_out=self.encoder_output_dim,
                axis=2,
            )
        return self.decoder_cell.prepare_input(model, input_blob)

    def build_initial_coverage(self, model):
        """The initial coverage (zeros, one per encoder position: its size is read from
        ``encoder_outputs`` when the net runs) for soft-coverage attention; also adds
        ``coverage_weights``, the encoder outputs' FC the coverage term scales."""
        if not self._coverage:
            raise AssertionError("build_initial_coverage is for AttentionType.SoftCoverage")
        self.coverage_weights = brew.fc(
            model,
            self.encoder_outputs,
            self.scope("coverage_weights"),
            dim_in=self.encoder_output_dim,
            dim_out=self.encoder_output_dim,
            axis=2,
        )
        encoder_length = model.net.Slice(
            model.net.Shape(self.encoder_outputs), starts=[0], ends=[1]
        )
        device = scope.CurrentDeviceScope()
        if device is not None and core.IsGPUDeviceType(device.device_type):
            encoder_length = model.net.CopyGPUToCPU(encoder_length, "encoder_length_cpu")
        return model.net.ConstantFill(
            encoder_length, self.scope("initial_coverage"), value=0.0, input_as_shape=1
        )

    def get_state_names(self):
        names = list(self.decoder_cell.get_state_names())
        names[self.get_output_state_index()] = self.scope("hidden_t_external")
        names.append(self.scope("attention_weighted_encoder_context_t"))
        if self._coverage:
            names.append(self.scope("coverage_t"))
        return names

    def get_output_dim(self):
        return self.decoder_state_dim + self.encoder_output_dim

    def get_output_state_index(self):
        return self.decoder_cell.get_output_state_index()

    def _combine(self, model, decoder_output, context):
        with core.NameScope(self.name or ""):
            return brew.concat(
                model, [decoder_output, context], "states_and_context_combination", axis=2
            )

    def _prepare_output(self, model, states):
        context = states[-2] if self._coverage else states[-1]
        return self._combine(model, self.hidden_t_intermediate, context)

    def _prepare_output_sequence(self, model, state_outputs):
        # state_outputs alternates (all steps, last step) per state; the attention states
        # come last.
        n_extra = 2 if self._coverage else 1
        decoder_output = self.decoder_cell._prepare_output_sequence(
            model, state_outputs[: -2 * n_extra]
        )
        context_index = 2 * (len(self.get_state_names()) - n_extra)
        return self._combine(model, decoder_output, state_outputs[context_index])


class LSTMWithAttentionCell(AttentionCell):
    """An ``LSTMCell`` decoder (named ``<name>/decoder``) with attention."""

    _decoder_class = LSTMCell

    def __init__(
        self,
        encoder_output_dim,
        encoder_outputs,
        encoder_lengths,
        decoder_input_dim,
        decoder_state_dim,
        name,
        attention_type,
        weighted_encoder_outputs,
        forget_bias,
        lstm_memory_optimization,
        attention_memory_optimization,
        forward_only=False,
    ):
        decoder = self._decoder_class(
            input_size=decoder_input_dim,
            hidden_size=decoder_state_dim,
            forget_bias=forget_bias,
            memory_optimization=lstm_memory_optimization,
            name=f"{name}/decoder",
            forward_only=False,
            drop_states=False,
        )
        super().__init__(
            encoder_output_dim=encoder_output_dim,
            encoder_outputs=encoder_outputs,
            encoder_lengths=encoder_lengths,
            decoder_cell=decoder,
            decoder_state_dim=decoder_state_dim,
            name=name,
            attention_type=attention_type,
            weighted_encoder_outputs=weighted_encoder_outputs,
            attention_memory_optimization=attention_memory_optimization,
            forward_only=forward_only,
        )


class MILSTMWithAttentionCell(LSTMWithAttentionCell):
    """A ``MILSTMCell`` decoder (named ``<name>/decoder``) with attention; Caffe2's arguments,
    which have no encoder lengths."""

    _decoder_class = MILSTMCell

    def __init__(self, encoder_output_dim, encoder_outputs, *args, **kwargs):
        super().__init__(encoder_output_dim, encoder_outputs, None, *args, **kwargs)


def LSTMWithAttention(
    model,
    decoder_inputs,
    decoder_input_lengths,
    initial_decoder_hidden_state,
    initial_decoder_cell_state,
    initial_attention_weighted_encoder_context,
    encoder_output_dim,
    encoder_outputs,
    encoder_lengths,
    decoder_input_dim,
    decoder_state_dim,
    scope,
    attention_type=AttentionType.Regular,
    outputs_with_grads=(0, 4),
    weighted_encoder_outputs=None,
    lstm_memory_optimization=False,
    attention_memory_optimization=False,
    forget_bias=0.0,
    forward_only=False,
):
    """An LSTM decoder with attention over ``encoder_outputs``, run over ``decoder_inputs``
    (``T x N x decoder_input_dim``) by one RecurrentNetwork op. The context is computed after
    the new hidden state (Luong et al.'s order). Returns the states over the sequence:
    ``(hidden_all, hidden_last, cell_all, cell_last, context_all, context_last[, coverage...])``.

    outputs_with_grads: indices of those outputs that receive gradients from outside.
    lstm_memory_optimization / attention_memory_optimization: recompute the LSTM gates /
    the attention sums on the backward pass instead of keeping them.
    """
    cell = LSTMWithAttentionCell(
        encoder_output_dim=encoder_output_dim,
        encoder_outputs=encoder_outputs,
        encoder_lengths=encoder_lengths,
        decoder_input_dim=decoder_input_dim,
        decoder_state_dim=decoder_state_dim,
        name=scope,
        attention_type=attention_type,
        weighted_encoder_outputs=weighted_encoder_outputs,
        forget_bias=forget_bias,
        lstm_memory_optimization=lstm_memory_optimization,
        attention_memory_optimization=attention_memory_optimization,
        forward_only=forward_only,
    )
    initial_states = [
        initial_decoder_hidden_state,
        initial_decoder_cell_state,
        initial_attention_weighted_encoder_context,
    ]
    if attention_type == AttentionType.SoftCoverage:
        initial_states.append(cell.build_initial_coverage(model))
    _, states = cell.apply_over_sequence(
        model=model,
        inputs=decoder_inputs,
        seq_lengths=decoder_input_lengths,
        initial_states=initial_states,
        outputs_with_grads=outputs_with_grads,
    )
    return states
