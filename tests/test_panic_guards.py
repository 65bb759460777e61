"""A panic in the engine reaches Python as ``_native.InternalError``, a ``RuntimeError`` naming
the entry point, and never as pyo3's ``PanicException`` (a ``BaseException`` that ``except
Exception`` misses).

``FERROCAFFE_TEST_PANIC=<entry point>`` (read once, when the process starts) makes that entry
point panic inside its guard; ``<entry point>/detached`` makes it panic with the GIL released.
Each case runs in a child process started with that variable set.
"""

import json
import os
import subprocess
import sys

import pytest

from ferrocaffe import _native

# The child: calls one entry point and prints, as JSON, what it raised.
CHILD = r"""
import json, sys
from ferrocaffe import _native
from ferrocaffe.proto import caffe2_pb2

net = caffe2_pb2.NetDef(name="n", op=[caffe2_pb2.OperatorDef(type="Relu", input=["x"],
                                                           output=["y"])])
net_bytes = net.SerializeToString()
op_bytes = net.op[0].SerializeToString()
ws = _native.Workspace() if sys.argv[1] != "Workspace" else None
calls = {
    "ssa_get_ssa": lambda: _native.ssa_get_ssa(net_bytes),
    "graph_remove_ops": lambda: _native.graph_remove_ops(net_bytes, [0]),
    "backward_pass": lambda: _native.backward_pass([op_bytes], [("y", None)]),
    "ir_state": lambda: _native.ir_state([op_bytes]),
    "roundtrip": lambda: _native.roundtrip("NetDef", net_bytes),
    "Workspace": lambda: _native.Workspace(),
    "Workspace.run_net": lambda: ws.run_net("n"),
    "Workspace.fetch": lambda: ws.fetch("x"),
    "Workspace.run_plan": lambda: ws.run_plan(caffe2_pb2.PlanDef(name="p").SerializeToString()),
    "workspace.RunNetOnce": None,
}
try:
    if sys.argv[1] == "workspace.RunNetOnce":
        from ferrocaffe import workspace
        workspace.RunNetOnce(net)
    else:
        calls[sys.argv[1]]()
except Exception as e:
    out = {"raised": [c.__name__ for c in type(e).__mro__], "message": str(e)}
except BaseException as e:
    out = {"base_exception": type(e).__name__, "message": str(e)}
else:
    out = {"returned": True}
print(json.dumps(out))
"""


def run_child(entry: str, panic_point: str | None) -> dict:
    env = dict(os.environ)
    env.pop("FERROCAFFE_TEST_PANIC", None)
    if panic_point is not None:
        env["FERROCAFFE_TEST_PANIC"] = panic_point
    done = subprocess.run(
        [sys.executable, "-c", CHILD, entry],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# (what the child calls, the panic point, the name the message must hold)
CASES = [
    ("ssa_get_ssa", "ssa_get_ssa", "ssa_get_ssa"),
    ("graph_remove_ops", "graph_remove_ops/detached", "graph_remove_ops"),
    ("backward_pass", "backward_pass", "backward_pass"),
    ("ir_state", "ir_state/detached", "ir_state"),
    ("roundtrip", "roundtrip", "roundtrip"),
    ("roundtrip", "roundtrip/detached", "roundtrip"),
    ("Workspace", "Workspace", "Workspace"),
    ("Workspace.run_net", "Workspace.run_net/detached", "Workspace.run_net"),
    ("Workspace.fetch", "Workspace.fetch", "Workspace.fetch"),
    ("Workspace.run_plan", "Workspace.run_plan", "Workspace.run_plan"),
    # Through the Python API: the error keeps its class and message.
    ("workspace.RunNetOnce", "Workspace.run_net_once/detached", "Workspace.run_net_once"),
]


@pytest.mark.parametrize("entry,point,name", CASES, ids=[c[1] for c in CASES])
def test_a_panic_is_an_internal_error_naming_the_entry_point(entry, point, name):
    out = run_child(entry, point)
    assert "base_exception" not in out, out
    assert "raised" in out, out
    assert out["raised"][0] == "InternalError"
    assert "RuntimeError" in out["raised"]
    assert out["message"].startswith(f"{name}: internal error (panic): ")
    assert f"forced panic in {point}" in out["message"]


def test_a_panic_point_of_another_entry_leaves_this_one_alone():
    assert run_child("roundtrip", "ssa_get_ssa") == {"returned": True}
    # The GIL-held point of an entry does not fire for its detached part, nor the reverse.
    assert run_child("roundtrip", "roundtrip/") == {"returned": True}


def test_without_the_variable_nothing_panics():
    assert run_child("roundtrip", None) == {"returned": True}
    assert run_child("Workspace.run_plan", None) == {"returned": True}


def test_internal_error_is_a_runtime_error():
    assert issubclass(_native.InternalError, RuntimeError)
    assert not issubclass(_native.InternalError, ValueError)
