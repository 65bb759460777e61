"""Replay the golden checkpoint corpus (``tests/golden/checkpoints``): Save / Load / Checkpoint /
DBExists on the minidb and protodb files Caffe2 wrote, the same write steps run by ferrocaffe
(its files must be Caffe2's byte for byte, and the loads must give the same results on them),
and SerializeBlob / DeserializeBlob. Every case must pass."""

import numpy as np
import pytest
from replay import checkpoints
from replay.common import array, load_cases

from ferrocaffe import workspace

CASES = load_cases("checkpoints")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_checkpoint_case(case):
    diffs = checkpoints.replay(case)
    assert diffs == [], f"{case['name']}:\n" + "\n".join(diffs)


def test_corpus_size():
    assert len(CASES) == 98
    assert len({c["name"] for c in CASES}) == 98


def _case(name):
    return next(c for c in CASES if c["name"] == name)


def _recorded(f):
    return (checkpoints.golden_path() / "checkpoints" / f["path"]).read_bytes()


def _minidb_bytes(records):
    return b"".join(
        len(k).to_bytes(4, "little") + len(v).to_bytes(4, "little") + k + v for k, v in records
    )


def test_written_files_are_compared_byte_for_byte():
    f = _case("ckpt.chunked.several_blobs")["files"][0]
    data = _recorded(f)
    assert checkpoints.file_diffs(f, data) == []
    flipped = data[:-1] + bytes([data[-1] ^ 1])
    assert checkpoints.file_diffs(f, flipped)
    assert checkpoints.file_diffs(f, data + data[:8])
    # chunks of one blob in another order: not the same bytes, so not the same file
    records = checkpoints.minidb_records(data)
    assert len(records) > 2
    assert checkpoints.file_diffs(f, _minidb_bytes([records[1], records[0], *records[2:]]))


def test_thread_ordered_chunks_compare_modulo_chunk_order():
    f = _case("ckpt.chunked.multithreaded_order")["files"][0]
    assert f["bytes_reproducible"] is False
    records = checkpoints.minidb_records(_recorded(f))
    assert checkpoints.file_diffs(f, _minidb_bytes(sorted(records))) == []
    assert checkpoints.file_diffs(f, _minidb_bytes(records[:-1]))
    changed = [*records[:-1], (records[-1][0], records[-1][1] + b"\0")]
    assert checkpoints.file_diffs(f, _minidb_bytes(changed))


def test_a_wrong_recording_fails():
    """The replay is not vacuous: a changed value, blob list, empty blob, error or stage and a
    changed SerializeBlob record are all reported."""
    case = _case("ckpt.dtype.float32")
    assert checkpoints.replay(case) == []
    load = case["loads"][0]
    for changed in (
        dict(load, blobs=[dict(load["blobs"][0], name="zzz")]),
        dict(load, workspace_blobs=[*load["workspace_blobs"], "zzz"]),
        dict(load, empty_blobs=["zzz"]),
        dict(load, expected="error", error={"type": "RuntimeError", "match": "x"}),
    ):
        assert checkpoints.replay(dict(case, loads=[changed]))
    errors = _case("ckpt.save_error.missing_input")
    assert checkpoints.replay(errors) == []
    step = errors["write_steps"][0]
    assert step["error"]["stage"] == "create"
    wrong_stage = dict(step, error=dict(step["error"], stage="run"))
    assert checkpoints.replay(dict(errors, write_steps=[wrong_stage]))
    serialize = _case("ckpt.serialize.float32")
    assert checkpoints.replay(serialize) == []
    b64 = serialize["serialized_b64"]
    assert checkpoints.replay(dict(serialize, serialized_b64=b64[:-4] + "AAAA"))


def test_blob_values_compare_bitwise():
    meta = _case("ckpt.dtype.float32")["loads"][0]["blobs"][0]
    value = array("checkpoints", meta)
    workspace.ResetWorkspace()
    try:
        workspace.FeedBlob(meta["name"], value)
        assert checkpoints.compare_blob("fed", meta) == []
        flat = value.copy().reshape(-1)
        i = int(np.flatnonzero(np.isfinite(flat))[0])
        flat[i] = np.nextafter(flat[i], np.float32(np.inf))
        workspace.FeedBlob(meta["name"], flat.reshape(value.shape))
        assert checkpoints.compare_blob("one ulp off", meta)
        workspace.FeedBlob(meta["name"], value.astype(np.float64))
        assert checkpoints.compare_blob("float64", meta)
        workspace.FeedBlob(meta["name"], value.reshape(-1))
        assert checkpoints.compare_blob("flat", meta)
    finally:
        workspace.ResetWorkspace()
