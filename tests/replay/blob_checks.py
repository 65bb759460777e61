"""Workspace-level checks that several corpus replays share: feeding listed arrays, fetching a
blob without letting an exception escape, comparing a blob with a recorded array, and telling
whether a blob exists but holds no tensor. Built on ``replay.common``."""

from __future__ import annotations

import numpy as np

from ferrocaffe import workspace
from replay.common import ATOL, RTOL, array, compare_array


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (messages can carry long C++-style traces)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def feed(corpus: str, metas) -> None:
    """Feed every ``{name, key, dtype, shape}`` entry of a list."""
    for m in metas or []:
        workspace.FeedBlob(m["name"], array(corpus, m))


def fetch(name: str):
    """``(value, None)``, or ``(None, problem)`` when ``FetchBlob`` raises."""
    try:
        return workspace.FetchBlob(name), None
    except Exception as e:  # noqa: BLE001 - any failure is a difference to report
        exists = _has_blob(name)
        suffix = " (HasBlob is False)" if exists is False else ""
        return None, f"FetchBlob({name!r}) raised {describe(e)}{suffix}"


def _has_blob(name: str):
    try:
        return bool(workspace.HasBlob(name))
    except Exception:  # noqa: BLE001
        return None


def compare_blob(corpus: str, label: str, meta: dict, rtol=RTOL, atol=ATOL) -> list[str]:
    """Fetch ``meta['name']`` and compare it with the recorded array ``meta`` names."""
    value, problem = fetch(meta["name"])
    if problem:
        return [f"{label}: {problem}"]
    return compare_array(label, value, array(corpus, meta), rtol=rtol, atol=atol)


def holds_a_tensor(value) -> bool:
    """Whether a fetched value is a tensor (a numeric, bool or string array), rather than the
    description Caffe2's ``FetchBlob`` returns for a blob holding no tensor."""
    if isinstance(value, np.ndarray):
        return True
    return np.isscalar(value) and not isinstance(value, (bytes, str))


def fetch_tensor(name: str):
    """``(array, None)`` for a blob holding a tensor, else ``(None, problem)``: ``FetchBlob``
    raised, or the blob holds something else."""
    value, problem = fetch(name)
    if problem:
        return None, problem
    if not holds_a_tensor(value):
        return None, f"holds no tensor ({value!r})"
    return np.asarray(value), None


def no_tensor_diffs(label: str, name: str) -> list[str]:
    """The blob must exist and hold no tensor: ``FetchBlob`` raises or returns a description
    (bytes or str) instead of an array."""
    if not _has_blob(name):
        return [f"{label}: blob {name!r} does not exist (it should exist and hold no tensor)"]
    try:
        value = workspace.FetchBlob(name)
    except Exception:  # noqa: BLE001 - nothing to fetch: as expected
        return []
    if holds_a_tensor(value):
        arr = np.asarray(value)
        return [f"{label}: blob {name!r} holds a {arr.dtype} tensor of shape {arr.shape}"]
    return []
