"""Stress: Python threads running nets and plans on one workspace at the same time (runs
release the GIL), and plans whose concurrent substeps outnumber the threads they run on.
Every result is checked; nothing is timed."""

import threading

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

THREADS = 6
ROUNDS = 40


def run_threads(target, n=THREADS):
    """Runs ``target(k)`` on ``n`` threads; re-raises the first failure of any."""
    errors = []

    def wrapped(k):
        try:
            target(k)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrapped, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def affine_net(k, net_type):
    """y_k = 2 * x_k + x_k (a Scale and an Add beside an independent Relu)."""
    net = core.Net(f"affine_{net_type}_{k}")
    s = net.Scale(f"x_{net_type}_{k}", f"s_{net_type}_{k}", scale=2.0)
    net.Add([s, f"x_{net_type}_{k}"], f"y_{net_type}_{k}")
    net.Relu(f"x_{net_type}_{k}", f"r_{net_type}_{k}")
    if net_type != "simple":
        net.Proto().type = net_type
        net.Proto().num_workers = 2 + k
    return net


def test_threads_run_their_own_nets_on_one_workspace():
    workspace.ResetWorkspace()
    for net_type in ("simple", "dag"):
        nets = []
        for k in range(THREADS):
            workspace.FeedBlob(f"x_{net_type}_{k}", np.zeros(8, np.float32))
            net = affine_net(k, net_type)
            workspace.CreateNet(net)
            nets.append(net)

        def body(k, net_type=net_type, nets=nets):
            rng = np.random.default_rng(k)
            name = nets[k].Proto().name
            for _ in range(ROUNDS):
                x = rng.standard_normal(8).astype(np.float32)
                workspace.FeedBlob(f"x_{net_type}_{k}", x)
                workspace.RunNet(name)
                np.testing.assert_allclose(
                    workspace.FetchBlob(f"y_{net_type}_{k}"), 3 * x, rtol=1e-6
                )
                np.testing.assert_array_equal(
                    workspace.FetchBlob(f"r_{net_type}_{k}"), np.maximum(x, 0)
                )

        run_threads(body)


def counting_net(name, counter):
    net = core.Net(name)
    net.Add([counter, "one"], counter)
    return net


def test_threads_sharing_one_net_lose_no_update():
    workspace.ResetWorkspace()
    workspace.FeedBlob("one", np.ones(1, np.int64))
    workspace.FeedBlob("shared", np.zeros(1, np.int64))
    net = counting_net("shared_counter", "shared")
    workspace.CreateNet(net)

    def body(k):
        for _ in range(ROUNDS):
            workspace.RunNet("shared_counter")

    run_threads(body)
    assert workspace.FetchBlob("shared").tolist() == [THREADS * ROUNDS]


def concurrent_plan(prefix, substeps, instances):
    """A plan whose one step runs ``substeps`` counting substeps concurrently, each with
    ``instances`` instances."""
    nets = [counting_net(f"{prefix}_count{j}", f"{prefix}_c{j}") for j in range(substeps)]
    steps = [core.execution_step(f"{prefix}_s{j}", [n]) for j, n in enumerate(nets)]
    top = core.execution_step(
        f"{prefix}_top",
        steps,
        concurrent_substeps=True,
        num_concurrent_instances=instances,
    )
    return core.Plan(top)


def test_threads_running_plans_with_concurrent_substeps():
    workspace.ResetWorkspace()
    workspace.FeedBlob("one", np.ones(1, np.int64))

    def body(k):
        for r in range(4):
            prefix = f"t{k}r{r}"
            for j in range(3):
                workspace.FeedBlob(f"{prefix}_c{j}", np.zeros(1, np.int64))
            workspace.RunPlan(concurrent_plan(prefix, 3, 20))
            for j in range(3):
                assert workspace.FetchBlob(f"{prefix}_c{j}").tolist() == [20]

    run_threads(body, 4)


def test_ten_thousand_concurrent_instances_complete():
    workspace.ResetWorkspace()
    workspace.FeedBlob("one", np.ones(1, np.int64))
    for j in range(2):
        workspace.FeedBlob(f"big_c{j}", np.zeros(1, np.int64))
    workspace.RunPlan(concurrent_plan("big", 2, 10_000))
    assert workspace.FetchBlob("big_c0").tolist() == [10_000]
    assert workspace.FetchBlob("big_c1").tolist() == [10_000]


def test_a_failing_concurrent_instance_fails_the_plan():
    workspace.ResetWorkspace()
    workspace.FeedBlob("one", np.ones(1, np.int64))
    # The counter's type does not match `one`'s: every run fails.
    workspace.FeedBlob("bad_c0", np.zeros(1, np.float32))
    try:
        workspace.RunPlan(concurrent_plan("bad", 1, 50))
    except RuntimeError as e:
        assert "One of the workers died" in str(e)
    else:
        raise AssertionError("the plan should have failed")


def test_dag_nets_of_many_sizes_on_many_threads():
    workspace.ResetWorkspace()

    def body(k):
        for w in range(2, 30):
            x = np.full(4, float(k * 100 + w), np.float32)
            net = caffe2_pb2.NetDef(
                name=f"dag_{k}_{w}",
                type="dag",
                num_workers=w,
                op=[
                    core.CreateOperator("Scale", [f"dx_{k}"], [f"da_{k}"], scale=2.0),
                    core.CreateOperator("Relu", [f"dx_{k}"], [f"db_{k}"]),
                    core.CreateOperator("Add", [f"da_{k}", f"db_{k}"], [f"dy_{k}"]),
                ],
            )
            workspace.FeedBlob(f"dx_{k}", x)
            workspace.RunNetOnce(net)
            np.testing.assert_array_equal(workspace.FetchBlob(f"dy_{k}"), 3 * x)

    run_threads(body)
