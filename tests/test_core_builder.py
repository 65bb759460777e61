"""Builder API behaviour (scope, BlobReference, CreateOperator, Net, MakeArgument) beyond the
golden examples, which test_api_examples.py replays."""

import copy
import pickle
import threading

import numpy as np
import pytest

from ferrocaffe import core, scope, utils
from ferrocaffe.core.operator import _edit_distance, _nearby_opnames
from ferrocaffe.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def fresh_net_names(monkeypatch):
    monkeypatch.setattr(core.Net, "_net_names_used", set())


def test_net_names_registry_is_read_through_the_class():
    core.Net("n")
    core.Net._net_names_used = set()
    assert core.Net("n").Name() == "n"
    assert core.Net("n").Name() == "n_1"


def test_scopes_are_per_thread():
    seen = {}

    def other():
        seen["name"] = scope.CurrentNameScope()
        seen["device"] = scope.CurrentDeviceScope()

    with scope.NameScope("main"), scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert scope.CurrentNameScope() == "main/"
    assert seen == {"name": "", "device": None}


def test_device_scope_merges_extra_info_sorted():
    outer = caffe2_pb2.DeviceOption()
    outer.extra_info.extend(["z", "a"])
    inner = caffe2_pb2.DeviceOption()
    inner.extra_info.append("m")
    with scope.DeviceScope(outer):
        with scope.DeviceScope(inner):
            assert list(scope.CurrentDeviceScope().extra_info) == ["a", "m", "z"]
    assert list(inner.extra_info) == ["m"]


def test_empty_device_scope():
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        with scope.EmptyDeviceScope():
            assert scope.CurrentDeviceScope() is None
            assert not core.CreateOperator("Relu", "x", "y").HasField("device_option")
        assert scope.CurrentDeviceScope().device_type == caffe2_pb2.CUDA


def test_blob_reference_copy_and_pickle():
    net = core.Net("n")
    b = core.BlobReference("a/b", net)
    c = copy.copy(b)
    assert c == "a/b" and c.Net() is net
    d = pickle.loads(pickle.dumps(core.BlobReference("x")))
    assert d == "x" and d.Net() is None
    assert (b.GetNameScope(), b.GetUnscopedName()) == ("a/", "b")


def test_blob_reference_hashes_and_compares_like_its_name():
    a = core.BlobReference("fc/w")
    assert hash(a) == hash("fc/w")
    assert a == "fc/w" and a == b"fc/w" and a == core.BlobReference(b"fc/w")
    assert a != "fc/b" and a != core.BlobReference("fc/b") and not (a != "fc/w")
    assert a != 3 and a != None  # noqa: E711 - Caffe2's __eq__: anything else is unequal
    assert core.BlobReference(7) == "7" and str(core.BlobReference(b"x")) == "x"
    # Dicts keyed by references find them by name, and the other way round.
    d = {a: 1, "b": 2}
    assert d["fc/w"] == 1 and d[core.BlobReference("b")] == 2
    # The name can be replaced (as Caffe2's attribute could be); hash follows it.
    a._name = "other"
    assert a == "other" and hash(a) == hash("other")
    deep = copy.deepcopy({core.BlobReference("k"): core.BlobReference("v")})
    ((k, v),) = deep.items()
    assert (type(k), k, type(v), v) == (core.BlobReference, "k", core.BlobReference, "v")
    m = core.BlobReference("m")
    m.meta["x"] = 1
    assert copy.deepcopy(m).meta == {"x": 1}
    with pytest.raises(TypeError):
        core.BlobReference("a") < core.BlobReference("b")  # noqa: B015 - no ordering
    # Bytes that are not UTF-8 raise as Caffe2's .decode("utf-8") did.
    with pytest.raises(UnicodeDecodeError):
        core.BlobReference(b"\xff")
    with pytest.raises(UnicodeDecodeError):
        core.BlobReference("a") == b"\xff"  # noqa: B015


def test_blob_reference_dir_lists_operators():
    names = dir(core.BlobReference("x"))
    assert "Relu" in names and "GetNameScope" in names


def test_create_operator_engine_key():
    assert core.IsOperatorWithEngine("Relu", "")
    assert not core.IsOperatorWithEngine("NoSuchOp", "DEFAULT")


def test_edit_distance_matches_caffe2_rules():
    assert _edit_distance("Relu", "Relu", 3) == 0
    assert _edit_distance("Sigmoid", "Sigmiod", 3) == 1  # one transposition
    assert _edit_distance("kitten", "sitting", 3) == 3
    assert _edit_distance("a", "abcdef", 3) == 4  # lengths too far apart
    assert _edit_distance("abcd", "wxyz", 0) == 4  # 0 = no limit


def test_unknown_op_suggests_nearby_names():
    assert "Relu" in _nearby_opnames("Relux")
    net = core.Net("n")
    with pytest.raises(AttributeError, match=r"Did you mean: \[.*Sigmoid.*\]"):
        net.Sigmiod("x", "y")


def test_uses_blob_and_used_blob_names():
    net = core.Net("n")
    net.AddExternalInput("ext")
    net.Relu("x", "y")
    net.Proto().external_output.append("y")
    assert net.UsesBlob("x") and net.UsesBlob("ext")
    assert not net.UsesBlob("y")
    assert net.UsedBlobNames() == {"ext", "x", "y"}


def test_run_all_on_gpu_and_mkl():
    step = core.Net("step")
    step.Relu("a", "b")
    net = core.Net("n")
    net.RecurrentNetwork(["x"], ["y"], step_net=step.Proto())
    net.Relu("y", "z")
    net.RunAllOnGPU(gpu_id=2, use_cudnn=True)
    proto = net.Proto()
    assert (proto.device_option.device_type, proto.device_option.device_id) == (1, 2)
    assert [op.engine for op in proto.op] == ["CUDNN", "CUDNN"]
    inner = proto.op[0].arg[0].n
    assert inner.device_option.device_id == 2 and inner.op[0].engine == "CUDNN"
    net.RunAllOnMKL()
    assert net.Proto().device_option == caffe2_pb2.DeviceOption(device_type=caffe2_pb2.MKLDNN)


def test_append_net_sets_device_on_recurrent_step_ops():
    step = core.Net("step")
    step.Relu("a", "b")
    src = core.Net("src")
    src.RecurrentNetwork(["x"], ["y"], step_net=step.Proto())
    dst = core.Net("dst")
    dev = core.DeviceOption(caffe2_pb2.CUDA, 1)
    dst.AppendNet(src, device_option=dev)
    op = dst.Proto().op[0]
    assert op.device_option == dev and op.arg[0].n.op[0].device_option == dev
    assert not src.Proto().op[0].HasField("device_option")


def test_log_info_adds_fill_and_print():
    net = core.Net("n")
    net.AddExternalInput("x")
    net.LogInfo("hello", core.BlobReference("x"))
    types = [op.type for op in net.Proto().op]
    assert types == ["GivenTensorStringFill", "Print", "Print"]
    assert net.Proto().op[0].output[0] == "n/log"
    assert list(net.Proto().op[2].input) == ["x"]


def test_net_from_netdef_continues_autogen_names():
    nd = caffe2_pb2.NetDef(name="m")
    op = nd.op.add(type="Relu")
    op.input.append("m_blob_4")
    op.output.append("m_blob_5")
    net = core.Net(nd)
    assert net.NextName() == "m_blob_6"


def test_deduplicate_gradient_slices_sum():
    net = core.Net("d")
    g = net.DeduplicateGradientSlices(core.GradientSlice("i", "v"))
    assert [op.type for op in net.Proto().op] == ["Unique", "UnsortedSegmentSum"]
    assert net.Proto().op[0].engine == "SparseHash"
    assert g == core.GradientSlice("d/Unique:0", "d/UnsortedSegmentSum:0")


def test_make_argument_numpy_int_array_and_message_list():
    arg = utils.MakeArgument("a", np.array([[1, 2], [3, 4]], dtype=np.int64))
    assert list(arg.ints) == [1, 2, 3, 4]
    arg = utils.MakeArgument("b", np.array([True, False]))
    assert list(arg.ints) == [1, 0]
    with pytest.raises(ValueError, match="Unknown argument type: key=c"):
        utils.MakeArgument("c", None)


def test_args_to_dict():
    args = [
        utils.MakeArgument("i", 3),
        utils.MakeArgument("fs", [1.0, 2.0]),
        utils.MakeArgument("s", "x"),
        utils.MakeArgument("empty", []),
        caffe2_pb2.Argument(i=1),
    ]
    d = utils.ArgsToDict(args)
    assert d["i"] == 3 and list(d["fs"]) == [1.0, 2.0] and d["s"] == b"x"
    assert d["empty"] is None
    assert len(d) == 4


def test_operator_tracebacks_recorded_when_workspace_keeps_them(monkeypatch):
    import collections

    from ferrocaffe import workspace

    tracebacks = collections.defaultdict(dict)
    monkeypatch.setattr(workspace, "operator_tracebacks", tracebacks, raising=False)
    net = core.Net("tb")
    net.Relu("x", "y")
    net.Relu("y", "z")
    assert sorted(tracebacks["tb"]) == [0, 1]
    innermost = tracebacks["tb"][1][0]
    assert innermost[0] == __file__
    assert innermost[2] == "test_operator_tracebacks_recorded_when_workspace_keeps_them"
