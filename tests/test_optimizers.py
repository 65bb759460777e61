"""Every ``optimizer.build_*``: the update ops and state blobs it adds for a small linear
model (dense gradients) and an embedding (sparse ones), and that training with it lowers the
loss."""

import numpy as np
import pytest

from ferrocaffe import brew, core, model_helper, optimizer, workspace
from ferrocaffe.optimizer import (
    build_adadelta,
    build_adagrad,
    build_adam,
    build_decay_adagrad,
    build_ftrl,
    build_gftrl,
    build_rms_prop,
    build_sgd,
    build_storm,
    build_wngrad,
    build_yellowfin,
)

PERFECT = np.array([2, 6, 5, 0, 1], dtype=np.float32)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(core.Net, "_net_names_used", set())
    optimizer.reset_optimizer_instance_count()
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def dense_model():
    model = model_helper.ModelHelper(name="test")
    out = brew.fc(
        model, "data", "fc", PERFECT.size, 1, ("ConstantFill", {}), ("ConstantFill", {}), axis=0
    )
    sq = model.SquaredL2Distance([out, "label"], "sq")
    loss = model.AveragedLoss(sq, "avg_loss")
    model.AddGradientOperators([loss])
    return model


def sparse_model():
    model = model_helper.ModelHelper(name="test_sparse")
    w = model.param_init_net.ConstantFill([], "w", shape=[PERFECT.size], value=0.0)
    model.params.append(w)
    picked = model.net.Gather([w, "indices"], "gather")
    out = model.net.SumElements(picked, "sum")
    sq = model.net.SquaredL2Distance([out, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "avg_loss")
    grads = model.AddGradientOperators([loss])
    assert isinstance(grads["w"], core.GradientSlice)
    return model


def train_dense(model, steps):
    rng = np.random.RandomState(0)
    data = rng.randint(2, size=(20, PERFECT.size)).astype(np.float32)
    labels = data.dot(PERFECT)[:, None]
    workspace.FeedBlob("data", data[0])
    workspace.FeedBlob("label", labels[0])
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net, True)
    before = workspace.FetchBlob("fc_w").copy()
    for _ in range(steps):
        k = rng.randint(len(data))
        workspace.FeedBlob("data", data[k])
        workspace.FeedBlob("label", labels[k])
        workspace.RunNet("test")
    err_before = np.abs(before - PERFECT).max()
    err_after = np.abs(workspace.FetchBlob("fc_w") - PERFECT).max()
    return err_before, err_after


def train_sparse(model, steps):
    rng = np.random.RandomState(1)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateBlob("indices")
    workspace.CreateBlob("label")
    workspace.CreateNet(model.net, True)
    for _ in range(steps):
        mask = rng.randint(2, size=PERFECT.size).astype(bool)
        if not mask.any():
            continue
        idx = np.arange(PERFECT.size)[mask].astype(np.int64)
        workspace.FeedBlob("indices", idx)
        workspace.FeedBlob("label", np.array(PERFECT[mask].sum(), np.float32))
        workspace.RunNet("test_sparse")
    return np.abs(workspace.FetchBlob("w") - PERFECT).max()


# (builder, kwargs, update op for dense, state suffixes, trains sparse)
CASES = {
    "sgd": (build_sgd, dict(base_learning_rate=0.1), "WeightedSum", [], "ScatterWeightedSum"),
    "ftrl": (
        build_ftrl,
        dict(engine=None, alpha=1.0, beta=0.1, lambda1=0.0, lambda2=0.0),
        "Ftrl",
        ["_ftrl_nz"],
        "SparseFtrl",
    ),
    "gftrl": (
        build_gftrl,
        dict(engine=None, alpha=1.0, beta=0.1, lambda1=0.0, lambda2=0.0),
        "GFtrl",
        ["_gftrl_nz"],
        None,
    ),
    "wngrad": (build_wngrad, dict(base_learning_rate=25.0), "Wngrad", ["_moment"], "SparseWngrad"),
    "storm": (
        build_storm,
        dict(base_learning_rate=2.0),
        "Storm",
        ["_moment", "_grad_sq_sum"],
        "SparseStorm",
    ),
    "adadelta": (
        build_adadelta,
        dict(base_learning_rate=1.0, decay=0.995),
        "Adadelta",
        ["_squared_moment", "_squared_moment_update"],
        "SparseAdadelta",
    ),
    "decay_adagrad": (
        build_decay_adagrad,
        dict(base_learning_rate=1.0),
        "DecayAdagrad",
        ["_first_mo1ment", "_second_moment"],
        None,
    ),
    "rms_prop": (
        build_rms_prop,
        dict(base_learning_rate=0.1, epsilon=0.1),
        "RmsProp",
        ["_mean_squares", "_momentum"],
        None,
    ),
    "yellowfin": (
        build_yellowfin,
        dict(base_learning_rate=0.1),
        "YellowFin",
        ["_moment", "_lr_avg", "_mu_avg", "_curv_win", "_g_avg", "_g2_avg", "_scalars_memory"],
        None,
    ),
    "adam": (build_adam, dict(base_learning_rate=0.1), "Adam", ["_first_moment"], "SparseAdam"),
    "adagrad": (
        build_adagrad,
        dict(base_learning_rate=1.0),
        "Adagrad",
        ["_squared_sum"],
        "SparseAdagrad",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dense_build_and_train(name):
    build, kwargs, op_type, suffixes, _ = CASES[name]
    model = dense_model()
    opt = build(model, **kwargs)
    types = [op.type for op in model.net.Proto().op]
    assert types.count(op_type) == 2, types
    aux = [str(b) for b in opt.get_auxiliary_parameters().local]
    for suffix in suffixes:
        assert {"fc_w" + suffix, "fc_b" + suffix} <= set(aux), aux
    before, after = train_dense(model, 200)
    assert after < 0.5 * before, (before, after)
    for blob in aux:
        assert workspace.HasBlob(blob)


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c[4]))
def test_sparse_build_and_train(name):
    build, kwargs, _, _, sparse_op = CASES[name]
    model = sparse_model()
    build(model, **kwargs)
    assert sparse_op in [op.type for op in model.net.Proto().op]
    assert train_sparse(model, 200) < 0.5 * np.abs(PERFECT).max()


def test_rms_prop_runs_momentum_sgd_with_a_positive_rate():
    model = dense_model()
    build_rms_prop(model, base_learning_rate=0.1)
    ops = list(model.net.Proto().op)
    lr_op = next(op for op in ops if op.type == "LearningRate")
    assert next(a.f for a in lr_op.arg if a.name == "base_lr") == pytest.approx(0.1)
    rms = [op for op in ops if op.type in ("RmsProp", "MomentumSGDUpdate")]
    assert [op.type for op in rms] == ["RmsProp", "MomentumSGDUpdate"] * 2


def test_storm_sparse_inputs_put_values_before_indices():
    model = sparse_model()
    build_storm(model, base_learning_rate=1.0)
    op = next(op for op in model.net.Proto().op if op.type == "SparseStorm")
    assert list(op.input)[:3] == ["w", "w_moment", "w_grad_sq_sum"]
    assert op.input[4] == "indices"


def test_yellowfin_counts_iterations():
    model = dense_model()
    opt = build_yellowfin(model)
    # One entry per parameter, all the one counter.
    assert {str(b) for b in opt.get_auxiliary_parameters().shared} == {"optimizer_iteration"}
    train_dense(model, 3)
    assert workspace.FetchBlob("optimizer_iteration")[0] == 3


def test_build_ftrl_simd_engine_is_registered():
    model = dense_model()
    build_ftrl(model, alpha=1.0)
    assert {op.engine for op in model.net.Proto().op if op.type == "Ftrl"} == {"SIMD"}


def test_sparse_only_optimizers_reject_slices():
    for build in (build_rms_prop, build_yellowfin):
        optimizer.reset_optimizer_instance_count()
        with pytest.raises(AssertionError, match="sparse"):
            build(sparse_model(), base_learning_rate=0.1)
