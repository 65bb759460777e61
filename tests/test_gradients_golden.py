"""Replays every case of the golden gradients corpus recorded from Caffe2
(``tests/golden/gradients``) with ferrocaffe's public API (``replay/gradients.py``): the gradient
ops and gradient map of ``core.GradientRegistry.GetBackwardPass`` (or the error it raises), and
``core.get_ssa`` / ``core.get_undefined_blobs`` of the forward net. Cases whose order Caffe2
took from Python's set iteration are compared modulo that order only. Every case must pass."""

import pytest
from replay import gradients
from replay.common import case_by_name, case_names

CORPUS = "gradients"
NAMES = case_names(CORPUS)


def test_corpus_holds_every_gradient_case():
    assert len(NAMES) == 377
    assert len(set(NAMES)) == len(NAMES), "case names must be unique"


@pytest.mark.parametrize("name", NAMES)
def test_gradient_case(name):
    diffs = gradients.replay(case_by_name(CORPUS, name))
    assert diffs == [], f"{name}: {len(diffs)} difference(s) from Caffe2:\n" + "\n".join(diffs)
