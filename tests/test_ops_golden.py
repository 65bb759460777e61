"""Replays every case of the golden op corpus recorded from Caffe2 (``tests/golden/ops``) with
ferrocaffe's public API (``replay/ops.py``): each op's outputs, or its error at the stage Caffe2
raises it; random fills against their statistics; and for differentiable ops the gradient ops
``core.GradientRegistry.GetGradientForOp`` makes and their values on the recorded output
gradients. Every case must pass."""

import pytest
from replay import ops
from replay.common import case_by_name, case_names

CORPUS = "ops"
NAMES = case_names(CORPUS)


def test_corpus_holds_every_op_case():
    assert len(NAMES) == 186
    assert len(set(NAMES)) == len(NAMES), "case names must be unique"


@pytest.mark.parametrize("name", NAMES)
def test_op_case(name):
    diffs = ops.replay(case_by_name(CORPUS, name))
    assert diffs == [], f"{name}: {len(diffs)} difference(s) from Caffe2:\n" + "\n".join(diffs)
