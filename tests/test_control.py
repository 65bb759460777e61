"""ferrocaffe.control (control flow as execution steps), brew.cond / brew.loop (If and While
operators through control_ops_util), control_ops_grad and functional."""

import numpy as np
import pytest

from ferrocaffe import brew, control, core, workspace
from ferrocaffe.control_ops_grad import disambiguate_grad_if_op_output
from ferrocaffe.functional import Functional, OpSchema
from ferrocaffe.model_helper import ModelHelper


@pytest.fixture(autouse=True)
def fresh():
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


class Counting:
    """An init net with a counter and the limit ``n``; ``tick`` counts up and publishes the
    count; ``below`` is a condition net (count < n)."""

    def __init__(self, n=6):
        self.init = core.Net("init")
        counter = self.init.CreateCounter([], init_count=0)
        limit = self.init.ConstantFill([], shape=[], value=n, dtype=core.DataType.INT64)
        self.tick = core.Net("tick")
        self.tick.CountUp([counter])
        self.count = self.tick.RetrieveCount([counter])
        self.init.ConstantFill([], [self.count], shape=[], value=0, dtype=core.DataType.INT64)
        self.tick.AddExternalOutput(self.count)
        self.below = core.Net("below")
        self.below.AddExternalOutput(self.below.LT([self.count, limit]))

    def run(self, step):
        plan = core.Plan("control_test")
        plan.AddStep(control.Do("init", self.init))
        plan.AddStep(step)
        workspace.RunPlan(plan)
        return int(workspace.FetchBlob(str(self.count)))


def test_for_runs_a_fixed_number_of_times():
    c = Counting()
    assert c.run(control.For("for", c.tick, 4)) == 4


def test_for_over_steps():
    c = Counting()
    assert c.run(control.For("for", [control.Do("tick_step", c.tick)], 3)) == 3


def test_while_and_do_while_with_condition_net():
    c = Counting(n=5)
    assert c.run(control.While("while", c.below, c.tick)) == 5
    c = Counting(n=0)
    # DoWhile runs the body before checking
    assert c.run(control.DoWhile("dowhile", c.below, c.tick)) == 1
    c = Counting(n=0)
    assert c.run(control.While("while0", c.below, c.tick)) == 0


def test_until_and_do_until():
    c = Counting(n=3)
    stop = core.Net("stop")
    stop.AddExternalOutput(stop.GE([c.count, stop.Const(3, dtype=np.int64)]))
    assert c.run(control.Until("until", stop, c.tick)) == 3
    c = Counting(n=3)
    stop = core.Net("stop2")
    stop.AddExternalOutput(stop.GE([c.count, stop.Const(2, dtype=np.int64)]))
    assert c.run(control.DoUntil("dountil", stop, c.tick)) == 2


@pytest.mark.parametrize(("relation", "expected"), [("And", False), ("Or", True)])
def test_merge_condition_nets_runs_both_and_combines(relation, expected):
    nets = []
    for i, value in enumerate([True, False]):
        net = core.Net(f"merge_part{i}")
        net.AddExternalOutput(
            net.ConstantFill([], f"part{i}", shape=[], value=value, dtype=core.DataType.BOOL)
        )
        nets.append(net)
    merged = control.MergeConditionNets("merged", nets, relation)
    assert [op.type for op in merged.Proto().op] == ["ConstantFill", "ConstantFill", relation]
    workspace.RunNetOnce(merged)
    assert bool(workspace.FetchBlob(merged.Proto().external_output[-1])) is expected
    assert control.MergeConditionNets("one", nets[:1], relation) is nets[0]


@pytest.mark.parametrize("cond", [True, False])
def test_if_else_on_blob_and_net(cond):
    flag = core.Net("flag")
    flag_blob = flag.ConstantFill([], "flag", shape=[], value=cond, dtype=core.DataType.BOOL)
    flag.AddExternalOutput(flag_blob)
    yes = core.Net("yes")
    yes.ConstantFill([], "picked", shape=[], value=1.0)
    no = core.Net("no")
    no.ConstantFill([], "picked", shape=[], value=2.0)
    workspace.RunNetOnce(flag)
    workspace.RunPlan(core.Plan(control.If("if_blob", flag_blob, yes, no)))
    assert workspace.FetchBlob("picked") == (1.0 if cond else 2.0)
    workspace.RunPlan(core.Plan(control.IfNot("ifnot_net", flag, yes, no)))
    assert workspace.FetchBlob("picked") == (2.0 if cond else 1.0)


def test_switch_runs_every_true_case():
    cases = []
    for i, value in enumerate([True, False, True]):
        cond = core.Net(f"cond{i}")
        cond.AddExternalOutput(
            cond.ConstantFill([], f"c{i}", shape=[], value=value, dtype=core.DataType.BOOL)
        )
        body = core.Net(f"body{i}")
        body.ConstantFill([], f"ran{i}", shape=[], value=1.0)
        cases.append((cond, body))

    def ran():
        return [float(workspace.FetchBlob(f"ran{i}")) for i in range(3)]

    for i in range(3):
        workspace.FeedBlob(f"ran{i}", np.array(0.0, dtype=np.float32))
    workspace.RunPlan(core.Plan(control.Switch("switch", cases)))
    assert ran() == [1.0, 0.0, 1.0]
    for i in range(3):
        workspace.FeedBlob(f"ran{i}", np.array(0.0, dtype=np.float32))
    workspace.RunPlan(core.Plan(control.SwitchNot("switchnot", cases)))
    assert ran() == [0.0, 1.0, 0.0]


def test_bool_net_and_combine_conditions():
    net = control.BoolNet(("a", True), ("b", False))
    workspace.RunNetOnce(net)
    assert list(net.Proto().external_output) == ["a", "b"]
    net_a, net_b = control.BoolNet(("a", True)), control.BoolNet(("b", False))
    combined = control.CombineConditions("both", [net_a, net_b], "Or")
    workspace.RunNetOnce(combined)
    assert workspace.FetchBlob(combined.Proto().external_output[-1])
    combined = control.CombineConditions("both2", [net_a, net_b], "And")
    workspace.RunNetOnce(combined)
    assert not workspace.FetchBlob(combined.Proto().external_output[-1])


def test_control_names_are_unique():
    a = control.Do("same", core.Net("n1"), core.Net("n2"))
    b = control.Do("same", core.Net("n3"), core.Net("n4"))
    assert a.Name() != b.Name()
    with pytest.raises(ValueError, match="input cannot be empty"):
        control.Do("empty")


def test_brew_cond_picks_branch():
    workspace.FeedBlob("cond", np.array(False))
    workspace.FeedBlob("a", np.array(5))
    workspace.FeedBlob("b", np.array(6))
    then_model = ModelHelper(name="then")
    then_model.net.Copy("a", "out")
    else_model = ModelHelper(name="else")
    tmp = else_model.net.Add(["b", "b"], "tmp")
    else_model.net.Copy(tmp, "out")
    model = ModelHelper(name="cond_model")
    brew.cond(model, "cond", ["a", "b", "out"], then_model, else_model)
    assert [op.type for op in model.net.Proto().op] == ["CreateScope", "CreateScope", "If"]
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out") == 12
    assert not workspace.HasBlob("tmp")
    workspace.FeedBlob("cond", np.array(True))
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out") == 5


def test_brew_loop_with_condition_model():
    for name, value in [("i", 0), ("one", 1), ("limit", 4), ("acc", 0)]:
        workspace.FeedBlob(name, np.array(value))
    body = ModelHelper(name="body")
    body.net.Add(["acc", "i"], "acc")
    cond = ModelHelper(name="cond")
    cond.net.Add(["i", "one"], "i")
    cond.net.LE(["i", "limit"], "go")
    model = ModelHelper(name="loop_model")
    brew.loop(model, "go", ["i", "one", "limit", "acc"], body, cond)
    types = [op.type for op in model.net.Proto().op]
    assert types == ["ConstantFill", "CreateScope", "CreateScope", "While"]
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("acc") == 1 + 2 + 3 + 4
    assert workspace.FetchBlob("i") == 5


def test_undefined_branch_input_is_rejected():
    then_model = ModelHelper(name="then")
    then_model.net.Copy("nowhere", "out")
    model = ModelHelper(name="m")
    with pytest.raises(AssertionError, match="Input blob nowhere is undefined"):
        brew.cond(model, "cond", ["out"], then_model)


def test_disambiguate_if_gradient_output_renames_inside_branches():
    then_net = core.Net("then")
    then_net.Copy("g", "x_grad")
    else_net = core.Net("else")
    else_net.Copy("h", "x_grad")
    grad_op = core.CreateOperator(
        "If",
        ["c", "g", "h"],
        ["x_grad"],
        then_net=then_net.Proto(),
        else_net=else_net.Proto(),
    )
    disambiguate_grad_if_op_output(grad_op, 0, "x_grad_split")
    assert grad_op.output[0] == "x_grad_split"
    for arg in grad_op.arg:
        assert arg.n.op[0].output[0] == "x_grad_split"


def test_functional_runs_single_ops():
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], dtype=np.float32)
    out = Functional.Relu(x)
    np.testing.assert_array_equal(out[0], np.maximum(x, 0))
    np.testing.assert_array_equal(out["output_0"], np.maximum(x, 0))
    joined, info = Functional.Concat(x, x, axis=1)
    np.testing.assert_array_equal(joined, np.concatenate([x, x], axis=1))
    np.testing.assert_array_equal(info, [2, 2])
    parts = Functional.Split(x, axis=0, split=np.array([1, 1], dtype=np.int32), num_output=2)
    np.testing.assert_array_equal(parts[1], x[1:])
    # the caller's workspace is untouched
    assert workspace.Blobs() == []


def test_functional_checks_counts_against_the_schema():
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(ValueError, match="Number of inputs"):
        Functional.Relu(x, x)
    with pytest.raises(ValueError, match="num_output"):
        Functional.Split(x, axis=0)
    with pytest.raises(ValueError, match="no operator schema"):
        Functional.NoSuchOperator(x)
    schema = OpSchema.get("Concat")
    assert (schema.min_input, schema.max_input) == (1, OpSchema.inf)
    assert schema.CalculateOutput(3) == 2


def test_workspace_guard_switches_and_restores():
    workspace.FeedBlob("outer", np.array(1.0))
    with workspace.WorkspaceGuard("guarded_ws"):
        assert workspace.CurrentWorkspace() == "guarded_ws"
        assert not workspace.HasBlob("outer")
    assert workspace.CurrentWorkspace() == "default"
    with pytest.raises(KeyError):
        with workspace.WorkspaceGuard("guarded_ws"):
            raise KeyError("inside")
    assert workspace.CurrentWorkspace() == "default"


def test_counter_ops_have_schemas():
    net = core.Net("counters")
    counter = net.CreateCounter([], init_count=2)
    down = net.CountDown([counter])
    count = net.RetrieveCount([counter])
    net.ResetCounter([counter], init_count=7)
    after_reset = net.RetrieveCount([counter])
    workspace.RunNetOnce(net)
    assert not workspace.FetchBlob(str(down))
    assert workspace.FetchBlob(str(count)) == 1
    assert workspace.FetchBlob(str(after_reset)) == 7
    bad = core.CreateOperator("CountUp", ["a", "b"], ["c"])
    with pytest.raises(RuntimeError):
        workspace.RunOperatorOnce(bad)


def test_make_two_class_and_its_gradient():
    x = np.array([0.0, 0.3, 1.0], dtype=np.float32)
    y = Functional.MakeTwoClass(x)[0]
    np.testing.assert_allclose(y, np.stack([1 - x, x], axis=1))
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("MakeTwoClass", ["x"], ["y"]), ["y_grad"]
    )
    assert [(op.type, list(op.input), list(op.output)) for op in grad_ops] == [
        ("MakeTwoClassGradient", ["y_grad"], ["x_grad"])
    ]
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        Functional.MakeTwoClass(np.array([2.0], dtype=np.float32))
