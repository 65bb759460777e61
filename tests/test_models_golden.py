"""Replay the golden model corpus (``tests/golden/models``, recorded from the real Caffe2):
every model must reproduce Caffe2's outputs, and the three shipped as ``.pb``/``.npy`` files must
hold the same nets and run to the same output."""

import pytest
from replay import models
from replay.common import case_by_name, case_names

NAMES = case_names("models")


@pytest.mark.parametrize("name", NAMES)
def test_model(name):
    diffs = models.replay(case_by_name("models", name))
    assert diffs == [], "\n".join(diffs)


def test_every_model_is_replayed():
    assert len(NAMES) == 16
    assert len(set(NAMES)) == len(NAMES)
    assert len([n for n in NAMES if case_by_name("models", n).get("files")]) == 3
