"""Replay the golden RNN corpus (``tests/golden/rnn``, recorded from the real Caffe2): LSTM (1
and 2 layers, full and partial sequence lengths, a large case), GRU and a custom step net,
forward and gradient, each run with ``enable_rnn_executor`` 1 (as stored) and 0, which must
match Caffe2 and each other; plus the forward-only ``lstm_lm`` model of the models corpus, with
the executor on and off."""

import numpy as np
import pytest
from replay import models, rnn
from replay.common import case_by_name, case_names

RNN_CASES = case_names("rnn")
LSTM_MODELS = [n for n in case_names("models") if ".lstm_lm" in n]


@pytest.mark.parametrize("name", RNN_CASES)
def test_rnn_case(name):
    diffs = rnn.replay(case_by_name("rnn", name))
    assert diffs == [], "\n".join(diffs)


def test_every_rnn_case_is_replayed():
    assert len(RNN_CASES) == 6
    assert len(set(RNN_CASES)) == len(RNN_CASES)


@pytest.mark.parametrize("name", RNN_CASES)
def test_executor_and_plain_runs_agree_exactly(name):
    """Caffe2 gives bitwise identical results with the RNN executor on and off."""
    case = case_by_name("rnn", name)
    assert case["executor_check"]["bitwise_identical"]
    _, stored = rnn.run(case, None)
    _, plain = rnn.run(case, 0)
    names = {meta["name"] for _, meta in rnn.compared_blobs(case)}
    assert set(stored) == names and set(plain) == names
    differing = [n for n in sorted(names) if not np.array_equal(stored[n], plain[n])]
    assert differing == [], differing


def test_blob_fetcher_case_exists():
    assert [n for n in RNN_CASES if case_by_name("rnn", n).get("blob_fetcher")]


@pytest.mark.parametrize("executor", [1, 0])
@pytest.mark.parametrize("name", LSTM_MODELS)
def test_forward_only_lstm_language_model(name, executor):
    diffs = models.replay(case_by_name("models", name), rnn_executor=executor)
    assert diffs == [], "\n".join(diffs)


def test_lstm_language_model_exists():
    assert LSTM_MODELS
