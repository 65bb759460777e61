"""ferrocaffe.graph (graph surgery) and core.ssa from Python: worked examples, errors, and
property tests against the pure-Python reference in graph_reference.py."""

import copy

import graph_reference as ref
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrocaffe import core, graph
from ferrocaffe.proto import caffe2_pb2


def make_net(ops, external_input=(), external_output=(), name="predict"):
    net = caffe2_pb2.NetDef()
    net.name = name
    for op_type, inputs, outputs in ops:
        op = net.op.add()
        op.type = op_type
        op.input.extend(inputs)
        op.output.extend(outputs)
        op.name = ""
    net.external_input.extend(external_input)
    net.external_output.extend(external_output)
    return net


def model():
    net = make_net(
        [
            ("FC", ["data", "w", "b"], ["fc"]),
            ("Relu", ["fc"], ["fc"]),
            ("Softmax", ["fc"], ["prob"]),
            ("Print", ["fc"], []),
        ],
        ["data", "w", "b"],
        ["prob"],
    )
    arg = net.op[0].arg.add()
    arg.name = "axis"
    arg.i = 1
    net.op[0].device_option.device_type = 0
    net.op[0].engine = "CUDNN"
    net.type = "dag"
    net.num_workers = 2
    return net


class NetHolder:
    """Duck-typed like core.Net: anything with Proto() is accepted."""

    def __init__(self, proto):
        self._proto = proto

    def Proto(self):
        return self._proto


# -- maps ----------------------------------------------------------------------------------


def test_producer_and_consumer_maps():
    net = model()
    producers = graph.producer_map(net)
    assert producers == {("fc", 1): (0, 0), ("fc", 2): (1, 0), ("prob", 1): (2, 0)}
    assert list(producers) == [("fc", 1), ("fc", 2), ("prob", 1)]
    consumers = graph.consumer_map(NetHolder(net))
    assert consumers[("fc", 2)] == [(2, 0), (3, 0)]
    assert consumers[("data", 0)] == [(0, 0)]
    assert consumers[("nothing", 7)] == []  # a defaultdict(list), like mobile_cv's
    assert all(type(k) is tuple for k in consumers)
    assert graph.versioned_external_outputs(net) == [("prob", 1)]


# -- renames -------------------------------------------------------------------------------


def test_rename_input_is_refused_when_the_version_is_shared():
    net = model()
    before = net.SerializeToString()
    with pytest.raises(graph.IllegalGraphTransformError) as info:
        graph.rename_op_input(net, 2, 0, "x")
    assert isinstance(info.value, ValueError)
    assert "'fc'" in str(info.value) and "#3 (Print)" in str(info.value)
    assert net.SerializeToString() == before  # inputs are never modified


def test_rename_input_from_producer_renames_that_version_everywhere():
    net = model()
    out, init = graph.rename_op_input(net, 2, 0, "relu_out", from_producer=True)
    assert init is None
    expected = copy.deepcopy(net)
    expected.op[1].output[0] = "relu_out"
    expected.op[2].input[0] = "relu_out"
    expected.op[3].input[0] = "relu_out"
    assert out == expected  # every other field (args, engine, device option...) kept
    assert net == model()


def test_rename_input_updates_init_net_and_external_inputs():
    predict = make_net([("FC", ["data", "w", "b"], ["y"])], ["data", "w", "b"], ["y"])
    init = make_net(
        [("GivenTensorFill", [], ["w"]), ("GivenTensorFill", [], ["b"])], [], ["w", "b"], "init"
    )
    out, init_out = graph.rename_op_input(predict, 0, 1, "fc_w", init_net=init)
    assert list(out.op[0].input) == ["data", "fc_w", "b"]
    assert list(out.external_input) == ["data", "fc_w", "b"]
    assert list(init_out.op[0].output) == ["fc_w"]
    assert list(init_out.external_output) == ["fc_w", "b"]
    # The parameter is read at the init net's version.
    ssa, _ = core.get_ssa(out, core.get_ssa(init_out)[1])
    assert ssa[0][0] == [("data", 0), ("fc_w", 1), ("b", 1)]
    # A plain input (no init producer) is renamed in external_input only.
    out, init_out = graph.rename_op_input(predict, 0, 0, "image", init_net=init)
    assert list(out.external_input) == ["image", "w", "b"]
    assert init_out == init


def test_rename_output_makes_reshape_in_place():
    net = make_net(
        [("Reshape", ["data", "shape"], ["r", "old_shape"]), ("FC", ["r", "w"], ["y"])],
        ["data", "shape", "w"],
        ["y"],
    )
    out = graph.rename_op_output(net, 0, 0, "data")
    assert list(out.op[0].output) == ["data", "old_shape"]
    assert list(out.op[1].input) == ["data", "w"]
    renamed = graph.rename_op_output(net, 1, 0, "logits")
    assert list(renamed.external_output) == ["logits"]


def test_errors():
    net = model()
    with pytest.raises(ValueError, match="out of range"):
        graph.rename_op_output(net, 9, 0, "z")
    with pytest.raises(ValueError, match="no output 3"):
        graph.rename_op_output(net, 0, 3, "z")
    with pytest.raises(ValueError, match="no input 5"):
        graph.rename_op_input(net, 0, 5, "z")
    with pytest.raises(ValueError, match="must not be empty"):
        graph.rename_op_output(net, 0, 0, "")
    with pytest.raises(ValueError, match="out of range"):
        graph.sub_graph_external_io(net, [0, 10])
    with pytest.raises(TypeError, match="NetDef"):
        graph.producer_map("not a net")
    with pytest.raises(TypeError, match="init_net"):
        graph.rename_op_input(net, 0, 0, "x", init_net=caffe2_pb2.OperatorDef())


# -- removal, sub-graphs, chains -------------------------------------------------------------


def test_remove_dead_end_ops():
    net = make_net(
        [
            ("Relu", ["x"], ["a"]),
            ("Print", ["a"], []),
            ("Relu", ["a"], ["dead"]),
            ("Relu", ["dead"], ["dead2"]),
            ("Relu", ["a"], ["y"]),
            ("Relu", ["y"], ["y"]),
        ],
        ["x"],
        ["y"],
    )
    out, removed = graph.remove_dead_end_ops(net)
    assert removed == [1, 2, 3]
    assert [list(op.output) for op in out.op] == [["a"], ["y"], ["y"]]
    again, removed = graph.remove_dead_end_ops(out)
    assert removed == [] and again == out
    assert len(graph.remove_ops(net, [0, 0, 5]).op) == 4


def test_sub_graph_external_io():
    net = make_net(
        [
            ("Shape", ["x"], ["s"]),
            ("Slice", ["s"], ["s2"]),
            ("Reshape", ["x", "s2"], ["r", "old"]),
            ("FC", ["r", "w"], ["y"]),
        ],
        ["x", "w"],
        ["y", "old"],
    )
    assert graph.sub_graph_external_io(net, [0, 1, 2]) == ([("x", 0)], [("r", 1), ("old", 1)])
    assert graph.sub_graph_external_io(net, [3]) == ([("r", 1), ("w", 0)], [("y", 1)])


def test_find_chains():
    net = make_net(
        [
            ("Copy", ["a"], ["b"]),
            ("Copy", ["b"], ["c"]),
            ("Relu", ["c"], ["d"]),
            ("Copy", ["d"], ["e"]),
            ("Copy", ["e"], ["f"]),
            ("Copy", ["f"], ["g"]),
        ],
        ["a"],
        ["g"],
    )
    assert graph.find_chains(net, "Copy") == [[0, 1], [3, 4, 5]]
    assert graph.find_chains(net, "Relu", min_length=1) == [[2]]
    assert graph.find_chains(net, "Nope") == []


# -- core.ssa beyond the golden corpus ---------------------------------------------------------


def test_get_ssa_updates_the_given_dict_in_place():
    net = make_net([("Relu", ["x"], ["y"]), ("Relu", ["y"], ["x"])])
    bv = {"x": 5, "q": 2}
    ssa, versions = core.get_ssa(net, bv)
    assert versions is bv
    assert list(bv.items()) == [("x", 6), ("q", 2), ("y", 1)]
    assert ssa == [([("x", 5)], [("y", 1)]), ([("y", 1)], [("x", 6)])]
    empty = {}
    assert core.get_ssa(net, empty)[1] is empty
    with pytest.raises(AssertionError):
        core.get_ssa("not a net")


def test_get_ssa_of_a_large_net_matches_reference():
    """Over 2**17 blob_versions entries (past the size a presized dict is made at, so the dict
    grows as well) and large versions: the same lists, tuples, ints and key order as the
    reference."""
    ops = []
    for i in range(70_000):
        ops.append(("FC", ["h", "w%d" % i, "b%d" % i], ["o%d" % i]))
        ops.append(("Relu", ["o%d" % i], ["h"]))
    ops.append(("Copy", ["h"], ["copy"]))
    net = make_net(ops, ["h"] + ["w%d" % i for i in range(70_000)], ["h"])
    start = {"h": 2**40, "extra": 7}
    ssa, versions = core.get_ssa(net, dict(start))
    ref_ssa, ref_versions = ref.get_ssa(net, dict(start))
    assert len(versions) > 2**17
    assert ssa == ref_ssa
    assert list(versions.items()) == list(ref_versions.items())
    assert type(ssa) is list and type(versions) is dict
    inputs, outputs = ssa[-1]
    assert type(inputs) is list and type(inputs[0]) is tuple
    assert inputs == [("h", 2**40 + 70_000)] and type(inputs[0][1]) is int
    assert outputs == [("copy", 1)] and versions["copy"] == 1


def test_ssa_helpers_on_given_ssa():
    ssa = [([("x", 0)], [("y", 1)]), ([("y", 1), ("w", 0)], [("y", 2), ("z", 1)])]
    assert core.get_undefined_blobs(ssa) == {"x", "w"}
    producers = core.get_output_producers(ssa)
    assert producers == {("y", 1): 0, ("y", 2): 1, ("z", 1): 1}
    assert list(producers) == [("y", 1), ("y", 2), ("z", 1)]
    versions = {"x": 0, "y": 2, "z": 1, "w": 0}
    assert core.get_op_ids_in_path(ssa, versions, ["x"], ["z"]) == [0, 1]
    assert core.get_op_ids_in_path(ssa, versions, ["y"], ["y"]) == []
    with pytest.raises(KeyError, match="nope"):
        core.get_op_ids_in_path(ssa, versions, [], ["nope"])
    with pytest.raises(ValueError):
        core.get_undefined_blobs([([("x", 0, 1)], [])])


# -- property tests against the pure-Python reference --------------------------------------------

NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def random_net(draw):
    n_ops = draw(st.integers(0, 12))
    ops = []
    for _ in range(n_ops):
        op_type = draw(st.sampled_from(["Relu", "Sum", "Copy"]))
        inputs = draw(st.lists(st.sampled_from(NAMES), max_size=3))
        outputs = draw(st.lists(st.sampled_from(NAMES), max_size=2))
        ops.append((op_type, inputs, outputs))
    ext_in = draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True))
    ext_out = draw(st.lists(st.sampled_from(NAMES + ["zz"]), max_size=3, unique=True))
    return make_net(ops, ext_in, ext_out)


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(random_net(), st.dictionaries(st.sampled_from(NAMES + ["q"]), st.integers(-3, 3)))
def test_ssa_matches_reference(net, start):
    a_start, b_start = dict(start), dict(start)
    ssa, versions = core.get_ssa(net, a_start)
    ref_ssa, ref_versions = ref.get_ssa(net, b_start)
    assert ssa == ref_ssa
    assert list(versions.items()) == list(ref_versions.items())
    assert core.get_undefined_blobs(ssa) == ref.get_undefined_blobs(ref_ssa)
    producers = core.get_output_producers(ssa)
    assert list(producers.items()) == list(ref.get_output_producers(ref_ssa).items())
    names = list(versions)
    for i in range(min(3, len(names))):
        ins, outs = names[:i], names[i:]
        assert core.get_op_ids_in_path(ssa, versions, ins, outs) == ref.get_op_ids_in_path(
            ref_ssa, ref_versions, ins, outs
        )


@FAST
@given(random_net())
def test_maps_and_queries_match_reference(net):
    assert list(graph.producer_map(net).items()) == list(ref.producer_map(net).items())
    assert list(graph.consumer_map(net).items()) == list(ref.consumer_map(net).items())
    assert graph.versioned_external_outputs(net) == ref.versioned_external_outputs(net)
    out, removed = graph.remove_dead_end_ops(net)
    ref_out, ref_removed = ref.remove_dead_end_ops(net)
    assert removed == ref_removed and out == ref_out
    for op_type in ["Relu", "Copy"]:
        for min_length in [1, 2]:
            assert graph.find_chains(net, op_type, min_length) == ref.find_chains(
                net, op_type, min_length
            )
    for ops in ([], list(range(0, len(net.op), 2)), list(range(len(net.op)))[::-1]):
        assert graph.sub_graph_external_io(net, ops) == ref.sub_graph_external_io(net, ops)


@FAST
@given(random_net(), random_net(), st.data())
def test_renames_match_reference(net, init, data):
    init.name = "init"
    if not net.op:
        return
    op_id = data.draw(st.integers(0, len(net.op) - 1))
    op = net.op[op_id]
    new_name = data.draw(st.sampled_from(NAMES + ["fresh"]))
    if op.output:
        k = data.draw(st.integers(0, len(op.output) - 1))
        out = graph.rename_op_output(net, op_id, k, new_name)
        assert out == ref.rename_op_output(net, op_id, k, new_name)
    if op.input:
        k = data.draw(st.integers(0, len(op.input) - 1))
        from_producer = data.draw(st.booleans())
        with_init = init if data.draw(st.booleans()) else None
        try:
            expected = ref.rename_op_input(net, op_id, k, new_name, with_init, from_producer)
        except ref.Refused:
            with pytest.raises(graph.IllegalGraphTransformError):
                graph.rename_op_input(net, op_id, k, new_name, with_init, from_producer)
        else:
            actual = graph.rename_op_input(net, op_id, k, new_name, with_init, from_producer)
            assert actual == expected
