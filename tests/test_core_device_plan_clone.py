"""Behaviour of core's device helpers, execution steps/plans and net cloning that users rely
on beyond the golden examples (which live in test_api_examples.py)."""

import pytest

from ferrocaffe import core, scope
from ferrocaffe.proto import caffe2_pb2

CPU = caffe2_pb2.CPU
CUDA = caffe2_pb2.CUDA


def gpu(i):
    return core.DeviceOption(CUDA, i)


def op_types(net):
    return [op.type for op in net.Proto().op]


# ----------------------------------------------------------------------------- device


def test_device_option_explicit_zero_seed_is_present():
    d = core.DeviceOption(CPU, random_seed=0, extra_info=["a", "b"])
    assert d.HasField("random_seed") and d.random_seed == 0
    assert list(d.extra_info) == ["a", "b"]
    assert not d.HasField("numa_node_id")


def test_device_option_equal_is_symmetric_and_honours_flags():
    a = core.DeviceOption(CUDA, 2, random_seed=5, node_name="h1")
    b = core.DeviceOption(CUDA, 2, random_seed=6, node_name="h2")
    for x, y in ((a, b), (b, a)):
        assert core.device_option_equal(x, y)
        assert not core.device_option_equal(x, y, ignore_node_name=False)
        assert not core.device_option_equal(x, y, ignore_random_seed=False)
    # CPU ids never matter, GPU ids always do.
    assert core.device_option_equal(core.DeviceOption(CPU, 0), core.DeviceOption(CPU, 7))
    assert not core.device_option_equal(gpu(0), gpu(1))


def test_infer_op_blob_devices_returns_copies():
    op = core.CreateOperator("Relu", ["x"], ["y"], device_option=gpu(3))
    ins, outs = core.InferOpBlobDevices(op)
    ins[0].device_id = 9
    assert op.device_option.device_id == 3
    assert outs[0] == gpu(3)


def test_infer_copy_op_without_device_option_raises():
    op = core.CreateOperator("CopyGPUToCPU", ["x"], ["y"])
    with pytest.raises(RuntimeError, match="CopyGPUToCPU op should have cuda device option"):
        core.InferOpBlobDevices(op)


def test_copy_from_cpu_input_reads_cpu():
    op = core.CreateOperator("CopyFromCPUInput", ["x"], ["y"], device_option=gpu(1))
    ins, outs = core.InferOpBlobDevicesAsDict(op)
    assert ins == {"x": caffe2_pb2.DeviceOption()}
    assert outs == {"y": gpu(1)}


def test_inject_reuses_one_copy_for_several_consumers():
    net = core.Net("dev_reuse")
    net.AddExternalInput("x")
    with core.DeviceScope(gpu(0)):
        net.Relu("x", "a")
        net.Sigmoid("x", "b")
    new_net, b2d = core.InjectCrossDeviceCopies(net)
    assert op_types(new_net) == ["CopyCPUToGPU", "Relu", "Sigmoid"]
    assert [list(op.input) for op in new_net.Proto().op] == [["x"], ["x_gpu_0"], ["x_gpu_0"]]
    assert b2d["x_gpu_0"] == gpu(0)
    # The source net is left untouched.
    assert op_types(net) == ["Relu", "Sigmoid"]
    assert list(net.Proto().op[0].input) == ["x"]


def test_inject_keeps_in_place_ops_in_place():
    net = core.Net("dev_inplace")
    net.AddExternalInput("x")
    with core.DeviceScope(gpu(1)):
        net.Relu("x", "x")
    new_net, b2d = core.InjectCrossDeviceCopies(net)
    relu = new_net.Proto().op[1]
    assert (list(relu.input), list(relu.output)) == (["x_gpu_1"], ["x_gpu_1"])
    assert b2d["x"] == caffe2_pb2.DeviceOption()


def test_inject_uses_net_device_option_for_external_inputs():
    net = core.Net("dev_netopt")
    net.Proto().device_option.CopyFrom(gpu(0))
    net.AddExternalInput("x")
    with core.DeviceScope(gpu(0)):
        net.Relu("x", "y")
    new_net, b2d = core.InjectCrossDeviceCopies(net)
    assert op_types(new_net) == ["Relu"]
    assert b2d["x"] == gpu(0)


def test_inject_unsupported_device_pair_raises():
    net = core.Net("dev_mkl")
    net.AddExternalInput("x")
    with core.DeviceScope(gpu(0)):
        net.Relu("x", "y")
    with pytest.raises(ValueError, match="Non-supported devices"):
        core.InjectCrossDeviceCopies(
            net, blob_to_device={"x": core.DeviceOption(caffe2_pb2.MKLDNN)}
        )


def test_inject_among_nets_reuses_copies_across_nets():
    first = core.Net("dev_first")
    first.AddExternalInput("x")
    with core.DeviceScope(gpu(0)):
        first.Relu("x", "a")
    second = core.Net("dev_second")
    second.AddExternalInput("x")
    with core.DeviceScope(gpu(0)):
        second.Sigmoid("x", "b")
    new_nets = core.InjectDeviceCopiesAmongNetsWithoutB2D([first, second])
    assert op_types(new_nets[0]) == ["CopyCPUToGPU", "Relu"]
    # The second net reads the copy made by the first and declares it as an input.
    assert op_types(new_nets[1]) == ["Sigmoid"]
    assert list(new_nets[1].Proto().op[0].input) == ["x_gpu_0"]
    assert list(new_nets[1].Proto().external_input) == ["x", "x_gpu_0"]


def test_inject_among_nets_rejects_non_nets():
    with pytest.raises(AssertionError, match="should be a list of nets"):
        core.InjectDeviceCopiesAmongNets([core.Net("dev_ok"), "not a net"])


# ----------------------------------------------------------------------------- plan


@pytest.fixture
def fresh_step_names():
    saved = core.ExecutionStep._step_names_used
    core.ExecutionStep._step_names_used = set()
    yield
    core.ExecutionStep._step_names_used = saved


def test_step_names_registry_is_read_through_the_class(fresh_step_names):
    assert core.ExecutionStep(None).Name() == "step"
    core.ExecutionStep._step_names_used = set()
    assert core.ExecutionStep(None).Name() == "step"
    assert core.ExecutionStep(None).Name() == "step_1"


def test_step_is_frozen_once_added():
    inner = core.ExecutionStep("frozen_inner", core.Net("plan_frozen"))
    core.ExecutionStep("frozen_outer").AddSubstep(inner)
    with pytest.raises(AssertionError, match="Cannot mutate a step"):
        inner.SetIter(2)
    with pytest.raises(AssertionError, match="Cannot mutate a step"):
        inner.AddNet(core.Net("plan_frozen_2"))


def test_plan_skips_empty_steps_and_freezes_them():
    plan = core.Plan("plan_empty")
    empty = core.ExecutionStep("nothing")
    plan.AddStep(empty)
    assert plan.Steps() == [] and len(plan.Proto().execution_step) == 0
    with pytest.raises(AssertionError):
        empty.SetOnlyOnce(True)


def test_plan_net_order_includes_report_net_last():
    a, b, rep = core.Net("plan_a"), core.Net("plan_b"), core.Net("plan_rep")
    top = core.execution_step(
        "plan_top", [core.execution_step("x", a), core.execution_step("y", b)]
    )
    top.SetReportNet(rep, 3)
    plan = core.Plan(top)
    assert [n.Name() for n in plan.Nets()] == ["plan_a", "plan_b", "plan_rep"]
    assert [n.name for n in plan.Proto().network] == ["plan_a", "plan_b", "plan_rep"]


def test_plan_round_trip_keeps_structure_and_ops():
    a = core.Net("plan_rt")
    a.ConstantFill([], "v", shape=[2], value=3.0)
    plan = core.Plan("plan_rt_plan")
    plan.AddStep(
        core.execution_step("outer", [core.execution_step("inner", a, num_iter=4)], only_once=True)
    )
    rebuilt = core.Plan.create_from_proto(plan.Proto())
    net_name = rebuilt.Nets()[0].Name()
    assert net_name != "plan_rt" and net_name.startswith("plan_rt")
    step = rebuilt.Proto().execution_step[0]
    assert step.only_once and step.substep[0].num_iter == 4
    assert list(step.substep[0].network) == [net_name]
    ops = rebuilt.Proto().network[0].op
    assert [op.type for op in ops] == ["ConstantFill"]


def test_execution_step_list_of_steps_becomes_substeps():
    s = core.execution_step(
        "plan_list",
        [core.execution_step("p1", core.Net("plan_l1")), core.Net("plan_l2")],
        concurrent_substeps=True,
    )
    assert [sub.name for sub in s.Proto().substep][0] == "p1"
    assert s.Proto().concurrent_substeps
    assert [n.Name() for n in s.Nets()] == ["plan_l1", "plan_l2"]


def test_get_all_attributes_collects_nested_nets():
    n1, n2 = core.Net("plan_attr1"), core.Net("plan_attr2")
    n1.add_attribute("k", "first")
    n2.add_attribute("k", "second")
    n2.add_attribute("other", 0)
    top = core.execution_step(
        "plan_attr", [core.execution_step("a", n1), core.execution_step("b", n2)]
    )
    assert top.get_all_attributes("k") == ["first", "second"]
    assert core.Plan(top).get_all_attributes("missing") == []


# ----------------------------------------------------------------------------- clone


def test_remap_input_handles_repeats_and_leaves_outputs():
    op = core.CreateOperator("Sum", ["a", "b", "a"], ["a"])
    core.remap_input(op, {"a": "A"})
    assert list(op.input) == ["A", "b", "A"]
    assert list(op.output) == ["a"]


def test_clone_and_bind_keeps_inputs_read_in_place():
    net = core.Net("clone_inplace")
    net.AddExternalInput("x")
    net.Relu("x", "x")
    net.Relu("x", "y")
    cloned, remap = core.clone_and_bind_net(net, "clone_inplace_bound", "p/")
    assert remap == {"x": "x", "y": "p/y"}
    assert [list(op.output) for op in cloned.Proto().op] == [["x"], ["p/y"]]
    # The source net is unchanged.
    assert list(net.Proto().op[1].output) == ["y"]


def test_recurrent_network_op_remap_rewrites_names_and_step_net():
    step_net = core.Net("clone_rnn_step")
    step_net.Relu("h", "h_next")
    op = core.CreateOperator(
        "RecurrentNetwork",
        ["x"],
        ["y"],
        alias_src=["h_next", "keep"],
        timestep="t",
        step_net=step_net.Proto(),
    )
    core.recurrent_network_op_remap(op, "ignored/", {"h_next": "H", "t": "T", "h": "HH"})
    args = {a.name: a for a in op.arg}
    assert list(args["alias_src"].strings) == [b"H", b"keep"]
    assert args["timestep"].s == b"T"
    sub = args["step_net"].n
    assert sub.name == "cloned_sub_net"
    assert (list(sub.op[0].input), list(sub.op[0].output)) == (["HH"], ["H"])


def test_control_op_remap_clones_both_branches():
    then_net, else_net = core.Net("clone_then"), core.Net("clone_else")
    then_net.Relu("a", "b")
    else_net.Sigmoid("a", "b")
    op = core.CreateOperator(
        "If", ["cond"], [], then_net=then_net.Proto(), else_net=else_net.Proto()
    )
    core.control_op_remap(op, "", {"a": "A", "b": "B"})
    nets = {a.name: a.n for a in op.arg}
    for key in ("then_net", "else_net"):
        assert nets[key].name.endswith("_remapped")
        assert list(nets[key].op[0].input) == ["A"]
        assert list(nets[key].op[0].output) == ["B"]


def test_net_clone_applies_default_remap_funcs():
    body = core.Net("clone_body")
    body.Relu("v", "v")
    outer = core.Net("clone_outer")
    outer.While(["c"], [], loop_net=body.Proto())
    cloned = outer.Clone("clone_outer_copy", blob_remap={"v": "w"})
    loop = cloned.Proto().op[0].arg[0].n
    assert list(loop.op[0].input) == ["w"]
    assert sorted(core.DEFAULT_REMAP_FUNCS) == [
        "AsyncIf",
        "If",
        "RecurrentNetwork",
        "RecurrentNetworkGradient",
        "While",
    ]


def test_scoped_execution_step_uses_name_scope():
    with scope.NameScope("sc"):
        with scope.NameScope("inner"):
            s = core.scoped_execution_step("plan_scoped", core.Net("plan_scoped_net"))
    assert s.Name() == "sc/inner/plan_scoped"
