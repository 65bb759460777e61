"""Replay of the ``rnn/`` corpus: models holding a RecurrentNetwork op (rnn_cell.LSTM,
gru_cell.GRU, recurrent.recurrent_net) with their gradient ops.

A case runs ``init_net`` once, feeds ``feeds`` (they replace the random parameter fills), runs
``main_net`` once and compares ``outputs`` and ``gradients`` with the record. It is replayed
twice: with the main net as stored (``enable_rnn_executor: 1`` on its recurrent ops) and with
the flag set to 0; both runs must match the record and each other. The case with a
``blob_fetcher`` block also runs ``RecurrentNetworkBlobFetcher`` on the step workspaces after
the run as stored and compares the sorted names it returns."""

from __future__ import annotations

import numpy as np

from ferrocaffe import core, workspace
from replay.blob_checks import describe, feed, fetch
from replay.common import ATOL, RTOL, array, compare_array, fresh_state, parse

CORPUS = "rnn"
LARGE_TOL = (1e-4, 1e-4)
RECURRENT_OP_TYPES = ("RecurrentNetwork", "RecurrentNetworkGradient")
EXECUTOR_ARG = "enable_rnn_executor"
FETCHER_PREFIX = "fetched"
FETCHER_OUTPUT = "fetched_blob_names"


def tolerance(case: dict) -> tuple[float, float]:
    return LARGE_TOL if case.get("large") else (RTOL, ATOL)


def set_rnn_executor(net, enabled: int) -> int:
    """Set ``enable_rnn_executor`` to ``enabled`` on every RecurrentNetwork (and its gradient)
    op of ``net`` and of the nets its ops hold in arguments, adding the argument where it is
    missing. Returns how many ops were set."""
    count = 0
    for op in net.op:
        if op.type in RECURRENT_OP_TYPES:
            flags = [a for a in op.arg if a.name == EXECUTOR_ARG]
            if not flags:
                flag = op.arg.add()
                flag.name = EXECUTOR_ARG
                flags = [flag]
            for flag in flags:
                flag.i = int(enabled)
            count += 1
        for a in op.arg:
            if a.HasField("n"):
                count += set_rnn_executor(a.n, enabled)
            for sub in a.nets:
                count += set_rnn_executor(sub, enabled)
    return count


def compared_blobs(case: dict) -> list[tuple[str, dict]]:
    """``(label, meta)`` for every recorded output and gradient."""
    blobs = [(f"outputs[{m['name']}]", m) for m in case["outputs"]]
    blobs += [(f"gradients[{m['name']} of {m['of']}]", m) for m in case["gradients"]]
    return blobs


def _run_tag(executor: int | None) -> str:
    return "as stored" if executor is None else f"{EXECUTOR_ARG}={executor}"


def run(case: dict, executor: int | None = None) -> tuple[list[str], dict]:
    """One replay in a fresh workspace: the main net as stored (``executor=None``) or with
    ``enable_rnn_executor`` set to ``executor``. Returns the differences from the record and
    the fetched value of every compared blob that could be fetched."""
    fresh_state()
    tag = _run_tag(executor)
    rtol, atol = tolerance(case)
    init = parse("NetDef", case["init_net_b64"])
    main = parse("NetDef", case["main_net_b64"])
    diffs: list[str] = []
    if executor is not None:
        count = set_rnn_executor(main, executor)
        if count == 0 or count != case.get("recurrent_ops", count):
            diffs.append(
                f"{tag}: set on {count} recurrent ops, the case lists {case.get('recurrent_ops')}"
            )
    try:
        workspace.RunNetOnce(init)
        feed(CORPUS, case["feeds"])
        workspace.RunNetOnce(main)
    except Exception as e:  # noqa: BLE001 - a failing run is a difference
        return diffs + [f"{tag}: running the nets raised {describe(e)}"], {}
    values = {}
    for label, meta in compared_blobs(case):
        value, problem = fetch(meta["name"])
        if problem:
            diffs.append(f"{tag}: {label}: {problem}")
            continue
        values[meta["name"]] = value
        diffs += compare_array(f"{tag}: {label}", value, array(CORPUS, meta), rtol, atol)
    if case.get("blob_fetcher") and executor is None:
        # Recorded after the run as stored: the names follow the executor's blob naming
        # (``timestep_rnnexec_t<ws><t>``), so the run with the executor off has others.
        diffs += blob_fetcher_diffs(tag, case["blob_fetcher"])
    return diffs, values


def blob_fetcher_diffs(tag: str, spec: dict) -> list[str]:
    """Run ``RecurrentNetworkBlobFetcher`` (prefix ``fetched``) on the step workspaces blob:
    the names it returns, sorted, must be the recorded ones, and each must exist."""
    op = core.CreateOperator(
        "RecurrentNetworkBlobFetcher",
        [spec["step_workspaces_blob"]],
        [FETCHER_OUTPUT],
        prefix=FETCHER_PREFIX,
    )
    try:
        workspace.RunOperatorOnce(op)
    except Exception as e:  # noqa: BLE001
        return [f"{tag}: RecurrentNetworkBlobFetcher raised {describe(e)}"]
    value, problem = fetch(FETCHER_OUTPUT)
    if problem:
        return [f"{tag}: blob_fetcher: {problem}"]
    names = sorted(
        n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in np.asarray(value).ravel()
    )
    expected = spec["fetched_names_sorted"]
    if names != expected:
        missing = sorted(set(expected) - set(names))
        extra = sorted(set(names) - set(expected))
        return [
            f"{tag}: blob_fetcher: {len(names)} names, expected {len(expected)}; "
            f"missing {missing[:10]}, unexpected {extra[:10]}"
        ]
    absent = [n for n in names if not workspace.HasBlob(n)]
    if absent:
        return [f"{tag}: blob_fetcher: returned names that are no blobs: {absent[:10]}"]
    return []


def replay(case: dict) -> list[str]:
    """Both runs (as stored, and with the executor off) against the record and each other."""
    fresh_state()
    rtol, atol = tolerance(case)
    diffs_on, on = run(case, None)
    diffs_off, off = run(case, 0)
    diffs = diffs_on + diffs_off
    for label, meta in compared_blobs(case):
        name = meta["name"]
        if name in on and name in off:
            diffs += compare_array(
                f"{_run_tag(0)} vs {_run_tag(None)}: {label}",
                off[name],
                np.asarray(on[name]),
                rtol,
                atol,
            )
    fresh_state()
    return diffs
