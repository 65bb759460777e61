"""Replay of the ``checkpoints/`` corpus: Save / Checkpoint / Load / DBExists on the minidb and
protodb files Caffe2 wrote, the same write steps replayed by ferrocaffe (its files must be
Caffe2's, byte for byte), the loads again on ferrocaffe's own files, and SerializeBlob /
DeserializeBlob. The rules are those of the ``checkpoints/`` section of the golden README.

Every case runs with the current directory set to an empty scratch directory: DB names that
are meant to be resolved against the workspace root folder must not land there."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import struct
import tempfile
import traceback

import numpy as np

from ferrocaffe import workspace
from ferrocaffe.proto import caffe2_pb2

from .common import array, error_diffs, fresh_state, golden_path

CORPUS = "checkpoints"
_DB_ARGS = ("db", "db_name")


# -- blob values ------------------------------------------------------------------------------


def blob_value(meta: dict):
    """The value a blob entry of the corpus stands for: bytes for a ``std::string`` blob, an
    object array of bytes for a string tensor, else the recorded array."""
    if meta.get("type") == "std::string":
        return base64.b64decode(meta["bytes_b64"])
    if "strings_b64" in meta:
        flat = np.empty(len(meta["strings_b64"]), dtype=object)
        flat[:] = [base64.b64decode(s) for s in meta["strings_b64"]]
        return flat.reshape(meta["shape"])
    return array(CORPUS, meta)


def feed(metas) -> None:
    for m in metas or []:
        workspace.FeedBlob(m["name"], blob_value(m))


def compare_blob(what: str, meta: dict) -> list[str]:
    """The blob ``meta['name']`` must hold exactly the recorded value: the same kind of value,
    dtype, shape and bytes (NaN payloads and the sign of zero included)."""
    name = meta["name"]
    try:
        got = workspace.FetchBlob(name)
    except Exception as e:  # noqa: BLE001
        return [f"{what}: FetchBlob({name!r}) raised {type(e).__name__}: {e}"]
    want = blob_value(meta)
    if isinstance(want, bytes):
        if type(got) is not bytes:
            return [f"{what}: expected the std::string blob {want!r}, got {type(got).__name__}"]
        if got != want:
            return [f"{what}: std::string blob {got!r}, expected {want!r}"]
        return []
    if not isinstance(got, np.ndarray):
        return [f"{what}: expected an ndarray, got {type(got).__name__}: {got!r:.200}"]
    if got.dtype != want.dtype:
        return [f"{what}: dtype {got.dtype}, expected {want.dtype}"]
    if got.shape != want.shape:
        return [f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"]
    if want.dtype == object:
        for i, (x, y) in enumerate(zip(got.reshape(-1), want.reshape(-1), strict=True)):
            if type(x) is not bytes or x != y:
                return [f"{what}: string element {i} is {x!r}, expected {y!r}"]
        return []
    g = np.ascontiguousarray(got).reshape(-1)
    w = np.ascontiguousarray(want).reshape(-1)
    if g.tobytes() != w.tobytes():
        gb, wb = g.view(f"V{g.itemsize}"), w.view(f"V{w.itemsize}")
        bad = np.flatnonzero(gb != wb)
        i = int(bad[0])
        return [
            f"{what}: {bad.size} of {w.size} values differ bitwise "
            f"(first at flat index {i}: {g[i]!r}, expected {w[i]!r})"
        ]
    return []


def empty_description(name: str) -> bytes:
    """What Caffe2's FetchBlob returns for a blob that exists but holds nothing: bytes naming
    the blob and its C++ type (as ``models/`` records for the masks of test-mode Dropout)."""
    return f"{name}, a C++ native class of type nullptr (uninitialized).".encode()


# -- files and DB names -----------------------------------------------------------------------


def copy_files(case: dict, directory: str) -> None:
    """The case's recorded files, under their ``db`` names."""
    root = golden_path() / CORPUS
    for f in case.get("files") or []:
        shutil.copyfile(root / f["path"], os.path.join(directory, f["db"]))


def bind(op, directory: str):
    """``(op, relative)``: with ``absolute_path`` set, a copy of the op whose non-empty ``db`` /
    ``db_name`` / ``dbs`` names are ``directory/<name>``; otherwise the op itself, to be run
    with the workspace root folder set to ``directory`` (``relative`` is True)."""
    absolute = any(a.name == "absolute_path" and a.i for a in op.arg)
    if not absolute:
        return op, True
    bound = caffe2_pb2.OperatorDef()
    bound.CopyFrom(op)
    for a in bound.arg:
        if a.name in _DB_ARGS and a.s:
            a.s = os.path.join(directory, a.s.decode()).encode()
        elif a.name == "dbs":
            a.strings[:] = [
                os.path.join(directory, s.decode()).encode() if s else s for s in a.strings
            ]
    return bound, False


def parse_op(b64: str):
    op = caffe2_pb2.OperatorDef()
    op.ParseFromString(base64.b64decode(b64))
    return op


def minidb_records(data: bytes) -> list[tuple[bytes, bytes]]:
    """The ``(key, value)`` records of a minidb file (int32 LE key length, int32 LE value
    length, key, value); ValueError when the bytes do not split into whole records."""
    out, off = [], 0
    while off < len(data):
        if off + 8 > len(data):
            raise ValueError(f"a record header is cut at byte {off}")
        klen, vlen = struct.unpack_from("<ii", data, off)
        start = off + 8
        if klen < 0 or vlen < 0 or start + klen + vlen > len(data):
            raise ValueError(f"the record at byte {off} is cut")
        out.append((data[start : start + klen], data[start + klen : start + klen + vlen]))
        off = start + klen + vlen
    return out


def _blob_order(records) -> list[bytes]:
    order: list[bytes] = []
    for key, _ in records:
        name = key.split(b"#%")[0]
        if name not in order:
            order.append(name)
    return order


def file_diffs(f: dict, got: bytes) -> list[str]:
    """ferrocaffe's file against Caffe2's: identical bytes, except that a file Caffe2 wrote
    with chunks in a thread-dependent order (``bytes_reproducible: false``, minidb) must hold
    the same records, with the blobs in the same order, in any chunk order."""
    want = (golden_path() / CORPUS / f["path"]).read_bytes()
    if got == want:
        return []
    what = f"written file {f['db']}"
    if not f.get("bytes_reproducible", True) and f["db_type"] == "minidb":
        try:
            rg, rw = minidb_records(got), minidb_records(want)
        except ValueError as e:
            return [f"{what}: not a sequence of minidb records ({e})"]
        if sorted(rg) == sorted(rw) and _blob_order(rg) == _blob_order(rw):
            return []
        return [
            f"{what}: records {[k for k, _ in rg]} differ from Caffe2's {[k for k, _ in rw]} "
            "(compared modulo chunk order)"
        ]
    pairs = enumerate(zip(got, want, strict=False))
    first = next((i for i, (x, y) in pairs if x != y), min(len(got), len(want)))
    msg = (
        f"{what}: {len(got)} bytes, Caffe2 wrote {len(want)}; first difference at byte {first} "
        f"(ours {got[first : first + 16].hex()}, Caffe2 {want[first : first + 16].hex()})"
    )
    if f["db_type"] == "minidb":
        msg += _record_detail(got, want)
    return [msg]


def _record_detail(got: bytes, want: bytes) -> str:
    try:
        rg, rw = minidb_records(got), minidb_records(want)
    except ValueError as e:
        return f"; ours does not split into records ({e})"
    if [k for k, _ in rg] != [k for k, _ in rw]:
        return f"; record keys {[k for k, _ in rg]}, Caffe2 {[k for k, _ in rw]}"
    for (key, a), (_, b) in zip(rg, rw, strict=True):
        if a == b:
            continue
        try:
            pa, pb = caffe2_pb2.BlobProto(), caffe2_pb2.BlobProto()
            pa.ParseFromString(a)
            pb.ParseFromString(b)
        except Exception:  # noqa: BLE001
            return f"; record {key!r}: our value does not parse as a BlobProto"
        if str(pa) == str(pb):
            return f"; record {key!r}: the same BlobProto, serialized differently"
        return f"; record {key!r}: BlobProto\n{pa}\nCaffe2:\n{pb}"
    return ""


# -- running ops ------------------------------------------------------------------------------


@contextlib.contextmanager
def _scratch(prefix: str):
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _enter(directory: str, relative: bool) -> None:
    """A fresh workspace; its root folder is ``directory`` for ops with relative DB names."""
    fresh_state(directory if relative else None)


def creation_stage(case: dict, op, prepare) -> str:
    """``create`` when CreateNet of a one-op net holding ``op`` raises (after ``prepare()`` in
    a fresh workspace, on a scratch copy of the case's files), else ``run``."""
    with _scratch("ckpt_stage_") as d:
        copy_files(case, d)
        bound, relative = bind(op, d)
        _enter(d, relative)
        prepare()
        net = caffe2_pb2.NetDef()
        net.name = "ckpt_stage_probe"
        net.op.extend([bound])
        try:
            workspace.CreateNet(net)
        except Exception:  # noqa: BLE001
            return "create"
        return "run"


def check_error(what: str, exc, spec: dict, case: dict, op, prepare) -> list[str]:
    diffs = error_diffs(what, exc, spec)
    if exc is None or diffs or not spec.get("stage"):
        return diffs
    stage = creation_stage(case, op, prepare)
    if stage != spec["stage"]:
        return [f"{what}: the error comes when the op is {stage}; Caffe2 at {spec['stage']}"]
    return []


def replay_load(case: dict, v: dict, directory: str, tag: str) -> list[str]:
    """One ``loads`` entry, in a fresh workspace, on the files in ``directory``."""
    what = f"{tag} {v['label']}"
    op = parse_op(v["op_b64"])
    bound, relative = bind(op, directory)
    _enter(directory, relative)
    feed(v.get("pre_feeds"))
    exc = None
    try:
        workspace.RunOperatorOnce(bound)
    except Exception as e:  # noqa: BLE001
        exc = e
    if v["expected"] == "error":
        return check_error(what, exc, v["error"], case, op, lambda: feed(v.get("pre_feeds")))
    if exc is not None:
        return [f"{what}: {op.type} raised {type(exc).__name__}: {exc}"]
    diffs = []
    for m in v.get("blobs") or []:
        diffs += compare_blob(f"{what}: blob {m['name']!r}", m)
    for name in v.get("empty_blobs") or []:
        if not workspace.HasBlob(name):
            diffs.append(f"{what}: blob {name!r} should exist and hold nothing; it does not exist")
            continue
        try:
            got = workspace.FetchBlob(name)
        except Exception as e:  # noqa: BLE001
            diffs.append(f"{what}: FetchBlob of the empty blob {name!r} raised {e!r}")
            continue
        want = empty_description(name)
        if type(got) is not bytes or got != want:
            diffs.append(
                f"{what}: blob {name!r} should hold nothing (FetchBlob gives {want!r}); "
                f"got {type(got).__name__}: {got!r:.200}"
            )
    names = sorted(str(b) for b in workspace.Blobs())
    if names != sorted(v["workspace_blobs"]):
        diffs.append(f"{what}: workspace blobs {names}, expected {v['workspace_blobs']}")
    return diffs


def replay_writes(case: dict, directory: str) -> list[str]:
    """Run the write steps in one workspace with their DB files in ``directory``."""
    steps = case["write_steps"]
    ops = [parse_op(st["op_b64"]) for st in steps]
    bound = [bind(op, directory) for op in ops]
    _enter(directory, any(rel for _, rel in bound))

    def setup(st):
        feed(st.get("feeds"))
        if st.get("setup_net_b64"):
            net = caffe2_pb2.NetDef()
            net.ParseFromString(base64.b64decode(st["setup_net_b64"]))
            workspace.RunNetOnce(net)

    diffs, probes = [], []
    for i, (st, op, (bop, _)) in enumerate(zip(steps, ops, bound, strict=True)):
        what = f"write step {i} ({op.type})"
        setup(st)
        exc = None
        try:
            workspace.RunOperatorOnce(bop)
        except Exception as e:  # noqa: BLE001
            exc = e
        if st["expected"] == "error":
            diffs += error_diffs(what, exc, st["error"])
            if exc is not None and st["error"].get("stage"):
                probes.append((what, i))
        elif exc is not None:
            diffs.append(f"{what}: raised {type(exc).__name__}: {exc}")
    # the creation-stage probes reset the workspace, so they come after every step
    for what, i in probes:

        def prepare(i=i):
            for st in steps[: i + 1]:
                setup(st)

        stage = creation_stage(case, ops[i], prepare)
        if stage != steps[i]["error"]["stage"]:
            diffs.append(
                f"{what}: the error comes when the op is {stage}; "
                f"Caffe2 at {steps[i]['error']['stage']}"
            )
    return diffs


# -- cases ------------------------------------------------------------------------------------


def replay_serialize(case: dict) -> list[str]:
    fresh_state()
    if "error" in case:
        call, args = case["call"], case["args"]
        exc = None
        try:
            if call == "SerializeBlob":
                workspace.SerializeBlob(args["name"])
            else:
                workspace.DeserializeBlob(args["name"], base64.b64decode(args["bytes_b64"]))
        except Exception as e:  # noqa: BLE001
            exc = e
        return error_diffs(call, exc, case["error"])
    diffs = []
    feed(case["feeds"])
    stored = base64.b64decode(case["serialized_b64"])
    got = workspace.SerializeBlob(case["blob"])
    if type(got) is not bytes:
        diffs.append(f"SerializeBlob returned {type(got).__name__}, not bytes")
    elif got != stored:
        ours, theirs = caffe2_pb2.BlobProto(), caffe2_pb2.BlobProto()
        theirs.ParseFromString(stored)
        try:
            ours.ParseFromString(got)
            detail = f"ours:\n{ours}\nCaffe2:\n{theirs}"
        except Exception:  # noqa: BLE001
            detail = "ours does not parse as a BlobProto"
        diffs.append(
            f"SerializeBlob({case['blob']!r}): {len(got)} bytes {got.hex()}, Caffe2 "
            f"{len(stored)} bytes {stored.hex()}; {detail}"
        )
    into = case["deserialize_into"]
    workspace.DeserializeBlob(into, stored)
    diffs += compare_blob(f"DeserializeBlob({into!r}, Caffe2's bytes)", dict(case["expected"]))
    if type(got) is bytes and got != stored:
        workspace.DeserializeBlob(into + "_own", got)
        diffs += compare_blob(
            "DeserializeBlob(own bytes)", dict(case["expected"], name=into + "_own")
        )
    return diffs


def _replay_files(case: dict) -> list[str]:
    diffs = []
    with _scratch("ckpt_stored_") as d:
        copy_files(case, d)
        for v in case.get("loads") or []:
            diffs += replay_load(case, v, d, "stored file:")
    if not case.get("write_steps"):
        return diffs
    with _scratch("ckpt_written_") as d:
        step_diffs = replay_writes(case, d)
        diffs += step_diffs
        made = sorted(os.listdir(d))
        want = sorted(f["db"] for f in case.get("files") or [])
        if made != want:
            diffs.append(f"the write steps left the files {made}; Caffe2 left {want}")
        for f in case.get("files") or []:
            p = os.path.join(d, f["db"])
            if os.path.exists(p):
                with open(p, "rb") as fh:
                    diffs += file_diffs(f, fh.read())
        if not step_diffs and made == want:
            for v in case.get("loads") or []:
                if v.get("roundtrip", True):
                    diffs += replay_load(case, v, d, "round trip:")
    return diffs


def replay(case: dict) -> list[str]:
    """The differences between ferrocaffe and the recorded case (empty: it passes)."""
    cwd = os.getcwd()
    with _scratch("ckpt_cwd_") as decoy:
        os.chdir(decoy)
        try:
            if case["section"] == "serialize":
                diffs = replay_serialize(case)
            else:
                diffs = _replay_files(case)
            stray = sorted(os.listdir(decoy))
            if stray:
                diffs.append(f"files appeared in the current directory: {stray}")
        except Exception as e:  # noqa: BLE001
            trace = traceback.format_exc(limit=-4)
            diffs = [f"replay aborted: {type(e).__name__}: {e}\n{trace}"]
        finally:
            os.chdir(cwd)
            fresh_state()
    return diffs
