"""The Python face of gradient generation: ``GradientRegistry`` (Python gradient functions,
``GetGradientForOp``, ``GetBackwardPass``), ``IR``, and the errors for bad input."""

import pytest

from ferrocaffe import core
from ferrocaffe.proto import caffe2_pb2


def op(t, ins, outs, name="", **args):
    o = caffe2_pb2.OperatorDef(type=t, input=ins, output=outs, name=name)
    for k, v in args.items():
        a = o.arg.add(name=k)
        if isinstance(v, caffe2_pb2.NetDef):
            a.n.CopyFrom(v)
        elif isinstance(v, float):
            a.f = v
        elif isinstance(v, bytes):
            a.s = v
    return o


@pytest.fixture
def registry():
    reg = core.GradientRegistry.gradient_registry_
    saved = dict(reg)
    yield core.GradientRegistry
    reg.clear()
    reg.update(saved)


def test_backward_pass_shapes():
    ops = [op("Relu", ["x"], ["y"]), op("SumElements", ["y"], ["loss"])]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, ["loss"])
    assert isinstance(grad_ops, list)
    assert all(isinstance(o, caffe2_pb2.OperatorDef) for o in grad_ops)
    assert [o.type for o in grad_ops] == ["ConstantFill", "SumElementsGradient", "ReluGradient"]
    assert {str(k): str(v) for k, v in grad_map.items()} == {
        "loss": "loss_autogen_grad",
        "y": "y_grad",
        "x": "x_grad",
    }
    assert grad_map["x"] == "x_grad"


def test_sparse_gradients_are_gradient_slices():
    ops = [op("Gather", ["w", "ids"], ["e"]), op("SumElements", ["e"], ["loss"])]
    _, grad_map = core.GradientRegistry.GetBackwardPass(ops, ["loss"])
    g = grad_map["w"]
    assert isinstance(g, core.GradientSlice)
    assert (str(g.indices), str(g.values)) == ("ids", "e_grad")


def test_ys_given_as_gradient_slice_and_bad_ys():
    ops = [op("Relu", ["x"], ["y"])]
    _, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"x": core.GradientSlice("i", "v")})
    assert isinstance(grad_map["x"], core.GradientSlice)
    with pytest.raises(TypeError, match="ys should either be a list or a dict."):
        core.GradientRegistry.GetBackwardPass(ops, ("y",))


def test_get_gradient_for_op():
    grad_ops, g_input = core.GradientRegistry.GetGradientForOp(op("Relu", ["x"], ["y"]), ["y_grad"])
    assert [o.type for o in grad_ops] == ["ReluGradient"]
    assert list(grad_ops[0].input) == ["y", "y_grad"]
    assert grad_ops[0].is_gradient_op
    assert g_input == ["x_grad"]


def test_unknown_op_type_names_the_op():
    with pytest.raises(
        Exception, match=r"Exception when creating gradient for \[NoSuchOpXyz\]"
    ) as e:
        core.GradientRegistry.GetBackwardPass([op("NoSuchOpXyz", ["x"], ["y"])], ["y"])
    assert "GradientRegistry()->Has(def.type())" in str(e.value)
    assert 'type: "NoSuchOpXyz"' in str(e.value)


def test_ops_without_gradient():
    # NO_GRADIENT: nothing flows through, no error.
    ops = [op("Relu", ["x"], ["h"]), op("StopGradient", ["h"], ["h"]), op("Relu", ["h"], ["y"])]
    _, grad_map = core.GradientRegistry.GetBackwardPass(ops, ["y"])
    assert "x" not in grad_map and "h" not in grad_map
    # SHOULD_NOT_DO_GRADIENT: an error naming the op.
    with pytest.raises(Exception, match=r"\[Not\].*One should not call gradient for operator Not"):
        core.GradientRegistry.GetBackwardPass([op("Not", ["x"], ["y"])], ["y"])
    # An orphan StopGradient output.
    with pytest.raises(ValueError, match="StopGradient's output 's' is orphan"):
        core.GradientRegistry.GetBackwardPass([op("StopGradient", ["x"], ["s"])], ["x"])


def test_malformed_control_ops_name_the_op():
    no_then = op("If", ["c", "x"], ["y"], name="my_if")
    with pytest.raises(AssertionError, match="Expected then subnet in If op") as e:
        core.GradientRegistry.GetBackwardPass([no_then], ["y"])
    assert "my_if" in str(e.value)
    bad_then = op("If", ["c", "x"], ["y"], name="my_if", then_net=b"not a net")
    with pytest.raises(AssertionError, match="Expected non empty net argument then_net"):
        core.GradientRegistry.GetBackwardPass([bad_then], ["y"])
    body = caffe2_pb2.NetDef(name="body")
    body.op.extend([op("Relu", ["y"], ["y"]), op("Relu", ["y"], ["y"])])
    loop = op("While", ["c", "y"], ["y"], name="my_while", loop_net=body)
    with pytest.raises(AssertionError, match="requires single Do op as a loop body") as e:
        core.GradientRegistry.GetBackwardPass([loop], ["y"])
    assert "my_while" in str(e.value)


def test_python_gradient_function_is_used_and_native_makers_win(registry):
    calls = []

    @registry.RegisterGradient("PyDouble")
    def double_gradient(o, g_output):
        calls.append((o.type, list(g_output)))
        g = op("Scale", [g_output[0]], [o.input[0] + "_grad"], scale=2.0)
        return g, [o.input[0] + "_grad"]

    @registry.RegisterGradient("Relu")
    def never(o, g_output):
        raise AssertionError("the native Relu maker should win")

    ops = [op("PyDouble", ["x"], ["h"]), op("Relu", ["h"], ["y"])]
    grad_ops, grad_map = registry.GetBackwardPass(ops, ["y"])
    assert [o.type for o in grad_ops] == ["ConstantFill", "ReluGradient", "Scale"]
    assert calls == [("PyDouble", ["h_grad"])]
    assert grad_map["x"] == "x_grad"
    grad_ops, g_input = registry.GetGradientForOp(op("PyDouble", ["a"], ["b"]), ["gb"])
    assert grad_ops[0].type == "Scale" and g_input == ["a_grad"]


def test_python_gradient_function_raising_names_the_op(registry):
    @registry.RegisterGradient("PyBoom")
    def boom(o, g_output):
        raise ValueError("boom")

    with pytest.raises(RuntimeError, match=r"\[PyBoom\]") as e:
        registry.GetBackwardPass([op("PyBoom", ["x"], ["y"], name="the_op")], ["y"])
    assert "the_op" in str(e.value) and "boom" in str(e.value)
    assert isinstance(e.value.__cause__, ValueError)


@pytest.mark.parametrize(
    "result, why",
    [
        ("nonsense", "must return"),
        (([], [1]), "input gradient must be"),
        ((["not an op"], ["x_grad"]), "expected an OperatorDef"),
        (([], ["a", "b"]), "2 input gradients for an operator with 1 inputs"),
        (([], None), "as g_input"),
    ],
)
def test_python_gradient_function_wrong_shape_names_the_op(registry, result, why):
    registry.RegisterGradient("PyWrong")(lambda o, g: result)
    with pytest.raises(RuntimeError, match=r"\[PyWrong\]") as e:
        registry.GetBackwardPass([op("PyWrong", ["x"], ["y"])], ["y"])
    assert isinstance(e.value.__cause__, TypeError)
    assert why in str(e.value.__cause__)
    assert "PyWrong" in str(e.value.__cause__)


def test_control_gradients_are_registered_and_replaceable(registry):
    assert registry.gradient_registry_["If"] is core.gen_if_gradient
    assert registry.gradient_registry_["Do"] is core.gen_do_gradient
    assert registry.gradient_registry_["While"] is core.gen_while_gradient

    @registry.RegisterGradient("If")
    def my_if(o, g_output):
        return [], [None] * len(o.input)

    then = caffe2_pb2.NetDef(name="t")
    then.op.extend([op("Relu", ["x"], ["y"])])
    grad_ops, grad_map = registry.GetBackwardPass(
        [op("If", ["c", "x"], ["y"], then_net=then)], ["y"]
    )
    assert [o.type for o in grad_ops] == ["ConstantFill"]
    assert "x" not in grad_map


def test_builtin_control_gradient_callable_directly():
    then = caffe2_pb2.NetDef(name="t")
    then.op.extend([op("Relu", ["x"], ["y"])])
    grad_ops, g_input = core.gen_if_gradient(op("If", ["c", "x"], ["y"], then_net=then), ["gy2"])
    assert [o.type for o in grad_ops] == ["If"]
    assert g_input == [None, "x_grad"]


def test_ir_state():
    ops = [op("Relu", ["x"], ["a"]), op("Sigmoid", ["x"], ["b"]), op("Add", ["a", "b"], ["c"])]
    ir = core.IR(ops)
    assert dict(ir.frontier) == {"x": 0, "a": 0, "b": 0, "c": 0}
    assert ir.input_usages["x"][0] == [0, 1]
    assert ir.ssa[2].in_versions == {"a": 0, "b": 0}
    grad_ops, _ = ir.GetBackwardPass(["c"])
    gens = ir.gradient_generators["x"][0]
    assert [type(g).__name__ for g in gens] == ["GradGenMeta", "GradGenMeta"]
    assert gens[1].grad_op is grad_ops[-2]
    assert list(grad_ops[-2].output) == ["_x_grad_autosplit_0"]
    assert gens[1].gradient == "x_grad"
    assert ir.gradient_frontier == {"c": 0, "a": 0, "b": 0, "x": 0}
    assert ir.out_version_history["a"][0] == (ops[0], 0)
    assert core.IR.IS_AUTO_GEN_SUM_OPS_TAG == "is_auto_gen_sum_ops"
    assert core.IR.ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG == "only_keep_is_auto_gen_sum_ops_tag"
    with pytest.raises(ValueError, match="orphan"):
        core.IR([op("StopGradient", ["x"], ["s"])])


def test_get_index_from_gradient_list():
    gl = [None, core.GradientSlice("i", "v"), "d"]
    assert core.GetIndexFromGradientList(gl, "v") == 1
    assert core.GetIndexFromGradientList(gl, "d") == 2
    assert core.GetIndexFromGradientList(gl, "z") is None


def test_add_gradient_operators_appends_to_the_net():
    from ferrocaffe.core.gradients import add_gradient_operators

    ops = [
        op("Relu", ["x"], ["h"]),
        op("FC", ["h", "W", "b"], ["y"]),
        op("SumElements", ["y"], ["loss"]),
    ]
    expected_ops, expected_map = core.GradientRegistry.GetBackwardPass(ops[1:], ["loss"])
    net = caffe2_pb2.NetDef(name="n")
    net.op.extend(ops)
    grads = add_gradient_operators(net, ["loss"], skip=1)
    assert net.name == "n"
    assert list(net.op[:3]) == ops
    assert list(net.op[3:]) == list(expected_ops)
    assert grads == expected_map
    assert "x" not in grads and grads["h"] == "h_grad"


def test_gradient_map_holds_plain_blob_references():
    """The map's references are ``BlobReference``s like ``BlobReference(name)``: no net, and a
    ``meta`` dict of each one's own that persists."""
    from ferrocaffe.core.blob import BlobReference
    from ferrocaffe.core.gradients import add_gradient_operators

    ops = [op("Relu", ["x"], ["y"]), op("SumElements", ["y"], ["loss"])]
    net = caffe2_pb2.NetDef(name="n")
    net.op.extend(ops)
    for grads in (
        core.GradientRegistry.GetBackwardPass(ops, ["loss"])[1],
        add_gradient_operators(net, ["loss"]),
    ):
        refs = [r for kv in grads.items() for r in kv]
        assert refs and all(type(r) is BlobReference for r in refs)
        assert all(r.Net() is None and r._from_net is None for r in refs)
        assert vars(refs[0]) == vars(BlobReference(str(refs[0])))
        refs[0].meta["k"] = 1
        assert refs[0].meta == {"k": 1} and refs[1].meta == {}
        assert repr(grads["x"]) == 'BlobReference("x_grad")'
        with pytest.raises(AttributeError, match="does not have a net"):
            _ = grads["x"].Relu
    with_net = BlobReference("b", net=net)
    assert with_net.Net() is net and with_net.meta == {}


def test_native_gradient_map_converts_like_add_gradient_operators():
    from ferrocaffe import _native

    net = core.Net("gmap")
    net.FC(["x", "w", "b"], "y")
    net.SumElements("y", "loss")
    grads = net.AddGradientOperators(["loss"])
    pairs = [(str(k), str(v)) for k, v in grads.items()]
    native = _native.GradientMap(pairs)
    as_refs = native.to_dict(blob_ref=core.BlobReference)
    assert as_refs == grads and list(as_refs) == list(grads)
    assert all(type(k) is core.BlobReference for k in as_refs)
    assert all(type(v) is core.BlobReference for v in as_refs.values())
    assert native.to_dict() == dict(pairs)
    assert all(type(k) is str for k in native.to_dict())
