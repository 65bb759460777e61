"""data_parallel_model: every golden ``dpm/`` case rebuilt with ferrocaffe's model_helper, brew,
optimizer and ``Parallelize_CPU``; the nets must be Caffe2's op for op, training them must
reproduce the recorded checkpoints, and the helpers (GetCheckpointParams,
GetLearningRateBlobNames, ExtractPredictorNet, FinalizeAfterCheckpoint) must give what Caffe2's
gave. Plus the multi-process nets (rendezvous with engine MPI: CreateCommonWorld, Allreduce,
Broadcast, Barrier), which are built but not run here, and the refusal of other engines."""

import base64
import logging

import numpy as np
import pytest
from golden_nets import assert_nets_equal, load_cases, parse_net
from model_zoo import dpm_forward
from replay import dpm as dpm_replay
from replay.common import error_diffs, fresh_state

from ferrocaffe import brew, cnn, core, data_parallel_model, model_helper, optimizer, workspace
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.utils import ArgsToDict

CASES = load_cases("dpm")
OK_CASES = sorted(n for n, c in CASES.items() if c["expected"] == "ok")
ERROR_CASES = sorted(n for n, c in CASES.items() if c["expected"] != "ok")
CPU0 = core.DeviceOption(caffe2_pb2.CPU, 0)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(core.Net, "_net_names_used", set())
    optimizer.reset_optimizer_instance_count()
    fresh_state()
    yield
    fresh_state()


def build(case, devices=None, net_name=None, **parallelize_kwargs):
    """The case's model, parallelized with Parallelize_CPU as its ``parallelize.call`` says."""
    kind = case["model"]
    name = net_name or case.get("net_name") or case["name"].replace(".", "_")
    if kind == "cnn":
        model = cnn.CNNModelHelper(order="NCHW", name=name)
    else:
        model = model_helper.ModelHelper(name=name)
    opt = case["optimizer"]

    def input_builder_fun(model):
        return None

    def forward_pass_builder_fun(model, loss_scale):
        return [dpm_forward(model, kind, loss_scale)]

    def optimizer_builder_fun(model):
        return optimizer.build_sgd(
            model,
            base_learning_rate=opt["base_learning_rate"],
            policy="fixed",
            momentum=opt["momentum"],
        )

    kwargs = dict(
        devices=case["devices"] if devices is None else devices,
        shared_model=case["parallelize"]["shared_model"],
    )
    if case["parallelize"]["combine_spatial_bn"]:
        kwargs["combine_spatial_bn"] = True
    kwargs.update(parallelize_kwargs)
    data_parallel_model.Parallelize_CPU(
        model,
        input_builder_fun=input_builder_fun,
        forward_pass_builder_fun=forward_pass_builder_fun,
        optimizer_builder_fun=optimizer_builder_fun,
        **kwargs,
    )
    return model


def b64(net):
    proto = net.Proto() if isinstance(net, core.Net) else net
    return base64.b64encode(proto.SerializeToString()).decode()


def _op_key(op):
    return op.SerializeToString(deterministic=True)


def assert_nets_equal_ops_unordered(actual, expected, start=0, unordered_external=False):
    """Equal NetDefs, except that the ops from index ``start`` on may come in any order (the
    nets that Caffe2 built from Python sets: see the corpus' ``hash_order_dependent``), and
    with ``unordered_external`` the external inputs/outputs too."""
    assert sorted(_op_key(op) for op in actual.op[start:]) == sorted(
        _op_key(op) for op in expected.op[start:]
    ), "the unordered ops differ"
    head_a, head_e = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    head_a.CopyFrom(actual)
    head_e.CopyFrom(expected)
    del head_a.op[start:]
    del head_e.op[start:]
    assert_nets_equal(head_a, head_e, unordered_external=unordered_external)


def assert_param_init_nets_equal(actual, expected, hash_dependent):
    """The broadcast Copy ops at the end follow Python set order in Caffe2 when the case says
    so; everything before them must be identical."""
    if not hash_dependent:
        assert_nets_equal(actual, expected)
        return
    start = len(expected.op)
    while start > 0 and expected.op[start - 1].type == "Copy":
        start -= 1
    assert start < len(expected.op)
    assert_nets_equal_ops_unordered(actual, expected, start)


# ------------------------------------------------------------------------- golden: the nets
@pytest.mark.parametrize("name", OK_CASES)
def test_nets_match_caffe2(name):
    case = CASES[name]
    model = build(case)
    assert_nets_equal(model.net.Proto(), parse_net(case["net_b64"]))
    assert_param_init_nets_equal(
        model.param_init_net.Proto(),
        parse_net(case["param_init_net_b64"]),
        "param_init_net" in case["hash_order_dependent"],
    )
    assert model.net.Proto().name == case["net_name"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_device_nets_match_caffe2(name):
    """``single_device`` is the model on device [0] with the whole batch: what
    Parallelize_CPU(devices=[0]) builds (no reduction, no broadcast)."""
    case = CASES[name]
    single = case["single_device"]
    model = build(case, devices=[0], net_name=single["net_name"])
    assert_nets_equal(model.net.Proto(), parse_net(single["net_b64"]))
    assert_nets_equal(model.param_init_net.Proto(), parse_net(single["param_init_net_b64"]))


# ---------------------------------------------------------------------- golden: training
@pytest.mark.parametrize("name", OK_CASES)
def test_training_reproduces_caffe2_checkpoints(name):
    case = CASES[name]
    model = build(case)
    run = dict(case, param_init_net_b64=b64(model.param_init_net), net_b64=b64(model.net))
    diffs, completed = dpm_replay.train(f"devices {case['devices']}", run)
    assert diffs == [], "\n".join(diffs)
    assert completed


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_device_training_reproduces_caffe2_checkpoints(name):
    case = CASES[name]
    single = case["single_device"]
    model = build(case, devices=[0], net_name=single["net_name"])
    run = dict(single, param_init_net_b64=b64(model.param_init_net), net_b64=b64(model.net))
    diffs, completed = dpm_replay.train("single device", run)
    assert diffs == [], "\n".join(diffs)
    assert completed


# ------------------------------------------------------------------- golden: error cases
@pytest.mark.parametrize("name", ERROR_CASES)
def test_parallelize_error_as_caffe2(name):
    case = CASES[name]
    spec = case["parallelize_error"]
    assert spec["stage"] == "Parallelize_CPU"
    raised = None
    try:
        build(case)
    except Exception as e:  # noqa: BLE001 - compared with the recorded error below
        raised = e
    assert error_diffs("Parallelize_CPU", raised, spec) == []
    assert isinstance(raised, AssertionError)


# ------------------------------------------------------------------------ golden: the API
@pytest.mark.parametrize("name", OK_CASES)
def test_checkpoint_params_and_learning_rate_names(name):
    case = CASES[name]
    model = build(case)
    assert (
        sorted(str(b) for b in data_parallel_model.GetCheckpointParams(model))
        == case["api"]["GetCheckpointParams"]
    )
    assert (
        data_parallel_model.GetLearningRateBlobNames(model)
        == case["api"]["GetLearningRateBlobNames"]
    )
    assert data_parallel_model.GetDevices(model) == case["devices"]


def _train(case, model):
    run = dict(case, param_init_net_b64=b64(model.param_init_net), net_b64=b64(model.net))
    diffs, completed = dpm_replay.train("training", run)
    assert diffs == [] and completed, "\n".join(diffs)


@pytest.mark.parametrize("name", OK_CASES)
def test_extract_predictor_net(name):
    case = CASES[name]
    spec = case["api"]["ExtractPredictorNet"]
    model = build(case)
    if "error" in spec:
        raised = None
        try:
            data_parallel_model.ExtractPredictorNet(model, ["data"], ["softmax"], CPU0)
        except Exception as e:  # noqa: BLE001 - compared with the recorded error below
            raised = e
        assert error_diffs("ExtractPredictorNet", raised, spec["error"]) == []
        return
    _train(case, model)
    predict_net, export_blobs = data_parallel_model.ExtractPredictorNet(
        model, ["data"], ["softmax"], CPU0
    )
    assert_nets_equal(
        predict_net.Proto(), parse_net(spec["predict_net_b64"]), unordered_external=True
    )
    assert sorted(str(b) for b in export_blobs) == spec["export_blobs"]
    assert spec["run_after_iter"] == case["iterations"]
    diffs = dpm_replay._predictor_diffs(dict(spec, predict_net_b64=b64(predict_net.Proto())))
    assert diffs == [], "\n".join(diffs)


@pytest.mark.parametrize("name", OK_CASES)
def test_finalize_after_checkpoint_and_resume(name):
    case = CASES[name]
    spec = case["api"]["FinalizeAfterCheckpoint"]
    assert spec["call"] == "FinalizeAfterCheckpoint(model, cpu_mode=True)"
    model = build(case)
    _train(case, model)
    assert data_parallel_model.FinalizeAfterCheckpoint(model, cpu_mode=True) is None
    sync_net = model._checkpoint_net.Proto()
    assert_nets_equal_ops_unordered(
        sync_net, parse_net(spec["checkpoint_sync_net_b64"]), unordered_external=True
    )
    diffs = dpm_replay._resume_diffs(case, dict(spec, checkpoint_sync_net_b64=b64(sync_net)))
    assert diffs == [], "\n".join(diffs)


@pytest.mark.parametrize("name", OK_CASES)
def test_finalize_after_checkpoint_default_runs_on_the_cpu_ops(name):
    """Without cpu_mode the sync net says CUDA at net level while its Copy ops keep their CPU
    device options: it runs on a machine without a GPU, as in Caffe2."""
    case = CASES[name]
    spec = case["api"]["FinalizeAfterCheckpoint_default"]
    assert spec["ok"]
    model = build(case)
    workspace.RunNetOnce(model.param_init_net)
    data_parallel_model.FinalizeAfterCheckpoint(model)
    proto = model._checkpoint_net.Proto()
    expected = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA, device_id=0)
    assert proto.device_option == expected
    assert len(proto.op) == spec["num_ops"]
    assert all(op.device_option == CPU0 for op in proto.op)
    # A second call reruns the same net.
    data_parallel_model.FinalizeAfterCheckpoint(model)
    assert model._checkpoint_net.Proto() is proto


def test_every_case_is_covered():
    assert len(CASES) == 9
    assert ERROR_CASES == ["dpm.sparse_gather.dev2"]


# --------------------------------------------------------- multi-process nets (not run here)
RENDEZVOUS = dict(engine="MPI", shard_id=1, num_shards=2, kv_handler=None)


def _mlp_model(rendezvous, name="dpm_mpi"):
    case = CASES["dpm.mlp_sgd.dev2"]
    model = model_helper.ModelHelper(name=name)

    def forward(model, loss_scale):
        return [dpm_forward(model, "mlp", loss_scale)]

    data_parallel_model.Parallelize_CPU(
        model,
        lambda m: None,
        forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(
            m, base_learning_rate=0.1, policy="fixed"
        ),
        devices=case["devices"],
        rendezvous=rendezvous,
    )
    return model


def _args(op):
    return ArgsToDict(op.arg)


def test_mpi_rendezvous_builds_caffe2s_collective_ops():
    model = _mlp_model(dict(RENDEZVOUS))
    net = model.net.Proto()
    init = model.param_init_net.Proto()
    grads = ["fc1_w_grad", "fc1_b_grad", "fc2_w_grad", "fc2_b_grad"]
    params = ["fc1_b", "fc1_w", "fc2_b", "fc2_w"]

    # 2 devices x 4 threads + 8 for the distributed ops.
    assert net.num_workers == 16

    # Gradients: one Allreduce per gradient over both devices' copies, last gradient first,
    # each with its own common world (at most num_workers - 1 = 15 of them).
    allreduces = [op for op in net.op if op.type == "Allreduce"]
    assert [op.name for op in allreduces] == list(reversed(grads))
    for k, op in enumerate(allreduces):
        g = op.name
        assert op.engine == "MPI"
        assert list(op.input) == [f"allreduce_{k}_cw", f"cpu_0/{g}", f"cpu_1/{g}"]
        assert list(op.output) == [f"cpu_0/{g}", f"cpu_1/{g}"]
        assert _args(op) == {"gpu_direct": 0}
        assert op.device_option == CPU0
        assert list(op.control_input) == []
    assert not any(op.type in ("Sum", "Copy") for op in net.op)

    # Their common worlds: one CreateCommonWorld, the others clone it (same timeout).
    worlds = [op for op in init.op if op.type in ("CreateCommonWorld", "CloneCommonWorld")]
    create = worlds[0]
    assert create.type == "CreateCommonWorld"
    assert list(create.input) == [] and list(create.output) == ["allreduce_0_cw"]
    assert create.name == "allreduce_0_cw_op" and create.engine == "MPI"
    assert [a.name for a in create.arg] == ["size", "rank", "timeout_ms"]
    assert _args(create) == {"size": 2, "rank": 1, "timeout_ms": 30000}
    assert create.device_option == CPU0
    for k, op in enumerate(worlds[1:4], 1):
        assert op.type == "CloneCommonWorld"
        assert list(op.input) == ["allreduce_0_cw"]
        assert list(op.output) == [f"allreduce_{k}_cw"]
        assert op.name == f"allreduce_{k}_cw_op" and op.engine == "MPI"
        assert list(op.arg) == []

    # Initial parameter sync: Broadcast per blob of param_init_net, sorted by name, one
    # common world (max_concurrent_distributed_ops=1), chained by control inputs.
    assert worlds[4].type == "CloneCommonWorld"
    assert list(worlds[4].output) == ["broadcast_0_cw"]
    assert len(worlds) == 5
    broadcasts = [op for op in init.op if op.type == "Broadcast"]
    assert [op.name for op in broadcasts] == params
    for k, op in enumerate(broadcasts):
        p = op.name
        assert op.engine == "MPI"
        assert list(op.input) == ["broadcast_0_cw", f"cpu_0/{p}", f"cpu_1/{p}"]
        assert list(op.output) == [f"cpu_0/{p}", f"cpu_1/{p}"]
        # The previous Broadcast's outputs (all of them) must be ready.
        previous = [] if k == 0 else [f"cpu_0/{params[k - 1]}", f"cpu_1/{params[k - 1]}"]
        assert list(op.control_input) == previous
        assert op.device_option == CPU0
    assert not any(op.type == "Copy" for op in init.op)
    assert init.op[-len(broadcasts) :] == broadcasts

    # The loss is scaled by 1 / (devices x shards).
    scales = [op for op in net.op if op.type == "Scale" and not op.is_gradient_op]
    assert {_args(op)["scale"] for op in scales} == {0.25}

    # A barrier before training, its common world in its own init net.
    barrier_init, barrier = (
        model._data_parallel_model_init_nets[0],
        model._data_parallel_model_nets[0],
    )
    assert model._data_parallel_model_init_nets[1] is model.param_init_net
    assert model._data_parallel_model_nets[1] is model.net
    (cw,) = barrier_init.Proto().op
    assert cw.type == "CreateCommonWorld" and cw.engine == "MPI"
    assert list(cw.output) == ["pre_training_barrier_cw"]
    assert _args(cw) == {"size": 2, "rank": 1, "timeout_ms": 300000}
    (op,) = barrier.Proto().op
    assert op.type == "Barrier" and op.engine == "MPI"
    assert list(op.input) == ["pre_training_barrier_cw"] and list(op.output) == []
    assert barrier.Proto().name == "pre_training_barrier_net"


def test_mpi_rendezvous_optional_keys_and_store_handler():
    model = _mlp_model(
        dict(RENDEZVOUS, kv_handler="store_handler", transport="tcp", interface="eth0")
    )
    create = next(op for op in model.param_init_net.Proto().op if op.type == "CreateCommonWorld")
    assert list(create.input) == ["store_handler"]
    assert [a.name for a in create.arg] == ["size", "rank", "timeout_ms", "transport", "interface"]
    assert _args(create)["transport"] == b"tcp"


def test_rendezvous_timeout_ms_sets_the_collectives_worlds_not_the_barrier():
    model = _mlp_model(dict(RENDEZVOUS, timeout_ms=2500))
    creates = [op for op in model.param_init_net.Proto().op if op.type == "CreateCommonWorld"]
    assert creates and all(_args(op)["timeout_ms"] == 2500 for op in creates)
    barrier = next(
        op for op in model._barrier_init_net.Proto().op if op.type == "CreateCommonWorld"
    )
    assert _args(barrier)["timeout_ms"] == 300 * 1000
    default = _mlp_model(dict(RENDEZVOUS), name="dpm_mpi_default")
    create = next(op for op in default.param_init_net.Proto().op if op.type == "CreateCommonWorld")
    assert _args(create)["timeout_ms"] == 30 * 1000


def test_more_gradients_than_common_worlds_chain_by_control_input():
    model = model_helper.ModelHelper(name="dpm_mpi_two")
    data_parallel_model.Parallelize_CPU(
        model,
        lambda m: None,
        lambda m, s: [dpm_forward(m, "mlp", s)],
        optimizer_builder_fun=lambda m: optimizer.build_sgd(
            m, base_learning_rate=0.1, policy="fixed"
        ),
        devices=[0, 1],
        rendezvous=dict(RENDEZVOUS),
        max_concurrent_distributed_ops=2,
    )
    ops = [op for op in model.net.Proto().op if op.type == "Allreduce"]
    assert [op.input[0] for op in ops] == ["allreduce_0_cw", "allreduce_1_cw"] * 2
    assert [list(op.control_input) for op in ops] == [
        [],
        [],
        ["cpu_0/fc2_b_grad"],
        ["cpu_0/fc2_w_grad"],
    ]


@pytest.mark.parametrize("engine", ["GLOO", "NCCL", "REDIS"])
def test_other_engines_are_refused_naming_mpi(engine):
    model = model_helper.ModelHelper(name="dpm_gloo")
    with pytest.raises(ValueError, match=f"engine '{engine}'.*available.*'MPI'"):
        data_parallel_model.Parallelize_CPU(
            model,
            lambda m: None,
            lambda m, s: [dpm_forward(m, "mlp", s)],
            optimizer_builder_fun=lambda m: optimizer.build_sgd(m, base_learning_rate=0.1),
            devices=[0, 1],
            rendezvous=dict(RENDEZVOUS, engine=engine),
        )
    # Refused before anything was built.
    assert len(model.net.Proto().op) == 0 and len(model.param_init_net.Proto().op) == 0


def test_one_shard_rendezvous_builds_the_single_host_nets_plus_a_barrier():
    model = _mlp_model(dict(RENDEZVOUS, shard_id=0, num_shards=1), name="dpm_one_shard")
    types = [op.type for op in model.net.Proto().op]
    assert "Allreduce" not in types and types.count("Sum") == 4
    assert model._data_parallel_model_nets[0].Proto().op[0].type == "Barrier"


# ------------------------------------------------------------------- other API behaviour
def test_convert_net_for_device():
    net = core.Net("convert_me")
    net.FC(["x", "w", "b"], "y")
    net.Proto().external_output.append("y")
    device = core.DeviceOption(caffe2_pb2.CPU, 3)
    converted = data_parallel_model.ConvertNetForDevice(net, device)
    (op,) = converted.Proto().op
    assert list(op.input) == ["cpu_3/x", "cpu_3/w", "cpu_3/b"]
    assert list(op.output) == ["cpu_3/y"]
    assert op.device_option == device
    assert list(converted.Proto().external_input) == ["cpu_3/x", "cpu_3/w", "cpu_3/b"]
    assert list(converted.Proto().external_output) == ["cpu_3/y"]
    # The original is untouched.
    assert list(net.Proto().op[0].input) == ["x", "w", "b"]
    gpu = data_parallel_model.ConvertNetForDevice(net, core.DeviceOption(caffe2_pb2.CUDA, 1))
    assert gpu.Proto().op[0].input[0] == "gpu_1/x"


def test_parallelize_inside_a_gpu_device_scope_is_refused():
    model = model_helper.ModelHelper(name="dpm_scoped")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        with pytest.raises(AssertionError, match="without device-scope"):
            data_parallel_model.Parallelize_CPU(model, lambda m: None, lambda m, s: [])


def test_forward_only_model_groups_params_and_returns_early():
    model = model_helper.ModelHelper(name="dpm_forward_only", init_params=False)
    data_parallel_model.Parallelize_CPU(
        model, lambda m: None, lambda m, s: [dpm_forward(m, "mlp", s)], devices=[0, 1]
    )
    assert model._param_names == ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
    assert set(model._device_grouped_blobs["fc1_w"]) == {0, 1}
    assert str(model._device_grouped_blobs["fc1_w"][1]) == "cpu_1/fc1_w"
    assert not any(op.is_gradient_op for op in model.net.Proto().op)


def test_sparse_gradient_is_grouped_as_a_gradient_slice_on_one_device():
    case = CASES["dpm.sparse_gather.dev2"]
    model = build(case, devices=[0], net_name="dpm_sparse_one")
    grad = model._device_grouped_blobs["idx:gathered_grad"][0]
    assert isinstance(grad, core.GradientSlice)
    assert (str(grad.indices), str(grad.values)) == ("cpu_0/idx", "cpu_0/gathered_grad")
    assert model.param_to_grad[model.params[0]] == grad


def test_bmuf_builds_the_block_update_nets_and_trains():
    model = model_helper.ModelHelper(name="dpm_bmuf")

    def update(m):
        # Plain SGD per device with a fixed step.
        lr = m.param_init_net.ConstantFill([], "lr", shape=[1], value=-0.1)
        one = m.param_init_net.ConstantFill([], "one", shape=[1], value=1.0)
        for p in m.GetParams():
            m.WeightedSum([p, one, m.param_to_grad[p], lr], p)

    data_parallel_model.Parallelize_BMUF(
        model,
        lambda m: None,
        lambda m, s: [dpm_forward(m, "mlp", s)],
        update,
        devices=[0, 1],
        cpu_device=True,
        block_momentum=0.5,
    )
    updates = model._global_model_param_updates_net.Proto()
    assert updates.name == "global_model" and updates.type == "dag"
    names = ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
    # The average: a Sum of the devices' copies into the first one's, copied back.
    expected = []
    for n in names:
        expected += [("Sum", [f"cpu_0/{n}", f"cpu_1/{n}"], [f"cpu_0/{n}"])]
        expected += [("Copy", [f"cpu_0/{n}"], [f"cpu_1/{n}"])]
    # The block update on the first device, then the broadcast.
    for n in names:
        p, g, v = f"cpu_0/{n}", f"cpu_0/{n}_g", f"cpu_0/{n}_v"
        expected += [
            ("Scale", [p], [p]),
            ("Sub", [p, g], [p]),
            ("Scale", [p], [p]),
            ("Scale", [v], [v]),
            ("Add", [v, p], [v]),
            ("Add", [g, v], [g]),
            ("Copy", [g], [p]),
        ]
    expected += [("Copy", [f"cpu_0/{n}"], [f"cpu_1/{n}"]) for n in names]
    assert [(op.type, list(op.input), list(op.output)) for op in updates.op] == expected
    assert [ArgsToDict(op.arg)["scale"] for op in updates.op[8:12] if op.type == "Scale"] == [
        0.5,
        1.0,
        0.5,
    ]
    init = model._global_model_init_net.Proto()
    assert [(op.type, list(op.output)) for op in init.op[:2]] == [
        ("ConstantFill", ["cpu_0/fc1_w_v"]),
        ("Copy", ["cpu_0/fc1_w_g"]),
    ]
    assert model._data_parallel_model_nets[1] == (model._global_model_param_updates_net, 1)

    rng = np.random.default_rng(0)
    for d in (0, 1):
        workspace.FeedBlob(f"cpu_{d}/data", rng.standard_normal((4, 10)).astype(np.float32))
        workspace.FeedBlob(f"cpu_{d}/label", np.array([0, 1, 2, 3], dtype=np.int32))
    data_parallel_model.RunInitNet(model)
    g = workspace.FetchBlob("cpu_0/fc1_w_g").copy()
    np.testing.assert_array_equal(g, workspace.FetchBlob("cpu_0/fc1_w"))
    workspace.RunNet(model.net, 2)
    local = [workspace.FetchBlob(f"cpu_{d}/fc1_w").copy() for d in (0, 1)]
    workspace.RunNet(model._global_model_param_updates_net.Proto().name)
    # v = 0.5 * 0 + 1.0 * (mean - g); g += v; every device takes g.
    want = g + ((local[0] + local[1]) / 2 - g)
    for d in (0, 1):
        np.testing.assert_allclose(
            workspace.FetchBlob(f"cpu_{d}/fc1_w"), want, rtol=1e-5, atol=1e-6
        )
    np.testing.assert_allclose(workspace.FetchBlob("cpu_0/fc1_w_v"), want - g, rtol=1e-5, atol=1e-6)


def test_parallelize_gpu_builds_cuda_nets_and_runs_only_with_gpus(caplog):
    model = model_helper.ModelHelper(name="dpm_gpu")
    with caplog.at_level(logging.WARNING, logger="data_parallel_model"):
        data_parallel_model.Parallelize_GPU(
            model,
            lambda m: None,
            lambda m, s: [dpm_forward(m, "mlp", s)],
            optimizer_builder_fun=lambda m: optimizer.build_sgd(
                m, base_learning_rate=0.1, policy="fixed"
            ),
            devices=[0, 1],
        )
    assert model._device_prefix == "gpu" and model._device_type == caffe2_pb2.CUDA
    fc = model.net.Proto().op[0]
    assert fc.input[0] == "gpu_0/data" and fc.device_option.device_type == caffe2_pb2.CUDA
    sums = [op for op in model.net.Proto().op if op.type == "Sum"]
    assert len(sums) == 4 and all(op.name == "dpm" for op in sums)
    assert data_parallel_model.GetLearningRateBlobNames(model) == [
        "SgdOptimizer_0_lr_gpu0",
        "SgdOptimizer_0_lr_gpu1",
    ]
    if workspace.NumCudaDevices() >= 2:
        workspace.RunNetOnce(model.param_init_net)
        np.testing.assert_array_equal(
            workspace.FetchBlob("gpu_0/fc1_w"), workspace.FetchBlob("gpu_1/fc1_w")
        )
    else:
        assert "Only" in caplog.text and "GPUs available" in caplog.text
        with pytest.raises(RuntimeError):
            workspace.RunNetOnce(model.param_init_net)


def test_shared_model_requires_cpu():
    model = model_helper.ModelHelper(name="dpm_gpu_shared")
    with pytest.raises(AssertionError, match="Shared model only supported on CPU"):
        data_parallel_model.Parallelize_GPU(
            model, lambda m: None, lambda m, s: [], devices=[0], shared_model=True
        )


def test_optimize_gradient_memory_trains_to_the_recorded_parameters():
    """Sharing the gradient blobs (ferrocaffe.memonger) changes blob names, not results."""
    case = CASES["dpm.mlp_sgd.dev2"]
    model = build(case, optimize_gradient_memory=True)
    shared = {o for op in model.net.Proto().op for o in op.output if "_shared" in o}
    assert shared, "no gradient blob was shared"
    _train(case, model)


def test_compat_resolves_caffe2_name():
    import importlib

    from ferrocaffe import compat

    compat.install()
    try:
        assert importlib.import_module("caffe2.python.data_parallel_model") is data_parallel_model
    finally:
        compat.uninstall()


def test_use_nccl_is_accepted_and_changes_nothing_on_cpu():
    case = CASES["dpm.mlp_sgd.dev2"]
    model = build(case, use_nccl=True)
    assert_nets_equal(model.net.Proto(), parse_net(case["net_b64"]))


def test_optimize_gradient_memory_shares_each_devices_gradients(monkeypatch):
    import types

    calls = []

    def share_grad_blobs(net, losses, param_grads, namescope, **kwargs):
        calls.append(([str(x) for x in losses], sorted(map(str, param_grads)), namescope, kwargs))
        return net.Proto()

    fake = types.ModuleType("ferrocaffe.memonger")
    fake.share_grad_blobs = share_grad_blobs
    monkeypatch.setattr(data_parallel_model, "memonger", fake)
    case = CASES["dpm.mlp_sgd.dev2"]
    model = build(case, optimize_gradient_memory=True)
    grads = sorted(
        f"cpu_{d}/{p}_grad" for d in (0, 1) for p in ("fc1_w", "fc1_b", "fc2_w", "fc2_b")
    )
    assert calls == [
        (["cpu_0/loss_scaled"], grads, "cpu_0/", {"share_activations": False}),
        (["cpu_1/loss_scaled"], grads, "cpu_1/", {"share_activations": False}),
    ]
    calls.clear()
    data_parallel_model.OptimizeGradientMemory(model, None, ["fc1"], True)
    assert [(c[2], c[3]) for c in calls] == [
        (
            f"cpu_{d}/",
            {
                "dont_share_blobs": {f"cpu_{d}/fc1"},
                "share_activations": True,
                "blob_shapes": None,
            },
        )
        for d in (0, 1)
    ]


def _bn_first_forward(model, loss_scale):
    """SpatialBN straight on the data: its gradient op is the last op of the backward pass."""
    x = brew.spatial_bn(model, "data", "bn", 3, epsilon=1e-3, momentum=0.9, is_test=False)
    x = brew.fc(model, x, "fc", 3 * 4 * 4, 2)
    softmax = brew.softmax(model, x, "softmax")
    loss = model.AveragedLoss(model.LabelCrossEntropy([softmax, "label"], "xent"), "loss")
    return [model.Scale(loss, "loss_scaled", scale=loss_scale)]


def test_combined_spatial_bn_keeps_a_gradient_run_that_ends_the_net():
    model = model_helper.ModelHelper(name="dpm_bn_first")
    data_parallel_model.Parallelize_CPU(
        model,
        input_builder_fun=lambda m: None,
        forward_pass_builder_fun=_bn_first_forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1, policy="fixed"),
        devices=[0, 1],
        combine_spatial_bn=True,
    )
    ops = model.net.Proto().op
    grads = [op for op in ops if op.type == "SpatialBNGradient"]
    assert [op.device_option.device_id for op in grads] == [0, 1]
    assert all(ArgsToDict(op.arg)["num_batches"] == 2 for op in grads)
    assert [op.type for op in ops].count("ChannelBackpropStats") == 2
    rng = np.random.default_rng(1)
    workspace.RunNetOnce(model.param_init_net)
    for d in (0, 1):
        workspace.FeedBlob(f"cpu_{d}/data", rng.standard_normal((4, 3, 4, 4)).astype(np.float32))
        workspace.FeedBlob(f"cpu_{d}/label", np.array([0, 1, 1, 0], dtype=np.int32))
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net.Proto().name)
    scale = workspace.FetchBlob("cpu_0/bn_s")
    assert not np.array_equal(scale, np.ones(3, np.float32))
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_1/bn_s"), scale)


def test_gpu_combined_spatial_bn_reduces_statistics_on_the_cpu():
    model = model_helper.ModelHelper(name="dpm_bn_gpu")
    data_parallel_model.Parallelize_GPU(
        model,
        input_builder_fun=lambda m: None,
        forward_pass_builder_fun=_bn_first_forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1, policy="fixed"),
        devices=[0, 1],
        combine_spatial_bn=True,
    )
    ops = list(model.net.Proto().op)
    types = [op.type for op in ops]
    first = types.index("ChannelStats")
    assert types[first : first + 2] == ["ChannelStats", "ChannelStats"]
    copy_out = ops[first + 2]
    assert copy_out.type == "CopyGPUToCPU"
    assert (list(copy_out.input), list(copy_out.output)) == (
        ["gpu_0/data_sums"],
        ["cpu_0/data_sums_gpu_0_copy"],
    )
    total = ops[first + 4]
    assert total.type == "Sum" and total.device_option.device_type == caffe2_pb2.CPU
    assert list(total.output) == ["cpu_0/data_sums_combined"]
    back = ops[first + 5]
    assert back.type == "CopyCPUToGPU" and list(back.output) == ["gpu_0/data_sums_combined"]
    bn = next(op for op in ops if op.type == "SpatialBN")
    assert list(bn.input[-2:]) == ["gpu_0/data_sums_combined", "gpu_0/data_sumsq_combined"]
    assert types.count("SpatialBNGradient") == 2


def test_convert_net_for_device_refuses_a_recurrent_network_as_caffe2():
    net = core.Net("rnn_net")
    net.RecurrentNetwork(["x"], ["y"])
    device = core.DeviceOption(caffe2_pb2.CPU, 1)
    with pytest.raises(NotImplementedError, match="RecurrentNetwork conversion not yet supported"):
        data_parallel_model.ConvertNetForDevice(net, device)
