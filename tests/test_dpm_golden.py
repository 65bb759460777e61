"""Replay the golden data-parallel corpus (``tests/golden/dpm``): the nets that
``data_parallel_model.Parallelize_CPU`` built, trained for 5 iterations on 2-4 CPU devices
(dag executor), must reproduce Caffe2's parameters, momentum and losses, as must the
one-device runs, the extracted predictor and the checkpoint resume."""

import pytest
from replay import dpm
from replay.common import case_by_name, case_names

NAMES = case_names("dpm")


@pytest.mark.parametrize("name", NAMES)
def test_dpm_case(name):
    diffs = dpm.replay(case_by_name("dpm", name))
    assert diffs == [], "\n".join(diffs)


def test_every_case_is_replayed():
    assert len(NAMES) == 9
    assert len(set(NAMES)) == len(NAMES)
