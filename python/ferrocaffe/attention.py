"""Caffe2's ``attention`` module: the attention mechanisms of the decoder cells in
``rnn_cell`` (``AttentionCell``, ``LSTMWithAttention``).

Each ``apply_*_attention`` function adds one decoder step's attention to a step model and
returns ``(context, weights, blobs to recompute[, coverage])``:

* ``context``: the attention-weighted encoder context, ``[1, batch, encoder_output_dim]``;
* ``weights``: the attention weights, ``[batch, encoder_length, 1]``.

Shapes in the comments: ``T`` encoder length, ``N`` batch, ``D`` encoder output dim.
Blob names are ``<scope>/<name>`` and the ops are the ones Caffe2 added, in its order, so nets
built here equal Caffe2's.
"""

from ferrocaffe import brew

__all__ = [
    "AttentionType",
    "s",
    "apply_recurrent_attention",
    "apply_regular_attention",
    "apply_dot_attention",
    "apply_soft_coverage_attention",
]


class AttentionType:
    """The attention mechanisms (Caffe2's integer codes)."""

    Regular, Recurrent, Dot, SoftCoverage = range(4)


def s(scope, name):
    """``scope/name``: attention blobs are scoped by hand (they mix step-net and outer blobs)."""
    return f"{scope}/{name}"


def _weights_and_context(model, logits, encoder_outputs_transposed, dim, scope, lengths):
    """From logits ``[N, T, 1]``: the softmax weights over ``T`` (masked past each encoder
    sequence's length when ``lengths`` is given) and the weighted context ``[1, N, D]``."""
    if lengths is not None:
        logits = model.net.SequenceMask(
            [logits, lengths], ["masked_attention_logits"], mode="sequence"
        )
    weights = brew.softmax(model, logits, s(scope, "attention_weights_3d"), engine="CUDNN", axis=1)
    # [N, D, T] x [N, T, 1] -> [N, D, 1]
    context = brew.batch_mat_mul(
        model,
        [encoder_outputs_transposed, weights],
        s(scope, "attention_weighted_encoder_context"),
    )
    context, _ = model.net.Reshape(
        context,
        [context, s(scope, "attention_weighted_encoder_context_old_shape")],
        shape=[1, -1, dim],
    )
    return context, weights


def _sum_match_logits(model, summed, dim, scope):
    """Additive (sum-match) scores ``v^T tanh(summed)`` from ``summed`` ``[T, N, D]``, as
    ``[N, T, 1]`` logits. ``tanh`` is applied in place, and the score FC has a frozen bias."""
    summed = model.net.Tanh(summed, summed)
    logits = brew.fc(
        model,
        summed,
        s(scope, "attention_logits"),
        dim_in=dim,
        dim_out=1,
        axis=2,
        freeze_bias=True,
    )
    return brew.transpose(model, logits, s(scope, "attention_logits_transposed"), axes=[1, 0, 2])


def _sum_match_attention(model, summed, encoder_outputs_transposed, dim, scope, lengths):
    """Additive attention from the sums ``[T, N, D]``: its weights and context."""
    logits = _sum_match_logits(model, summed, dim, scope)
    return _weights_and_context(model, logits, encoder_outputs_transposed, dim, scope, lengths)


def _projected_step_blob(model, blob, dim_in, dim_out, scope, name):
    """A ``[1, N, dim_in]`` step blob projected to ``[N, dim_out]`` (FC on axis 2, then the
    leading 1 squeezed in place)."""
    projected = brew.fc(model, blob, s(scope, name), dim_in=dim_in, dim_out=dim_out, axis=2)
    return model.net.Squeeze(projected, projected, dims=[0])


def _projected_decoder_state(model, state, state_dim, dim, scope):
    return _projected_step_blob(
        model, state, state_dim, dim, scope, "weighted_decoder_hidden_state"
    )


def apply_recurrent_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    weighted_encoder_outputs,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    attention_weighted_encoder_context_t_prev,
    scope,
    encoder_lengths=None,
):
    """Recurrent attention: the scores also see the previous step's context
    (Cohn et al. 2016, section 4.1)."""
    dim = encoder_output_dim
    prev_context = _projected_step_blob(
        model,
        attention_weighted_encoder_context_t_prev,
        dim,
        dim,
        scope,
        "weighted_prev_attention_context",
    )
    decoder_state = _projected_decoder_state(
        model, decoder_hidden_state_t, decoder_hidden_state_dim, dim, scope
    )
    step_sum = model.net.Add(
        [prev_context, decoder_state], s(scope, "decoder_hidden_encoder_outputs_sum_tmp")
    )
    summed = model.net.Add(
        [weighted_encoder_outputs, step_sum],
        s(scope, "decoder_hidden_encoder_outputs_sum"),
        broadcast=1,
    )
    context, weights = _sum_match_attention(
        model, summed, encoder_outputs_transposed, dim, scope, encoder_lengths
    )
    return context, weights, [summed]


def apply_regular_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    weighted_encoder_outputs,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    scope,
    encoder_lengths=None,
):
    """Additive attention (Bahdanau et al.): scores from the projected encoder outputs plus the
    projected decoder state."""
    dim = encoder_output_dim
    decoder_state = _projected_decoder_state(
        model, decoder_hidden_state_t, decoder_hidden_state_dim, dim, scope
    )
    summed = model.net.Add(
        [weighted_encoder_outputs, decoder_state],
        s(scope, "decoder_hidden_encoder_outputs_sum"),
        broadcast=1,
        use_grad_hack=1,
    )
    context, weights = _sum_match_attention(
        model, summed, encoder_outputs_transposed, dim, scope, encoder_lengths
    )
    return context, weights, [summed]


def apply_dot_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    scope,
    encoder_lengths=None,
):
    """Dot-product attention (Luong et al.): scores are the encoder outputs dotted with the
    decoder state, projected to the encoder's width first when the sizes differ."""
    dim = encoder_output_dim
    state = decoder_hidden_state_t
    if decoder_hidden_state_dim != dim:
        state = brew.fc(
            model,
            state,
            s(scope, "weighted_decoder_hidden_state"),
            dim_in=decoder_hidden_state_dim,
            dim_out=dim,
            axis=2,
        )
    # [1, N, D] -> [N, D] -> [N, D, 1]
    state = model.net.Squeeze(state, s(scope, "squeezed_weighted_decoder_hidden_state"), dims=[0])
    state = model.net.ExpandDims(state, state, dims=[2])
    # [N, D, T]^T x [N, D, 1] -> [N, T, 1]
    logits = model.net.BatchMatMul(
        [encoder_outputs_transposed, state], s(scope, "attention_logits"), trans_a=1
    )
    context, weights = _weights_and_context(
        model, logits, encoder_outputs_transposed, dim, scope, encoder_lengths
    )
    return context, weights, []


def apply_soft_coverage_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    weighted_encoder_outputs,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    scope,
    encoder_lengths,
    coverage_t_prev,
    coverage_weights,
):
    """Additive attention with a soft coverage term: the scores also see the attention already
    paid to each encoder position (``coverage_t_prev``, ``[1, N, T]``, weighting
    ``coverage_weights``). Returns the new coverage as a fourth value."""
    dim = encoder_output_dim
    decoder_state = _projected_decoder_state(
        model, decoder_hidden_state_t, decoder_hidden_state_dim, dim, scope
    )
    summed = model.net.Add(
        [weighted_encoder_outputs, decoder_state],
        s(scope, "decoder_hidden_encoder_outputs_sum_tmp"),
        broadcast=1,
    )
    # [1, N, T] -> [N, T] -> [T, N]
    coverage = model.net.Squeeze(coverage_t_prev, s(scope, "coverage_t_prev_2d"), dims=[0])
    coverage = brew.transpose(model, coverage, s(scope, "coverage_t_prev_transposed"))
    # [T, N, D] * [T, N] (broadcast from axis 0)
    scaled = model.net.Mul(
        [coverage_weights, coverage],
        s(scope, "scaled_coverage_weights"),
        broadcast=1,
        axis=0,
    )
    summed = model.net.Add([summed, scaled], s(scope, "decoder_hidden_encoder_outputs_sum"))
    context, weights = _sum_match_attention(
        model, summed, encoder_outputs_transposed, dim, scope, encoder_lengths
    )
    weights_2d = model.net.Squeeze(weights, s(scope, "attention_weights_2d"), dims=[2])
    coverage_t = model.net.Add([coverage_t_prev, weights_2d], s(scope, "coverage_t"), broadcast=1)
    return context, weights, [summed], coverage_t
