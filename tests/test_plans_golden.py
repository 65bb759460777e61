"""Replay the golden plans corpus (``tests/golden/plans``, recorded from the real Caffe2): every
case must pass. The plans with concurrent instances are run three times over, as their results
must not depend on thread timing."""

import pytest
from replay import plans
from replay.common import case_by_name, case_names

NAMES = case_names("plans")
CONCURRENT = [n for n in NAMES if "num_concurrent_instances" in n]


@pytest.mark.parametrize("name", NAMES)
def test_plan_case(name):
    diffs = plans.replay(case_by_name("plans", name))
    assert diffs == [], "\n".join(diffs)


def test_every_case_is_replayed():
    assert len(NAMES) == 19
    assert len(set(NAMES)) == len(NAMES)


def test_concurrent_instances_are_stable():
    assert len(CONCURRENT) == 2
    for _ in range(3):
        for name in CONCURRENT:
            diffs = plans.replay(case_by_name("plans", name))
            assert diffs == [], name + "\n" + "\n".join(diffs)
