"""Replay of the ``dpm/`` corpus: the nets ``data_parallel_model.Parallelize_CPU`` built for 2-4
CPU devices, trained 5 iterations, as Caffe2 recorded them.

A training run (the multi-device one, then the ``single_device`` one in a fresh workspace) runs
``RunNetOnce(param_init_net)``, feeds ``init_feeds``, and for each iteration feeds its
``iteration_feeds``, calls ``CreateNet(net)`` before the first ``RunNet(net_name)``, runs it and
after each ``checkpoints[].after_iter`` compares the recorded ``blobs``; it stops at the first
checkpoint that differs. After the multi-device run, the ``api`` blocks that consist of recorded
nets are replayed in the same workspace: the ``ExtractPredictorNet`` predict net run on its
``feeds`` must give its ``outputs``, and ``FinalizeAfterCheckpoint.resume_check`` feeds the
restored blobs, runs ``checkpoint_sync_net``, compares ``synced``, runs the listed iterations
and compares ``after``. An ``error`` case (``Parallelize_CPU`` itself raised) has only its
one-device run.

The nets that follow Python set order (``hash_order_dependent``: the broadcast ``Copy`` ops of
``param_init_net``, the ops of ``checkpoint_sync_net``, the predictor's ``external_input``) are
only run here, never compared as messages, so their order cannot matter."""

from __future__ import annotations

from ferrocaffe import workspace
from replay.blob_checks import compare_blob, describe, feed
from replay.common import fresh_state, parse

CORPUS = "dpm"


def train(tag: str, run: dict) -> tuple[list[str], bool]:
    """One training run in the current workspace. Returns the differences and whether the run
    went through every iteration with matching checkpoints."""
    pinit = parse("NetDef", run["param_init_net_b64"])
    net = parse("NetDef", run["net_b64"])
    try:
        workspace.RunNetOnce(pinit)
        feed(CORPUS, run["init_feeds"])
    except Exception as e:  # noqa: BLE001 - a failing step is a difference
        return [f"{tag}: param_init_net / init_feeds raised {describe(e)}"], False
    checkpoints = {c["after_iter"]: c["blobs"] for c in run["checkpoints"]}
    diffs: list[str] = []
    for it, feeds in enumerate(run["iteration_feeds"], 1):
        try:
            feed(CORPUS, feeds)
            if it == 1:
                workspace.CreateNet(net)
            workspace.RunNet(run["net_name"])
        except Exception as e:  # noqa: BLE001
            return diffs + [f"{tag}: iteration {it} raised {describe(e)}"], False
        for meta in checkpoints.get(it, []):
            diffs += compare_blob(CORPUS, f"{tag}: after iteration {it}: {meta['name']}", meta)
        if diffs:
            return diffs + [f"{tag}: stopped after iteration {it}"], False
    missing = sorted(set(checkpoints) - set(range(1, len(run["iteration_feeds"]) + 1)))
    if missing:
        diffs.append(f"{tag}: checkpoints after iterations {missing} were never reached")
    return diffs, not diffs


def _predictor_diffs(spec: dict) -> list[str]:
    tag = "ExtractPredictorNet predict_net"
    try:
        feed(CORPUS, spec["feeds"])
        workspace.RunNetOnce(parse("NetDef", spec["predict_net_b64"]))
    except Exception as e:  # noqa: BLE001
        return [f"{tag} raised {describe(e)}"]
    diffs = []
    for meta in spec["outputs"]:
        diffs += compare_blob(CORPUS, f"{tag}: {meta['name']}", meta)
    return diffs


def _resume_diffs(case: dict, finalize: dict) -> list[str]:
    check = finalize["resume_check"]
    tag = "checkpoint resume"
    try:
        feed(CORPUS, check["restored"])
        workspace.RunNetOnce(parse("NetDef", finalize["checkpoint_sync_net_b64"]))
    except Exception as e:  # noqa: BLE001
        return [f"{tag}: checkpoint_sync_net raised {describe(e)}"]
    diffs = []
    for meta in check["synced"]:
        diffs += compare_blob(CORPUS, f"{tag}: synced {meta['name']}", meta)
    iters = check["then_run_iters"]
    for it in iters:
        try:
            feed(CORPUS, case["iteration_feeds"][it - 1])
            workspace.RunNet(case["net_name"])
        except Exception as e:  # noqa: BLE001
            return diffs + [f"{tag}: iteration {it} raised {describe(e)}"]
    for meta in check["after"]:
        diffs += compare_blob(CORPUS, f"{tag}: after iteration {iters[-1]}: {meta['name']}", meta)
    return diffs


def replay(case: dict) -> list[str]:
    fresh_state()
    diffs: list[str] = []
    if case.get("expected", "ok") == "ok":
        run_diffs, completed = train(f"devices {case['devices']}", case)
        diffs += run_diffs
        if completed:
            api = case.get("api") or {}
            predictor = api.get("ExtractPredictorNet") or {}
            if "predict_net_b64" in predictor:
                diffs += _predictor_diffs(predictor)
            finalize = api.get("FinalizeAfterCheckpoint") or {}
            if finalize.get("resume_check") and "checkpoint_sync_net_b64" in finalize:
                diffs += _resume_diffs(case, finalize)
    elif "single_device" not in case:
        diffs.append("an error case without a single_device run: nothing to replay")
    single = case.get("single_device")
    if single:
        fresh_state()
        diffs += train("single device", single)[0]
    fresh_state()
    return diffs
