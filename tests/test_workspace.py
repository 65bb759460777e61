"""ferrocaffe.workspace: feeding, fetching, nets, executors, plans, errors and threads."""

import threading

import numpy as np
import pytest

from ferrocaffe import workspace
from ferrocaffe.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def fresh():
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    yield
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()


def op(op_type, inputs, outputs, **args):
    o = caffe2_pb2.OperatorDef(type=op_type, input=inputs, output=outputs, name="")
    for k, v in args.items():
        a = o.arg.add(name=k)
        if isinstance(v, float):
            a.f = v
        elif isinstance(v, int):
            a.i = v
        elif isinstance(v, str):
            a.s = v.encode()
        elif isinstance(v, list) and all(isinstance(x, int) for x in v):
            a.ints.extend(v)
        elif isinstance(v, list):
            a.floats.extend(v)
        elif isinstance(v, caffe2_pb2.NetDef):
            a.n.CopyFrom(v)
    return o


def net(name, ops, net_type="", num_workers=0):
    n = caffe2_pb2.NetDef(name=name, op=ops)
    if net_type:
        n.type = net_type
    if num_workers:
        n.num_workers = num_workers
    return n


class Wrapped:
    """Anything with .Proto(), as core.Net / core.Plan are."""

    def __init__(self, proto):
        self._p = proto

    def Proto(self):
        return self._p

    def Name(self):
        return self._p.name


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([1.5, -2.25]),
        np.array([[1, -2]], dtype=np.int32),
        np.array([1 << 40], dtype=np.int64),
        np.array([True, False, True]),
        np.array([255, 0], dtype=np.uint8),
        np.array([-128], dtype=np.int8),
        np.array([-300], dtype=np.int16),
        np.array([65535], dtype=np.uint16),
        np.array([0.5, -0.0], dtype=np.float16),
        np.array(3.0, dtype=np.float32),
        np.zeros((0, 3), dtype=np.float32),
    ],
    ids=lambda a: "%s%s" % (a.dtype, list(a.shape)),
)
def test_feed_fetch_round_trip(arr):
    assert workspace.FeedBlob("x", arr) is True
    got = workspace.FetchBlob("x")
    assert got.dtype == arr.dtype and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)


def test_non_contiguous_and_byteswapped_inputs_are_normalised():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    workspace.FeedBlob("t", a.T)
    np.testing.assert_array_equal(workspace.FetchBlob("t"), a.T)
    b = np.arange(3, dtype=">i4")
    workspace.FeedBlob("b", b)
    got = workspace.FetchBlob("b")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [0, 1, 2])


def test_fetch_is_a_snapshot_that_later_runs_do_not_change():
    workspace.FeedBlob("acc", np.zeros(2, dtype=np.float32))
    workspace.FeedBlob("one", np.ones(2, dtype=np.float32))
    workspace.CreateNet(net("inc", [op("Add", ["acc", "one"], ["acc"])]))
    workspace.RunNet("inc")
    first = workspace.FetchBlob("acc")
    workspace.RunNet("inc", 3)
    np.testing.assert_array_equal(first, [1, 1])
    np.testing.assert_array_equal(workspace.FetchBlob("acc"), [4, 4])
    # The fetched array is the caller's (as in Caffe2): writing it leaves the blob alone.
    first[0] = 7
    np.testing.assert_array_equal(workspace.FetchBlob("acc"), [4, 4])


def test_feed_does_not_copy_but_ops_never_write_into_the_fed_array():
    x = np.ones(4, dtype=np.float32)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("two", np.full(4, 2, dtype=np.float32))
    workspace.RunOperatorOnce(op("Mul", ["x", "two"], ["x"]))
    np.testing.assert_array_equal(x, np.ones(4))
    np.testing.assert_array_equal(workspace.FetchBlob("x"), np.full(4, 2))


def test_strings_and_bytes():
    workspace.FeedBlob("s", np.array(["ab", "c"]))
    workspace.FeedBlob("o", np.array([[b"x"], [b"yz"]], dtype=object))
    got = workspace.FetchBlob("s")
    assert got.dtype == object and list(got) == [b"ab", b"c"]
    assert workspace.FetchBlob("o").shape == (2, 1)
    workspace.FeedBlob("raw", b"\x00\x01")
    assert workspace.FetchBlob("raw") == b"\x00\x01"
    workspace.RunOperatorOnce(op("Copy", ["s"], ["s2"]))
    assert list(workspace.FetchBlob("s2")) == [b"ab", b"c"]


def test_bool_views_of_other_bytes_are_normalised():
    raw = np.array([0, 2, 1, 255], dtype=np.uint8)
    workspace.FeedBlob("b", raw.view(np.bool_))
    workspace.RunOperatorOnce(op("Not", ["b"], ["nb"]))
    assert workspace.FetchBlob("nb").tolist() == [True, False, False, False]


def test_tensor_proto_feed():
    t = caffe2_pb2.TensorProto(dims=[2], data_type=caffe2_pb2.TensorProto.INT64, int64_data=[4, 5])
    workspace.FeedBlob("t", t)
    got = workspace.FetchBlob("t")
    assert got.dtype == np.int64 and list(got) == [4, 5]


def test_blob_listing_removal_and_dict_view():
    workspace.FeedBlob("b", np.zeros(1, np.float32))
    workspace.FeedBlob("a", np.zeros(1, np.float32))
    assert workspace.Blobs() == ["a", "b"]
    assert workspace.HasBlob("a") and not workspace.HasBlob("zz")
    assert workspace.RemoveBlob("a") is True
    assert workspace.RemoveBlob("a") is False
    workspace.blobs["q"] = np.arange(3, dtype=np.int32)
    assert "q" in workspace.blobs and len(workspace.blobs) == 2
    with pytest.raises(RuntimeError, match="Can't find blob: a"):
        workspace.FetchBlob("a")


def test_switch_workspaces():
    workspace.FeedBlob("x", np.zeros(1, np.float32))
    with pytest.raises(RuntimeError):
        workspace.SwitchWorkspace("other")
    workspace.SwitchWorkspace("other", True)
    assert workspace.CurrentWorkspace() == "other"
    assert not workspace.HasBlob("x")
    assert "other" in workspace.Workspaces()
    workspace.SwitchWorkspace("default")
    assert workspace.HasBlob("x")


def test_create_net_rules_and_duck_typing():
    n = net("twice", [op("ConstantFill", [], ["c"], shape=[1], value=2.0)])
    assert workspace.CreateNet(Wrapped(n)) is True
    with pytest.raises(RuntimeError, match="I respectfully refuse to overwrite"):
        workspace.CreateNet(n)
    assert workspace.CreateNet(n, overwrite=True)
    assert workspace.RunNet(Wrapped(n)) is True
    np.testing.assert_array_equal(workspace.FetchBlob("c"), [2.0])
    assert workspace.Nets() == ["twice"]
    with pytest.raises(RuntimeError, match="Can't find net nope"):
        workspace.RunNet("nope")
    assert workspace.RunNet("nope", allow_fail=True) is False


def test_missing_input_names_op_and_blob_and_creates_nothing():
    with pytest.raises(
        RuntimeError, match="op Relu: Encountered a non-existing input blob: nowhere"
    ):
        workspace.RunNetOnce(net("n", [op("Relu", ["nowhere"], ["y"])]))
    assert not workspace.HasBlob("y")


def test_kernel_errors_name_the_op():
    workspace.FeedBlob("x", np.ones(3, np.float32))
    workspace.FeedBlob("y", np.ones(4, np.float32))
    with pytest.raises(RuntimeError) as e:
        workspace.RunOperatorOnce(op("Add", ["x", "y"], ["z"]))
    msg = str(e.value)
    assert "A_dim == B_dim || A_dim == 1 || B_dim == 1. A_dim: 3,B_dim: 4" in msg
    assert "type Add" in msg and "inputs [x, y]" in msg


def test_unknown_op_and_bad_protobuf():
    with pytest.raises(RuntimeError, match="Cannot create operator of type 'NoSuchOp'"):
        workspace.RunOperatorOnce(op("NoSuchOp", [], ["y"]))
    with pytest.raises(ValueError, match="malformed caffe2.NetDef"):
        workspace.RunNetOnce(b"\xff\xff\xff")


def test_wrong_argument_type_is_an_error_not_a_crash():
    with pytest.raises(RuntimeError, match="Argument value"):
        workspace.RunOperatorOnce(op("ConstantFill", [], ["y"], shape=[1], value="x", dtype=1))


def test_legacy_and_numpy_broadcasting():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    workspace.FeedBlob("a", a)
    workspace.FeedBlob("b", np.array([1, 2, 3], dtype=np.float32))
    workspace.RunOperatorOnce(op("Add", ["a", "b"], ["c"], broadcast=1, axis=1))
    np.testing.assert_array_equal(workspace.FetchBlob("c"), a + np.array([1, 2, 3])[:, None])
    workspace.FeedBlob("r", np.array([[10.0], [20.0]], dtype=np.float32))
    workspace.FeedBlob("k", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    workspace.RunOperatorOnce(op("Mul", ["r", "k"], ["m"]))
    np.testing.assert_array_equal(workspace.FetchBlob("m"), [[10, 20, 30], [20, 40, 60]])


def test_fc_matches_numpy():
    rng = np.random.RandomState(0)
    x = rng.randn(5, 7).astype(np.float32)
    w = rng.randn(3, 7).astype(np.float32)
    b = rng.randn(3).astype(np.float32)
    for k, v in dict(x=x, w=w, b=b).items():
        workspace.FeedBlob(k, v)
    workspace.RunOperatorOnce(op("FC", ["x", "w", "b"], ["y"]))
    np.testing.assert_allclose(workspace.FetchBlob("y"), x @ w.T + b, rtol=1e-5, atol=1e-5)


def _chain_net(name, net_type, branches=4, depth=5):
    ops = []
    for i in range(branches):
        prev = "x"
        for d in range(depth):
            out = "b%d_%d" % (i, d)
            ops.append(op("Tanh" if d % 2 else "Sigmoid", [prev], [out]))
            prev = out
    ops.append(op("Sum", ["b%d_%d" % (i, depth - 1) for i in range(branches)], ["total"]))
    ops.append(op("Scale", ["total"], ["total"], scale=0.5))
    return net(name, ops, net_type, num_workers=4 if net_type else 0)


def test_dag_gives_the_same_results_as_simple():
    x = np.random.RandomState(1).randn(16, 16).astype(np.float32)
    results = {}
    for t in ["simple", "dag", "async_scheduling"]:
        workspace.ResetWorkspace()
        workspace.FeedBlob("x", x)
        workspace.CreateNet(_chain_net("n", t))
        workspace.RunNet("n", 3)
        results[t] = {b: workspace.FetchBlob(b) for b in workspace.Blobs()}
    for t in ["dag", "async_scheduling"]:
        assert results[t].keys() == results["simple"].keys()
        for b, v in results["simple"].items():
            np.testing.assert_array_equal(results[t][b], v)


def test_dag_reports_the_failing_op():
    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.FeedBlob("y", np.ones(3, np.float32))
    n = net("bad", [op("Relu", ["x"], ["r"]), op("Add", ["x", "y"], ["z"])], "dag", 2)
    workspace.CreateNet(n)
    with pytest.raises(RuntimeError, match="A_dim: 2,B_dim: 3"):
        workspace.RunNet("bad")


def test_unknown_net_type():
    with pytest.raises(RuntimeError, match="Cannot find net type"):
        workspace.CreateNet(net("n", [], "no_such_executor"))


def test_run_plan_accepts_plan_proto_and_wrapper():
    workspace.FeedBlob("acc", np.zeros(1, np.float32))
    workspace.FeedBlob("one", np.ones(1, np.float32))
    inc = net("inc", [op("Add", ["acc", "one"], ["acc"])])
    plan = caffe2_pb2.PlanDef(name="p", network=[inc])
    plan.execution_step.add(name="loop", network=["inc"], num_iter=4)
    assert workspace.RunPlan(plan) is True
    assert workspace.RunPlan(Wrapped(plan)) is True
    np.testing.assert_array_equal(workspace.FetchBlob("acc"), [8.0])


def test_control_ops_if_while_do():
    workspace.FeedBlob("x", np.array(0, dtype=np.int64))
    workspace.FeedBlob("one", np.array(1, dtype=np.int64))
    workspace.FeedBlob("three", np.array(3, dtype=np.int64))
    cond = net("cond", [op("LT", ["x", "three"], ["c"])])
    body = net("body", [op("Add", ["x", "one"], ["x"])])
    workspace.RunOperatorOnce(op("LT", ["x", "three"], ["c"]))
    workspace.RunOperatorOnce(op("While", ["c"], [], loop_net=body, cond_net=cond))
    assert int(workspace.FetchBlob("x")) == 3
    inner = net("inner", [op("Add", ["v", "v"], ["v"]), op("ConstantFill", [], ["tmp"], shape=[1])])
    workspace.RunOperatorOnce(op("CreateScope", [], ["scope"]))
    do = op("Do", ["x", "scope"], ["x", "scope"], net=inner)
    do.arg.add(name="inner_blobs", strings=[b"v"])
    do.arg.add(name="outer_blobs_idx", ints=[0])
    workspace.RunOperatorOnce(do)
    assert int(workspace.FetchBlob("x")) == 6
    assert not workspace.HasBlob("tmp")
    workspace.RunOperatorOnce(op("HasScope", ["scope"], ["has"]))
    assert workspace.FetchBlob("has").tolist() == [True]


def test_free_leaves_an_empty_blob():
    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.RunOperatorOnce(op("Free", ["x"], ["x"]))
    assert workspace.HasBlob("x")
    assert workspace.FetchBlob("x") == b"x, a C++ native class of type nullptr (uninitialized)."
    workspace.RunOperatorOnce(op("CreateMutex", [], ["m"]))
    assert b"std::mutex" in workspace.FetchBlob("m")


def test_iter_counters_and_seeded_fills():
    workspace.RunOperatorOnce(op("ConstantFill", [], ["it"], shape=[1], value=0, dtype=10))
    workspace.CreateNet(net("n", [op("Iter", ["it"], ["it"])]))
    workspace.RunNet("n", 5)
    assert workspace.FetchBlob("it").tolist() == [5]
    g = op("GaussianFill", [], ["g"], shape=[1000])
    g.device_option.random_seed = 7
    workspace.RunOperatorOnce(g)
    first = workspace.FetchBlob("g").copy()
    workspace.RunOperatorOnce(g)
    np.testing.assert_array_equal(workspace.FetchBlob("g"), first)
    assert abs(first.mean()) < 0.15 and 0.85 < first.std() < 1.15


def test_registered_operators_cover_kernels_and_schemas():
    ops = workspace.RegisteredOperators()
    assert ops == sorted(ops)
    for t in ("FC", "Add", "ConstantFill", "Do", "If", "While", "AtomicIter", "Conv"):
        assert t in ops


def test_global_init_accepts_caffe2_flags():
    assert workspace.GlobalInit(["caffe2", "--caffe2_log_level=0"]) is True
    with pytest.raises(RuntimeError):
        workspace.GlobalInit(["caffe2", "not_a_flag"])


def test_threads_run_different_nets_on_one_workspace():
    n_threads, iters = 4, 200
    workspace.FeedBlob("one", np.ones(8, np.float32))
    for t in range(n_threads):
        workspace.FeedBlob("acc%d" % t, np.zeros(8, np.float32))
        ops = [op("Add", ["acc%d" % t, "one"], ["acc%d" % t]) for _ in range(5)]
        workspace.CreateNet(net("net%d" % t, ops, "dag" if t % 2 else ""))
    errors = []

    def worker(t):
        try:
            for _ in range(iters):
                workspace.RunNet("net%d" % t)
                workspace.FetchBlob("acc%d" % t)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for t in range(n_threads):
        np.testing.assert_array_equal(workspace.FetchBlob("acc%d" % t), np.full(8, 5.0 * iters))


def test_threads_running_the_same_net_are_serialised():
    workspace.FeedBlob("acc", np.zeros(1, np.float32))
    workspace.FeedBlob("one", np.ones(1, np.float32))
    workspace.CreateNet(net("inc", [op("Add", ["acc", "one"], ["acc"])]))
    threads = [threading.Thread(target=workspace.RunNet, args=("inc", 250)) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert workspace.FetchBlob("acc").tolist() == [1000.0]


def test_blobs_queue_round_trip_and_close():
    workspace.RunOperatorOnce(op("CreateBlobsQueue", [], ["q"], capacity=2, num_blobs=2))
    assert b"BlobsQueue" in workspace.FetchBlob("q")
    workspace.FeedBlob("a", np.arange(3, dtype=np.float32))
    workspace.FeedBlob("b", np.array([7], dtype=np.int64))
    workspace.RunOperatorOnce(op("EnqueueBlobs", ["q", "a", "b"], ["a", "b"]))
    workspace.RunOperatorOnce(op("DequeueBlobs", ["q"], ["x", "y"]))
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [0, 1, 2])
    assert workspace.FetchBlob("y").tolist() == [7]
    workspace.RunOperatorOnce(op("CloseBlobsQueue", ["q"], []))
    workspace.RunOperatorOnce(op("SafeDequeueBlobs", ["q"], ["x", "y", "status"]))
    assert workspace.FetchBlob("status").tolist() is True
    with pytest.raises(
        RuntimeError, match="No known serializer for std::shared_ptr<caffe2::BlobsQueue>"
    ):
        workspace.SerializeBlob("q")


def test_serialize_round_trip():
    workspace.FeedBlob("t", np.arange(6, dtype=np.int16).reshape(2, 3))
    data = workspace.SerializeBlob("t")
    workspace.DeserializeBlob("u", data)
    got = workspace.FetchBlob("u")
    assert got.dtype == np.int16 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3))
    with pytest.raises(RuntimeError, match="Cannot parse content into a BlobProto"):
        workspace.DeserializeBlob("v", b"\xff\xff")


def test_run_operator_multiple_reset_blob_and_background_plans():
    workspace.RunOperatorOnce(op("ConstantFill", [], ["it"], shape=[1], value=0, dtype=10))
    assert workspace.RunOperatorMultiple(op("Iter", ["it"], ["it"]), 4)
    assert workspace.FetchBlob("it").tolist() == [4]
    assert "__run_operator_multiple__" not in workspace.Nets()
    workspace.ResetBlob("it")
    assert workspace.HasBlob("it") and isinstance(workspace.FetchBlob("it"), bytes)
    workspace.FeedBlob("acc", np.zeros(1, np.float32))
    workspace.FeedBlob("one", np.ones(1, np.float32))
    plan = caffe2_pb2.PlanDef(name="p", network=[net("inc", [op("Add", ["acc", "one"], ["acc"])])])
    plan.execution_step.add(name="loop", network=["inc"], num_iter=7)
    run = workspace.RunPlanInBackground(plan)
    assert run.wait(30) and run.is_done() and run.is_succeeded()
    assert workspace.FetchBlob("acc").tolist() == [7.0]
    bad = caffe2_pb2.PlanDef(name="bad")
    bad.execution_step.add(name="s", network=["missing"])
    run = workspace.RunPlanInBackground(bad)
    assert run.wait(30) and not run.is_succeeded()
    assert "uses undefined net missing" in str(run.error)
    assert workspace.IsImmediate() is False
