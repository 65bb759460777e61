"""Shared helpers for tests that compare nets with the golden corpora: where the corpora are,
how to read a case's protobufs, and a readable assertion for NetDef equality."""

import base64
import difflib
import json
import os
from pathlib import Path

from google.protobuf import text_format

from ferrocaffe.proto import caffe2_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(os.environ.get("FERROCAFFE_GOLDEN", REPO_ROOT / "tests" / "golden"))


def load_cases(corpus):
    """The cases of ``<golden>/<corpus>/cases.jsonl`` by name."""
    with open(GOLDEN / corpus / "cases.jsonl") as f:
        cases = [json.loads(line) for line in f]
    return {c["name"]: c for c in cases}


def parse_net(b64):
    net = caffe2_pb2.NetDef()
    net.ParseFromString(base64.b64decode(b64))
    return net


def _op_text(op):
    return text_format.MessageToString(op)


def assert_nets_equal(actual, expected, unordered_external=False):
    """Parsed-protobuf equality; on failure, a unified diff op by op.

    ``unordered_external``: compare ``external_input`` / ``external_output`` as sets (for
    nets whose lists Caffe2 filled from Python sets)."""
    actual_cmp = caffe2_pb2.NetDef()
    actual_cmp.CopyFrom(actual)
    expected_cmp = caffe2_pb2.NetDef()
    expected_cmp.CopyFrom(expected)
    if unordered_external:
        for net in (actual_cmp, expected_cmp):
            for field in (net.external_input, net.external_output):
                names = sorted(field)
                del field[:]
                field.extend(names)
    if actual_cmp == expected_cmp:
        return
    lines = []
    for i in range(max(len(actual_cmp.op), len(expected_cmp.op))):
        a = _op_text(actual_cmp.op[i]) if i < len(actual_cmp.op) else "<missing>\n"
        e = _op_text(expected_cmp.op[i]) if i < len(expected_cmp.op) else "<missing>\n"
        if a != e:
            lines.append(f"--- op {i}")
            lines.extend(
                difflib.unified_diff(
                    e.splitlines(), a.splitlines(), "expected", "actual", lineterm=""
                )
            )
    for name in actual_cmp.DESCRIPTOR.fields_by_name:
        if name == "op":
            continue
        if getattr(actual_cmp, name) != getattr(expected_cmp, name):
            lines.append(
                f"--- field {name}: expected {getattr(expected_cmp, name)!r}, "
                f"actual {getattr(actual_cmp, name)!r}"
            )
    raise AssertionError("nets differ:\n" + "\n".join(lines))
