"""Python operators: functions called back from the Rust runtime (in ops, nets, dag nets with
worker threads, plans), their arguments, errors and gradients."""

import threading

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.core import CreatePythonOperator


@pytest.fixture(autouse=True)
def fresh():
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _copy(inputs, outputs):
    outputs[0].reshape(inputs[0].shape)
    outputs[0].data[...] = inputs[0].data


def test_inputs_and_outputs_are_tensor_views():
    seen = {}

    def f(inputs, outputs):
        seen["shape"] = inputs[0].shape
        seen["type"] = type(inputs[0].data)
        seen["data"] = inputs[0].data.copy()
        outputs[0].reshape((2, 3))
        outputs[0].data[...] = np.arange(6).reshape(2, 3)

    x = np.array([[1.5, 2.5]], dtype=np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(CreatePythonOperator(f, ["x"], ["y"]))
    assert seen["shape"] == (1, 2) and seen["type"] is np.ndarray
    np.testing.assert_array_equal(seen["data"], x)
    y = workspace.FetchBlob("y")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.arange(6).reshape(2, 3))


def test_in_place_op_sees_its_input_before_writing():
    def double(inputs, outputs):
        outputs[0].reshape(inputs[0].shape)
        outputs[0].data[...] = inputs[0].data * 2

    workspace.FeedBlob("x", np.array([1.0, 3.0], dtype=np.float32))
    before = workspace.FetchBlob("x")
    workspace.RunOperatorOnce(CreatePythonOperator(double, ["x"], ["x"]))
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [2.0, 6.0])
    # An earlier fetch keeps its values (the op wrote a buffer of the blob's own).
    np.testing.assert_array_equal(before, [1.0, 3.0])


def test_feed_and_init_through_the_tensor_handle():
    def f(inputs, outputs):
        outputs[0].feed(np.array([[7, 8]], dtype=np.int64))
        outputs[1].init([2, 2], core.DataType.INT32)
        outputs[1].data[1, 1] = 5

    workspace.RunOperatorOnce(CreatePythonOperator(f, [], ["a", "b"]))
    a = workspace.FetchBlob("a")
    assert a.dtype == np.int64
    np.testing.assert_array_equal(a, [[7, 8]])
    np.testing.assert_array_equal(workspace.FetchBlob("b"), [[0, 0], [0, 5]])


def test_exception_reaches_the_caller_unchanged_with_the_op_named():
    class Boom(Exception):
        pass

    def f(inputs, outputs):
        raise Boom("intentional")

    op = CreatePythonOperator(f, [], [], name="exploding")
    with pytest.raises(Boom, match="intentional") as info:
        workspace.RunOperatorOnce(op)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "Python" in notes and "exploding" in notes
    # The op still runs afterwards (a caught exception inside does not break anything).
    calls = []

    def g(inputs, outputs):
        try:
            raise ValueError("handled")
        except ValueError:
            calls.append(1)

    workspace.RunOperatorOnce(CreatePythonOperator(g, [], []))
    assert calls == [1]


def test_exception_inside_a_dag_net_on_a_worker_thread():
    def f(inputs, outputs):
        raise KeyError("from a worker")

    net = core.Net("dag_fail")
    net.Proto().op.extend([CreatePythonOperator(f, [], [])])
    net.Proto().type = "dag"
    net.Proto().num_workers = 2
    with pytest.raises(KeyError, match="from a worker"):
        workspace.RunNetOnce(net)


def test_pass_workspace_gives_the_running_workspace():
    got = []

    def f(inputs, outputs, ws):
        got.append(ws.blobs["internal"].fetch())
        ws.create_blob("made_here").feed(np.array([4.0], dtype=np.float32))

    ws = workspace.C.Workspace()
    net = core.Net("pass_ws")
    net.GivenTensorFill([], ["internal"], values=[1.0, 2.0], shape=[2])
    net.Python(f, pass_workspace=True)([], [])
    ws.run(net)
    np.testing.assert_array_equal(got[0], [1.0, 2.0])
    np.testing.assert_array_equal(ws.blobs["made_here"].fetch(), [4.0])
    assert not workspace.HasBlob("internal")


def test_builder_runs_once_per_op_instance():
    net = core.Net("builder")
    net.Python((_counting_builder, ["tag"], {"start": 10}))(["i"], ["o"])
    _BUILT.clear()
    workspace.FeedBlob("i", np.array([1.0], dtype=np.float32))
    workspace.CreateNet(net)
    for _ in range(3):
        workspace.RunNet(net)
    assert _BUILT == ["tag"]
    np.testing.assert_array_equal(workspace.FetchBlob("o"), [13.0])


_BUILT = []


def _counting_builder(tag, start):
    _BUILT.append(tag)
    state = [start]

    def f(inputs, outputs):
        state[0] += 1
        outputs[0].reshape(inputs[0].shape)
        outputs[0].data[...] = state[0]

    return f


def test_many_ops_in_a_dag_net_run_by_a_plan_on_several_threads():
    threads = set()

    def f(inputs, outputs):
        threads.add(threading.get_ident())
        _copy(inputs, outputs)

    x = np.random.RandomState(0).rand(3, 4).astype(np.float32)
    net = core.Net("dag")
    net.Proto().op.extend([CreatePythonOperator(f, ["x"], ["y%d" % i]) for i in range(8)])
    net.Proto().type = "dag"
    net.Proto().num_workers = 4
    plan = core.Plan("plan")
    plan.AddStep(core.ExecutionStep("step", net, 20))
    workspace.FeedBlob("x", x)
    workspace.RunPlan(plan)
    for i in range(8):
        np.testing.assert_array_equal(workspace.FetchBlob("y%d" % i), x)
    assert threads  # the op ran (on the executor's worker threads)


def test_python_threads_run_nets_with_python_ops_at_once():
    def f(inputs, outputs):
        _copy(inputs, outputs)

    workspace.FeedBlob("x", np.ones(5, dtype=np.float32))
    nets = []
    for t in range(4):
        net = core.Net("thread_net_%d" % t)
        net.Proto().op.extend([CreatePythonOperator(f, ["x"], ["t%d" % t])])
        nets.append(net)
        workspace.CreateNet(net)
    errors = []

    def run(net):
        try:
            for _ in range(25):
                workspace.RunNet(net)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(n,)) for n in nets]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    for t in range(4):
        np.testing.assert_array_equal(workspace.FetchBlob("t%d" % t), np.ones(5))


def test_gradient_runs_the_gradient_function():
    def f(inputs, outputs):
        outputs[0].reshape(inputs[0].shape)
        outputs[0].data[...] = inputs[0].data * 3

    def grad_f(inputs, outputs):
        # inputs: x, y, dy; outputs: dx
        assert len(inputs) == 3 and len(outputs) == 1
        outputs[0].reshape(inputs[2].shape)
        outputs[0].data[...] = inputs[2].data * 3

    net = core.Net("grad")
    x = net.AddExternalInput("x")
    y = net.Python(f, grad_f)([x], ["y"])
    loss = net.SumElements([y], "loss")
    net.AddGradientOperators([loss])
    grad_ops = [o for o in net.Proto().op if o.type == "PythonGradient"]
    assert len(grad_ops) == 1
    assert list(grad_ops[0].input) == ["x", "y", "y_grad"]
    assert list(grad_ops[0].output) == ["x_grad"]
    workspace.FeedBlob("x", np.array([1.0, 2.0], dtype=np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("x_grad"), [3.0, 3.0])


def test_gradient_with_output_and_input_indices():
    def f(inputs, outputs):
        for i in range(3):
            outputs[i].reshape(inputs[i].shape)
            outputs[i].data[...] = inputs[i].data

    op = CreatePythonOperator(
        f,
        ["a", "b", "c"],
        ["p", "q", "r"],
        grad_f=lambda i, o: None,
        grad_output_indices=[0, 2],
        grad_input_indices=[1],
    )
    grad_ops, g_input = core.GradientRegistry.GetGradientForOp(op, ["p_g", "q_g", "r_g"])
    assert list(grad_ops[0].input) == ["a", "b", "c", "p", "q", "r", "p_g", "r_g"]
    assert list(grad_ops[0].output) == ["b_grad"]
    assert g_input == [None, "b_grad", None]
    assert {a.name for a in grad_ops[0].arg} >= {"token", "grad_output_indices"}


def test_unregistered_token_and_missing_gradient_are_errors():
    op = core.CreateOperator("Python", [], [], token="no-such-token")
    with pytest.raises(RuntimeError, match="no-such-token"):
        workspace.RunOperatorOnce(op)
    token_op = CreatePythonOperator(lambda i, o: None, [], [])
    grad = core.CreateOperator("PythonGradient", [], [], arg=token_op.arg)
    with pytest.raises(RuntimeError, match="no gradient function"):
        workspace.RunOperatorOnce(grad)


def test_python_op_in_a_recurrent_style_child_workspace():
    # A Do op runs its net in a child workspace: the op gets that workspace.
    seen = []

    def f(inputs, outputs, ws):
        seen.append(sorted(ws.blobs))
        _copy(inputs, outputs)

    inner = core.Net("inner")
    inner.Python(f, pass_workspace=True)(["x"], ["y"])
    workspace.FeedBlob("x", np.array([5.0], dtype=np.float32))
    outer = core.Net("outer")
    outer.CreateScope([], ["scope"])
    outer.Do(
        ["x", "scope"],
        ["y", "scope"],
        net=inner.Proto(),
        inner_blobs=["x", "y"],
        outer_blobs_idx=[0, 1],
    )
    workspace.RunNetOnce(outer)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [5.0])
    assert seen and "x" in seen[0]
