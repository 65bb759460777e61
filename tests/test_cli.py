"""The ``ferrocaffe`` command (python/ferrocaffe/__main__.py), run as a subprocess."""

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ferrocaffe.proto import caffe2_pb2


def _run(*args: str, cwd: str = "/") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ferrocaffe", *args], capture_output=True, text=True, cwd=cwd
    )


def _json(*args: str) -> dict:
    proc = _run("inspect", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


LENET_SSA = [
    ("Conv", "data@0, conv1_w@0, conv1_b@0 -> conv1@1"),
    ("MaxPool", "conv1@1 -> pool1@1"),
    ("Conv", "pool1@1, conv2_w@0, conv2_b@0 -> conv2@1"),
    ("MaxPool", "conv2@1 -> pool2@1"),
    ("FC", "pool2@1, fc3_w@0, fc3_b@0 -> fc3@1"),
    ("Relu", "fc3@1 -> fc3@2"),
    ("FC", "fc3@2, pred_w@0, pred_b@0 -> pred@1"),
    ("Softmax", "pred@1 -> softmax@1"),
]
LENET_INPUTS = "data conv1_w conv1_b conv2_w conv2_b fc3_w fc3_b pred_w pred_b".split()


def test_no_arguments_inspects_the_bundled_example():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "net 'lenet_predict' from bundled example lenet_predict.pbtxt: 8 ops" in out
    assert "external inputs (9): " + ", ".join(LENET_INPUTS) in out
    assert "external outputs (1): softmax" in out
    assert "[5] Relu    fc3 -> fc3" in out
    assert "kernel=5 order='NCHW'" in out
    ssa_lines = out.split("SSA (")[1].splitlines()[1:9]
    for line, (op_type, flow) in zip(ssa_lines, LENET_SSA, strict=True):
        assert line.split("] ", 1)[1].split() == [op_type, *flow.split()], line
    assert "undefined blobs (read before any op writes them) (9): " in out
    assert "not declared in external_input: none" in out
    assert "external outputs no op writes: none" in out


def test_default_subcommand_and_explicit_inspect_agree():
    assert _run().stdout == _run("inspect").stdout


def test_json_report_of_the_example():
    r = _json()
    assert r["name"] == "lenet_predict" and r["num_ops"] == 8
    assert [op["type"] for op in r["ops"]] == [t for t, _ in LENET_SSA]
    assert r["external_input"] == LENET_INPUTS
    assert r["external_output"] == ["softmax"]
    assert r["blob_versions"]["fc3"] == 2 and r["blob_versions"]["data"] == 0
    assert r["undefined_blobs"] == sorted(LENET_INPUTS)
    assert r["undeclared_inputs"] == [] and r["missing_outputs"] == []


def test_binary_file_from_the_model_corpus(golden_dir):
    path = golden_dir / "models" / "files" / "lenet.mnist" / "predict_net.pb"
    net = caffe2_pb2.NetDef.FromString(path.read_bytes())
    r = _json(str(path))
    assert r["name"] == net.name
    assert [op["type"] for op in r["ops"]] == [op.type for op in net.op]
    assert r["ops"][0]["engine"] == "CUDNN"
    assert r["external_input"] == list(net.external_input)


def test_ssa_matches_caffe2_on_golden_forward_nets(golden_dir, tmp_path):
    cases = [
        json.loads(line)
        for line in (golden_dir / "gradients" / "cases.jsonl").read_text().splitlines()
        if line.strip()
    ]
    picked = [c for c in cases if not c.get("large")][:40:4]
    assert len(picked) == 10
    for case in picked:
        pb = tmp_path / f"{case['name']}.pb"
        pb.write_bytes(base64.b64decode(case["forward_b64"]))
        r = _json(str(pb))
        assert r["ssa"] == case["ssa"], case["name"]
        assert r["blob_versions"] == case["blob_versions"], case["name"]
        assert r["undefined_blobs"] == sorted(case["undefined_blobs"]), case["name"]


def test_text_file_with_undeclared_input_and_unwritten_output(tmp_path):
    path = tmp_path / "net.pbtxt"
    path.write_text(
        'name: "t"\n'
        'op { input: "x" input: "w" output: "y" type: "Mul" }\n'
        'op { input: "y" output: "y" type: "Relu" }\n'
        'external_input: "x"\n'
        'external_output: "y"\n'
        'external_output: "z"\n'
    )
    proc = _run("inspect", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "[1] Relu y@1 -> y@2" in proc.stdout
    assert "undefined blobs (read before any op writes them) (2): w, x" in proc.stdout
    assert "not declared in external_input: w" in proc.stdout
    assert "external outputs no op writes: z" in proc.stdout


def test_a_file_without_subcommand_is_inspected(tmp_path):
    path = tmp_path / "n.pb"
    net = caffe2_pb2.NetDef(name="solo")
    net.op.add(type="Relu", input=["a"], output=["b"])
    path.write_bytes(net.SerializeToString())
    proc = _run(str(path))
    assert proc.returncode == 0, proc.stderr
    assert "net 'solo'" in proc.stdout and "Relu a@0 -> b@1" in proc.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        (b"\xff\xff\xff", "is not a binary or text-format NetDef"),
        (b"op { bogus: 1 }", "is not a binary or text-format NetDef"),
    ],
)
def test_bad_input_is_a_clean_error(tmp_path, content, message):
    path = tmp_path / "bad.pb"
    if content is not None:
        path.write_bytes(content)
    proc = _run("inspect", str(path))
    assert proc.returncode == 2
    assert "ferrocaffe inspect: error: " in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_text_file_is_a_clean_error(tmp_path):
    path = tmp_path / "bad.pbtxt"
    path.write_text("op { bogus: 1 }")
    proc = _run("inspect", str(path))
    assert proc.returncode == 2
    assert "is not a text-format NetDef" in proc.stderr and "Traceback" not in proc.stderr


def test_help_and_version():
    proc = _run("--help")
    assert proc.returncode == 0 and "inspect" in proc.stdout
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("ferrocaffe ")


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("ferrocaffe")
    assert script.is_file(), "pip install should create the `ferrocaffe` script"
    proc = subprocess.run([str(script)], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert "lenet_predict" in proc.stdout
