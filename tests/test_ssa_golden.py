"""core.get_ssa / get_undefined_blobs against the SSA Caffe2 recorded for every forward net of
the gradients corpus (tests/golden/gradients/cases.jsonl, or $FERROCAFFE_GOLDEN)."""

import base64
import json
from pathlib import Path

import pytest
from conftest import golden_path

from ferrocaffe import core
from ferrocaffe.proto import caffe2_pb2

REPO = Path(__file__).resolve().parent.parent
GOLDEN = golden_path()
CASES_FILE = GOLDEN / "gradients" / "cases.jsonl"


def _load_cases():
    with open(CASES_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]


CASES = _load_cases()


def _forward(case):
    net = caffe2_pb2.NetDef()
    net.ParseFromString(base64.b64decode(case["forward_b64"]))
    return net


def test_corpus_is_complete():
    # Every line of the corpus is replayed below; the corpus has 377 cases.
    assert len(CASES) == 377
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ssa_matches_caffe2(case):
    ssa, versions = core.get_ssa(_forward(case))

    # Exactly Caffe2's types: a list of (list, list) tuples of (str, int) tuples, and a dict.
    assert type(ssa) is list
    assert type(versions) is dict
    for entry in ssa:
        assert type(entry) is tuple and len(entry) == 2
        for side in entry:
            assert type(side) is list
            for name, version in side:
                assert type(name) is str and type(version) is int

    as_json = [[[[n, v] for n, v in ins], [[n, v] for n, v in outs]] for ins, outs in ssa]
    assert as_json == case["ssa"]
    assert versions == case["blob_versions"]

    undefined = core.get_undefined_blobs(ssa)
    assert type(undefined) is set
    assert sorted(undefined) == case["undefined_blobs"]


@pytest.mark.parametrize("case", CASES[::25], ids=[c["name"] for c in CASES[::25]])
def test_undefined_blobs_from_recorded_ssa(case):
    # get_undefined_blobs also accepts an ssa it did not compute (lists instead of tuples).
    assert sorted(core.get_undefined_blobs(case["ssa"])) == case["undefined_blobs"]
