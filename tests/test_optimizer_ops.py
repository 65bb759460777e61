"""The optimizer operators of ``ops/cpu/optim_more.rs`` and the LearningRate policies, each
against a NumPy reference of Caffe2's update rule; sparse variants against their dense rule
on the indexed rows; bad inputs and arguments."""

import math

import numpy as np
import pytest
from op_runner import fresh_workspace, run  # noqa: F401  (autouse fixture)

from ferrocaffe import core, workspace


def f32(*shape, low=-1.0, high=1.0, seed=0):
    return np.random.RandomState(seed).uniform(low, high, size=shape).astype(np.float32)


def scalar(v, dtype=np.float32):
    return np.array([v], dtype=dtype)


# -- references ----------------------------------------------------------------------------


def ref_ftrl(w, n, z, g, alpha, beta, lambda1, lambda2):
    l1, l2 = lambda1, lambda2
    n_new = n + g * g
    sigma = (np.sqrt(n_new) - np.sqrt(n)) / alpha
    z_new = z + g - sigma * w
    w_new = np.where(
        np.abs(z_new) > l1,
        (l1 * np.sign(z_new) - z_new) / ((beta + np.sqrt(n_new)) / alpha + l2),
        0.0,
    )
    return w_new, n_new, z_new


def ref_adadelta(w, h, d, g, lr, eps, decay):
    h_new = decay * h + (1 - decay) * g * g
    step = np.sqrt(d + eps) / np.sqrt(h_new + eps) * g
    return w + lr * step, h_new, decay * d + (1 - decay) * step * step


def ref_storm(w, m, s, g, lr, momentum, beta):
    s_new = s + np.sum(g * g)
    rate = lr * (beta + s_new) ** (-1.0 / 3.0)
    m_new = g + (1 - momentum * rate * rate) * (m - g)
    return w + rate * m_new, m_new, s_new


FTRL_ARGS = dict(alpha=0.3, beta=0.5, lambda1=0.05, lambda2=0.01)


def test_ftrl_dense_with_and_without_the_alpha_input():
    w, g = f32(3, 2, seed=1), f32(3, 2, seed=2)
    nz = np.abs(f32(3, 2, 2, seed=3))
    want = ref_ftrl(w, nz[..., 0], nz[..., 1], g, **FTRL_ARGS)
    got_w, got_nz = run("Ftrl", {"w": w, "nz": nz, "g": g}, ["w", "nz"], **FTRL_ARGS)
    np.testing.assert_allclose(got_w, want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_nz[..., 0], want[1], rtol=1e-5)
    np.testing.assert_allclose(got_nz[..., 1], want[2], rtol=1e-5, atol=1e-6)
    # A fourth input overrides the alpha argument.
    args = dict(FTRL_ARGS, alpha=100.0)
    inputs = {"w": w, "nz": nz, "g": g, "alpha": scalar(0.3)}
    got_w2, _ = run("Ftrl", inputs, ["w_out", "nz_out"], **args)
    np.testing.assert_allclose(got_w2, want[0], rtol=1e-5, atol=1e-6)


def test_sparse_ftrl_updates_the_indexed_rows_only():
    w, nz = f32(4, 2, seed=4), np.abs(f32(4, 2, 2, seed=5))
    idx = np.array([3, 1], dtype=np.int64)
    g = f32(2, 2, seed=6)
    got_w, got_nz = run(
        "SparseFtrl", {"w": w, "nz": nz, "i": idx, "g": g}, ["w", "nz"], **FTRL_ARGS
    )
    want_w, want_nz = w.copy(), nz.copy()
    for k, r in enumerate(idx):
        a, b, c = ref_ftrl(w[r], nz[r, :, 0], nz[r, :, 1], g[k], **FTRL_ARGS)
        want_w[r], want_nz[r, :, 0], want_nz[r, :, 1] = a, b, c
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_nz, want_nz, rtol=1e-5, atol=1e-6)


def test_ftrl_rejects_a_state_of_the_wrong_size():
    with pytest.raises(RuntimeError, match="two per value of var"):
        run("Ftrl", {"w": f32(3), "nz": f32(3), "g": f32(3)}, ["w", "nz"])


def test_gftrl_zeroes_weak_columns_and_shrinks_strong_ones():
    rows, cols = 2, 3
    w = np.zeros((rows, cols), np.float32)
    nz = np.zeros((rows, cols, 2), np.float32)
    g = np.array([[0.01, 1.0, -2.0], [0.01, -1.0, 0.5]], np.float32)
    alpha, beta, l1, l2 = 0.5, 1.0, 0.2, 0.1
    got_w, got_nz = run(
        "GFtrl",
        {"w": w, "nz": nz, "g": g},
        ["w", "nz"],
        alpha=alpha,
        beta=beta,
        lambda1=l1,
        lambda2=l2,
    )
    n_new = g * g
    z_new = g - (np.sqrt(n_new) / alpha) * w
    z_norm = np.sqrt((z_new**2).sum(axis=0))
    thr = l1 * math.sqrt(rows)
    want = np.where(
        z_norm > thr,
        z_new * (thr / z_norm - 1) / ((beta + np.sqrt(n_new)) / alpha + l2),
        0.0,
    )
    assert (want[:, 0] == 0).all() and (want[:, 1:] != 0).all()
    np.testing.assert_allclose(got_w, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_nz[..., 1], z_new, rtol=1e-6)


@pytest.mark.parametrize("extra_outputs", [0, 1, 2])
def test_wngrad_dense(extra_outputs):
    w, g = f32(5, seed=7), f32(5, seed=8)
    b, lr, eps = 3.0, -0.2, 1e-5
    outs = ["w", "b", "eff", "upd"][: 2 + extra_outputs]
    got = run("Wngrad", {"w": w, "b": scalar(b), "g": g, "lr": scalar(lr)}, outs, epsilon=eps)
    eff = lr / (b + eps)
    np.testing.assert_allclose(got[0], w + eff * g, rtol=1e-6)
    np.testing.assert_allclose(got[1], [b + np.sum(g * g) / (b + eps)], rtol=1e-6)
    if extra_outputs >= 1:
        np.testing.assert_allclose(got[2], [eff], rtol=1e-6)
    if extra_outputs == 2:
        np.testing.assert_allclose(got[3], eff * g, rtol=1e-6)


def test_sparse_wngrad():
    w, g = f32(4, 3, seed=9), f32(2, 3, seed=10)
    idx = np.array([2, 0], dtype=np.int32)
    b, lr = 2.0, -0.5
    got_w, got_b = run(
        "SparseWngrad",
        {"w": w, "b": scalar(b), "i": idx, "g": g, "lr": scalar(lr)},
        ["w", "b"],
        epsilon=0.0,
    )
    want = w.copy()
    want[idx] += lr / b * g
    np.testing.assert_allclose(got_w, want, rtol=1e-6)
    np.testing.assert_allclose(got_b, [b + np.sum(g * g) / b], rtol=1e-6)


def test_adadelta_dense_and_sparse():
    w, g = f32(3, 2, seed=11), f32(3, 2, seed=12)
    h, d = np.abs(f32(3, 2, seed=13)), np.abs(f32(3, 2, seed=14))
    lr, eps, decay = -0.7, 1e-4, 0.9
    got = run(
        "Adadelta",
        {"w": w, "h": h, "d": d, "g": g, "lr": scalar(lr)},
        ["w", "h", "d"],
        epsilon=eps,
        decay=decay,
    )
    for a, b in zip(got, ref_adadelta(w, h, d, g, lr, eps, decay), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    idx = np.array([1], dtype=np.int64)
    w, h, d = f32(3, 2, seed=11), np.abs(f32(3, 2, seed=13)), np.abs(f32(3, 2, seed=14))
    got = run(
        "SparseAdadelta",
        {"w": w, "h": h, "d": d, "i": idx, "g": g[1:2], "lr": scalar(lr)},
        ["w", "h", "d"],
        epsilon=eps,
        decay=decay,
    )
    want = [w.copy(), h.copy(), d.copy()]
    for arr, v in zip(want, ref_adadelta(w[1], h[1], d[1], g[1], lr, eps, decay), strict=True):
        arr[1] = v
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_sparse_adadelta_rejects_an_index_out_of_range():
    with pytest.raises(RuntimeError, match="out of range"):
        run(
            "SparseAdadelta",
            {
                "w": f32(2, 2),
                "h": f32(2, 2),
                "d": f32(2, 2),
                "i": np.array([2], np.int64),
                "g": f32(1, 2),
                "lr": scalar(0.1),
            },
            ["w", "h", "d"],
        )


def test_rmsprop():
    g, ms, mom = f32(4, seed=15), np.abs(f32(4, seed=16)), f32(4, seed=17)
    lr, decay, momentum, eps = 0.3, 0.8, 0.5, 1e-5
    got = run(
        "RmsProp",
        {"g": g, "ms": ms, "mom": mom, "lr": scalar(lr)},
        ["go", "ms", "mom"],
        decay=decay,
        momentum=momentum,
        epsilon=eps,
    )
    ms_new = ms + (1 - decay) * (g * g - ms)
    mom_new = momentum * mom + lr * g / np.sqrt(eps + ms_new)
    np.testing.assert_allclose(got[1], ms_new, rtol=1e-6)
    np.testing.assert_allclose(got[2], mom_new, rtol=1e-5)
    np.testing.assert_allclose(got[0], mom_new, rtol=1e-5)


def test_storm_dense_and_sparse():
    w, m, g = f32(2, 3, seed=18), f32(2, 3, seed=19), f32(2, 3, seed=20)
    lr, momentum, beta = -0.4, 2.0, 0.5
    got = run(
        "Storm",
        {"w": w, "m": m, "s": scalar(0.3), "g": g, "lr": scalar(lr)},
        ["w", "m", "s"],
        momentum=momentum,
        beta=beta,
    )
    for a, b in zip(got, ref_storm(w, m, 0.3, g, lr, momentum, beta), strict=True):
        np.testing.assert_allclose(np.ravel(a), np.ravel(b), rtol=1e-5)
    # Sparse: GRAD comes before INDICES; the sum takes the slice's values.
    idx = np.array([1], dtype=np.int64)
    w, m = f32(2, 3, seed=18), f32(2, 3, seed=19)
    got = run(
        "SparseStorm",
        {"w": w, "m": m, "s": scalar(0.3), "g": g[1:], "i": idx, "lr": scalar(lr)},
        ["w", "m", "s"],
        momentum=momentum,
        beta=beta,
    )
    rw, rm, rs = ref_storm(w[1], m[1], 0.3, g[1], lr, momentum, beta)
    np.testing.assert_allclose(got[0][1], rw, rtol=1e-5)
    np.testing.assert_allclose(got[0][0], w[0])
    np.testing.assert_allclose(got[1][1], rm, rtol=1e-5)
    np.testing.assert_allclose(got[2], [rs], rtol=1e-6)


@pytest.mark.parametrize("bias_correction_first", [True, False])
def test_decay_adagrad(bias_correction_first):
    w, g = f32(4, seed=21), f32(4, seed=22)
    m, v = f32(4, seed=23), np.abs(f32(4, seed=24))
    lr, b1, b2, eps, wd, it = -0.1, 0.5, 0.9, 1e-3, 0.01, 3
    got = run(
        "DecayAdagrad",
        {"w": w, "m": m, "v": v, "g": g, "lr": scalar(lr), "it": scalar(it, np.int64)},
        ["w", "m", "v"],
        beta1=b1,
        beta2=b2,
        epsilon=eps,
        weight_decay=wd,
        bias_correction_first=bias_correction_first,
    )
    m_new = b1 * m + (1 - b1) * g
    v_new = b2 * v + g * g
    corr = 1 - b1 ** (it + 1) if bias_correction_first else 1.0
    w_new = w + lr * (m_new / corr / (np.sqrt(v_new) + eps) + wd * w)
    np.testing.assert_allclose(got[0], w_new, rtol=1e-5)
    np.testing.assert_allclose(got[1], m_new, rtol=1e-6)
    np.testing.assert_allclose(got[2], v_new, rtol=1e-6)


def _yellowfin_inputs(n, width):
    z = np.zeros(n, np.float32)
    return {
        "w": f32(n, seed=25),
        "mom": z.copy(),
        "lr": scalar(0.1),
        "mu": scalar(0.0),
        "win": np.zeros(width, np.float32),
        "ga": z.copy(),
        "g2a": z.copy(),
        "sm": np.zeros(5, np.float32),
    }


def test_yellowfin_first_steps_follow_the_numpy_tuner():
    n, width, beta = 6, 3, 0.9
    state = _yellowfin_inputs(n, width)
    names = list(state)
    w = state["w"].astype(np.float64)
    mom = np.zeros(n)
    g_avg = np.zeros(n)
    sm = np.zeros(5)
    lr_avg, mu_avg = 0.1, 0.0
    logs = []
    for it in range(1, 5):
        g = f32(n, seed=30 + it) * it
        got = run(
            "YellowFin",
            dict(state, g=g, it=scalar(it, np.int64)),
            names,
            beta=beta,
            curv_win_width=width,
            zero_debias=False,
            epsilon=1e-6,
        )
        state = dict(zip(names, got, strict=True))
        gd = g.astype(np.float64)
        g_avg = beta * g_avg + (1 - beta) * gd
        g_norm2 = max(np.sum(gd * gd), 1e-6)
        sm[1] = beta * sm[1] + (1 - beta) * g_norm2
        sm[0] = beta * sm[0] + (1 - beta) * math.sqrt(g_norm2)
        logs.append(math.log(g_norm2))
        window = logs[-width:]
        sm[2] = beta * sm[2] + (1 - beta) * min(window)
        sm[3] = beta * sm[3] + (1 - beta) * max(window)
        variance = max(sm[1] - g_avg.dot(g_avg), 1e-6)
        sm[4] = beta * sm[4] + (1 - beta) * max(sm[0], 1e-6) / sm[1]
        if it > 1:
            h_min, h_max, dist = math.exp(sm[2]), math.exp(sm[3]), sm[4]
            p = dist**2 * h_min**2 / 2 / variance
            w3 = (-math.sqrt(p * p + 4.0 / 27.0 * p**3) - p) / 2.0
            wc = math.copysign(abs(w3) ** (1.0 / 3.0), w3)
            root = min(wc - p / 3.0 / wc + 1, 1 - 1e-6)
            dr = math.sqrt(h_max / h_min)
            mu = max(((dr - 1) / (dr + 1)) ** 2, root**2)
            lr = (1 - math.sqrt(mu)) ** 2 / h_min
            lr_avg = beta * lr_avg + (1 - beta) * lr
            mu_avg = beta * mu_avg + (1 - beta) * mu
        new_mom = mu_avg * mom + lr_avg * gd
        w = w - new_mom
        mom = new_mom
        np.testing.assert_allclose(state["sm"], sm, rtol=1e-4)
        np.testing.assert_allclose(state["lr"], [lr_avg], rtol=1e-4)
        np.testing.assert_allclose(state["mu"], [mu_avg], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(state["w"], w, rtol=1e-4, atol=1e-6)


def test_yellowfin_rejects_a_bad_window():
    state = _yellowfin_inputs(4, 3)
    with pytest.raises(RuntimeError, match="curv_win_width must be positive"):
        run(
            "YellowFin",
            dict(state, g=f32(4), it=scalar(1, np.int64)),
            list(state),
            curv_win_width=0,
        )
    with pytest.raises(RuntimeError, match="curv_win_width"):
        run(
            "YellowFin",
            dict(state, g=f32(4), it=scalar(1, np.int64)),
            list(state),
            curv_win_width=5,
        )


def test_new_ops_are_checked_against_their_schemas():
    with pytest.raises(RuntimeError, match="3 inputs given, expected exactly 5"):
        workspace.RunOperatorOnce(core.CreateOperator("Storm", ["a", "b", "c"], ["a", "b", "c"]))
    # The sparse variants update their state in place.
    op = core.CreateOperator("SparseWngrad", ["a", "b", "i", "g", "lr"], ["x", "b"])
    with pytest.raises(RuntimeError, match="must be the same blob"):
        workspace.RunOperatorOnce(op)


# -- LearningRate policies -----------------------------------------------------------------


def lr_at(it, **args):
    (out,) = run("LearningRate", {"it": scalar(it, np.int64)}, ["lr"], **args)
    return float(out)


def test_alter_policy():
    args = dict(policy="alter", base_lr=0.5, active_period=3, inactive_period=2)
    assert [lr_at(i, **args) for i in range(6)] == [0.5, 0.5, 0.5, 0, 0, 0.5]
    off_first = [lr_at(i, active_first=False, **args) for i in range(6)]
    assert off_first == [0, 0, 0, 0.5, 0.5, 0]


def test_hill_policy():
    args = dict(
        policy="hill",
        base_lr=2.0,
        num_iter=10,
        start_multiplier=0.1,
        gamma=1.0,
        power=0.5,
        end_multiplier=0.3,
    )
    assert lr_at(5, **args) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
    assert lr_at(13, **args) == pytest.approx(2.0 * 0.5)
    assert lr_at(1000, **args) == pytest.approx(2.0 * 0.3)


def test_slope_and_gate_policies():
    slope = dict(
        policy="slope",
        base_lr=1.0,
        num_iter_1=10,
        multiplier_1=1.0,
        num_iter_2=20,
        multiplier_2=0.5,
    )
    assert [lr_at(i, **slope) for i in (5, 15, 30)] == pytest.approx([1.0, 0.75, 0.5])
    gate = dict(policy="gate", base_lr=-2.0, num_iter=7, multiplier_1=0.25, multiplier_2=-1.0)
    assert [lr_at(i, **gate) for i in (6, 7)] == pytest.approx([-0.5, 2.0])
    with pytest.raises(RuntimeError, match="num_iter_2 > num_iter_1"):
        lr_at(1, **dict(slope, num_iter_2=10))


def test_composite_policy():
    args = dict(
        policy="composite",
        base_lr=0.1,
        sub_policy_num_iters=[2, 3],
        sub_policy_0_policy="exp",
        sub_policy_0_gamma=0.5,
        sub_policy_0_lr_scale=2.0,
        sub_policy_1_policy="step",
        sub_policy_1_stepsize=2,
        sub_policy_1_gamma=0.1,
    )
    got = [lr_at(i, **args) for i in range(1, 8)]
    want = [0.1 * 2.0 * 0.5**1, 0.1 * 2.0 * 0.5**2]
    want += [0.1 * 0.1 ** (i // 2) for i in range(3, 8)]
    assert got == pytest.approx(want)
    with pytest.raises(RuntimeError, match="sub_policy_1_policy"):
        lr_at(1, **{k: v for k, v in args.items() if k != "sub_policy_1_policy"})
    with pytest.raises(RuntimeError, match="Unknown learning rate policy: nope"):
        lr_at(1, policy="nope", base_lr=1.0)
