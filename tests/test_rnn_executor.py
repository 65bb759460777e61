"""The RNN step executor: bit-identical to running the step nets one by one under any thread
count and timestep bound (500 runs), forward-only nets that cycle over few workspaces,
recomputed blobs, errors that name the op and the timestep (and a clean run afterwards),
step nets given as text, links with a window of several rows."""

import numpy as np
import pytest
from google.protobuf import text_format

from ferrocaffe import core, rnn_cell, workspace
from ferrocaffe.model_helper import ModelHelper
from ferrocaffe.proto import caffe2_pb2

T, N, D, H = 7, 3, 4, 5


@pytest.fixture(autouse=True)
def fresh():
    core.Net._net_names_used = set()
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _configure(net_proto, enabled, threads=None, max_parallel=None, num_workspaces=None):
    for op in net_proto.op:
        if not op.type.startswith("RecurrentNetwork"):
            continue
        drop = {
            "enable_rnn_executor",
            "rnn_executor.num_threads",
            "rnn_executor.max_parallel_timesteps",
            "num_workspaces",
        }
        keep = [a for a in op.arg if a.name not in drop]
        del op.arg[:]
        op.arg.extend(keep)
        op.arg.add(name="enable_rnn_executor", i=int(enabled))
        if threads is not None:
            op.arg.add(name="rnn_executor.num_threads", i=threads)
        if max_parallel is not None:
            op.arg.add(name="rnn_executor.max_parallel_timesteps", i=max_parallel)
        if num_workspaces is not None and op.type == "RecurrentNetwork":
            op.arg.add(name="num_workspaces", i=num_workspaces)


def _lstm(layers, forward_only=False, memory_optimization=False):
    model = ModelHelper(name="stress")
    states = []
    for i in range(layers):
        states += [f"h{i}", f"c{i}"]
    out = rnn_cell.LSTM(
        model,
        "input",
        "seq_lengths",
        states,
        D,
        [H] * layers,
        scope="lstm",
        forward_only=forward_only,
        memory_optimization=memory_optimization,
    )
    blobs = [str(b) for b in out]
    if not forward_only:
        sq = model.net.Sqr(out[0], "sq")
        model.net.AveragedLoss(sq, "loss")
        grad_map = model.AddGradientOperators(["loss"])
        blobs += ["loss"] + sorted(
            str(grad_map[b]) for b in ["input"] + states + [str(p) for p in model.params]
        )
    return model, states, blobs


def _feed(model, states, seed=0):
    rng = np.random.default_rng(seed)
    workspace.RunNetOnce(model.param_init_net)
    for p in model.params:
        shape = workspace.FetchBlob(str(p)).shape
        workspace.FeedBlob(str(p), (rng.standard_normal(shape) * 0.4).astype(np.float32))
    workspace.FeedBlob("input", rng.standard_normal((T, N, D)).astype(np.float32))
    workspace.FeedBlob("seq_lengths", np.array([T, T - 3, 2], np.int32))
    for s in states:
        workspace.FeedBlob(s, (rng.standard_normal((1, N, H)) * 0.4).astype(np.float32))


def _run(model, blobs, runs=1):
    name = model.net.Proto().name
    workspace.CreateNet(model.net, overwrite=True)
    results = []
    for _ in range(runs):
        workspace.RunNet(name)
        results.append({b: workspace.FetchBlob(b).copy() for b in blobs})
    return results


def _assert_identical(expected, got, what):
    for b, v in expected.items():
        assert got[b].dtype == v.dtype and got[b].shape == v.shape, (what, b)
        assert got[b].tobytes() == v.tobytes(), f"{what}: {b} differs by {np.abs(got[b] - v).max()}"


def test_stress_500_runs_random_threads_and_bounds_bit_identical():
    rng = np.random.default_rng(2024)
    total = 0
    # Training net (2 layers, forward and gradient): 15 configurations x 20 runs.
    model, states, blobs = _lstm(2)
    _feed(model, states)
    _configure(model.net.Proto(), False)
    reference = _run(model, blobs)[0]
    for _ in range(15):
        threads = int(rng.integers(1, 9))
        bound = int(rng.choice([0, 1, 2, 3, 5]))
        _configure(model.net.Proto(), True, threads, bound)
        for r in _run(model, blobs, runs=20):
            _assert_identical(reference, r, f"threads={threads} max_parallel={bound}")
            total += 1
    # Forward-only net cycling over 1-4 step workspaces: 10 configurations x 20 runs.
    core.Net._net_names_used = set()
    workspace.ResetWorkspace()
    model, states, blobs = _lstm(2, forward_only=True)
    _feed(model, states)
    _configure(model.net.Proto(), False)
    reference = _run(model, blobs)[0]
    for _ in range(10):
        threads = int(rng.integers(2, 9))
        bound = int(rng.choice([0, 2, 4]))
        num_ws = int(rng.integers(1, 5))
        _configure(model.net.Proto(), True, threads, bound, num_ws)
        for r in _run(model, blobs, runs=20):
            _assert_identical(reference, r, f"forward-only, {num_ws} workspaces, {threads} threads")
            total += 1
    assert total == 500


def test_forward_only_cycles_over_num_workspaces():
    model, states, blobs = _lstm(1, forward_only=True)
    for enabled, num_ws in [(0, None), (1, None), (1, 3), (0, 1)]:
        # Step workspaces are never dropped, so each configuration starts afresh.
        workspace.ResetWorkspace()
        _feed(model, states)
        _configure(model.net.Proto(), enabled, 4, None, num_ws)
        _run(model, blobs)
        op = next(o for o in model.net.Proto().op if o.type == "RecurrentNetwork")
        fetched = workspace.FetchBlob(op.output[-1])
        # Not a tensor: FetchBlob describes it as Caffe2 did.
        assert (
            fetched
            == (
                f"{op.output[-1]}, a C++ native class of type caffe2::detail::ScratchWorkspaces."
            ).encode()
        )
        names = ["fetched_names"]
        workspace.RunOperatorOnce(
            core.CreateOperator("RecurrentNetworkBlobFetcher", [op.output[-1]], names, prefix="f")
        )
        got = {n.decode() if isinstance(n, bytes) else n for n in workspace.FetchBlob(names[0])}
        expected_ws = num_ws if num_ws is not None else (4 if enabled else 2)
        assert any(n.startswith("f_lstm/hidden_state") for n in got)
        # Fetched names end with the workspace index: exactly num_workspaces of them.
        idx = {
            int(n[len("f_lstm/hidden_state") :])
            for n in got
            if n.startswith("f_lstm/hidden_state") and n[len("f_lstm/hidden_state") :].isdigit()
        }
        assert idx == set(range(expected_ws)), (enabled, num_ws, idx)


def test_recompute_blobs_on_backward_gives_the_same_gradients():
    model, states, blobs = _lstm(1)
    _feed(model, states, seed=7)
    expected = _run(model, blobs)[0]
    core.Net._net_names_used = set()
    workspace.ResetWorkspace()
    model2, states2, blobs2 = _lstm(1, memory_optimization=True)
    op = next(o for o in model2.net.Proto().op if o.type == "RecurrentNetwork")
    recompute = next(a for a in op.arg if a.name == "recompute_blobs_on_backward")
    assert len(recompute.strings) > 0
    _feed(model2, states2, seed=7)
    for enabled in (0, 1):
        _configure(model2.net.Proto(), enabled, 3)
        got = _run(model2, blobs2)[0]
        for b in blobs:
            np.testing.assert_allclose(got[b], expected[b], rtol=1e-5, atol=1e-6, err_msg=b)


# ----------------------------------------------------------------- a hand-written RNN op
def _gather_rnn(enabled, text_step_net=True):
    """h_t = h_{t-1} + table[idx_t]: the step Gather fails when idx_t is out of range."""
    step = caffe2_pb2.NetDef(name="gather_step")
    step.op.add(type="Gather", input=["table", "idx_t"], output=["g_t"])
    step.op.add(type="Add", input=["h_prev", "g_t"], output=["h_t"])
    step.external_input.extend(["idx_t", "h_prev", "table"])
    step.external_output.append("h_t")
    args = dict(
        alias_src=["states", "states"],
        alias_dst=["h_all", "h_last"],
        alias_offset=[1, -1],
        recurrent_states=["states"],
        initial_recurrent_state_ids=[1],
        link_internal=["h_prev", "h_t", "idx_t"],
        link_external=["states", "states", "idx"],
        link_offset=[0, 1, 0],
        timestep="timestep",
        enable_rnn_executor=enabled,
        step_net=text_format.MessageToString(step) if text_step_net else step,
    )
    args["rnn_executor.num_threads"] = 4
    return core.CreateOperator(
        "RecurrentNetwork", ["idx", "h0", "table"], ["h_all", "h_last", "step_ws"], **args
    )


@pytest.mark.parametrize("enabled", [1, 0])
def test_failure_names_op_and_timestep_and_the_op_runs_again(enabled):
    table = np.arange(6 * 2, dtype=np.float32).reshape(6, 1, 2)
    idx = np.array([[0], [1], [2], [9], [4]], np.int32)  # 9 is out of range: fails at t = 3
    workspace.FeedBlob("table", table)
    workspace.FeedBlob("h0", np.zeros((1, 1, 2), np.float32))
    workspace.FeedBlob("idx", idx)
    net = core.Net("gather_rnn")
    net.Proto().op.append(_gather_rnn(enabled))
    workspace.CreateNet(net)
    with pytest.raises(RuntimeError) as info:
        workspace.RunNet("gather_rnn")
    msg = str(info.value)
    assert "timestep 3" in msg and "Gather" in msg, msg
    # Fix the data: the same created net runs again and gives the right sums.
    idx[3, 0] = 3
    workspace.FeedBlob("idx", idx)
    for _ in range(2):
        workspace.RunNet("gather_rnn")
        expected = np.cumsum(table[idx[:, 0]], axis=0)
        np.testing.assert_array_equal(workspace.FetchBlob("h_all"), expected)
        np.testing.assert_array_equal(workspace.FetchBlob("h_last"), expected[-1:])


def test_step_net_as_netdef_or_text_agree():
    workspace.FeedBlob("table", np.arange(8, dtype=np.float32).reshape(4, 1, 2))
    workspace.FeedBlob("h0", np.ones((1, 1, 2), np.float32))
    workspace.FeedBlob("idx", np.array([[3], [0], [2]], np.int32))
    workspace.RunOperatorOnce(_gather_rnn(1, text_step_net=True))
    a = workspace.FetchBlob("h_all")
    workspace.RunOperatorOnce(_gather_rnn(0, text_step_net=False))
    np.testing.assert_array_equal(a, workspace.FetchBlob("h_all"))
    bad = _gather_rnn(1)
    for arg in bad.arg:
        if arg.name == "step_net":
            arg.s = b"op { this is not a net"
    with pytest.raises(RuntimeError, match="step_net"):
        workspace.RunOperatorOnce(bad)


def test_link_window_and_multi_row_initial_state():
    """h_{t+2} = h_t + h_{t+1}: the step sees a window of two state rows; the initial value
    has two rows (a 3-d initial state)."""
    step = caffe2_pb2.NetDef(name="fib")
    step.op.add(
        type="Split", input=["win"], output=["a", "b"], arg=[caffe2_pb2.Argument(name="axis", i=0)]
    )
    step.op.add(type="Add", input=["a", "b"], output=["h_t"])
    for enabled in (1, 0):
        op = core.CreateOperator(
            "RecurrentNetwork",
            ["x", "h0"],
            ["h_all", "step_ws"],
            alias_src=["states"],
            alias_dst=["h_all"],
            alias_offset=[2],
            recurrent_states=["states"],
            initial_recurrent_state_ids=[1],
            link_internal=["win", "h_t"],
            link_external=["states", "states"],
            link_offset=[0, 2],
            link_window=[2, 1],
            timestep="timestep",
            enable_rnn_executor=enabled,
            step_net=step,
        )
        workspace.FeedBlob("x", np.zeros((6, 1, 1), np.float32))
        workspace.FeedBlob("h0", np.array([[[1.0]], [[1.0]]], np.float32))
        workspace.RunOperatorOnce(op)
        np.testing.assert_array_equal(workspace.FetchBlob("h_all").ravel(), [2, 3, 5, 8, 13, 21])


def _feed_len(model, states, t_len, lengths):
    rng = np.random.default_rng(t_len)
    workspace.FeedBlob("input", rng.standard_normal((t_len, N, D)).astype(np.float32))
    workspace.FeedBlob("seq_lengths", np.array(lengths, np.int32))
    for s in states:
        workspace.FeedBlob(s, (rng.standard_normal((1, N, H)) * 0.4).astype(np.float32))


@pytest.mark.parametrize("enabled", [False, True])
def test_buffers_reused_across_runs_of_other_lengths_give_fresh_results(enabled):
    """The op keeps its buffers (state and gradient buffers, the sequence gradient, which the
    steps overwrite without a zero fill) from run to run: runs of 7, 4 and 7 timesteps in one
    workspace equal runs in fresh workspaces bit for bit."""
    cases = [(T, [T, T - 3, 2]), (4, [4, 1, 3]), (T, [2, T, T - 1])]

    def build_and_init():
        core.Net._net_names_used = set()
        model, states, blobs = _lstm(1)
        _feed(model, states)
        _configure(model.net.Proto(), enabled)
        workspace.CreateNet(model.net, overwrite=True)
        return model, states, blobs

    fresh = []
    for t_len, lengths in cases:
        workspace.ResetWorkspace()
        model, states, blobs = build_and_init()
        _feed_len(model, states, t_len, lengths)
        workspace.RunNet(model.net.Proto().name)
        fresh.append({b: workspace.FetchBlob(b).copy() for b in blobs})
    workspace.ResetWorkspace()
    model, states, blobs = build_and_init()
    for (t_len, lengths), expected in zip(cases, fresh, strict=True):
        _feed_len(model, states, t_len, lengths)
        workspace.RunNet(model.net.Proto().name)
        got = {b: workspace.FetchBlob(b) for b in blobs}
        assert got["input_grad"].shape == (t_len, N, D)
        _assert_identical(expected, got, f"T={t_len}")
