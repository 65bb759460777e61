"""What every corpus replay shares: where the data is, reading cases, arrays and protobufs,
comparing arrays with the corpus tolerances, matching recorded errors, and a clean slate
before each case. The comparison rules are those of ``tests/golden/README.md``."""

from __future__ import annotations

import base64
import functools
import json
import os
from pathlib import Path

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

RTOL = 1e-4
ATOL = 1e-5


def golden_path() -> Path:
    """The corpus root: ``$FERROCAFFE_GOLDEN`` when set, else ``tests/golden`` in the repo."""
    override = os.environ.get("FERROCAFFE_GOLDEN")
    return Path(override) if override else REPO_ROOT / "tests" / "golden"


def side_file(name: str) -> Path:
    """A file recorded beside the corpora (``op-catalog.json``, ``caffe2-wire-format.json``):
    inside the corpus root in the repository, one level up in the shared layout."""
    root = golden_path()
    inside = root / name
    return inside if inside.exists() else root.parent / name


@functools.cache
def load_cases(corpus: str) -> tuple[dict, ...]:
    """The cases of ``<golden>/<corpus>/cases.jsonl``, in file order."""
    with open(golden_path() / corpus / "cases.jsonl", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def case_names(corpus: str) -> list[str]:
    return [c["name"] for c in load_cases(corpus)]


def case_by_name(corpus: str, name: str) -> dict:
    for c in load_cases(corpus):
        if c["name"] == name:
            return c
    raise KeyError(f"{corpus}: no case named {name!r}")


@functools.cache
def _npz(corpus: str, file: str):
    return np.load(golden_path() / corpus / file, allow_pickle=False)


def array(corpus: str, spec: dict, file: str = "arrays.npz") -> np.ndarray:
    """The array a ``{key, dtype, shape}`` entry names, checked against its dtype and shape."""
    arr = _npz(corpus, file)[spec["key"]]
    if "dtype" in spec and str(arr.dtype) != spec["dtype"]:
        raise AssertionError(f"{spec['key']}: npz dtype {arr.dtype}, listed {spec['dtype']}")
    if "shape" in spec and list(arr.shape) != list(spec["shape"]):
        raise AssertionError(f"{spec['key']}: npz shape {arr.shape}, listed {spec['shape']}")
    return arr


_MESSAGES = {
    "OperatorDef": caffe2_pb2.OperatorDef,
    "NetDef": caffe2_pb2.NetDef,
    "PlanDef": caffe2_pb2.PlanDef,
    "TensorProto": caffe2_pb2.TensorProto,
    "BlobProto": caffe2_pb2.BlobProto,
}


def parse(kind: str, b64: str):
    """Parse the base64 of a serialized caffe2 message of the given short name."""
    msg = _MESSAGES[kind]()
    msg.ParseFromString(base64.b64decode(b64))
    return msg


def compare_array(what: str, actual, expected: np.ndarray, rtol=RTOL, atol=ATOL) -> list[str]:
    """Differences between a fetched value and a recorded array: dtype and shape exactly,
    floats within (rtol, atol) with NaNs in the same places, everything else exactly."""
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return [f"{what}: dtype {actual.dtype}, expected {expected.dtype}"]
    if actual.shape != expected.shape:
        return [f"{what}: shape {actual.shape}, expected {expected.shape}"]
    if expected.dtype.kind == "f":
        ok = np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            bad = np.argwhere(~ok)[:3].tolist()
            diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
            return [
                f"{what}: {int((~ok).sum())} of {ok.size} values differ "
                f"(max abs diff {np.nanmax(diff):.3g}; first at {bad})"
            ]
        return []
    if not np.array_equal(actual, expected):
        return [f"{what}: values differ"]
    return []


def error_diffs(what: str, exc: BaseException | None, spec: dict) -> list[str]:
    """Whether an exception matches a recorded ``error`` block: the class name ``type`` and the
    substring(s) ``match`` in its message."""
    if exc is None:
        return [f"{what}: no error, expected {spec.get('type')}: {spec.get('match')!r}"]
    diffs = []
    want = spec.get("type")
    if want and type(exc).__name__ != want and want not in [c.__name__ for c in type(exc).__mro__]:
        diffs.append(f"{what}: raised {type(exc).__name__}, expected {want}: {exc}")
    matches = spec.get("match")
    if isinstance(matches, str):
        matches = [matches]
    for m in matches or []:
        if m not in str(exc):
            diffs.append(f"{what}: message {str(exc)!r} lacks {m!r}")
    return diffs


def fresh_state(root_folder: str | None = None) -> None:
    """The state every case starts from: an empty workspace and empty net and step name
    registries (Caffe2 uniquifies names against them)."""
    if root_folder is None:
        workspace.ResetWorkspace()
    else:
        workspace.ResetWorkspace(root_folder)
    names = getattr(core.Net, "_net_names_used", None)
    if names is not None:
        names.clear()
    steps = getattr(core.ExecutionStep, "_step_names_used", None)
    if steps is not None:
        steps.clear()
