"""Replay the golden API-example corpus (``tests/golden/api_examples.jsonl``, recorded from the
real Caffe2) against ferrocaffe, one pytest case per corpus case: each snippet runs in a fresh
fork of a process that has only imported ferrocaffe, and what it records (and the exception
that escapes it) must match the recording. Every case of every group must pass."""

import pytest
from replay import api_examples

# Every group of the corpus, with its number of cases.
GROUPS = {
    "blobref": 20,
    "scope": 22,
    "create_operator": 36,
    "net": 101,
    "misc": 11,
    "device": 31,
    "plan": 49,
    "clone_bind": 11,
    "ssa": 12,
    "workspace": 21,
}

ALL_CASES = api_examples.load_cases()
CASES = [c for c in ALL_CASES if c["group"] in GROUPS]


def test_corpus_size():
    assert len(ALL_CASES) == 314
    assert len(CASES) == 314
    assert len({c["name"] for c in CASES}) == 314
    counts = {}
    for c in CASES:
        counts[c["group"]] = counts.get(c["group"], 0) + 1
    assert counts == GROUPS


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case):
    diffs = api_examples.replay(case)
    assert diffs == [], f"{case['name']}:\n" + "\n".join(diffs)


def test_fresh_interpreter_state():
    """Each case starts with empty name registries, whatever ran before it."""
    source = "n = core.Net('fresh')\nrecord('name', n.Name())\n"
    for _ in range(2):
        result = api_examples.execute({"name": "fresh", "source": source})
        assert result == {"records": [["name", "fresh"]], "error": None}


def test_a_wrong_record_fails():
    """The comparison is not vacuous: a changed, a missing or a reordered record, a protobuf
    that differs, and an error that is missing or unexpected are all reported."""
    with_records = next(c for c in CASES if c["name"] == "net.name_uniquified")
    raises = next(c for c in CASES if c["error"] is not None)
    for case in (with_records, raises):
        assert api_examples.replay(case) == []
    records = with_records["records"]
    assert api_examples.replay(dict(with_records, records=[[k, 0] for k, _ in records]))
    assert api_examples.replay(dict(with_records, records=records[:-1]))
    assert api_examples.replay(dict(with_records, records=records[::-1]))
    assert api_examples.replay(dict(with_records, error=raises["error"]))
    assert api_examples.replay(dict(raises, error=None))
    proto = next(
        c
        for c in CASES
        if c["records"] and isinstance(c["records"][0][1], dict) and c["records"][0][1].get("b64")
    )
    key, value = proto["records"][0]
    emptied = [[key, dict(value, b64="")]] + proto["records"][1:]
    assert api_examples.replay(proto) == []
    assert api_examples.replay(dict(proto, records=emptied))


def test_a_hanging_case_is_killed():
    result = api_examples.execute({"name": "hang", "source": "while True:\n    pass\n"}, 2)
    assert "timed out" in result["crash"]
    result = api_examples.execute({"name": "after", "source": "record('ok', 1)\n"})
    assert result == {"records": [["ok", 1]], "error": None}
