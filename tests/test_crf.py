"""The ``crf`` module (CRF loss against a brute-force sum over all label paths, gradients,
Viterbi re-ranking) and the padding ops it uses (``AddPadding``/``RemovePadding``/
``GatherPadding``, ``OneHot``)."""

import itertools

import numpy as np
import pytest

from ferrocaffe import brew, core, crf, workspace
from ferrocaffe.model_helper import ModelHelper


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _brute_force_loss(scores, labels, transitions):
    """-log p(labels) of a linear-chain CRF with BOS/EOS states, by enumerating every path."""
    n = scores.shape[1]
    bos, eos = n, n + 1

    def path_score(path):
        full = [bos, *path, eos]
        unary = sum(scores[t, c] for t, c in enumerate(path))
        return unary + sum(transitions[a, b] for a, b in zip(full, full[1:], strict=False))

    all_scores = [path_score(p) for p in itertools.product(range(n), repeat=len(scores))]
    log_z = np.logaddexp.reduce(np.array(all_scores, dtype=np.float64))
    return log_z - path_score(list(labels))


@pytest.mark.parametrize("num_tags,num_words", [(2, 3), (3, 2), (1, 4)])
def test_crf_loss_matches_brute_force_and_trains(num_tags, num_words):
    rng = np.random.RandomState(num_tags * 10 + num_words)
    model = ModelHelper(name="crf")
    scores_blob, labels_blob, trans_blob = model.net.AddExternalInputs(
        "scores", "labels", "crf_transitions"
    )
    scores = rng.randn(num_words, num_tags).astype(np.float32)
    labels = rng.randint(num_tags, size=num_words).astype(np.int64)
    transitions = rng.uniform(-1, 1, (num_tags + 2, num_tags + 2)).astype(np.float32)
    workspace.FeedBlob("scores", scores)
    workspace.FeedBlob("labels", labels)
    workspace.FeedBlob("crf_transitions", transitions)
    layer = crf.CRFWithLoss(model, num_tags, trans_blob)
    loss = layer.crf_loss(scores_blob, labels_blob)
    grads = model.net.AddGradientOperators([loss])
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    expected = _brute_force_loss(scores, labels, transitions)
    np.testing.assert_allclose(workspace.FetchBlob(loss), expected, rtol=1e-3, atol=1e-3)
    # d loss / d scores: expected counts under the CRF minus the labelled path's one-hot.
    g = workspace.FetchBlob(grads["scores"])
    eps = 1e-2
    for t, c in [(0, 0), (num_words - 1, num_tags - 1)]:
        bumped = scores.copy()
        bumped[t, c] += eps
        numeric = (_brute_force_loss(bumped, labels, transitions) - expected) / eps
        np.testing.assert_allclose(g[t, c], numeric, atol=2e-2)


def test_update_predictions_puts_the_viterbi_path_on_top():
    model = ModelHelper(name="crf")
    classes_blob, trans_blob = model.net.AddExternalInputs("classes", "crf_transitions")
    num_tags = 3
    # Transitions that forbid staying in a class: the best path alternates.
    transitions = np.zeros((num_tags + 2, num_tags + 2), np.float32)
    np.fill_diagonal(transitions, -100.0)
    classes = np.array([[5.0, 1.0, 0.0], [4.0, 1.0, 0.0], [6.0, 2.0, 0.0]], np.float32)
    workspace.FeedBlob("classes", classes)
    workspace.FeedBlob("crf_transitions", transitions)
    layer = crf.CRFWithLoss(model, num_tags, trans_blob)
    out = layer.update_predictions(classes_blob)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    new = workspace.FetchBlob(out)
    assert new.shape == classes.shape
    assert list(new.argmax(axis=1)) == [0, 1, 0]
    # Scores are swapped, not changed.
    np.testing.assert_array_equal(np.sort(new, axis=1), np.sort(classes, axis=1))


def test_padding_ops_round_trip_and_gradients():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    lengths = np.array([2, 0, 4], dtype=np.int32)
    start = np.array([-1.0, -2.0], np.float32)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("l", lengths)
    workspace.FeedBlob("s", start)
    net = core.Net("pad")
    y, yl = net.AddPadding(["x", "l", "s"], ["y", "yl"], padding_width=1, end_padding_width=2)
    z, zl = net.RemovePadding([y, yl], ["z", "zl"], padding_width=1, end_padding_width=2)
    net.SumElements([y], "loss")
    net.AddGradientOperators(["loss"])
    workspace.RunNetOnce(net)
    out = workspace.FetchBlob("y")
    assert out.shape == (6 + 3 * 3, 2)
    np.testing.assert_array_equal(workspace.FetchBlob("yl"), lengths + 3)
    # Segment 0: start row, 2 rows of x, two end rows (end_padding defaults to start_padding).
    np.testing.assert_array_equal(out[:5], [start, x[0], x[1], start, start])
    np.testing.assert_array_equal(workspace.FetchBlob("z"), x)
    np.testing.assert_array_equal(workspace.FetchBlob("zl"), lengths)
    # The padding row is used 3 * 3 times: its gradient sums them.
    np.testing.assert_array_equal(workspace.FetchBlob("s_grad"), [9.0, 9.0])
    np.testing.assert_array_equal(workspace.FetchBlob("x_grad"), np.ones_like(x))


def test_padding_and_one_hot_errors():
    workspace.FeedBlob("x", np.zeros((3, 2), np.float32))
    workspace.FeedBlob("l", np.array([2, 2], np.int32))
    with pytest.raises(RuntimeError, match="lengths add up"):
        workspace.RunOperatorOnce(core.CreateOperator("RemovePadding", ["x", "l"], ["y"]))
    workspace.FeedBlob("l", np.array([1], np.int32))
    with pytest.raises(RuntimeError, match="shorter than its padding"):
        workspace.RunOperatorOnce(core.CreateOperator("RemovePadding", ["x", "l"], ["y"]))
    workspace.FeedBlob("i", np.array([0, 3], np.int64))
    workspace.FeedBlob("n", np.array([3], np.int64))
    with pytest.raises(RuntimeError, match="out of bounds"):
        workspace.RunOperatorOnce(core.CreateOperator("OneHot", ["i", "n"], ["y"]))
    workspace.FeedBlob("i", np.array([2, 0], np.int64))
    workspace.RunOperatorOnce(core.CreateOperator("OneHot", ["i", "n"], ["y"]))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [[0, 0, 1], [1, 0, 0]])


def test_fc_model_with_crf_loss_builds_caffe2s_ops():
    model = ModelHelper(name="external")
    emb, labels, trans = model.net.AddExternalInputs("emb", "labels", "crf_transitions")
    pred = brew.fc(model, emb, "fc_0", 4, 2)
    crf.CRFWithLoss(model, 2, trans).crf_loss(pred, labels)
    types = [op.type for op in model.net.Proto().op]
    assert types[:4] == ["FC", "Copy", "Cast", "OneHot"]
    assert "RecurrentNetwork" in types and types[-1] == "Sub"
    assert model.net.Proto().op[-1].output == ["crf_loss"]


def test_fc_initializer_tuples_use_their_first_two_items():
    # Caffe2's crf_test passes ('UniformFill', {'min': -1.0}, {'max': 1.0}): the third item is
    # ignored, as Caffe2 ignored it.
    model = ModelHelper(name="init")
    brew.fc(
        model, "x", "y", 3, 2,
        ("UniformFill", {"min": -1.0}, {"max": 1.0}),
        ("ConstantFill", {"value": 0.5}, {"ignored": 1}),
    )  # fmt: skip
    ops = {op.output[0]: op for op in model.param_init_net.Proto().op}
    assert ops["y_w"].type == "UniformFill"
    assert [(a.name, a.f) for a in ops["y_w"].arg if a.name in ("min", "max")] == [("min", -1.0)]
    assert ops["y_b"].type == "ConstantFill"
