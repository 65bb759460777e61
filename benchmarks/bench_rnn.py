"""RNN benchmark: forward + backward of an LSTM built with ``rnn_cell.LSTM`` (a RecurrentNetwork
op and its gradient), against a plain-numpy LSTM measured in the same run.

    python benchmarks/bench_rnn.py          (build with `maturin develop --release` first)

1. ratio: one layer, T=64, N=32, D=128, H=256; the whole training net (input projection FC,
   RecurrentNetwork, loss, gradient ops) against numpy doing the same forward and backward
   with the input projection in one GEMM and one recurrent GEMM per step (and the recurrent
   weight gradient in one GEMM at the end). Target: ferrocaffe / numpy <= 0.5.
   Beside it, the products alone ("GEMM floor"): the matrix products any LSTM forward and
   backward has to do, batched wherever the recurrence allows (input projection, input
   gradient and both weight gradients as one GEMM each; the recurrent product and its input
   gradient once per step), each group timed on numpy and on ferrocaffe MatMul ops in the
   same run, the faster counted: no implementation on these two GEMMs goes below it (PyTorch's
   MKL kernels can).
   Where PyTorch is installed (it is not a dependency), its CPU ``nn.LSTM`` doing the same
   forward and backward is timed in the same run too: the issue's "PyTorch level".
   Each is also given as the rate of the pass's matrix arithmetic (GFLOP/s), beside the
   rate the 0.5 target needs; `cargo run --release -p ferrocaffe --example fma_peak`
   measures the machine's ceiling for that rate.
2. executor gain: the same net with ``enable_rnn_executor`` 0 (step nets one after another)
   against 1 (the threaded executor), for 1 and 2 layers: on ferrocaffe's own GEMM with the
   default executor thread count (one: the GEMMs themselves use both cores) and with 2 threads,
   and on numpy's OpenBLAS (``ferrocaffe.blas``).

Before timing, the loss and every parameter gradient are checked against numpy.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

from ferrocaffe import blas, core, model_helper, rnn_cell, workspace


def build(T, N, D, H, layers):
    """The training net: input FC projection + LSTM (+ gradient), loss = mean(h_all ** 2)."""
    core.Net._net_names_used = set()
    model = model_helper.ModelHelper(name="bench_lstm")
    inputs = ["input", "seq_lengths"]
    initial = []
    for i in range(layers):
        initial += ["h%d" % i, "c%d" % i]
    hidden_all, _, _, _ = rnn_cell.LSTM(
        model,
        "input",
        "seq_lengths",
        initial,
        D,
        [H] * layers if layers > 1 else H,
        scope="lstm",
    )
    sq = model.net.Sqr(hidden_all, "sq")
    loss = model.net.AveragedLoss(sq, "loss")
    model.AddGradientOperators([loss])
    return model, inputs + initial, str(hidden_all)


def set_executor(net_proto, enabled, threads):
    for op in net_proto.op:
        if not op.type.startswith("RecurrentNetwork"):
            continue
        keep = [
            a for a in op.arg if a.name not in ("enable_rnn_executor", "rnn_executor.num_threads")
        ]
        del op.arg[:]
        op.arg.extend(keep)
        op.arg.add(name="enable_rnn_executor", i=int(enabled))
        if threads:
            op.arg.add(name="rnn_executor.num_threads", i=threads)


def params_of(model):
    return [str(p) for p in model.params]


def setup(model, feed_names, T, N, D, H, layers, seed=0):
    workspace.ResetWorkspace()
    rng = np.random.default_rng(seed)
    workspace.RunNetOnce(model.param_init_net)
    values = {}
    for p in params_of(model):
        shape = workspace.FetchBlob(p).shape
        values[p] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        workspace.FeedBlob(p, values[p])
    values["input"] = rng.standard_normal((T, N, D)).astype(np.float32)
    values["seq_lengths"] = np.full(N, T, dtype=np.int32)
    for name in feed_names[2:]:
        values[name] = (rng.standard_normal((1, N, H)) * 0.1).astype(np.float32)
    for name in feed_names:
        workspace.FeedBlob(name, values[name])
    return values


def best_median(fns, repeat, trials=3):
    """For each function: the lowest, over ``trials``, of the median of ``repeat`` calls. Each
    trial times the functions one block after another, with a pause between blocks so that
    worker threads of one library (OpenBLAS spins after each call) do not steal the cores
    while the other is timed."""
    best = [float("inf")] * len(fns)
    for _ in range(trials):
        for k, fn in enumerate(fns):
            time.sleep(0.3)
            fn()
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            best[k] = min(best[k], statistics.median(times))
    return best


# ----------------------------------------------------------------------------- numpy LSTM
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(x, h0, c0, wx, bx, wh, bh):
    """Forward and backward of one LSTM layer (gates i, f, o, g, as Caffe2's LSTMUnit) and of
    loss = mean(h ** 2). Returns the loss and the gradients of the weights and the input."""
    T, N, _ = x.shape
    H = wh.shape[1]
    xp = (x.reshape(T * N, -1) @ wx.T + (bx + bh)).reshape(T, N, 4 * H)
    hs = np.empty((T + 1, N, H), np.float32)
    cs = np.empty((T + 1, N, H), np.float32)
    acts = np.empty((T, N, 4 * H), np.float32)
    hs[0], cs[0] = h0, c0
    for t in range(T):
        g = xp[t] + hs[t] @ wh.T
        a = acts[t]
        a[:, : 3 * H] = sigmoid(g[:, : 3 * H])
        a[:, 3 * H :] = np.tanh(g[:, 3 * H :])
        i, f, o, c = a[:, :H], a[:, H : 2 * H], a[:, 2 * H : 3 * H], a[:, 3 * H :]
        cs[t + 1] = f * cs[t] + i * c
        hs[t + 1] = o * np.tanh(cs[t + 1])
    h = hs[1:]
    loss = float(np.mean(np.square(h, dtype=np.float64)))
    dh_all = (2.0 / h.size) * h
    dgates = np.empty((T, N, 4 * H), np.float32)
    dh = np.zeros((N, H), np.float32)
    dc = np.zeros((N, H), np.float32)
    for t in range(T - 1, -1, -1):
        a = acts[t]
        i, f, o, c = a[:, :H], a[:, H : 2 * H], a[:, 2 * H : 3 * H], a[:, 3 * H :]
        dh = dh + dh_all[t]
        tc = np.tanh(cs[t + 1])
        dc = dc + dh * o * (1 - tc * tc)
        dg = dgates[t]
        dg[:, :H] = dc * c * i * (1 - i)
        dg[:, H : 2 * H] = dc * cs[t] * f * (1 - f)
        dg[:, 2 * H : 3 * H] = dh * tc * o * (1 - o)
        dg[:, 3 * H :] = dc * i * (1 - c * c)
        dc = dc * f
        dh = dg @ wh
    dg2 = dgates.reshape(T * N, 4 * H)
    dwh = dg2.T @ hs[:-1].reshape(T * N, H)
    dwx = dg2.T @ x.reshape(T * N, -1)
    db = dg2.sum(axis=0)
    dx = (dg2 @ wx).reshape(x.shape)
    return loss, {"wx": dwx, "bx": db, "wh": dwh, "bh": db, "x": dx, "h0": dh, "c0": dc}


def torch_lstm(values, params, T, N, D, H):
    """PyTorch's CPU ``nn.LSTM`` with the same weights, forward and backward of the same loss
    (``None`` where PyTorch is not installed). Checked against numpy before it is timed."""
    try:
        import torch
    except ImportError:
        return None
    lstm = torch.nn.LSTM(D, H)
    # Caffe2's gate order is (i, f, o, g); PyTorch's is (i, f, g, o).
    order = np.r_[0 : 2 * H, 3 * H : 4 * H, 2 * H : 3 * H]
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.from_numpy(params["i2h_w"][order]))
        lstm.bias_ih_l0.copy_(torch.from_numpy(params["i2h_b"][order]))
        lstm.weight_hh_l0.copy_(torch.from_numpy(params["gates_t_w"][order]))
        lstm.bias_hh_l0.copy_(torch.from_numpy(params["gates_t_b"][order]))
    x = torch.from_numpy(values["input"]).requires_grad_(True)
    state = (torch.from_numpy(values["h0"]), torch.from_numpy(values["c0"]))
    wanted = [x] + list(lstm.parameters())

    def run():
        out, _ = lstm(x, state)
        loss = (out * out).mean()
        return loss, torch.autograd.grad(loss, wanted)

    loss, grads = run()
    want_loss, want = numpy_lstm(
        values["input"], values["h0"][0], values["c0"][0], params["i2h_w"], params["i2h_b"],
        params["gates_t_w"], params["gates_t_b"],
    )  # fmt: skip
    loss = float(loss.detach())
    assert abs(loss - want_loss) <= 1e-3 * abs(want_loss), (loss, want_loss)
    np.testing.assert_allclose(grads[0].numpy(), want["x"], rtol=2e-3, atol=1e-6)
    np.testing.assert_allclose(grads[2].numpy()[order], want["wh"], rtol=2e-3, atol=1e-6)
    return run


def check_against_numpy(model, values, H):
    """The ferrocaffe run must match numpy (one layer)."""
    p = {name.split("/")[-1]: values[name] for name in params_of(model)}
    loss, grads = numpy_lstm(
        values["input"],
        values["h0"][0],
        values["c0"][0],
        p["i2h_w"],
        p["i2h_b"],
        p["gates_t_w"],
        p["gates_t_b"],
    )
    got = float(workspace.FetchBlob("loss"))
    # AveragedLoss sums in float32: allow its rounding over T*N*H values.
    assert abs(got - loss) <= 1e-3 * abs(loss), (got, loss)
    pairs = {
        "lstm/i2h_w_grad": "wx",
        "lstm/i2h_b_grad": "bx",
        "lstm/gates_t_w_grad": "wh",
        "lstm/gates_t_b_grad": "bh",
        "input_grad": "x",
    }
    for blob, key in pairs.items():
        np.testing.assert_allclose(
            workspace.FetchBlob(blob), grads[key], rtol=2e-3, atol=1e-6, err_msg=blob
        )


def pass_flops(T, N, D, H):
    """Floating-point operations of the matrix products of one LSTM forward + backward: the
    input projection and the recurrent product forward, and for each of the two the input
    gradient and the weight gradient backward (2 flops per multiply-add)."""
    return 3 * 2 * T * N * 4 * H * (D + H)


def gemm_floor(T, N, D, H, repeat):
    """The products alone of an LSTM forward + backward, per group the faster of numpy and
    ferrocaffe (MatMul ops): ``(total, {group: (numpy, ferrocaffe)})`` in seconds."""
    rng = np.random.default_rng(2)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    blobs = dict(
        x=rand(T * N, D), wx=rand(4 * H, D), wh=rand(4 * H, H), h=rand(N, H),
        dg_t=rand(N, 4 * H), dg=rand(T * N, 4 * H), hs=rand(T * N, H),
    )  # fmt: skip
    b = blobs
    groups = {  # group: (numpy, ferrocaffe MatMul ops as (A, B, trans_a, trans_b) repeated)
        "per-step h W^T": (lambda: [b["h"] @ b["wh"].T for _ in range(T)], [("h", "wh", 0, 1)] * T),
        "per-step dG W": (lambda: [b["dg_t"] @ b["wh"] for _ in range(T)], [("dg_t", "wh", 0, 0)] * T),
        "batched X Wx^T, dG^T H, dG^T X, dG Wx": (
            lambda: (b["x"] @ b["wx"].T, b["dg"].T @ b["hs"], b["dg"].T @ b["x"], b["dg"] @ b["wx"]),
            [("x", "wx", 0, 1), ("dg", "hs", 1, 0), ("dg", "x", 1, 0), ("dg", "wx", 0, 0)],
        ),
    }  # fmt: skip
    workspace.ResetWorkspace()
    for name, value in blobs.items():
        workspace.FeedBlob(name, value)
    fns = []
    for k, (ref, products) in enumerate(groups.values()):
        net = core.Net("gemm_floor_%d" % k)
        for j, (a, bb, ta, tb) in enumerate(products):
            net.MatMul([a, bb], ["out_%d" % j], trans_a=ta, trans_b=tb)
        workspace.CreateNet(net, overwrite=True)
        name = net.Proto().name
        fns += [ref, lambda name=name: workspace.RunNet(name)]
    times = best_median(fns, repeat)
    per_group = {label: (times[2 * k], times[2 * k + 1]) for k, label in enumerate(groups)}
    return sum(min(pair) for pair in per_group.values()), per_group


def create(model, enabled, threads, name):
    """A copy of the training net under ``name`` with the executor flag set; returns a runner."""
    proto = model.net.Proto().__class__()
    proto.CopyFrom(model.net.Proto())
    proto.name = name
    set_executor(proto, enabled, threads)
    workspace.CreateNet(proto, overwrite=True)
    workspace.RunNet(name)
    return lambda: workspace.RunNet(name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--N", type=int, default=32)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--H", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=10, help="calls per timing block")
    ap.add_argument("--threads", type=int, default=0, help="executor threads (0: default)")
    args = ap.parse_args(argv)
    T, N, D, H = args.T, args.N, args.D, args.H
    print(
        "LSTM T=%d N=%d D=%d H=%d, %d CPUs, GEMM backend %s"
        % (T, N, D, H, os.cpu_count(), blas.backend())
    )

    model, feeds, _ = build(T, N, D, H, 1)
    values = setup(model, feeds, T, N, D, H, 1)
    run_ours = create(model, True, args.threads, "lstm_executor")
    check_against_numpy(model, values, H)
    p = {name.split("/")[-1]: values[name] for name in params_of(model)}

    def run_numpy():
        numpy_lstm(
            values["input"],
            values["h0"][0],
            values["c0"][0],
            p["i2h_w"],
            p["i2h_b"],
            p["gates_t_w"],
            p["gates_t_b"],
        )

    run_torch = torch_lstm(values, p, T, N, D, H)
    fns = [run_ours, run_numpy] + ([run_torch] if run_torch else [])
    times = best_median(fns, args.repeat)
    ours, ref = times[:2]
    ratio = ours / ref
    print(
        "forward+backward: ferrocaffe %.2f ms, numpy %.2f ms, ratio %.3f (target <= 0.5)"
        % (ours * 1e3, ref * 1e3, ratio)
    )
    if run_torch:
        print(
            "  PyTorch CPU nn.LSTM (same weights, loss and gradients): %.2f ms, ratio %.3f to "
            "numpy; ferrocaffe / PyTorch %.3f" % (times[2] * 1e3, times[2] / ref, ours / times[2])
        )
    else:
        print("  PyTorch CPU nn.LSTM: not timed (PyTorch is not installed)")
    flops = pass_flops(T, N, D, H)
    rates = ", ".join(
        "%s %.0f" % (label, flops / t / 1e9)
        for label, t in zip(("ferrocaffe", "numpy", "PyTorch"), times, strict=False)
    )
    print(
        "  products of the pass: %.2f GFLOP; sustained GFLOP/s: %s; the 0.5 target needs %.0f "
        "(the machine's FMA peak: examples/fma_peak.rs)"
        % (flops / 1e9, rates, flops / (0.5 * ref) / 1e9)
    )
    floor, per_group = gemm_floor(T, N, D, H, args.repeat)
    for label, (t_np, t_ours) in per_group.items():
        print(
            "  GEMM floor, %s: numpy %.2f ms, ferrocaffe %.2f ms"
            % (label, t_np * 1e3, t_ours * 1e3)
        )
    print(
        "GEMM floor (products alone, faster of numpy/ferrocaffe per group): %.2f ms = %.3f of the "
        "numpy reference (the 0.5 target needs <= %.2f ms for everything)"
        % (floor * 1e3, floor / ref, 0.5 * ref * 1e3)
    )

    # The executor's gain over the step nets run one by one, per GEMM backend and executor
    # thread count: with threaded GEMMs (ferrocaffe's own, split with its helper thread, or a
    # CBLAS library's pool) the executor defaults to one thread.
    gains = {}
    configs = [("ferrocaffe GEMM", False, args.threads), ("ferrocaffe GEMM", False, 2)]
    bundled = blas._default_library()
    if bundled is not None:
        blas.load(bundled)
        configs.append(("numpy's OpenBLAS", True, args.threads))
    for backend, use, threads in configs:
        blas.use_cblas(use)
        for layers in (1, 2):
            model, feeds, _ = build(T, N, D, H, layers)
            setup(model, feeds, T, N, D, H, layers)
            seq_run = create(model, False, 0, "lstm_plain")
            par_run = create(model, True, threads, "lstm_threaded")
            seq, par = best_median([seq_run, par_run], args.repeat)
            gains[backend, threads, layers] = seq / par
            print(
                "executor gain (%s, %s executor threads), %d layer%s: step nets one by one "
                "%.2f ms, executor %.2f ms, gain %.2fx"
                % (
                    backend,
                    threads or "default",
                    layers,
                    "s" if layers > 1 else "",
                    seq * 1e3,
                    par * 1e3,
                    seq / par,
                )
            )
    blas.use_cblas(False)
    return ratio, gains


if __name__ == "__main__":
    main(sys.argv[1:])
