"""End-to-end training on the runtime: models built with brew, gradients from
AddGradientOperators, updates from optimizer.build_sgd / build_adam, run with RunNet.

* an MLP (FC/Relu/FC/Softmax + LabelCrossEntropy/AveragedLoss) and a small NCHW CNN
  (Conv/Relu/MaxPool/FC + SoftmaxWithLoss) learn synthetic separable data: the loss must fall
  well below chance level and the accuracy well above it;
* the parameter gradients the nets compute agree with central differences of the loss.

Parameters are set from numpy after the init net runs, so the runs do not depend on the
engine's random fills.
"""

import time

import numpy as np
import pytest

from ferrocaffe import brew, core, gradient_checker, model_helper, optimizer, workspace

N_CLASSES = 4


@pytest.fixture(autouse=True)
def fresh_workspace():
    old = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace("test_training", True)
    workspace.ResetWorkspace()
    optimizer.reset_optimizer_instance_count()
    yield
    workspace.ResetWorkspace()
    workspace.SwitchWorkspace(old)


# -- data ---------------------------------------------------------------------------------


def blobs_data(rng, n, dim=8):
    """Gaussian clusters around 4 well separated centres."""
    centres = np.zeros((N_CLASSES, dim), np.float32)
    for k in range(N_CLASSES):
        centres[k, 2 * k : 2 * k + 2] = 2.5
    y = rng.integers(0, N_CLASSES, size=n).astype(np.int32)
    x = centres[y] + rng.normal(0, 0.7, size=(n, dim)).astype(np.float32)
    return x.astype(np.float32), y


def images_data(rng, n, size=8):
    """1-channel images: a bright 3x3 square in one of the 4 quadrants, over noise."""
    y = rng.integers(0, N_CLASSES, size=n).astype(np.int32)
    x = rng.normal(0, 0.3, size=(n, 1, size, size)).astype(np.float32)
    half = size // 2
    for i, k in enumerate(y):
        r0 = (k // 2) * half + rng.integers(0, half - 2)
        c0 = (k % 2) * half + rng.integers(0, half - 2)
        x[i, 0, r0 : r0 + 3, c0 : c0 + 3] += 1.5
    return x, y


# -- models -------------------------------------------------------------------------------


def mlp(name="mlp"):
    m = model_helper.ModelHelper(name=name)
    h = brew.fc(m, "data", "fc1", 8, 16)
    h = brew.relu(m, h, "fc1_relu")
    h = brew.fc(m, h, "fc2", 16, N_CLASSES)
    softmax = brew.softmax(m, h, "softmax")
    xent = m.LabelCrossEntropy([softmax, "label"], "xent")
    m.AveragedLoss(xent, "loss")
    return m, softmax


def cnn(name="cnn"):
    m = model_helper.ModelHelper(name=name)
    h = brew.conv(m, "data", "conv1", 1, 4, 3, pad=1)
    h = brew.relu(m, h, "conv1_relu")
    h = brew.max_pool(m, h, "pool1", kernel=2, stride=2)
    h = brew.fc(m, h, "fc1", 4 * 4 * 4, N_CLASSES)
    softmax, _ = m.net.SoftmaxWithLoss([h, "label"], ["softmax", "loss"])
    return m, softmax


def set_params(model, rng, scale=0.3):
    """Runs the init net (optimizer state, counters), then replaces the weights by seeded
    values and the biases by zeros."""
    workspace.RunNetOnce(model.param_init_net)
    for p in model.params:
        shape = workspace.FetchBlob(str(p)).shape
        if str(p).endswith("_b"):
            value = np.zeros(shape, np.float32)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = rng.normal(0, scale * np.sqrt(2.0 / fan_in), size=shape)
        workspace.FeedBlob(str(p), np.asarray(value, np.float32))


def forward_net(model, n_forward):
    """A net with the model's first ``n_forward`` ops (the forward pass)."""
    net = core.Net(model.net.Name() + "_forward")
    net.Proto().op.extend(model.net.Proto().op[:n_forward])
    return net


def evaluate(fwd, x, y):
    workspace.FeedBlob("data", x)
    workspace.FeedBlob("label", y)
    workspace.RunNetOnce(fwd)
    loss = float(workspace.FetchBlob("loss"))
    acc = float(np.mean(np.argmax(workspace.FetchBlob("softmax"), axis=1) == y))
    return loss, acc


def train(build, data, build_optimizer, steps, batch, seed):
    rng = np.random.default_rng(seed)
    x, y = data(rng, 512)
    model, _ = build()
    n_forward = len(model.net.Proto().op)
    model.AddGradientOperators(["loss"])
    build_optimizer(model)
    set_params(model, rng)
    fwd = forward_net(model, n_forward)
    start_loss, start_acc = evaluate(fwd, x, y)
    workspace.FeedBlob("data", x[:batch])
    workspace.FeedBlob("label", y[:batch])
    workspace.CreateNet(model.net)
    t0 = time.perf_counter()
    for step in range(steps):
        lo = (step * batch) % len(x)
        workspace.FeedBlob("data", x[lo : lo + batch])
        workspace.FeedBlob("label", y[lo : lo + batch])
        workspace.RunNet(model.net)
    elapsed = time.perf_counter() - t0
    # fresh data from the same distribution: the model generalises, not memorises
    x_test, y_test = data(rng, 256)
    loss, acc = evaluate(fwd, x_test, y_test)
    print(
        f"{model.net.Name()}: loss {start_loss:.3f} -> {loss:.4f}, accuracy {start_acc:.2f} -> "
        f"{acc:.3f}, {steps} steps in {elapsed:.2f}s"
    )
    return start_loss, loss, acc


CHANCE_LOSS = float(np.log(N_CLASSES))  # 1.386: the loss of a uniform prediction


@pytest.mark.parametrize(
    "name, build_optimizer, steps",
    [
        ("sgd", lambda m: optimizer.build_sgd(m, 0.2, policy="fixed"), 300),
        ("sgd_momentum", lambda m: optimizer.build_sgd(m, 0.05, momentum=0.9), 200),
        ("adam", lambda m: optimizer.build_adam(m, 0.01), 200),
    ],
)
def test_mlp_learns_separable_blobs(name, build_optimizer, steps):
    start, loss, acc = train(mlp, blobs_data, build_optimizer, steps, batch=64, seed=1)
    assert start > 0.8 * CHANCE_LOSS
    assert loss < 0.05, (name, loss)
    assert acc > 0.97, (name, acc)


@pytest.mark.parametrize(
    "name, build_optimizer, steps",
    [
        ("sgd", lambda m: optimizer.build_sgd(m, 0.1, policy="fixed"), 300),
        ("adam", lambda m: optimizer.build_adam(m, 0.01), 200),
    ],
)
def test_cnn_learns_quadrants(name, build_optimizer, steps):
    start, loss, acc = train(cnn, images_data, build_optimizer, steps, batch=32, seed=2)
    assert start > 0.8 * CHANCE_LOSS
    assert loss < 0.1, (name, loss)
    assert acc > 0.95, (name, acc)


# -- parameter gradients vs central differences -------------------------------------------


def _analytic_and_numeric(build, data, seed, step=1e-3):
    rng = np.random.default_rng(seed)
    x, y = data(rng, 16)
    model, _ = build()
    n_forward = len(model.net.Proto().op)
    grad_map = model.AddGradientOperators(["loss"])
    set_params(model, rng, scale=1.0)
    workspace.FeedBlob("data", x)
    workspace.FeedBlob("label", y)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    fwd = forward_net(model, n_forward)
    results = {}
    for p in model.params:
        name = str(p)
        analytic = np.array(workspace.FetchBlob(str(grad_map[p])), np.float64)
        value = np.array(workspace.FetchBlob(name))
        numeric = np.zeros(value.shape)
        for i in range(value.size):
            losses = []
            for delta in (step, -step):
                moved = value.copy()
                moved.flat[i] += delta
                workspace.FeedBlob(name, moved)
                workspace.RunNetOnce(fwd)
                losses.append(float(workspace.FetchBlob("loss")))
            numeric.flat[i] = (losses[0] - losses[1]) / (2 * step)
        workspace.FeedBlob(name, value)
        results[name] = (analytic, numeric)
    return model, fwd, results


@pytest.mark.parametrize("build, data", [(mlp, blobs_data), (cnn, images_data)], ids=["mlp", "cnn"])
def test_parameter_gradients_match_finite_differences(build, data):
    model, fwd, results = _analytic_and_numeric(build, data, seed=3)
    assert len(results) == 4  # two weights and two biases
    for name, (analytic, numeric) in results.items():
        assert np.any(analytic != 0), name
        np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-3, err_msg=name)
    # The same with NetGradientChecker on the forward net, for the first layer's weight.
    first = str(model.params[0])
    mean, worst = gradient_checker.NetGradientChecker.Check(
        fwd,
        ["loss"],
        {first: workspace.FetchBlob(first)},
        first,
        step_size=1e-3,
        threshold=2e-2,
        print_net=False,
    )
    assert worst < 2e-2


def test_compare_nets_agrees_on_equivalent_nets_and_catches_a_difference():
    """CompareNets: FC vs MatMul+Add (same function) agree; FC vs FC with a scaled output
    does not."""
    rng = np.random.default_rng(4)
    values = {
        "x": rng.normal(size=(3, 4)).astype(np.float32),
        "w": rng.normal(size=(2, 4)).astype(np.float32),
        "b": rng.normal(size=(2,)).astype(np.float32),
    }
    a = core.Net("fc_net")
    a.Tanh(a.FC(["x", "w", "b"], "h"), "y")
    b = core.Net("matmul_net")
    b.Tanh(b.Add([b.MatMul(["x", "w"], "xw", trans_b=1), "b"], "h2", broadcast=1), "y2")
    gradient_checker.NetGradientChecker.CompareNets(
        [a, b], [["y"], ["y2"]], [0], ["x", "w", "b"], input_values=values, threshold=1e-5
    )
    c = core.Net("scaled_net")
    c.Tanh(c.Scale(c.FC(["x", "w", "b"], "h3"), "h4", scale=1.01), "y3")
    with pytest.raises(AssertionError, match="Different forward pass results"):
        gradient_checker.NetGradientChecker.CompareNets(
            [a, c], [["y"], ["y3"]], [0], ["x", "w", "b"], input_values=values, threshold=1e-5
        )
