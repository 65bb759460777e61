"""The gradient map of ``Net.AddGradientOperators`` is made on first use: every way of using it
sees the same entries as a plain dict built at once, and copies and pickles are plain dicts."""

import copy
import pickle

from ferrocaffe import core
from ferrocaffe.core.gradients import GradientMap
from ferrocaffe.proto import caffe2_pb2


def _net():
    net = core.Net("lazy_map")
    fc = net.FC(["x", "w", "b"], "fc")
    r = net.Relu(fc, "r")
    net.Sum([r, "x"], "s")
    net.SumElements("s", "loss")
    return net


def _expected():
    ops = list(_net().Proto().op)
    _, grads = core.GradientRegistry.GetBackwardPass(ops, ["loss"])
    return grads


def _fresh():
    grads = _net().AddGradientOperators(["loss"])
    assert type(grads) is GradientMap
    return grads


def test_every_use_sees_the_entries():
    expected = _expected()
    assert isinstance(_fresh(), dict)
    assert len(_fresh()) == len(expected) > 0
    assert _fresh() == expected
    assert expected == _fresh()
    assert not (_fresh() != expected)
    assert list(_fresh()) == list(expected)
    assert list(reversed(_fresh())) == list(reversed(expected))
    assert list(_fresh().items()) == list(expected.items())
    assert list(_fresh().keys()) == list(expected.keys())
    assert list(_fresh().values()) == list(expected.values())
    assert _fresh()["x"] == expected["x"]
    assert _fresh().get("w") == expected["w"]
    assert "b" in _fresh()
    assert repr(_fresh()) == repr(expected)
    assert str(_fresh()) == str(expected)
    assert bool(_fresh())
    assert dict(_fresh()) == expected
    assert {**_fresh()} == expected
    d = {}
    d.update(_fresh())
    assert d == expected
    assert (_fresh() | {}) == expected
    assert ({} | _fresh()) == expected
    assert _fresh().copy() == expected and type(_fresh().copy()) is dict
    assert _fresh() == _fresh()


def test_changes_apply_to_the_entries():
    expected = _expected()
    g = _fresh()
    g["extra"] = "extra_grad"
    assert list(g)[:-1] == list(expected) and g["extra"] == "extra_grad"
    g = _fresh()
    del g["x"]
    assert "x" not in g and len(g) == len(expected) - 1
    g = _fresh()
    assert g.pop("x") == expected["x"]
    g = _fresh()
    assert g.popitem() == list(expected.items())[-1]
    g = _fresh()
    assert g.setdefault("x", None) == expected["x"]
    g = _fresh()
    g.clear()
    assert len(g) == 0 and g == {}
    g = _fresh()
    g |= {"y": "y_grad"}
    assert len(g) == len(expected) + 1


def test_copies_and_pickles_are_plain_dicts():
    expected = _expected()
    for made in (
        copy.copy(_fresh()),
        copy.deepcopy(_fresh()),
        pickle.loads(pickle.dumps(_fresh())),
    ):
        assert type(made) is dict
        assert made == expected
    assert type(GradientMap.fromkeys(["a"])) is GradientMap


def test_net_outputs_include_the_gradient_ops():
    net = _net()
    net.AddGradientOperators(["loss"])
    outputs = {o for op in net.Proto().op for o in op.output}
    assert all(net.BlobIsDefined(o) for o in outputs)
    assert net._op_outputs == outputs
    assert not net.BlobIsDefined("nothing")


def test_grad_ops_are_appended_as_with_the_list_api():
    net = _net()
    ops = list(net.Proto().op)
    grad_ops, _ = core.GradientRegistry.GetBackwardPass(ops, ["loss"])
    net.AddGradientOperators(["loss"])
    appended = caffe2_pb2.NetDef(op=net.Proto().op[len(ops) :])
    assert appended == caffe2_pb2.NetDef(op=grad_ops)


def test_net_outputs_rebuilt_when_missing():
    net = _net()
    net.AddGradientOperators(["loss"])
    del net.__dict__["_op_outputs_set"]
    assert net.BlobIsDefined("x_grad") and net.BlobIsDefined("fc")
