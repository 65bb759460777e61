"""The attention module and the attention decoder cells of ``rnn_cell``: the nets they build
(Caffe2's ops, names and order), their forward results against numpy, the RecurrentNetwork
against the same cell unrolled, and gradients against finite differences."""

import numpy as np
import pytest

from ferrocaffe import gradient_checker, rnn_cell, scope, workspace
from ferrocaffe.attention import AttentionType
from ferrocaffe.model_helper import ModelHelper


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_with_attention(attention_type, T=3, N=2, D=2, H=3, E=4, L=3, lengths=False):
    """An LSTMWithAttention over random data; returns the model, its outputs and the values."""
    rng = np.random.RandomState(7)
    model = ModelHelper(name="m")
    names = ["decoder_inputs", "h0", "c0", "ctx0", "encoder_outputs"]
    inputs = model.net.AddExternalInputs(*names)
    values = {
        "decoder_inputs": rng.randn(T, N, D).astype(np.float32),
        "h0": rng.randn(1, N, H).astype(np.float32),
        "c0": rng.randn(1, N, H).astype(np.float32),
        "ctx0": rng.randn(1, N, E).astype(np.float32),
        "encoder_outputs": rng.randn(L, N, E).astype(np.float32),
    }
    encoder_lengths = None
    if lengths:
        encoder_lengths = model.net.AddExternalInputs("encoder_lengths")
        values["encoder_lengths"] = np.array([L, L - 1], dtype=np.int32)[:N]
    outputs = rnn_cell.LSTMWithAttention(
        model=model,
        decoder_inputs=inputs[0],
        decoder_input_lengths=None,
        initial_decoder_hidden_state=inputs[1],
        initial_decoder_cell_state=inputs[2],
        initial_attention_weighted_encoder_context=inputs[3],
        encoder_output_dim=E,
        encoder_outputs=inputs[4],
        encoder_lengths=encoder_lengths,
        decoder_input_dim=D,
        decoder_state_dim=H,
        scope="dec",
        attention_type=attention_type,
    )
    return model, outputs, values


def _run(model, values):
    for name, value in values.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)


def _step_net(model):
    (op,) = [op for op in model.net.Proto().op if op.type == "RecurrentNetwork"]
    (arg,) = [a for a in op.arg if a.name == "step_net"]
    return arg.n


def test_regular_attention_step_ops_are_caffe2s():
    model, _, _ = _lstm_with_attention(AttentionType.Regular)
    step = _step_net(model)
    assert [op.type for op in step.op] == [
        "Concat", "FC", "Sum", "LSTMUnit",  # decoder LSTM fed with the previous context
        "FC", "Squeeze", "Add", "Tanh", "FC", "Transpose", "Softmax", "BatchMatMul", "Reshape",
        "Copy",
    ]  # fmt: skip
    add = next(op for op in step.op if op.type == "Add")
    assert list(add.output) == ["dec/decoder_hidden_encoder_outputs_sum"]
    assert {a.name: a.i for a in add.arg} == {"broadcast": 1, "use_grad_hack": 1}
    logits = [op for op in step.op if op.type == "FC"][-1]
    assert list(logits.input) == [
        "dec/decoder_hidden_encoder_outputs_sum",
        "dec/attention_logits_w",
        "dec/attention_logits_b",
    ]
    # The outer net transposes and projects the encoder outputs once.
    outer = [(op.type, list(op.output)) for op in model.net.Proto().op][:3]
    assert outer == [
        ("Transpose", ["dec/encoder_outputs_transposed"]),
        ("FC", ["dec/weighted_encoder_outputs"]),
        ("FC", ["dec/decoder/i2h"]),
    ]
    # The score FC's bias is frozen: not a trainable parameter.
    assert "dec/attention_logits_b" not in [str(p) for p in model.GetParams()]


def test_regular_attention_forward_matches_numpy():
    model, outputs, values = _lstm_with_attention(AttentionType.Regular)
    _run(model, values)
    p = {str(b): workspace.FetchBlob(b) for b in model.GetParams()}
    p["dec/attention_logits_b"] = workspace.FetchBlob("dec/attention_logits_b")
    x, enc = values["decoder_inputs"], values["encoder_outputs"]
    h, c, ctx = values["h0"][0], values["c0"][0], values["ctx0"][0]
    H = h.shape[1]
    weighted_enc = enc @ p["dec/weighted_encoder_outputs_w"].T + p["dec/weighted_encoder_outputs_b"]
    hs, ctxs = [], []
    for t in range(x.shape[0]):
        i2h = x[t] @ p["dec/decoder/i2h_w"].T + p["dec/decoder/i2h_b"]
        gates = np.concatenate([h, ctx], axis=1) @ p["dec/decoder/gates_t_w"].T
        gates = gates + p["dec/decoder/gates_t_b"] + i2h
        i, f, o, g = (gates[:, k * H : (k + 1) * H] for k in range(4))
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        s = (
            weighted_enc
            + h @ p["dec/weighted_decoder_hidden_state_w"].T
            + p["dec/weighted_decoder_hidden_state_b"]
        )
        logits = np.tanh(s) @ p["dec/attention_logits_w"].T + p["dec/attention_logits_b"]
        w = np.exp(logits[:, :, 0] - logits[:, :, 0].max(axis=0))
        w = w / w.sum(axis=0)  # [L, N]
        ctx = np.einsum("ln,lne->ne", w, enc)
        hs.append(h)
        ctxs.append(ctx)
    hidden_all, _, _, _, context_all, _ = outputs
    np.testing.assert_allclose(workspace.FetchBlob(hidden_all)[:, :, :], np.stack(hs), atol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob(context_all), np.stack(ctxs), atol=1e-5)


@pytest.mark.parametrize(
    "kind",
    [AttentionType.Regular, AttentionType.Recurrent, AttentionType.Dot, AttentionType.SoftCoverage],
    ids=["regular", "recurrent", "dot", "soft_coverage"],
)
def test_every_attention_type_runs_and_weights_sum_to_one(kind):
    model, outputs, values = _lstm_with_attention(kind, lengths=kind != AttentionType.SoftCoverage)
    _run(model, values)
    T, N, H = 3, 2, 3
    assert workspace.FetchBlob(outputs[0]).shape == (T, N, H)
    assert workspace.FetchBlob(outputs[4]).shape == (T, N, 4)
    if kind == AttentionType.SoftCoverage:
        assert len(outputs) == 8
        # The coverage is the attention paid so far: T steps of weights summing to one each.
        coverage = workspace.FetchBlob(outputs[7])
        np.testing.assert_allclose(coverage.sum(axis=-1), np.full(coverage.shape[:-1], T), 1e-5)
    else:
        assert len(outputs) == 6


def test_encoder_lengths_mask_attention():
    model, outputs, values = _lstm_with_attention(AttentionType.Dot, lengths=True)
    _run(model, values)
    step = _step_net(model)
    assert "SequenceMask" in [op.type for op in step.op]
    # Batch item 1 has one encoder position fewer: its context is a mix of the others only.
    enc = values["encoder_outputs"]
    ctx = workspace.FetchBlob(outputs[4])[-1, 1]
    weights = np.linalg.lstsq(enc[:2, 1].T, ctx, rcond=None)[0]
    np.testing.assert_allclose(enc[:2, 1].T @ weights, ctx, atol=1e-5)
    np.testing.assert_allclose(weights.sum(), 1.0, atol=1e-4)


def test_attention_cell_unrolled_equals_recurrent_network():
    def build(T):
        model = ModelHelper(name="external")
        h, c, ctx = model.net.AddExternalInputs("h0", "c0", "ctx0")
        with scope.NameScope("ns"):
            x, lengths, enc, wenc = model.net.AddScopedExternalInputs("x", "lengths", "enc", "wenc")
            decoder = rnn_cell.MultiRNNCell(
                [
                    rnn_cell.MILSTMCell(
                        name="decoder_0",
                        input_size=2,
                        hidden_size=3,
                        forget_bias=0.0,
                        memory_optimization=False,
                    )
                ],
                name="decoder",
            )
            cell = rnn_cell.AttentionCell(
                encoder_output_dim=2,
                encoder_outputs=enc,
                encoder_lengths=None,
                decoder_cell=decoder,
                decoder_state_dim=3,
                name="attention_decoder",
                attention_type=AttentionType.Recurrent,
                weighted_encoder_outputs=wenc,
                attention_memory_optimization=True,
            )
            if T is not None:
                cell = rnn_cell.UnrolledCell(cell, T)
            out, _ = cell.apply_over_sequence(
                model=model, inputs=x, seq_lengths=lengths, initial_states=[h, c, ctx],
                outputs_with_grads=[0, 4],
            )  # fmt: skip
        return model, out

    rng = np.random.RandomState(3)
    (m1, o1), (m2, o2) = build(2), build(None)
    # One set of parameters: the unrolled steps share the unscoped cell's.
    assert sorted(str(p) for p in m1.GetParams()) == sorted(str(p) for p in m2.GetParams())
    workspace.RunNetOnce(m1.param_init_net)
    feeds = {
        "h0": rng.randn(1, 2, 3),
        "c0": rng.randn(1, 2, 3),
        "ctx0": rng.randn(1, 2, 2),
        "ns/x": rng.randn(2, 2, 2),
        "ns/enc": rng.randn(3, 2, 2),
        "ns/wenc": rng.randn(3, 2, 2),
    }
    for k, v in feeds.items():
        workspace.FeedBlob(k, v.astype(np.float32))
    workspace.FeedBlob("ns/lengths", np.array([2, 1], dtype=np.int32))
    gradient_checker.NetGradientChecker.CompareNets(
        [m1.net, m2.net], [[o1], [o2]], [0], inputs_with_grads=["h0", "ns/x", "ns/wenc"],
        threshold=1e-5,
    )  # fmt: skip


def test_layered_lstm_gradient_of_1d_initial_states():
    """Initial states of shape [H] are repeated over the batch: their gradient is summed over
    it (every layer, not only the first)."""
    rng = np.random.RandomState(1)
    model = ModelHelper(name="external")
    x, lengths = model.net.AddExternalInputs("x", "lengths")
    h_all, _, _, _ = rnn_cell.LSTM(
        model=model, input_blob=x, seq_lengths=lengths, initial_states=None, dim_in=2,
        dim_out=[2, 3], outputs_with_grads=(0,), return_params=False, memory_optimization=False,
        forget_bias=0.0, forward_only=False, return_last_layer_only=True,
    )  # fmt: skip
    workspace.RunNetOnce(model.param_init_net)
    values = {
        "x": rng.randn(3, 3, 2).astype(np.float32),
        "lengths": np.array([3, 2, 3], dtype=np.int32),
    }
    for p in model.GetParams():
        # Non-zero initial states, so that every path carries gradient.
        values[str(p)] = workspace.FetchBlob(p) + rng.rand(*workspace.FetchBlob(p).shape).astype(
            np.float32
        )
    loss = model.net.Tanh(model.net.SumElements([h_all], "output_sum", average=True))
    states = [str(p) for p in model.GetParams() if "initial" in str(p)]
    assert "layer_1/initial_hidden_state" in states and "layer_1/initial_cell_state" in states
    for name in states:
        gradient_checker.NetGradientChecker.Check(
            model.net, outputs_with_grad=[loss], input_values=values, input_to_check=name,
            print_net=False, step_size=1e-3, threshold=0.01,
        )  # fmt: skip


def test_decoder_cells_of_the_attention_cells():
    args = (3, 4, "dec", AttentionType.Regular, None, 0.0, False, False)
    lstm = rnn_cell.LSTMWithAttentionCell(2, "enc", "enc_len", *args)
    mi = rnn_cell.MILSTMWithAttentionCell(2, "enc", *args, forward_only=True)
    assert type(lstm.decoder_cell) is rnn_cell.LSTMCell and lstm.encoder_lengths == "enc_len"
    assert type(mi.decoder_cell) is rnn_cell.MILSTMCell and mi.encoder_lengths is None
    assert mi.decoder_cell.name == "dec/decoder" and mi.forward_only
    assert mi.get_output_dim() == 4 + 2
