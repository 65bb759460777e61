"""``ferrocaffe.compat.install()``: legacy code importing ``caffe2`` gets ferrocaffe's modules.
The script tests/legacy_caffe2_script.py runs in a fresh interpreter for each part."""

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ferrocaffe.compat as compat
from ferrocaffe.proto import caffe2_pb2

SCRIPT = Path(__file__).with_name("legacy_caffe2_script.py")


def _run(part: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), part], capture_output=True, text=True, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_legacy_script_protobuf_messages():
    got = _run("protos")
    assert got["plan_roundtrip_equal"] is True
    assert got["op_type"] == "Relu"
    assert (got["cpu"], got["cuda"], got["float"]) == (0, 1, 1)
    assert got["device_type"] == 0
    plan = caffe2_pb2.PlanDef.FromString(base64.b64decode(got["b64"]))
    assert plan.network[0].external_output == ["y"]
    assert plan.execution_step[0].num_iter == 3


def test_legacy_script_gets_ferrocaffe_modules():
    got = _run("modules")
    assert got["core"] == "ferrocaffe.core"
    assert got["workspace"] == "ferrocaffe.workspace"
    assert got["caffe2_pb2"] == "ferrocaffe.proto.caffe2_pb2"
    assert got["dotted_core_is_core"] and got["dotted_workspace_is_workspace"]
    assert got["dotted_pb2_is_pb2"] and got["core_pb2_is_pb2"]
    assert got["packages"] == ["caffe2", "caffe2.python", "caffe2.proto"]
    assert got["sys_modules"] == [
        "caffe2",
        "caffe2.proto",
        "caffe2.proto.caffe2_pb2",
        "caffe2.python",
        "caffe2.python.core",
        "caffe2.python.workspace",
    ]


def test_legacy_script_builds_a_net_with_core_net():
    got = _run("net")
    assert got["name"] == "legacy_mlp"
    assert got["outputs"] == ["fc", "relu", "softmax"]
    expected = caffe2_pb2.NetDef(name="legacy_mlp")
    expected.op.add(input=["data", "w", "b"], output=["fc"], name="", type="FC")
    expected.op.add(input=["fc"], output=["relu"], name="", type="Relu")
    expected.op.add(input=["relu"], output=["softmax"], name="", type="Softmax")
    expected.external_input.extend(["data", "w", "b"])
    expected.external_output.append("softmax")
    assert caffe2_pb2.NetDef.FromString(base64.b64decode(got["b64"])) == expected


@pytest.fixture
def installed():
    compat.install()
    yield
    compat.uninstall()


def test_install_is_idempotent_and_uninstall_forgets_caffe2(installed):
    import importlib

    import ferrocaffe.core

    compat.install()
    assert sum(f is compat._FINDER for f in sys.meta_path) == 1
    assert importlib.import_module("caffe2.python.core") is ferrocaffe.core
    # The module keeps its own spec (importlib.reload and pickle rely on it).
    assert ferrocaffe.core.__spec__.name == "ferrocaffe.core"
    assert ferrocaffe.core.__name__ == "ferrocaffe.core"
    compat.uninstall()
    assert not compat.is_installed()
    assert not [n for n in sys.modules if n.split(".")[0] == "caffe2"]
    compat.install()


def test_missing_modules_name_both_sides(installed):
    with pytest.raises(ModuleNotFoundError, match="ferrocaffe has no 'ferrocaffe.no_such'"):
        __import__("caffe2.python.no_such")
    import caffe2.python

    with pytest.raises(AttributeError, match="no attribute 'no_such'"):
        caffe2.python.no_such  # noqa: B018


def test_packages_load_submodules_on_attribute_access(installed):
    import caffe2

    import ferrocaffe.proto.caffe2_pb2

    assert caffe2.proto.caffe2_pb2 is ferrocaffe.proto.caffe2_pb2


def test_target_of():
    assert compat.target_of("caffe2.python.core") == "ferrocaffe.core"
    assert compat.target_of("caffe2.python.helpers.brew") == "ferrocaffe.helpers.brew"
    assert compat.target_of("caffe2.proto.caffe2_pb2") == "ferrocaffe.proto.caffe2_pb2"
    assert compat.target_of("caffe2") is None
    assert compat.target_of("caffe2x.python.core") is None


def test_install_refuses_after_a_real_caffe2_import():
    import types

    fake = types.ModuleType("caffe2")
    sys.modules["caffe2"] = fake
    try:
        with pytest.raises(RuntimeError, match="before Caffe2 is imported"):
            compat.install()
        assert not compat.is_installed()
    finally:
        del sys.modules["caffe2"]
