"""ferrocaffe.net_builder, task and session: nets, loops, conditionals, tasks and sessions
built with ``with`` blocks, run as plans on the runtime."""

import pytest

from ferrocaffe import context, core, workspace
from ferrocaffe.net_builder import NetBuilder, ops
from ferrocaffe.session import LocalSession, Session
from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType, final_output


@pytest.fixture(autouse=True)
def fresh():
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def run_builder(nb):
    plan = core.Plan("nb_test")
    plan.AddStep(core.to_execution_step(nb))
    workspace.RunPlan(plan)


def built_ops(nb):
    """Every op of the nets a builder holds, nested builders included."""
    found = []
    for child in nb.get():
        if isinstance(child, NetBuilder):
            found += built_ops(child)
        else:
            found += list(child.Proto().op)
    return found


def fetch(blob):
    return workspace.FetchBlob(str(blob))


def test_context_current_stack_and_default():
    class Scope(context.Managed):
        pass

    class Auto(context.DefaultManaged):
        pass

    assert Scope.current(required=False) is None
    with pytest.raises(AssertionError, match="required but none is active"):
        Scope.current()
    with Scope() as outer:
        assert Scope.current() is outer
        with Scope() as inner:
            assert Scope.current() is inner
        assert Scope.current() is outer
    assert isinstance(Auto.current(), Auto)
    assert Auto.current() is Auto.current()


def test_loop_with_stop_if_counts_down():
    with NetBuilder() as nb:
        x = ops.Const(4)
        steps = ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.LE([x, ops.Const(0)]))
            ops.Add([x, ops.Const(-1)], [x])
            ops.Add([steps, ops.Const(1)], [steps])
    run_builder(nb)
    assert fetch(x) == 0
    assert fetch(steps) == 4


def test_counted_loops_nest_and_iter_blob():
    # sum over i < 4, j < i of (10 * i + j)
    with NetBuilder() as nb:
        total = ops.Const(0)
        with ops.loop(4) as outer:
            tens = ops.Mul([outer.iter(), ops.Const(10)])
            with ops.loop(outer.iter()) as inner:
                ops.Add([total, ops.Add([tens, inner.iter()])], [total])
    run_builder(nb)
    assert fetch(total) == sum(10 * i + j for i in range(4) for j in range(i))


def test_loop_without_stop_condition_is_rejected():
    with pytest.raises(AssertionError, match="requires a stop condition"):
        with NetBuilder():
            with ops.loop():
                ops.Const(1)


def test_stop_guard_reports_whether_it_stopped():
    with NetBuilder() as nb:
        after_stop = ops.Const(0)
        with ops.stop_guard() as stopped:
            ops.stop_if(ops.Const(True))
            ops.Const(7, blob_out=after_stop)
        with ops.stop_guard() as kept:
            ops.stop_if(ops.Const(False))
        with ops.stop_guard() as empty:
            pass
    run_builder(nb)
    assert fetch(stopped.has_stopped())
    assert not fetch(kept.has_stopped())
    assert not fetch(empty.has_stopped())
    assert fetch(after_stop) == 0


@pytest.mark.parametrize(("value", "expected"), [(90, "big"), (60, "mid"), (5, "small")])
def test_if_elif_else_steps(value, expected):
    codes = {"big": 1, "mid": 2, "small": 3}
    with NetBuilder() as nb:
        x = ops.Const(value)
        out = ops.Const(0)
        with ops.If(ops.GE([x, ops.Const(80)])) as branch:
            ops.Const(codes["big"], blob_out=out)
        with branch.Elif(ops.GE([x, ops.Const(50)])) as branch:
            ops.Const(codes["mid"], blob_out=out)
        with branch.Else():
            ops.Const(codes["small"], blob_out=out)
    run_builder(nb)
    assert fetch(out) == codes[expected]


def test_if_net_uses_if_operator_and_keeps_branch_blobs_local():
    with NetBuilder() as nb:
        x = ops.Const(3)
        out = ops.Const(0)
        with ops.IfNet(ops.GT([x, ops.Const(1)])):
            local = ops.Const(40)
            ops.Add([local, x], [out])
        with ops.Else():
            ops.Const(-1, blob_out=out)
    if_ops = [op for op in built_ops(nb) if op.type == "If"]
    assert len(if_ops) == 1
    arg_names = {a.name for a in if_ops[0].arg}
    assert arg_names == {"then_net", "else_net"}
    then_net = next(a.n for a in if_ops[0].arg if a.name == "then_net")
    assert [op.type for op in then_net.op] == ["Do"]
    run_builder(nb)
    assert fetch(out) == 43
    assert not workspace.HasBlob(str(local))


def test_while_net_with_condition_block():
    with NetBuilder() as nb:
        i = ops.Const(0)
        acc = ops.Const(0)
        with ops.WhileNet():
            with ops.Condition():
                ops.Add([i, ops.Const(1)], [i])
                ops.LE([i, ops.Const(5)])
            ops.Add([acc, i], [acc])
    ops_types = [op.type for op in built_ops(nb)]
    assert "While" in ops_types and ops_types.count("CreateScope") == 2
    run_builder(nb)
    assert fetch(i) == 6
    assert fetch(acc) == 15


def test_task_setup_exit_and_outputs_in_local_session():
    with Task() as task:
        with ops.task_init():
            base = ops.Const(10)
        doubled = ops.Add([base, base])
        with ops.task_exit():
            last = ops.Add([doubled, base])
        ops.Add([doubled, ops.Const(1)], [doubled])
        out_doubled = final_output(doubled)
        out_last = final_output(last)
    with LocalSession() as session:
        session.run(task)
        assert out_doubled.fetch() == 21
        # the exit net runs after the body
        assert out_last.fetch() == 31


def test_net_added_twice_runs_twice():
    with Task() as task:
        total = ops.Const(0)
        net = core.Net("add_one")
        net.Add([total, net.Const(1)], [total])
        ops.net(net)
        ops.net(net)
        result = final_output(total)
    with LocalSession() as session:
        session.run(task)
        assert result.fetch() == 2


def test_concurrent_instances_have_private_counters():
    instances, iters = 4, 5
    with TaskGroup() as group:
        with Task(num_instances=instances):
            with ops.task_init():
                shared = ops.CreateCounter([], ["shared_counter"])
            local = ops.CreateCounter([], ["local_counter"])
            with ops.loop(iters):
                ops.CountUp(shared)
                ops.CountUp(local)
            # each instance adds its own local count to the shared one once more
            with ops.loop(ops.RetrieveCount(local)):
                ops.CountUp(shared)
            with ops.task_exit():
                total = final_output(ops.RetrieveCount(shared))
    with LocalSession() as session:
        session.run(group)
        assert total.fetch() == instances * iters * 2


def test_private_task_group_drops_its_blobs():
    with TaskGroup(WorkspaceType.PRIVATE) as group:
        with Node("local"), Task():
            scratch = ops.Const(5)
            kept = final_output(ops.Add([scratch, scratch]))
    with LocalSession() as session:
        session.run(group)
        assert kept.fetch() == 10
    assert not workspace.HasBlob(str(scratch))


def test_global_task_group_keeps_its_blobs():
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Task():
            value = ops.Const(8)
    with LocalSession() as session:
        session.run(group)
    assert workspace.FetchBlob(str(value)) == 8


def test_session_runs_a_net_and_rejects_use_after_close():
    net = core.Net("session_net")
    net.ConstantFill([], "filled", shape=[2], value=3.0)
    session = LocalSession()
    session.run(net)
    assert list(workspace.FetchBlob("filled")) == [3.0, 3.0]
    session.close()
    with pytest.raises(AssertionError, match="Session is closed"):
        session.run(net)


def test_task_group_tasks_run_concurrently_on_one_node():
    with TaskGroup() as group:
        with Task():
            a = final_output(ops.Const(1))
        with Task():
            b = final_output(ops.Const(2))
    plan_step = group.to_task().get_step().Proto()

    def concurrent(step):
        return step.concurrent_substeps or any(concurrent(s) for s in step.substep)

    assert concurrent(plan_step)
    with LocalSession() as session:
        session.run(group)
        assert (a.fetch(), b.fetch()) == (1, 2)


def test_reporter_step_runs_at_least_once_after_the_task():
    with TaskGroup() as group:
        with Task():
            with ops.task_init():
                count = ops.Const(0)
            with ops.task_reporter(interval_ms=1000):
                ops.Add([count, ops.Const(1)], [count])
            ops.Const(0)
            out = final_output(count)
    with LocalSession() as session:
        session.run(group)
        assert out.fetch() >= 1


def test_the_base_session_leaves_fetching_and_running_to_its_subclasses():
    base = Session()
    with pytest.raises(NotImplementedError, match="Session does not implement fetch_output"):
        base.fetch_output("x")
    with pytest.raises(NotImplementedError, match="Session does not implement _run_compiled"):
        base._run_compiled(None)
