"""scripts/caffe2_suite_report.py: the suite's figures with the listed exceptions applied, and
the exceptions file itself (every entry well formed)."""

import importlib.util
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "caffe2_suite_report", ROOT / "scripts" / "caffe2_suite_report.py"
)
rep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rep)


@pytest.mark.parametrize(
    "cond,version,holds",
    [
        (">=2", (2, 4, 6), True),
        (">=2", (1, 26, 4), False),
        (">=1.23", (1, 26, 4), True),
        (">=1.23", (1, 21, 6), False),
        ("<2", (1, 26, 4), True),
        ("==1.26", (1, 26, 4), True),
        (">1.26", (1, 26, 4), False),
    ],
)
def test_numpy_conditions(cond, version, holds):
    assert rep.numpy_condition_holds(cond, version) is holds


def test_a_malformed_condition_is_refused():
    with pytest.raises(ValueError, match="numpy condition"):
        rep.numpy_condition_holds("2+", (2, 0, 0))


ENTRIES = [
    {"file": "a", "tests": ["T::x"], "reason": "r1", "numpy": ">=2"},
    {"file": "a", "tests": ["T::y"], "reason": "r2", "mode": "upstream"},
    {"file": "b", "tests": ["T::z"], "reason": "r3"},
]


def test_entries_apply_by_mode_and_numpy():
    got = rep.applicable_exceptions(ENTRIES, "own", (2, 1, 0))
    assert set(got) == {("a", "T::x"), ("b", "T::z")}
    got = rep.applicable_exceptions(ENTRIES, "upstream", (1, 26, 4))
    assert set(got) == {("a", "T::y"), ("b", "T::z")}


def test_report_counts_excuses_only_failures_and_flags_stale_entries():
    census = {
        "files": {
            "a": {
                "selection": "operator-target",
                "passed_ids": ["T::x", "T::y", "T::w"],
                "seconds_median": 10.0,
            },
            "b": {"selection": "required", "passed_ids": ["T::z"], "seconds_median": 5.0},
            "c": {"selection": "required", "passed_ids": ["T::q"], "seconds_median": 99.0},
        }
    }
    run = {
        "files": {
            "a": {"tail": "1 failed, 2 passed in 4.50s", "passed": ["T::w", "T::y"]},
            "b": {"tail": "1 failed in 2.00s", "passed": []},
        }
    }
    exc = rep.applicable_exceptions(ENTRIES, "upstream", (2, 0, 0))  # x, y (stale), z
    lines = rep.report(run, census, exc)
    # file c was not run: left out of every figure
    assert lines[0] == (
        "operator-target: 2/3 (66.7%); without the 1 listed exceptions 2/2 (100.0%)"
    )
    assert lines[1] == "required: 0/1 (0.0%); without the 1 listed exceptions 0/0 (0.0%)"
    assert lines[2].startswith("wall time (pytest's per-file seconds, summed): 6.5 s here, 15.0 s")
    assert lines[3] == "listed as an exception but passes: a::T::y"
    assert len(lines) == 4


def test_the_exceptions_file_is_well_formed():
    entries = tomllib.loads((ROOT / "tests" / "caffe2_suite_exceptions.toml").read_text())[
        "exception"
    ]
    assert entries
    for e in entries:
        assert set(e) <= {"file", "tests", "reason", "numpy", "mode"}, e
        assert e["file"] and e["tests"] and e["reason"].strip(), e
        assert all("::" in t for t in e["tests"]), e
        assert e.get("mode", "own") in ("own", "upstream"), e
        if "numpy" in e:
            rep.numpy_condition_holds(e["numpy"], (2, 0, 0))  # parses
