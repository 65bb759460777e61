"""Replay of the ``plans/`` corpus: a PlanDef run with ``workspace.RunPlan``.

A case feeds ``feeds`` and runs the plan; then ``expected`` blobs must hold the recorded
values (exactly, except the float results of ``plan.sgd_training_loop``), ``checks`` blobs
(whose value depends on timing) must be at least their ``min``, ``absent_blobs`` must not exist
and ``empty_blobs`` must exist but hold no tensor. A case with ``error`` must raise it.
``runs_compared`` > 1 means Caffe2 gave the same result over that many runs: the plan is
replayed that many times, each in a fresh workspace."""

from __future__ import annotations

import numpy as np

from ferrocaffe import workspace
from replay.blob_checks import (
    compare_blob,
    describe,
    feed,
    fetch_tensor,
    no_tensor_diffs,
)
from replay.common import ATOL, RTOL, error_diffs, fresh_state, parse

CORPUS = "plans"
# Cases whose float results are compared with the corpus tolerance instead of exactly.
FLOAT_TOLERANT = {"plan.sgd_training_loop": (RTOL, ATOL)}


def _error_case(case: dict, plan) -> list[str]:
    fresh_state()
    feed(CORPUS, case.get("feeds"))
    try:
        workspace.RunPlan(plan)
    except Exception as e:  # noqa: BLE001 - compared with the recorded error
        return error_diffs("RunPlan", e, case["error"])
    return error_diffs("RunPlan", None, case["error"])


def _checks_diffs(pre: str, checks) -> list[str]:
    diffs = []
    for ch in checks or []:
        arr, problem = fetch_tensor(ch["blob"])
        if problem:
            diffs.append(f"{pre}checks[{ch['blob']}]: {problem}")
            continue
        if arr.size == 0 or not np.all(arr >= ch["min"]):
            diffs.append(
                f"{pre}checks[{ch['blob']}]: expected every value >= {ch['min']}, got "
                f"{arr.tolist()} (Caffe2 gave {ch.get('observed')})"
            )
    return diffs


def run_once(case: dict, plan, pre: str = "") -> list[str]:
    """One run of an ``ok`` case in a fresh workspace, and its differences."""
    fresh_state()
    feed(CORPUS, case.get("feeds"))
    try:
        returned = workspace.RunPlan(plan)
    except Exception as e:  # noqa: BLE001
        return [f"{pre}RunPlan raised {describe(e)}"]
    diffs = []
    if "run_plan_returned" in case and bool(returned) != bool(case["run_plan_returned"]):
        diffs.append(f"{pre}RunPlan returned {returned!r}, expected {case['run_plan_returned']}")
    tol = FLOAT_TOLERANT.get(case["name"])
    for meta in case.get("expected") or []:
        label = f"{pre}expected[{meta['name']}]"
        if tol is not None and meta["dtype"].startswith("float"):
            diffs += compare_blob(CORPUS, label, meta, *tol)
        else:
            diffs += compare_blob(CORPUS, label, meta, 0.0, 0.0)
    diffs += _checks_diffs(pre, case.get("checks"))
    for name in case.get("absent_blobs") or []:
        if workspace.HasBlob(name):
            diffs.append(f"{pre}absent_blobs: blob {name!r} exists after the plan")
    for name in case.get("empty_blobs") or []:
        diffs += no_tensor_diffs(f"{pre}empty_blobs", name)
    return diffs


def replay(case: dict, runs: int | None = None) -> list[str]:
    """The case's differences; ``runs`` overrides how many times an ``ok`` case is run
    (default: ``runs_compared``). Stops at the first run that differs."""
    fresh_state()
    plan = parse("PlanDef", case["plan_b64"])
    if "error" in case:
        diffs = _error_case(case, plan)
    else:
        reps = runs if runs is not None else max(1, int(case.get("runs_compared") or 1))
        diffs = []
        for rep in range(reps):
            pre = f"run {rep + 1}/{reps}: " if reps > 1 else ""
            diffs = run_once(case, plan, pre)
            if diffs:
                break
    fresh_state()
    return diffs
