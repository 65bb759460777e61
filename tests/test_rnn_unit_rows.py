"""LSTMUnit and LSTMUnitGradient on batches large enough that their rows are shared out
between two threads: every row must equal the same row computed alone (bit for bit) and
the textbook formulas, with ended sequences carried over or dropped."""

import numpy as np
import pytest

from ferrocaffe import core, workspace

N, D = 37, 128  # 37 x 4D gates: cut in parts (uneven: 10 10 10 7 rows)
FORGET_BIAS = 0.5


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def run(op_type, inputs, outputs, drop):
    workspace.ResetWorkspace()
    names = []
    for i, value in enumerate(inputs):
        names.append("in%d" % i)
        workspace.FeedBlob(names[-1], value)
    op = core.CreateOperator(
        op_type, names, outputs, forget_bias=FORGET_BIAS, drop_states=int(drop)
    )
    workspace.RunOperatorOnce(op)
    return [workspace.FetchBlob(o).copy() for o in outputs]


def data(n, t):
    rng = np.random.default_rng(7)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    lengths = rng.integers(0, 4, n).astype(np.int32)
    h_prev, c_prev, gates = f(1, n, D), f(1, n, D), f(1, n, 4 * D)
    h_t, c_t, dh, dc = f(1, n, D), f(1, n, D), f(1, n, D), f(1, n, D)
    return lengths, [h_prev, c_prev, gates, lengths, np.array([t], np.int32)], [h_t, c_t, dh, dc]


def rows(arrays, r):
    """Batch row r of every input: [1, N, X] tensors and the [N] lengths are cut, the
    one-element timestep is kept."""

    def row(a):
        if a.ndim == 3:
            return a[:, r : r + 1]
        return a if a.shape == (1,) else a[r : r + 1]

    return [row(a) for a in arrays]


@pytest.mark.parametrize("drop", [False, True])
def test_forward_rows_match_alone_and_formulas(drop):
    lengths, ins, _ = data(N, t=2)
    h, c = run("LSTMUnit", ins, ["h", "c"], drop)
    for r in range(N):
        h1, c1 = run("LSTMUnit", rows(ins, r), ["h", "c"], drop)
        assert np.array_equal(h1[0, 0], h[0, r]) and np.array_equal(c1[0, 0], c[0, r]), r
    h_prev, c_prev, g = ins[0][0], ins[1][0], ins[2][0]
    i, f, o = (
        sigmoid(g[:, :D]),
        sigmoid(g[:, D : 2 * D] + FORGET_BIAS),
        sigmoid(g[:, 2 * D : 3 * D]),
    )
    c_want = f * c_prev + i * np.tanh(g[:, 3 * D :])
    h_want = o * np.tanh(c_want)
    live = lengths > 2
    assert 0 < live.sum() < N
    np.testing.assert_allclose(c[0, live], c_want[live], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h[0, live], h_want[live], rtol=1e-5, atol=1e-6)
    carried_h = 0.0 if drop else h_prev[~live]
    carried_c = 0.0 if drop else c_prev[~live]
    np.testing.assert_array_equal(h[0, ~live], np.broadcast_to(carried_h, h[0, ~live].shape))
    np.testing.assert_array_equal(c[0, ~live], np.broadcast_to(carried_c, c[0, ~live].shape))


@pytest.mark.parametrize("drop", [False, True])
def test_gradient_rows_match_alone_and_formulas(drop):
    lengths, ins, after = data(N, t=1)
    outs = ["dh_prev", "dc_prev", "dgates"]
    dh_prev, dc_prev, dg = run("LSTMUnitGradient", ins + after, outs, drop)
    for r in range(N):
        one = run("LSTMUnitGradient", rows(ins + after, r), outs, drop)
        for got, alone in zip((dh_prev, dc_prev, dg), one, strict=True):
            assert np.array_equal(alone[0, 0], got[0, r]), r
    c_prev, g = ins[1][0], ins[2][0]
    c_t, dh, dc = after[1][0], after[2][0], after[3][0]
    i, f, o = (
        sigmoid(g[:, :D]),
        sigmoid(g[:, D : 2 * D] + FORGET_BIAS),
        sigmoid(g[:, 2 * D : 3 * D]),
    )
    cand, tc = np.tanh(g[:, 3 * D :]), np.tanh(c_t)
    c_term = dc + dh * o * (1 - tc * tc)
    live = lengths > 1
    assert 0 < live.sum() < N
    np.testing.assert_allclose(dc_prev[0, live], (c_term * f)[live], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dh_prev[0, live], 0.0)
    want_dg = np.concatenate(
        [
            c_term * cand * i * (1 - i),
            c_term * c_prev * f * (1 - f),
            dh * tc * o * (1 - o),
            c_term * i * (1 - cand * cand),
        ],
        axis=1,
    )
    np.testing.assert_allclose(dg[0, live], want_dg[live], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(dg[0, ~live], 0.0)
    np.testing.assert_array_equal(dh_prev[0, ~live], 0.0 if drop else dh[~live])
    np.testing.assert_array_equal(dc_prev[0, ~live], 0.0 if drop else dc[~live])
