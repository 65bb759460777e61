"""memonger: blob sharing keeps what nets compute bit for bit, the shared names and choices of
the recycling algorithms (hand-derived), the interval assignments on hand-computed examples,
graph verification, the helpers, and the errors."""

import numpy as np
import pytest

from ferrocaffe import _native, brew, core, memonger, model_helper, workspace
from ferrocaffe.memonger import AssignmentAlgorithm, LiveRange
from ferrocaffe.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def fresh_workspace(monkeypatch):
    monkeypatch.setattr(core.Net, "_net_names_used", set())
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def blobs_of(proto):
    return {b for op in proto.op for b in list(op.input) + list(op.output)}


def io_of(proto):
    return [(list(op.input), list(op.output)) for op in proto.op]


def mlp(scope="", depth=4, dim=5):
    m = model_helper.ModelHelper(name="mlp")
    with core.NameScope(scope):
        x = "data"
        for i in range(depth):
            x = brew.fc(m, x, f"fc{i}", dim_in=dim, dim_out=dim)
            x = brew.relu(m, x, f"relu{i}")
        m.net.Softmax(x, "pred").LabelCrossEntropy(["label"], ["xent"]).AveragedLoss([], "loss")
    grads = m.AddGradientOperators([f"{scope}/loss" if scope else "loss"])
    return m, grads


def convnet():
    m = model_helper.ModelHelper(name="conv")
    c = brew.conv(m, "data", "conv1", dim_in=2, dim_out=3, kernel=3, pad=1)
    c = brew.relu(m, c, "relu1")
    c = brew.conv(m, c, "conv2", dim_in=3, dim_out=3, kernel=3, pad=1)
    c = brew.relu(m, c, "relu2")
    f = brew.fc(m, c, "fc", dim_in=3 * 4 * 4, dim_out=4)
    m.net.Softmax(f, "pred").LabelCrossEntropy(["label"], ["xent"]).AveragedLoss([], "loss")
    grads = m.AddGradientOperators(["loss"])
    return m, grads


_PARAMS = {}


def run_and_fetch(m, net, feeds, names):
    """Runs ``net`` in a fresh workspace on the parameters ``m``'s init net made the first
    time (the same for every net of a test) and ``feeds``."""
    if id(m) not in _PARAMS:
        workspace.ResetWorkspace()
        workspace.RunNetOnce(m.param_init_net)
        outs = [o for op in m.param_init_net.Proto().op for o in op.output]
        _PARAMS[id(m)] = (m, {o: workspace.FetchBlob(o).copy() for o in outs})
    workspace.ResetWorkspace()
    for k, v in list(_PARAMS[id(m)][1].items()) + list(feeds.items()):
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(net)
    return {n: workspace.FetchBlob(n).copy() for n in names}


def assert_bitwise(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


# --------------------------------------------------------------------- share_grad_blobs


@pytest.mark.parametrize("share_activations", [False, True])
def test_share_grad_blobs_mlp_trains_bitwise_equal(share_activations):
    m, grads = mlp("name_x")
    param_grads = set(m.param_to_grad.values())
    optim = memonger.share_grad_blobs(
        m.net, ["name_x/loss"], param_grads, "name_x", share_activations=share_activations
    )
    assert len(blobs_of(optim)) < len(blobs_of(m.net.Proto()))
    assert any(b.startswith("name_x/__m") and b.endswith("_shared") for b in blobs_of(optim))
    # Parameter gradients are never renamed, nor the loss.
    for g in param_grads:
        assert str(g) in blobs_of(optim)
    assert "name_x/loss" in blobs_of(optim)
    assert memonger.verify_graph_equality(m.net.Proto(), optim)
    assert memonger.verify_inplace_blobs(m.net.Proto(), optim)

    rng = np.random.RandomState(0)
    feeds = {
        "name_x/data": rng.randn(3, 5).astype(np.float32),
        "name_x/label": rng.randint(0, 5, size=3).astype(np.int32),
    }
    names = ["name_x/loss"] + sorted(str(g) for g in param_grads)
    before = run_and_fetch(m, m.net, feeds, names)
    after = run_and_fetch(m, optim, feeds, names)
    assert_bitwise(before, after)


def test_share_grad_blobs_conv_trains_bitwise_equal():
    m, grads = convnet()
    param_grads = set(m.param_to_grad.values())
    optim = memonger.share_grad_blobs(
        m.net, ["loss"], param_grads, "", share_activations=True, dont_share_blobs=set()
    )
    assert len(blobs_of(optim)) < len(blobs_of(m.net.Proto()))
    rng = np.random.RandomState(1)
    feeds = {
        "data": rng.randn(2, 2, 4, 4).astype(np.float32),
        "label": rng.randint(0, 4, size=2).astype(np.int32),
    }
    names = ["loss"] + sorted(str(g) for g in param_grads)
    assert_bitwise(run_and_fetch(m, m.net, feeds, names), run_and_fetch(m, optim, feeds, names))


def test_share_grad_blobs_dont_share_and_blob_shapes():
    m, grads = mlp(depth=3)
    param_grads = set(m.param_to_grad.values())
    keep = str(grads["fc1"])
    optim = memonger.share_grad_blobs(
        m.net, ["loss"], param_grads, "", dont_share_blobs={keep}, share_activations=True
    )
    # Once the blob is dead, no later op writes into its storage.
    name = {i: list(op.output) for i, op in enumerate(optim.op)}
    original = m.net.Proto().op
    last_read = max(i for i, op in enumerate(original) if keep in op.input)
    storage = next(
        optim.op[i].output[list(op.output).index(keep)]
        for i, op in enumerate(original)
        if keep in op.output
    )
    assert not any(storage in name[j] for j in range(last_read + 1, len(original)))
    plain = memonger.share_grad_blobs(m.net, ["loss"], param_grads, "", share_activations=True)
    assert any(storage in op.output for op in plain.op[last_read + 1 :])

    shapes = {b: [3, 5] for b in blobs_of(m.net.Proto())}
    sized = memonger.share_grad_blobs(m.net, ["loss"], param_grads, "", blob_shapes=shapes)
    assert memonger.verify_graph_equality(m.net.Proto(), sized)
    assert len(blobs_of(sized)) < len(blobs_of(m.net.Proto()))


# ------------------------------------------------------------ optimize_inference_for_dag


def daggy_net():
    m = model_helper.ModelHelper(name="daggy")
    m.net.Proto().type = "dag"
    with core.NameScope("name_x"):
        a = brew.fc(m, "data", "fc1", dim_in=4, dim_out=4)
        left = brew.fc(m, brew.fc(m, a, "l1", dim_in=4, dim_out=4), "l2", dim_in=4, dim_out=4)
        right = brew.fc(m, brew.fc(m, a, "r1", dim_in=4, dim_out=4), "r2", dim_in=4, dim_out=4)
        s = brew.sum(m, [left, right], "sum")
        out = brew.relu(m, s, "out")
    m.net.AddExternalOutput(out)
    return m


def test_optimize_inference_for_dag_shares_and_computes_the_same():
    m = daggy_net()
    optim = memonger.optimize_inference_for_dag(m.net, ["name_x/data"], "name_x/")
    shared = sorted(b for b in blobs_of(optim) if b.endswith("_shared"))
    assert shared and all(b.startswith("name_x/__m") for b in shared)
    assert len(blobs_of(optim)) < len(blobs_of(m.net.Proto()))
    # Op order, types, external inputs and outputs unchanged.
    assert [op.type for op in optim.op] == [op.type for op in m.net.Proto().op]
    assert "name_x/out" in blobs_of(optim)
    # The two branches never write into a blob the other one still reads: l1/l2 and r1/r2
    # (which may run concurrently) keep distinct storage.
    ops = {op.output[0]: i for i, op in enumerate(m.net.Proto().op)}
    for a in ("name_x/l1", "name_x/l2"):
        for b in ("name_x/r1", "name_x/r2"):
            assert optim.op[ops[a]].output[0] != optim.op[ops[b]].output[0]

    feeds = {"name_x/data": np.random.RandomState(2).randn(3, 4).astype(np.float32)}
    before = run_and_fetch(m, m.net, feeds, ["name_x/out"])
    after = run_and_fetch(m, optim, feeds, ["name_x/out"])
    assert_bitwise(before, after)

    # A parameter given as an extra head changes nothing.
    again = memonger.optimize_inference_for_dag(m.net, ["name_x/data", "name_x/fc1_w"], "name_x/")
    assert io_of(again) == io_of(optim)


def test_optimize_inference_for_dag_chain_names():
    net = core.Net("chain")
    d = net.Relu("x", "a").Relu([], "b").Relu([], "c").Relu([], "d")
    net.AddExternalOutput(d)
    optim = memonger.optimize_inference_for_dag(net, ["x"], "ns/")
    # a is free after b is written; c takes it (hand-derived walk).
    assert io_of(optim) == [
        (["x"], ["ns/__m0_shared"]),
        (["ns/__m0_shared"], ["b"]),
        (["b"], ["ns/__m0_shared"]),
        (["ns/__m0_shared"], ["d"]),
    ]


def test_optimize_inference_for_dag_in_place_head():
    net = core.Net("inplace_head")
    net.IndexFreeze("A", "A")  # must run in place
    net.Sum(["A", "A"], "B")
    net.Relu("B", "C")
    net.Relu("C", "D")
    net.Sum(["D", "D"], "E")
    optim = memonger.optimize_inference_for_dag(net, ["A"], "")
    assert len(blobs_of(optim)) < len(blobs_of(net.Proto()))
    assert optim.op[0].input == optim.op[0].output


def test_optimize_inference_for_dag_errors():
    net = core.Net("bad_schema")
    net.IndexFreeze("A", "B")  # must run in place
    net.Relu("B", "C")
    with pytest.raises(RuntimeError, match="schema"):
        memonger.optimize_inference_for_dag(net, ["A"], "")

    net = core.Net("undeclared")
    net.Proto().op.extend([core.CreateOperator("Relu", ["hidden"], ["y"])])
    with pytest.raises(AssertionError, match="hidden not in external input"):
        memonger.optimize_inference_for_dag(net, ["hidden"], "")

    m, _ = mlp(depth=1)
    with pytest.raises(AssertionError, match="inference-only"):
        memonger.optimize_inference_for_dag(m.net, ["data"], "")

    # A head read by an op in the middle of the graph: that op is reached through its parent.
    net = core.Net("mid_head")
    net.Relu("x", "a")
    net.Sum(["a", "w"], "b")
    net.Relu("b", "c")
    optim = memonger.optimize_inference_for_dag(net, ["w", "x"], "")
    assert io_of(optim)[2] == (["b"], ["__m0_shared"])


def test_native_recycling_argument_errors():
    net = core.Net("n")
    net.Relu("x", "a")
    data = net.Proto().SerializeToString()
    with pytest.raises(ValueError, match="op index 5"):
        _native.memonger_compute_blob_recycling_for_dag(data, ["x"], [5], {"a"}, "", set(), {})
    with pytest.raises(Exception, match="NetDef"):
        _native.memonger_optimize_inference_net(b"\xff\xff\xff", [])
    with pytest.raises(TypeError):
        _native.memonger_optimize_inference_net(data, "x")


# --------------------------------------------------------------- optimize_inference_fast


def test_optimize_inference_fast_chain_and_results():
    net = core.Net("fast")
    net.Relu("x", "a").Relu([], "b").Relu([], "c").Relu([], "d")
    optim = memonger.optimize_inference_fast(net.Proto(), ["x", "d"])
    # The last freed blob is reused first; names count up as blobs are freed.
    assert io_of(optim) == [
        (["x"], ["__m0_shared"]),
        (["__m0_shared"], ["__m1_shared"]),
        (["__m1_shared"], ["__m0_shared"]),
        (["__m0_shared"], ["d"]),
    ]
    x = np.random.RandomState(3).randn(4).astype(np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(net)
    want = workspace.FetchBlob("d").copy()
    workspace.ResetWorkspace()
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(optim)
    assert np.array_equal(workspace.FetchBlob("d"), want)

    # Running it again over an optimized net, or over a dag net, changes nothing.
    assert memonger.optimize_inference_fast(optim, ["x", "d"]) == optim
    net.Proto().type = "dag"
    assert memonger.optimize_inference_fast(net.Proto(), ["x", "d"]) == net.Proto()


def test_optimize_inference_fast_training_net_bitwise_and_unique_outputs():
    m, grads = mlp(depth=3)
    static = [o for op in m.param_init_net.Proto().op for o in op.output]
    static += ["data", "label", "loss", str(grads["fc0_w"])]
    optim = memonger.optimize_inference_fast(m.net.Proto(), static)
    assert len(blobs_of(optim)) < len(blobs_of(m.net.Proto()))
    for op in optim.op:
        assert len(set(op.output)) == len(op.output), op
    rng = np.random.RandomState(4)
    feeds = {
        "data": rng.randn(2, 5).astype(np.float32),
        "label": rng.randint(0, 5, size=2).astype(np.int32),
    }
    names = ["loss", str(grads["fc0_w"])]
    assert_bitwise(run_and_fetch(m, m.net, feeds, names), run_and_fetch(m, optim, feeds, names))


# --------------------------------------------------------------- interval assignment


# x and y overlap; z follows x; w follows y and x but overlaps z. Sizes 10, 1, 1, 10.
RANGES = {
    "x": LiveRange(0, 1, 10),
    "y": LiveRange(0, 2, 1),
    "z": LiveRange(2, 3, 1),
    "w": LiveRange(3, 4, 10),
}


def test_compute_assignments_greedy_hand_computed():
    best = memonger.compute_assignments(RANGES, [], AssignmentAlgorithm.GREEDY)
    # z joins x (the only group it fits), w then only fits y's group.
    assert best == [
        [("x", RANGES["x"]), ("z", RANGES["z"])],
        [("y", RANGES["y"]), ("w", RANGES["w"])],
    ]
    assert memonger.get_memory_usage(best) == 20
    assert memonger.compute_blob_assignments(best) == {"x": "z", "z": "z", "y": "w", "w": "w"}


def test_compute_assignments_dp_hand_computed():
    best = memonger.compute_assignments(RANGES, [], AssignmentAlgorithm.DYNAMIC_PROGRAMMING)
    # The two large blobs share; the small ones stay alone: 10 + 1 + 1.
    assert best == [
        [("y", RANGES["y"])],
        [("z", RANGES["z"])],
        [("x", RANGES["x"]), ("w", RANGES["w"])],
    ]
    assert memonger.get_memory_usage(best) == 12
    assert memonger.compute_blob_assignments(best) == {"x": "w", "w": "w"}
    memonger.verify_assignments(best)


def test_compute_assignments_dp_on_init_and_empty():
    ranges = [("b", LiveRange(5, 6, 4))]
    init = [[("a", LiveRange(0, 2, 4))]]
    assert memonger.compute_assignments_dp(ranges, init) == [
        [("a", LiveRange(0, 2, 4)), ("b", LiveRange(5, 6, 4))]
    ]
    assert memonger.compute_assignments_dp([], None) == []
    # Greedy picks the group closest in size among those that fit.
    groups = [[("big", LiveRange(0, 1, 100))], [("small", LiveRange(0, 1, 3))]]
    out = memonger.compute_assignments_greedy([("c", LiveRange(2, 3, 4))], groups)
    assert out[1][-1][0] == "c" and len(out[0]) == 1


def test_compute_assignments_static_and_unknown_ranges():
    ranges = {
        "p": LiveRange(None, 3, None),  # a parameter: never written
        "q": LiveRange(1, None, None),  # never read
        "r": LiveRange(0, 2, None),
    }
    best = memonger.compute_assignments(ranges, ["p"], AssignmentAlgorithm.GREEDY)
    # Unknowns are filled: defined -1, used one past the last use (4), size 1.
    assert [("p", LiveRange(-1, 3, 1))] in best
    assert [("r", LiveRange(0, 2, 1))] in best and [("q", LiveRange(1, 4, 1))] in best
    with pytest.raises(ValueError, match="Invalid algo"):
        memonger.compute_assignments(ranges, [], "fastest")


def test_is_compatible():
    grp = [("a", LiveRange(0, 2, 1))]
    assert memonger.is_compatible(LiveRange(3, 4, 1), grp, [])
    assert not memonger.is_compatible(LiveRange(2, 4, 1), grp, [])
    assert not memonger.is_compatible(LiveRange(3, 4, 1), grp, ["a"])
    assert not memonger.is_compatible(LiveRange(None, 4, 1), grp, [])
    with pytest.raises(AssertionError, match="overlap"):
        memonger.verify_assignments([[("a", LiveRange(0, 2, 1)), ("b", LiveRange(2, 3, 1))]])


def test_compute_ranges_and_sizes():
    net = core.Net("r")
    net.Relu("x", "a").Relu([], "b")
    net.Sum(["a", "b"], "c")
    ranges = memonger.compute_ranges(net.Proto().op)
    assert list(ranges) == ["x", "a", "b", "c"]
    assert ranges["a"] == LiveRange(0, 2, None)
    assert ranges["x"] == LiveRange(None, 0, None)
    assert ranges["c"] == LiveRange(2, None, None)
    sized = memonger.compute_ranges(net.Proto().op, {"x": 1, "a": 2, "b": 3, "c": 4})
    assert sized["b"] == LiveRange(1, 2, 3)
    with pytest.raises(KeyError, match="blob c"):
        memonger.compute_ranges(net.Proto().op, {"x": 1, "a": 2, "b": 3})


def test_interference_graph_and_orders():
    net = core.Net("g")
    net.Relu("a", "b")  # 0
    net.Relu("x", "y")  # 1
    net.Relu("b", "c")  # 2
    net.Sum(["c", "y"], "d")  # 3
    g = memonger.compute_interference_graph(net.Proto().op)
    assert sorted(g.edges()) == [(0, 2), (1, 3), (2, 3)]
    assert g.edges[2, 3]["deps"] == {"c"}
    assert g.nodes[1]["op"].type == "Relu"
    order = memonger.topological_sort_traversal(g)
    pos = {n: i for i, n in enumerate(order)}
    assert all(pos[a] < pos[b] for a, b in g.edges())
    # The source with the longer path to the end (0 -> 2 -> 3) goes first, with its path.
    assert memonger.topological_sort_traversal_longest_path(g) == [0, 2, 1, 3]

    inplace = core.Net("inplace")
    for _ in range(3):
        inplace.Copy("b1", "b1")
    g = memonger.compute_interference_graph(inplace.Proto().op)
    assert list(g.edges()) == [(0, 1), (0, 2), (1, 2)]


@pytest.mark.parametrize("algo", list(AssignmentAlgorithm))
def test_optimize_interference_bitwise(algo):
    m, grads = mlp(depth=3)
    static = [o for op in m.param_init_net.Proto().op for o in op.output]
    static += ["data", "label", "loss", str(grads["fc0_w"])]
    opt = memonger.optimize_interference(m.Proto(), static, algo=algo)
    assert memonger.verify_graph_equality(m.Proto(), opt.net) or len(opt.net.op) == len(
        m.Proto().op
    )
    renamed = set(opt.blob_assignments)
    assert renamed and not renamed & set(static)
    rng = np.random.RandomState(5)
    feeds = {
        "data": rng.randn(2, 5).astype(np.float32),
        "label": rng.randint(0, 5, size=2).astype(np.int32),
    }
    names = ["loss", str(grads["fc0_w"])]
    before = run_and_fetch(m, m.net, feeds, names)
    # Sizes of the original blobs, read from the workspace the original net ran in.
    stats = memonger.compute_statistics(opt.assignments)
    assert 0 < stats.optimized_nbytes < stats.baseline_nbytes
    sizes = memonger.collect_blob_sizes(m.Proto())
    assert sizes["data"] == feeds["data"].nbytes
    after = run_and_fetch(m, opt.net, feeds, names)
    assert_bitwise(before, after)

    opt2 = memonger.optimize_interference(
        m.Proto(),
        static,
        ordering_function=memonger.topological_sort_traversal_longest_path,
        blob_sizes=sizes,
        algo=algo,
    )
    assert_bitwise(before, run_and_fetch(m, opt2.net, feeds, names))


def test_apply_assignments_in_step_nets():
    step = core.Net("step")
    step.Relu("a", "h")
    net = core.Net("outer")
    op = core.CreateOperator("RecurrentNetwork", ["a", "s"], ["o", "h_last"])
    arg = op.arg.add()
    arg.name = "step_net"
    arg.n.CopyFrom(step.Proto())
    net.Proto().op.extend([op])
    proto = net.Proto()
    memonger.apply_assignments(proto, {"a": "shared0"})
    rnn = proto.op[0]
    assert list(rnn.input) == ["shared0", "s"]
    assert list(rnn.arg[0].n.op[0].input) == ["shared0"]
    assert list(rnn.arg[0].n.external_input) == ["shared0"]
    assert rnn.arg[1].name == "a.rename" and rnn.arg[1].s == b"shared0"


# ------------------------------------------------------------------------- verification


def fc_net(names, inner_type="FC"):
    m = model_helper.ModelHelper(name="v")
    a = brew.fc(m, "data", names[0], dim_in=2, dim_out=2)
    b = brew.fc(m, a, names[1], dim_in=2, dim_out=2)
    c = brew.fc(m, a, names[2], dim_in=2, dim_out=2)
    brew.sum(m, [b, c], "out")
    return m.net.Proto()


def test_verify_graph_equality_true_and_false():
    base = fc_net(["x", "y", "z"])
    assert memonger.verify_graph_equality(base, fc_net(["p", "q", "r"]))
    # Same names for the two branches: the Sum reads the second one twice.
    assert not memonger.verify_graph_equality(base, fc_net(["x", "y", "y"]))

    other = caffe2_pb2.NetDef()
    other.CopyFrom(base)
    other.op[1].engine = "CUDNN"
    assert not memonger.verify_graph_equality(base, other)
    other.CopyFrom(base)
    other.op[1].device_option.device_type = 1
    assert not memonger.verify_graph_equality(base, other)
    other.CopyFrom(base)
    other.op[1].type = "Relu"
    assert not memonger.verify_graph_equality(base, other)
    other.CopyFrom(base)
    del other.op[-1]
    assert not memonger.verify_graph_equality(base, other)


def test_verify_inplace_blobs():
    a = core.Net("a")
    a.Relu("x", "y")
    b = core.Net("b")
    b.Relu("x", "x")
    assert memonger.verify_inplace_blobs(a.Proto(), a.Proto())
    assert not memonger.verify_inplace_blobs(a.Proto(), b.Proto())
    c = core.Net("c")
    c.Relu("q", "r")
    assert memonger.verify_inplace_blobs(a.Proto(), c.Proto())


# ------------------------------------------------------------------------------ helpers


def test_release_blobs_when_used():
    net = core.Net("rel")
    net.Relu("data", "x")
    net.Relu("x", "y")
    net.Relu("x", "z")
    net.Relu("y", "u")
    net.Alias(["u"], ["u_alias"])
    out = net.Sum(["z", "u"], "out")
    net.AddExternalOutput(out)
    out = memonger.release_blobs_when_used(net.Proto(), {"data"})
    types = [(op.type, list(op.input)) for op in out.op]
    assert types == [
        ("Relu", ["data"]),
        ("Relu", ["x"]),
        ("Relu", ["x"]),
        ("Free", ["x"]),
        ("Relu", ["y"]),
        ("Free", ["y"]),
        ("Alias", ["u"]),
        ("Sum", ["z", "u"]),
        ("Free", ["z"]),
    ]
    assert list(out.op[3].output) == ["x"]
    # The input is not modified; a selector limits what is freed.
    assert len(net.Proto().op) == 6
    only_y = memonger.release_blobs_when_used(net.Proto(), set(), lambda b: b == "y")
    assert [list(op.input) for op in only_y.op if op.type == "Free"] == [["y"]]


def test_estimate_memory_usage():
    net = core.Net("est")
    net.Relu("x", "a")
    net.Relu("a", "b")
    net.Free(["a"], ["a"])
    net.Relu("b", "c")
    shapes = {"a": [2, 3], "b": [4], "c": [10]}
    types = {b: caffe2_pb2.TensorProto.FLOAT for b in shapes}
    types["c"] = caffe2_pb2.TensorProto.INT64
    total, high, by_type = memonger.estimate_memory_usage(
        [net.Proto()], shapes, types, caffe2_pb2.DeviceOption()
    )
    # a 24 + b 16 + c 80 bytes; a is freed before c is allocated.
    assert total == 120
    assert high == 96
    assert dict(by_type) == {"Relu": 120}
    # Ops on another device are not counted.
    gpu = caffe2_pb2.DeviceOption(device_type=1)
    assert memonger.estimate_memory_usage([net.Proto()], shapes, types, gpu)[0] == 0
