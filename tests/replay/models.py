"""Replay of the ``models/`` corpus: small models exported the way Caffe2 models were deployed.

A case runs ``RunNetOnce(init_net)``, feeds ``inputs`` and runs ``RunNetOnce(predict_net)``;
then every entry of ``outputs`` must match (corpus tolerance), every entry of
``outputs_shape_only`` must have the recorded dtype and shape, and every
``outputs_not_fetched`` blob must exist, hold no tensor and be described by ``FetchBlob`` as
Caffe2 described it. For the models with ``files``, the
``.pb`` files must hold the case's nets and ``input.npy`` its input, and running them on
``input.npy`` must give ``output.npy``."""

from __future__ import annotations

import numpy as np

from ferrocaffe import workspace
from ferrocaffe.proto import caffe2_pb2
from replay.blob_checks import (
    compare_blob,
    describe,
    feed,
    fetch,
    fetch_tensor,
    no_tensor_diffs,
)
from replay.common import array, compare_array, fresh_state, golden_path, parse
from replay.rnn import set_rnn_executor

CORPUS = "models"


def _run_model(tag: str, init, predict, feed_inputs) -> list[str]:
    steps = (
        ("RunNetOnce(init_net)", lambda: workspace.RunNetOnce(init)),
        ("feeding the inputs", feed_inputs),
        ("RunNetOnce(predict_net)", lambda: workspace.RunNetOnce(predict)),
    )
    for what, step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - a failing step is a difference
            return [f"{tag}{what} raised {describe(e)}"]
    return []


def _shape_only_diffs(metas) -> list[str]:
    diffs = []
    for m in metas or []:
        label = f"outputs_shape_only[{m['name']}]"
        arr, problem = fetch_tensor(m["name"])
        if problem:
            diffs.append(f"{label}: {problem}")
            continue
        if str(arr.dtype) != m["dtype"] or list(arr.shape) != list(m["shape"]):
            diffs.append(
                f"{label}: {arr.dtype}{list(arr.shape)}, expected {m['dtype']}{m['shape']}"
            )
    return diffs


def _not_fetched_diffs(recorded) -> list[str]:
    """Each blob exists and holds no tensor, and ``FetchBlob`` returns for it the description
    Caffe2 returned (recorded as ``FetchBlob returned <type> '<text>'``)."""
    diffs = []
    for name, said in (recorded or {}).items():
        label = f"outputs_not_fetched[{name}]"
        found = no_tensor_diffs(label, name)
        if found:
            diffs += found
            continue
        value, problem = fetch(name)
        if problem:
            diffs.append(f"{label}: {problem}")
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        got = f"FetchBlob returned {type(value).__name__} {text!r}"
        if got != said:
            diffs.append(f"{label}: {got}; Caffe2: {said}")
    return diffs


def _read_net(path) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef()
    net.ParseFromString(path.read_bytes())
    return net


def _files_diffs(case: dict, init, predict) -> list[str]:
    """The ``files/`` copy of a model: the same nets and input, and it runs to ``output.npy``."""
    spec = case["files"]
    folder = golden_path() / CORPUS / spec["dir"]
    diffs = []
    nets = {}
    for field, recorded in (("init_net", init), ("predict_net", predict)):
        try:
            nets[field] = _read_net(folder / spec[field])
        except Exception as e:  # noqa: BLE001
            return [f"files: cannot read {spec[field]}: {describe(e)}"]
        if nets[field] != recorded:
            diffs.append(f"files: {spec[field]} does not hold the case's {field}")
    x = np.load(folder / spec["input"], allow_pickle=False)
    y = np.load(folder / spec["output"], allow_pickle=False)
    metas = [m for m in case["inputs"] if m["name"] == spec["input_blob"]]
    if len(metas) != 1:
        diffs.append(f"files: input blob {spec['input_blob']!r} is not one of the case's inputs")
    else:
        diffs += compare_array(
            f"files: {spec['input']} vs inputs[{spec['input_blob']}]",
            x,
            array(CORPUS, metas[0]),
            0.0,
            0.0,
        )
    fresh_state()
    ran = _run_model(
        "files: ",
        nets["init_net"],
        nets["predict_net"],
        lambda: workspace.FeedBlob(spec["input_blob"], x),
    )
    if ran:
        return diffs + ran
    value, problem = fetch(spec["output_blob"])
    if problem:
        return diffs + [f"files: {spec['output_blob']}: {problem}"]
    return diffs + compare_array(f"files: {spec['output_blob']} vs {spec['output']}", value, y)


def replay(case: dict, rnn_executor: int | None = None) -> list[str]:
    """The case's differences. ``rnn_executor`` (0 or 1), when given, is set as
    ``enable_rnn_executor`` on the recurrent ops of the predict net (as stored otherwise)."""
    fresh_state()
    init = parse("NetDef", case["init_net_b64"])
    predict = parse("NetDef", case["predict_net_b64"])
    run_predict = predict
    diffs: list[str] = []
    if rnn_executor is not None:
        run_predict = caffe2_pb2.NetDef()
        run_predict.CopyFrom(predict)
        if set_rnn_executor(run_predict, rnn_executor) == 0:
            diffs.append("the predict net holds no RecurrentNetwork op")
    ran = _run_model("", init, run_predict, lambda: feed(CORPUS, case["inputs"]))
    if ran:
        return diffs + ran
    for meta in case["outputs"]:
        diffs += compare_blob(CORPUS, f"outputs[{meta['name']}]", meta)
    diffs += _shape_only_diffs(case.get("outputs_shape_only"))
    diffs += _not_fetched_diffs(case.get("outputs_not_fetched"))
    if case.get("files"):
        diffs += _files_diffs(case, init, predict)
    fresh_state()
    return diffs
