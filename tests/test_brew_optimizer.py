"""model_helper, brew, cnn and optimizer: nets compared with the ones Caffe2 built (golden
``models/`` predict nets, ``dpm/`` one-device nets, op-catalog builder op sets), and unit tests
of the helpers' arguments, names and bookkeeping."""

import json
import logging
import threading

import numpy as np
import pytest
from conftest import side_file
from golden_nets import assert_nets_equal, load_cases, parse_net
from model_zoo import BUILDERS, dpm_forward, mlp_train

from ferrocaffe import brew, cnn, core, model_helper, optimizer, scope, utils
from ferrocaffe.modeling import initializers
from ferrocaffe.modeling.parameter_info import ParameterInfo, ParameterTags
from ferrocaffe.modeling.parameter_sharing import ParameterSharing
from ferrocaffe.optimizer_context import UseOptimizer
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.utils import ArgsToDict

MODEL_CASES = load_cases("models")


@pytest.fixture(autouse=True)
def fresh_names(monkeypatch):
    monkeypatch.setattr(core.Net, "_net_names_used", set())
    optimizer.reset_optimizer_instance_count()


def op_types(net):
    return [op.type for op in net.Proto().op]


def args_of(op):
    return ArgsToDict(op.arg)


def arg_names(op):
    return [a.name for a in op.arg]


# ------------------------------------------------------------------ golden: models/ corpus
def exported(net_proto, params):
    """The predict net as ``mobile_exporter.Export`` ships it: the model's net with external
    inputs reordered (blobs read before any write and not parameters first) and external
    outputs set to the blobs written but never read, in first-write order."""
    predict = caffe2_pb2.NetDef()
    predict.CopyFrom(net_proto)
    versions = {b: 0 for b in net_proto.external_input}
    read = set()
    for op in net_proto.op:
        read.update(op.input)
        for o in op.output:
            versions[o] = versions.get(o, 0) + 1
    inputs = [b for b, v in versions.items() if v == 0 and b not in params]
    outputs = [b for b, v in versions.items() if v != 0 and b not in read]
    del predict.external_input[:]
    predict.external_input.extend(inputs + [b for b in net_proto.external_input if b not in inputs])
    del predict.external_output[:]
    predict.external_output.extend(outputs)
    return predict


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_predict_net_matches_golden(name):
    case = MODEL_CASES[name]
    model = BUILDERS[name]()
    assert_nets_equal(
        exported(model.net.Proto(), case["params"]), parse_net(case["predict_net_b64"])
    )


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_param_init_net_matches_golden_parameters(name):
    """Every fill the helpers put in param_init_net has the shape of the tensor Caffe2
    shipped for that parameter; the parameter list is Caffe2's (GetAllParams order) for the
    models whose init net holds exactly the model's parameters."""
    case = MODEL_CASES[name]
    model = BUILDERS[name]()
    golden = {op.output[0]: list(args_of(op)["shape"]) for op in parse_net(case["init_net_b64"]).op}
    ours = {op.output[0]: list(args_of(op)["shape"]) for op in model.param_init_net.Proto().op}
    assert ours and all(golden[blob] == shape for blob, shape in ours.items())
    all_params = [str(p) for p in model.GetAllParams()]
    if name.startswith("model.embedding_bag"):
        # Embedding tables and id maps were added to the export by hand.
        assert set(all_params) < set(case["params"])
    else:
        assert all_params == case["params"]
    assert {str(p) for p in model.params} | {str(p) for p in model.GetComputedParams()} == set(ours)


def test_extract_predictor_net_matches_golden_mlp():
    case = MODEL_CASES["model.mlp.trained_extracted"]
    model = mlp_train()
    predict_net, export_blobs = model_helper.ExtractPredictorNet(
        model.net.Proto(), ["data"], ["softmax"]
    )
    assert_nets_equal(
        predict_net.Proto(), parse_net(case["predict_net_b64"]), unordered_external=True
    )
    assert sorted(export_blobs) == sorted(case["params"])


def test_extract_predictor_net_of_trained_model_drops_gradient_and_optimizer_ops():
    case = MODEL_CASES["model.mlp.trained_extracted"]
    model = mlp_train()
    model.AddGradientOperators(["loss"])
    optimizer.build_sgd(model, base_learning_rate=0.1)
    assert "FCGradient" in op_types(model.net) and "WeightedSum" in op_types(model.net)
    predict_net, _ = model_helper.ExtractPredictorNet(model.net.Proto(), ["data"], ["softmax"])
    assert_nets_equal(
        predict_net.Proto(), parse_net(case["predict_net_b64"]), unordered_external=True
    )


# --------------------------------------------------------------------- golden: dpm/ corpus
DPM_CASES = load_cases("dpm")
CPU0 = core.DeviceOption(caffe2_pb2.CPU, 0)


def _dpm_single_device(case):
    """The one-device model of a dpm/ case, built the way Parallelize_CPU(devices=[0]) builds
    it: forward pass under DeviceScope(CPU 0) + NameScope('cpu_0'), the loss gradient seeded
    with a ConstantFill of 1, AddGradientOperators, the optimizer (outside the name scope),
    and Parallelize's net settings (dag, 4 workers, first_iter_only_one_worker)."""
    kind = case["model"]
    single = case["single_device"]
    name = single["net_name"]
    if kind == "cnn":
        model = cnn.CNNModelHelper(order="NCHW", name=name)
    else:
        model = model_helper.ModelHelper(name=name)
    with scope.DeviceScope(CPU0), scope.NameScope("cpu_0"):
        loss = dpm_forward(model, kind)
    with scope.DeviceScope(CPU0):
        loss_grad = model.ConstantFill(loss, str(loss) + "_grad", value=1.0)
    model.AddGradientOperators({str(loss): str(loss_grad)})
    opt = case["optimizer"]
    optimizer.build_sgd(
        model,
        base_learning_rate=opt["base_learning_rate"],
        policy="fixed",
        momentum=opt["momentum"],
    )
    proto = model.net.Proto()
    proto.type = "dag"
    proto.num_workers = 4
    proto.arg.extend([utils.MakeArgument("first_iter_only_one_worker", 1)])
    return model


def _without_spatial_bn_combination(net):
    """A copy of a combine_spatial_bn=True net without what Parallelize added: its ChannelStats
    / Sum / Copy / ChannelBackpropStats ops (no device option), the statistic inputs of
    SpatialBN and SpatialBNGradient and their num_batches argument."""
    out = caffe2_pb2.NetDef()
    out.CopyFrom(net)
    del out.op[:]
    for op in net.op:
        if not op.HasField("device_option"):
            continue
        new_op = out.op.add()
        new_op.CopyFrom(op)
        if op.type in ("SpatialBN", "SpatialBNGradient"):
            del new_op.input[5:]
            kept = [a for a in new_op.arg if a.name != "num_batches"]
            del new_op.arg[:]
            new_op.arg.extend(kept)
    return out


@pytest.mark.parametrize("name", sorted(DPM_CASES))
def test_dpm_single_device_param_init_net_matches_golden(name):
    case = DPM_CASES[name]
    model = _dpm_single_device(case)
    assert_nets_equal(
        model.param_init_net.Proto(), parse_net(case["single_device"]["param_init_net_b64"])
    )


@pytest.mark.parametrize("name", sorted(DPM_CASES))
def test_dpm_single_device_net_matches_golden(name):
    case = DPM_CASES[name]
    model = _dpm_single_device(case)
    expected = parse_net(case["single_device"]["net_b64"])
    if case["parallelize"]["combine_spatial_bn"]:
        expected = _without_spatial_bn_combination(expected)
        for op in model.net.Proto().op:
            assert op.type not in ("ChannelStats", "ChannelBackpropStats")
    assert_nets_equal(model.net.Proto(), expected)


@pytest.mark.parametrize("name", ["dpm.mlp_sgd.dev2", "dpm.cnn_sgd.dev2"])
def test_dpm_checkpoint_params_and_lr_names_match_golden(name):
    """What DPM's GetCheckpointParams / GetLearningRateBlobNames report comes from the model:
    the first device's parameters (plus optimizer_iteration) and the LearningRate outputs."""
    case = DPM_CASES[name]
    model = _dpm_single_device(case)
    params = sorted(str(p) for p in model.GetParams("cpu_0"))
    assert params + ["optimizer_iteration"] == case["api"]["GetCheckpointParams"]
    lr_blobs = [op.output[0] for op in model.net.Proto().op if op.type == "LearningRate"]
    assert lr_blobs == case["api"]["GetLearningRateBlobNames"]


# ------------------------------------------------------------- golden: op-catalog builders
with open(side_file("op-catalog.json")) as _f:
    CATALOG = json.load(_f)


def _catalog_ops(builder):
    return sorted(k for k, v in CATALOG["ops"].items() if builder in (v.get("used_by") or []))


def _catalog_model(sparse):
    """A model with the op types of the catalog's optimizer builder models: two FC branches of
    one input summed and reduced with SumElements; with ``sparse``, an embedding (GaussianFill)
    pooled by SparseLengthsSum and a Gather from a second table feed them."""
    model = model_helper.ModelHelper(name="opt")
    x = "data"
    if sparse:
        emb = model.param_init_net.GaussianFill([], "emb", shape=[10, 4])
        model.AddParameter(emb)
        pooled = model.net.SparseLengthsSum([emb, "indices", "lengths"], "pooled")
        table = model.param_init_net.GaussianFill([], "table", shape=[10, 4])
        model.AddParameter(table)
        gathered = model.net.Gather([table, "ids"], "gathered")
        x = model.net.Sum([pooled, gathered], "x")
    a = brew.fc(model, x, "fc_a", 4, 2)
    b = brew.fc(model, x, "fc_b", 4, 2)
    y = model.net.Sum([a, b], "y")
    loss = model.net.SumElements(y, "loss")
    model.AddGradientOperators([loss])
    return model


@pytest.mark.parametrize(
    "builder, build, sparse",
    [
        ("optimizer.build_sgd(dense)", lambda m: optimizer.build_sgd(m, 0.1), False),
        ("optimizer.build_sgd(dense+sparse)", lambda m: optimizer.build_sgd(m, 0.1), True),
        (
            "optimizer.build_sgd(momentum)(dense)",
            lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9),
            False,
        ),
        (
            "optimizer.build_sgd(momentum)(dense+sparse)",
            lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9),
            True,
        ),
        (
            "optimizer.build_multi_precision_sgd(dense)",
            lambda m: optimizer.build_multi_precision_sgd(m, 0.1),
            False,
        ),
        (
            "optimizer.build_multi_precision_sgd(dense+sparse)",
            lambda m: optimizer.build_multi_precision_sgd(m, 0.1),
            True,
        ),
        ("optimizer.build_adagrad(dense)", lambda m: optimizer.build_adagrad(m, 0.1), False),
        (
            "optimizer.build_adagrad(dense+sparse)",
            lambda m: optimizer.build_adagrad(m, 0.1),
            True,
        ),
        ("optimizer.build_adam(dense)", lambda m: optimizer.build_adam(m, 0.1), False),
        ("optimizer.build_adam(dense+sparse)", lambda m: optimizer.build_adam(m, 0.1), True),
    ],
)
def test_optimizer_builders_emit_the_catalog_op_types(builder, build, sparse):
    model = _catalog_model(sparse)
    build(model)
    ours = sorted(set(op_types(model.net)) | set(op_types(model.param_init_net)))
    assert ours == _catalog_ops(builder)


def test_brew_emits_the_catalog_op_types():
    """The catalog's brew model uses fc, conv, max_pool, average_pool, relu, softmax,
    spatial_bn, dropout, concat, lrn and sum, trained with AveragedLoss."""
    model = model_helper.ModelHelper(name="brew_all")
    x = brew.conv(model, "data", "conv", 3, 4, 3, pad=1)
    x = brew.spatial_bn(model, x, "bn", 4, is_test=False)
    x = brew.relu(model, x, x)
    x = brew.lrn(model, x, "lrn", size=3)
    a = brew.max_pool(model, x, "max", kernel=2, stride=2)
    b = brew.average_pool(model, x, "avg", kernel=2, stride=2)
    x = brew.concat(model, [a, b], "cat")
    x = brew.dropout(model, x, "drop", ratio=0.5, is_test=False)
    c = brew.fc(model, x, "fc_a", 8 * 2 * 2, 3)
    d = brew.fc(model, x, "fc_b", 8 * 2 * 2, 3)
    x = brew.sum(model, [c, d], "sum")
    x = brew.softmax(model, x, "softmax")
    model.AveragedLoss(x, "loss")
    model.AddGradientOperators(["loss"])
    ours = sorted(set(op_types(model.net)) | set(op_types(model.param_init_net)))
    assert ours == _catalog_ops(
        "brew(fc,conv,max_pool,average_pool,relu,softmax,spatial_bn,dropout,concat,lrn,sum)"
    )


# ---------------------------------------------------------------------------- brew wrapper
def test_brew_passes_model_arg_scope_then_brew_arg_scope_then_call_kwargs():
    model = model_helper.ModelHelper(arg_scope={"order": "NHWC"})
    with brew.arg_scope([brew.conv], stride=2, pad=1):
        with brew.arg_scope(brew.conv, pad=3):
            brew.conv(model, "x", "c1", 2, 4, 3)
        brew.conv(model, "c1", "c2", 4, 4, 3, pad=0)
    brew.conv(model, "c2", "c3", 4, 4, 3)
    c1, c2, c3 = model.net.Proto().op
    assert args_of(c1) == {
        "kernel": 3,
        "order": b"NHWC",
        "stride": 2,
        "pad": 3,
        "exhaustive_search": 0,
    }
    assert args_of(c2)["pad"] == 0 and args_of(c2)["stride"] == 2
    assert "stride" not in args_of(c3) and "pad" not in args_of(c3)
    # NHWC weight layout: [out, kh, kw, in].
    assert list(args_of(model.param_init_net.Proto().op[0])["shape"]) == [4, 3, 3, 2]


def test_arg_scope_is_per_thread_and_restored():
    from ferrocaffe.helpers.arg_scope import get_current_scope

    seen = {}
    with brew.arg_scope([brew.relu, brew.fc], foo=1):
        t = threading.Thread(target=lambda: seen.setdefault("other", dict(get_current_scope())))
        t.start()
        t.join()
        assert get_current_scope() == {"relu": {"foo": 1}, "fc": {"foo": 1}}
    assert get_current_scope() == {}
    assert seen["other"] == {}


def test_helper_without_kwargs_only_gets_the_scope_values_it_names():
    model = model_helper.ModelHelper()
    normalized, mean, std = brew.layer_norm(model, "x", "ln", 8, axis=1, epsilon=1e-5)
    (op,) = model.net.Proto().op
    assert op.type == "LayerNorm"
    assert list(op.input) == ["x", "ln_scale", "ln_bias"]
    assert list(op.output) == ["ln", "ln_mean", "ln_std"]
    assert arg_names(op) == ["axis", "epsilon", "elementwise_affine"]
    assert [str(normalized), str(mean), str(std)] == ["ln", "ln_mean", "ln_std"]
    scale, bias = model.param_init_net.Proto().op
    assert (scale.type, args_of(scale)["value"], list(args_of(scale)["shape"])) == (
        "ConstantFill",
        1.0,
        [8],
    )
    assert model.weights == ["ln_scale"] and model.biases == ["ln_bias"]


def test_brew_lookup_and_registration():
    with pytest.raises(AttributeError, match="Helper function no_such_helper not registered"):
        brew.no_such_helper  # noqa: B018
    with pytest.raises(RuntimeError, match="first input of helper function should be model"):
        brew.relu("x", "y")
    assert brew.has_helper("fc") and brew.has_helper(brew.conv) and not brew.has_helper("x")

    def my_double_relu(model, blob_in, blob_out, **kwargs):
        y = model.net.Relu(blob_in, blob_out + "_a", **kwargs)
        return model.net.Relu(y, blob_out)

    brew.Register(my_double_relu)
    with pytest.raises(AttributeError, match="already exists"):
        brew.Register(my_double_relu)
    model = model_helper.ModelHelper()
    brew.my_double_relu(model=model, blob_in="x", blob_out="y")
    first, second = model.net.Proto().op
    assert arg_names(first) == ["order", "use_cudnn", "cudnn_exhaustive_search"]
    assert list(second.output) == ["y"]


# --------------------------------------------------------------------------- brew helpers
def test_fc_custom_initializers_and_freeze_bias():
    model = model_helper.ModelHelper()
    brew.fc(
        model,
        "x",
        "a",
        3,
        2,
        weight_init=("GaussianFill", {"std": 0.5}),
        bias_init=("ConstantFill", {"value": 0.1}),
    )
    brew.fc(
        model,
        "x",
        "b",
        3,
        2,
        WeightInitializer=initializers.Initializer,
        weight_init=("MSRAFill", {}),
        freeze_bias=True,
    )
    ops = model.param_init_net.Proto().op
    assert [(o.type, arg_names(o)) for o in ops] == [
        ("GaussianFill", ["shape", "std"]),
        ("ConstantFill", ["shape", "value"]),
        ("MSRAFill", ["shape"]),
        ("ConstantFill", ["shape"]),
    ]
    assert model.params == ["a_w", "a_b", "b_w"]
    assert model.GetComputedParams() == ["b_b"]
    assert args_of(model.net.Proto().op[1])["freeze_bias"] == 1


def test_init_params_false_records_params_without_fill_ops():
    model = model_helper.ModelHelper(init_params=False)
    brew.fc(model, "x", "fc", 3, 2)
    brew.conv(model, "fc", "conv", 2, 2, 1)
    brew.spatial_bn(model, "conv", "bn", 2, is_test=True)
    brew.prelu(model, "bn", "pr")
    assert len(model.param_init_net.Proto().op) == 0
    assert [str(p) for p in model.GetAllParams()] == [
        "fc_w", "fc_b", "conv_w", "conv_b", "bn_s", "bn_b", "pr_slope", "bn_rm", "bn_riv",
    ]  # fmt: skip
    assert all(p.Net() is model.param_init_net for p in model.params)


def test_conv_kernel_forms_group_engine_and_no_bias():
    model = model_helper.ModelHelper()
    brew.conv(model, "x", "a", 4, 8, [3, 5], group=2, ws_nbytes_limit=64)
    brew.conv(model, "x", "b", 4, 8, 3, no_bias=True, use_cudnn=False, float16_compute=True)
    brew.conv_nd(model, "x", "c", 4, 8, [3, 3, 3])
    a, b, c = model.net.Proto().op
    assert args_of(a) == {
        "kernel_h": 3, "kernel_w": 5, "order": b"NCHW", "exhaustive_search": 0,
        "ws_nbytes_limit": 64, "group": 2,
    }  # fmt: skip
    assert a.engine == "CUDNN"
    assert list(b.input) == ["x", "b_w"] and not b.HasField("engine")
    assert arg_names(b) == ["kernel", "order", "float16_compute"]
    assert list(args_of(c)["kernels"]) == [3, 3, 3]
    shapes = [list(args_of(op)["shape"]) for op in model.param_init_net.Proto().op]
    assert shapes == [[8, 2, 3, 5], [8], [8, 4, 3, 3], [8, 4, 3, 3, 3], [8]]
    with pytest.raises(ValueError, match='only engine you can specify is "CUDNN"'):
        brew.conv(model, "x", "d", 4, 8, 3, engine="NNPACK")
    with pytest.raises(ValueError, match="use_cudnn=False"):
        brew.conv(model, "x", "e", 4, 8, 3, use_cudnn=False, engine="CUDNN")


def test_conv_transpose_nhwc_weight_layout():
    model = model_helper.ModelHelper(arg_scope={"order": "NHWC"})
    brew.conv_transpose(model, "x", "up", 6, 3, 2, stride=2)
    w, b = model.param_init_net.Proto().op
    assert (w.type, list(args_of(w)["shape"])) == ("XavierFill", [6, 2, 2, 3])
    assert list(args_of(b)["shape"]) == [3]
    (op,) = model.net.Proto().op
    assert arg_names(op) == ["kernel", "order", "stride", "exhaustive_search"]
    assert model.weights == ["up_w"] and model.biases == ["up_b"]


def test_training_mode_normalization_outputs():
    model = model_helper.ModelHelper()
    out = brew.spatial_bn(model, "x", "bn", 3)
    in_out = brew.instance_norm(model, "x", "in", 3)
    bn, inorm = model.net.Proto().op
    assert str(out) == "bn" and str(in_out) == "in"
    assert list(bn.input) == ["x", "bn_s", "bn_b", "bn_rm", "bn_riv"]
    assert list(bn.output) == ["bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv"]
    assert list(inorm.output) == ["in", "in_sm", "in_siv"]
    fills = [(o.output[0], args_of(o).get("value")) for o in model.param_init_net.Proto().op]
    assert fills == [
        ("bn_s", 1.0), ("bn_b", 0.0), ("bn_rm", 0.0), ("bn_riv", 1.0), ("in_s", 1.0), ("in_b", 0.0),
    ]  # fmt: skip
    assert model.GetComputedParams() == ["bn_rm", "bn_riv"]


def test_lrn_on_gpu_uses_cudnn_with_one_output():
    model = model_helper.ModelHelper()
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        out = brew.lrn(model, "x", "n", size=3)
    brew.lrn(model, "x", "m", size=3)
    gpu, cpu = model.net.Proto().op
    assert str(out) == "n" and list(gpu.output) == ["n"] and gpu.engine == "CUDNN"
    assert list(cpu.output) == ["m", "_m_scale"] and not cpu.HasField("engine")


def test_dropout_concat_and_depth_concat():
    model = model_helper.ModelHelper()
    with pytest.raises(AssertionError, match="is_test"):
        brew.dropout(model, "x", "d")
    brew.dropout(model, "x", "d", ratio=0.2, is_test=False, use_cudnn=False)
    brew.concat(model, ["a", "b"], "c", axis=2)
    brew.depth_concat(model, ["a", "b"], "dc")
    drop, cat, dcat = model.net.Proto().op
    assert drop.engine == "DEFAULT" and list(drop.output) == ["d", "_d_mask"]
    assert arg_names(cat) == ["use_cudnn", "cudnn_exhaustive_search", "axis"]
    assert list(dcat.output) == ["dc", "_dc_concat_dims"] and args_of(dcat)["order"] == b"NCHW"


def test_small_helpers():
    model = model_helper.ModelHelper()
    brew.tanh(model, "x", "t")
    brew.transpose(model, "x", "tr", axes=[1, 0], use_cudnn=False)
    brew.mat_mul(model, ["a", "b"], "mm")
    brew.batch_mat_mul(model, ["a", "b"], "bmm", enable_tensor_core=True)
    brew.reduce_sum(model, "x", "rs", axes=[0])
    brew.sub(model, ["a", "b"], "s")
    brew.elementwise_linear(model, "x", "el", 4)
    it = brew.iter(model, "it")
    brew.accuracy(model, ["pred", "label"], "acc", top_k=1)
    assert op_types(model.net) == [
        "Tanh", "Transpose", "MatMul", "BatchMatMul", "ReduceSum", "Sub", "ElementwiseLinear",
        "Iter", "Accuracy",
    ]  # fmt: skip
    ops = model.net.Proto().op
    assert ops[0].engine == "CUDNN" and not ops[1].HasField("engine")
    assert ops[3].engine == "TENSORCORE"
    assert list(ops[8].input) == ["pred", "label"] and len(ops[8].arg) == 0
    assert str(it) == "it" and list(ops[7].input) == ["it"]
    init = model.param_init_net.Proto().op
    assert [o.output[0] for o in init] == ["el_w", "el_b", "it"]
    # brew.iter passes the model's arg_scope on, to the fill and to Iter (as Caffe2 does).
    assert arg_names(init[2]) == [
        "shape", "value", "dtype", "order", "use_cudnn", "cudnn_exhaustive_search",
    ]  # fmt: skip
    assert args_of(init[2])["dtype"] == core.DataType.INT64
    assert arg_names(ops[7]) == ["order", "use_cudnn", "cudnn_exhaustive_search"]
    assert init[2].device_option.device_type == caffe2_pb2.CPU
    assert model.weights == ["el_w"] and model.biases == ["el_b"]


def test_prelu_slope_parameter():
    model = model_helper.ModelHelper()
    brew.prelu(model, "x", "p", num_channels=3, slope_init=("ConstantFill", {"value": 0.1}))
    (fill,) = model.param_init_net.Proto().op
    assert args_of(fill) == {"shape": [3], "value": pytest.approx(0.1)}
    (op,) = model.net.Proto().op
    assert list(op.input) == ["x", "p_slope"] and len(op.arg) == 0
    assert model.params == ["p_slope"] and model.weights == []


def test_helpers_use_name_scope_for_params_and_outputs():
    model = model_helper.ModelHelper()
    with scope.NameScope("tower"):
        brew.fc(model, "x", "fc", 2, 2)
        brew.spatial_bn(model, "fc", "bn", 2, is_test=False)
    assert model.GetParams("tower") == ["tower/fc_w", "tower/fc_b", "tower/bn_s", "tower/bn_b"]
    assert model.GetParams("other") == []
    assert model.GetComputedParams("tower/") == ["tower/bn_rm", "tower/bn_riv"]
    with scope.NameScope("tower"):
        assert len(model.GetAllParams()) == 6
    fc, bn = model.net.Proto().op
    assert list(fc.input) == ["tower/x", "tower/fc_w", "tower/fc_b"]
    assert list(bn.output)[3:] == ["tower/bn_sm", "tower/bn_siv"]


# --------------------------------------------------------------------------- model helper
def test_model_helper_defaults():
    model = model_helper.ModelHelper()
    assert model.get_name() == "model" and model.net.Name() == "model"
    assert model.param_init_net.Name() == "model_init"
    assert model.arg_scope == {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}
    assert model.Proto() is model.net.Proto() and model.InitProto() is model.param_init_net.Proto()
    shared = model_helper.ModelHelper(name="test", param_model=model)
    brew.fc(shared, "x", "fc", 2, 2)
    assert model.params == ["fc_w", "fc_b"] and shared.param_init_net is model.param_init_net


def test_model_op_forwarding(caplog):
    model = model_helper.ModelHelper(name="fwd")
    with caplog.at_level(logging.WARNING):
        out = model.Sigmoid("x", "y")
        assert caplog.records == []
        model.Relu("y", "z")
    assert "does not recognize: Relu" in caplog.text
    assert str(out) == "y" and op_types(model.net) == ["Sigmoid", "Relu"]
    strict = model_helper.ModelHelper(name="strict", allow_not_known_ops=False)
    with pytest.raises(AttributeError, match="Operator Relu is not known to be safe"):
        strict.Relu("x", "y")
    with pytest.raises(AttributeError, match="is not a registered operator. Did you mean"):
        _ = model.Reluu
    assert "Softmax" in dir(model) and "Relu" not in dir(model)


def test_create_param_reuses_scopes_and_sharing():
    model = model_helper.ModelHelper()
    init = initializers.Initializer("ConstantFill", value=2.0)
    w = model.create_param("w", [2], init, tags=ParameterTags.WEIGHT)
    assert model.create_param("w", [2], init) is w
    with pytest.raises(AssertionError):
        model.create_param("w", [3], init)
    with scope.NameScope("a"):
        aw = model.create_param("w", [2], init)
    with ParameterSharing({"b": "a"}), scope.NameScope("b"):
        assert model.create_param("w", [2], init) is aw
    # The scopes are relative to the name scope the sharing is entered in.
    with scope.NameScope("g"):
        gw = model.create_param("w", [2], init)
        with ParameterSharing({"t0": ""}), scope.NameScope("t0"):
            assert model.create_param("w", [2], init) is gw
    with pytest.raises(AssertionError, match="is prefix of"):
        with ParameterSharing({"b": "b/c"}):
            pass
    with scope.NameScope("s"):
        explicit = model.create_param(core.BlobReference("plain"), [1], init)
    assert str(explicit) == "plain"
    with pytest.raises(TypeError, match="Unsupported type for param_name"):
        model.create_param(3, [1], init)
    assert [str(p) for p in model.params] == ["w", "a/w", "g/w", "plain"]
    assert [o.output[0] for o in model.param_init_net.Proto().op] == ["w", "a/w", "g/w", "plain"]
    info = model.get_param_info(w)
    assert isinstance(info, ParameterInfo) and info.shape == [2] and info.size == 2
    with pytest.raises(AssertionError, match="is not a BlobReference"):
        model.get_param_info("w")


def test_use_optimizer_attaches_optimizer_by_tag():
    model = model_helper.ModelHelper()
    weight_opt = optimizer.SgdOptimizer(0.5)
    default_opt = optimizer.AdagradOptimizer(0.1)
    with UseOptimizer({"WEIGHT": weight_opt, "DEFAULT": default_opt}):
        brew.fc(model, "x", "fc", 2, 2)
    assert model.get_param_info(core.BlobReference("fc_w")).optimizer is weight_opt
    assert model.get_param_info(core.BlobReference("fc_b")).optimizer is default_opt
    brew.fc(model, "x", "fc2", 2, 2)
    assert model.get_param_info(core.BlobReference("fc2_w")).optimizer is None


def test_validate_and_gradient_preconditions():
    model = model_helper.ModelHelper()
    model.AddParameter(core.BlobReference("p"))
    model.AddParameter(core.BlobReference("q"))
    model.AddParameter(core.BlobReference("p"))
    assert model._Validate() == ["p"]
    with pytest.raises(AssertionError, match=r"Duplicate params: \['p'\]"):
        model.Validate()
    with pytest.raises(RuntimeError, match="AddGradientOperators first"):
        model.GetOptimizationParamInfo()
    with pytest.raises(RuntimeError, match="AddGradientOperators first"):
        model.get_param_to_grad(model.params)


def test_add_gradient_operators_fills_param_to_grad():
    model = model_helper.ModelHelper()
    fc = brew.fc(model, "x", "fc", 3, 2)
    extra = model.param_init_net.ConstantFill([], "scale", shape=[2], value=1.0)
    model.AddParameter(extra)
    y = model.net.Mul([fc, extra], "y")
    loss = model.net.SumElements(y, "loss")
    grad_map = model.AddGradientOperators([loss])
    assert model.param_to_grad == {"fc_w": "fc_w_grad", "fc_b": "fc_b_grad", "scale": "scale_grad"}
    assert grad_map["x"] == "x_grad"
    infos = model.GetOptimizationParamInfo()
    assert [(i.name, str(i.grad)) for i in infos] == [
        ("fc_w", "fc_w_grad"), ("fc_b", "fc_b_grad"), ("scale", "scale_grad"),
    ]  # fmt: skip
    # A parameter not created by create_param gets its ParameterInfo here.
    assert infos[2].param_id is None and infos[2].shape is None
    assert [i.name for i in model.GetOptimizationParamInfo([model.params[1]])] == ["fc_b"]
    with pytest.raises(RuntimeError, match="twice"):
        model.AddGradientOperators([loss])


def test_get_complete_net_round_trip():
    model = model_helper.ModelHelper(name="cm")
    brew.fc(model, "x", "fc", 3, 2)
    complete = model.GetCompleteNet()
    assert op_types(complete) == ["XavierFill", "ConstantFill", "FC"]
    assert complete.Proto().op[0].debug_info == "/param_init_net"
    model.ConstructInitTrainNetfromNet(complete)
    assert op_types(model.param_init_net) == ["XavierFill", "ConstantFill"]
    assert op_types(model.net) == ["FC"]


def test_extract_predictor_net_device_renames_and_disabled_inputs():
    model = mlp_train()
    model.net.Relu("other", "unused_branch")
    device = core.DeviceOption(caffe2_pb2.CUDA, 2)
    predict, params = model_helper.ExtractPredictorNet(
        model.net.Proto(),
        ["data"],
        ["softmax"],
        device=device,
        renames={"data": "input", "softmax": "prob"},
    )
    ops = predict.Proto().op
    assert [o.type for o in ops] == ["FC", "Relu", "FC", "Relu", "FC", "Softmax"]
    assert list(ops[0].input)[0] == "input" and list(ops[-1].output) == ["prob"]
    assert all(
        o.device_option.device_type == caffe2_pb2.CUDA and o.device_option.device_id == 2
        for o in ops
    )
    assert sorted(predict.Proto().external_output) == ["prob"]
    assert "input" in predict.Proto().external_input and "input" not in params
    with pytest.raises(Exception, match="No ops with input"):
        model_helper.ExtractPredictorNet(model.net.Proto(), ["nope"], ["softmax"])
    with pytest.raises(Exception, match="No ops with output"):
        model_helper.ExtractPredictorNet(model.net.Proto(), ["data"], ["nope"])
    trimmed, _ = model_helper.ExtractPredictorNet(
        model.net.Proto(), ["data"], ["softmax"], disabled_inputs=["fc2_w"]
    )
    assert [o.type for o in trimmed.Proto().op] == ["FC", "Relu"]


def test_extract_predictor_net_rejects_training_mode_ops():
    model = model_helper.ModelHelper(name="bn_train")
    brew.spatial_bn(model, "data", "bn", 2, is_test=False)
    with pytest.raises(Exception, match="is_test=0"):
        model_helper.ExtractPredictorNet(model.net.Proto(), ["data"], ["bn"])


# --------------------------------------------------------------------------- CNN helper
def test_cnn_model_helper_settings():
    with pytest.raises(ValueError, match="Cannot understand the CNN storage order"):
        cnn.CNNModelHelper(order="CHWN")
    model = cnn.CNNModelHelper(order="NHWC", use_cudnn=False, ws_nbytes_limit=128)
    assert model.name == "CNN"
    assert model.arg_scope == {
        "order": "NHWC", "use_cudnn": False, "cudnn_exhaustive_search": False, "ws_nbytes_limit": 128,
    }  # fmt: skip
    model.Conv("x", "c", 2, 4, 3)
    model.Relu("c", "c")
    model.Transpose("c", "t", axes=[0, 3, 1, 2])
    conv, relu, tr = model.net.Proto().op
    assert not conv.HasField("engine") and args_of(conv)["order"] == b"NHWC"
    assert arg_names(relu) == ["order", "cudnn_exhaustive_search", "ws_nbytes_limit"]
    assert not tr.HasField("engine")
    assert model.XavierInit == ("XavierFill", {}) and model.MSRAInit == ("MSRAFill", {})
    assert model.ConstantInit(2) == ("ConstantFill", {"value": 2}) and model.ZeroInit == (
        "ConstantFill",
        {},
    )
    assert model.GPU.device_type == caffe2_pb2.CUDA and model.CPU.device_type == caffe2_pb2.CPU


# ------------------------------------------------------------------------ optimizer units
def _init_and_net():
    return core.Net("init"), core.Net("train")


def test_build_unique_mutex_iter_is_created_once_on_cpu():
    init, net = _init_and_net()
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        it = utils.BuildUniqueMutexIter(init, net, iter_val=5)
    assert utils.BuildUniqueMutexIter(init, net) == it
    assert op_types(init) == ["ConstantFill", "CreateMutex"] and op_types(net) == ["AtomicIter"]
    fill = init.Proto().op[0]
    assert args_of(fill) == {"shape": [1], "value": 5, "dtype": core.DataType.INT64}
    for op in list(init.Proto().op) + list(net.Proto().op):
        assert op.device_option.device_type == caffe2_pb2.CPU
        assert list(op.device_option.extra_info) == ["device_type_override:cpu"]
    assert list(net.Proto().op[0].input) == ["iteration_mutex", "optimizer_iteration"]


def test_sgd_dense_update_and_lr_policy_arguments():
    init, net = _init_and_net()
    opt = optimizer.SgdOptimizer(0.1, policy="step", stepsize=10, gamma=0.5)
    opt(net, init, "w", "w_grad")
    opt(net, init, "b", "b_grad")
    assert op_types(net) == ["AtomicIter", "LearningRate", "WeightedSum", "WeightedSum"]
    lr = net.Proto().op[1]
    assert list(lr.output) == ["SgdOptimizer_0_lr_cpu"]
    assert args_of(lr) == {
        "base_lr": pytest.approx(-0.1),
        "policy": b"step",
        "stepsize": 10,
        "gamma": 0.5,
    }
    assert list(net.Proto().op[2].input) == ["w", "ONE_0_0", "w_grad", "SgdOptimizer_0_lr_cpu"]
    assert [o.output[0] for o in init.Proto().op] == [
        "optimizer_iteration", "iteration_mutex", "ONE_0_0", "ONE_0_0",
    ]  # fmt: skip
    assert opt.get_auxiliary_parameters().shared == ["ONE_0_0", "ONE_0_0"]
    assert optimizer.SgdOptimizer(0.1).get_cpu_blob_name("lr") == "SgdOptimizer_1_lr_cpu"
    optimizer.reset_optimizer_instance_count()
    assert optimizer.SgdOptimizer(0.1).get_cpu_blob_name("lr") == "SgdOptimizer_0_lr_cpu"


def test_sgd_momentum_dense_and_sparse():
    init, net = _init_and_net()
    opt = optimizer.SgdOptimizer(0.05, momentum=0.9, nesterov=False)
    opt(net, init, "w", "w_grad")
    opt(net, init, "emb", core.GradientSlice("idx", "emb_grad_values"))
    lr, dense, sparse = net.Proto().op[1:]
    assert args_of(lr)["base_lr"] == pytest.approx(0.05)
    assert (dense.type, list(dense.input), list(dense.output)) == (
        "MomentumSGDUpdate", ["w_grad", "w_momentum", "SgdOptimizer_0_lr_cpu", "w"],
        ["w_grad", "w_momentum", "w"],
    )  # fmt: skip
    assert args_of(dense) == {"momentum": pytest.approx(0.9), "nesterov": 0}
    assert sparse.type == "SparseMomentumSGDUpdate"
    assert list(sparse.input) == [
        "emb_grad_values", "emb_momentum", "SgdOptimizer_0_lr_cpu", "emb", "idx",
    ]  # fmt: skip
    momentum_fill = init.Proto().op[3]
    assert (list(momentum_fill.input), list(momentum_fill.output)) == (["w"], ["w_momentum"])
    assert opt.get_auxiliary_parameters().local == ["w_momentum", "emb_momentum"]


def test_sgd_sparse_with_dedup_and_zero_rate():
    init, net = _init_and_net()
    optimizer.SgdOptimizer(0.0)(net, init, "w", "w_grad")
    assert op_types(net) == [] and op_types(init) == []
    with pytest.raises(AssertionError, match="positive base learning rate"):
        optimizer.SgdOptimizer(-1.0)(net, init, "w", "w_grad")
    opt = optimizer.SgdOptimizer(0.1, sparse_dedup_aggregator="sum")
    opt(net, init, "emb", core.GradientSlice("idx", "vals"))
    unique, segment_sum, scatter = net.Proto().op[2:]
    assert (unique.type, unique.engine) == ("Unique", "SparseHash")
    assert segment_sum.type == "UnsortedSegmentSum"
    assert scatter.type == "ScatterWeightedSum"
    assert list(scatter.input) == [
        "emb",
        "ONE_0_0",
        unique.output[0],
        segment_sum.output[0],
        "SgdOptimizer_2_lr_cpu",  # the third SgdOptimizer of the test
    ]


def test_optimizer_blob_names_follow_the_device_scope():
    init, net = _init_and_net()
    opt = optimizer.SgdOptimizer(0.1)
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1, node_name="n")):
        opt(net, init, "w", "w_grad")
    lr = net.Proto().op[1]
    assert list(lr.output) == ["SgdOptimizer_0_lrn_gpu1"]
    assert init.Proto().op[2].output[0] == "ONE_1_1n"
    assert net.Proto().op[0].device_option.device_type == caffe2_pb2.CPU


def test_multi_precision_sgd_falls_back_for_float32_params():
    init, net = _init_and_net()
    opt = optimizer.MultiPrecisionSgdOptimizer(0.1)
    opt(net, init, "w", "w_grad")
    assert op_types(net) == ["AtomicIter", "LearningRate", "WeightedSum"]
    assert list(net.Proto().op[1].output) == ["MultiPrecisionSgdOptimizer_0_lr_cpu"]


def test_weight_decay_builder():
    init, net = _init_and_net()
    optimizer.WeightDecayBuilder(1e-4)(net, init, "w", "w_grad")
    (op,) = net.Proto().op
    assert (op.type, list(op.input), list(op.output)) == (
        "WeightedSum", ["w_grad", "ONE_0_0", "w", "wd_0_0"], ["w_grad"],
    )  # fmt: skip
    assert args_of(init.Proto().op[1])["value"] == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="sparse gradients"):
        optimizer.WeightDecayBuilder(1e-4)(net, init, "e", core.GradientSlice("i", "v"))


def test_adagrad_dense_sparse_and_weight_decay():
    init, net = _init_and_net()
    init.XavierFill([], "w", shape=[4, 3])
    init.ConstantFill([], "b", shape=[4])
    opt = optimizer.AdagradOptimizer(alpha=0.2, epsilon=1e-6, weight_decay=0.01)
    opt(net, init, "w", "w_grad")
    opt(net, init, "b", "b_grad")
    opt(net, init, "w", core.GradientSlice("idx", "vals"))
    lr, dense_w, dense_b, sparse = net.Proto().op[1:]
    assert args_of(lr)["base_lr"] == pytest.approx(-0.2)
    assert list(lr.output) == ["AdagradOptimizer_0_lr_cpu"]
    assert dense_w.type == "Adagrad" and dense_w.HasField("engine") and dense_w.engine == ""
    assert list(dense_w.input) == ["w", "w_squared_sum", "w_grad", "AdagradOptimizer_0_lr_cpu"]
    assert arg_names(dense_w) == ["epsilon", "decay", "weight_decay"]
    assert arg_names(dense_b) == ["epsilon", "decay"]  # no decay for 1-d parameters
    assert sparse.type == "SparseAdagrad"
    assert list(sparse.input) == ["w", "w_squared_sum", "idx", "vals", "AdagradOptimizer_0_lr_cpu"]
    assert arg_names(sparse) == ["epsilon", "weight_decay"]
    fill = init.Proto().op[4]
    assert (fill.type, list(fill.input), list(fill.output)) == (
        "ConstantFill",
        ["w"],
        ["w_squared_sum"],
    )
    out = optimizer.AdagradOptimizer(0.1, output_effective_lr_and_update=True)
    out(net, init, "b", "b_grad")
    assert list(net.Proto().op[-1].output) == ["b", "b_squared_sum", "b_effective_lr", "b_update"]
    with pytest.raises(ValueError, match="unsupported options"):
        optimizer.AdagradOptimizer(swa_options={"swa_avg_start_it": 1})


def test_adam_dense_and_sparse():
    init, net = _init_and_net()
    opt = optimizer.AdamOptimizer(alpha=0.01, beta1=0.8)
    opt(net, init, "w", "w_grad")
    opt(net, init, "e", core.GradientSlice("idx", "vals"))
    lr, adam, sparse = net.Proto().op[1:]
    assert list(adam.input) == [
        "w", "w_first_moment", "w_second_moment", "w_grad", "AdamOptimizer_0_lr_cpu",
        "optimizer_iteration",
    ]  # fmt: skip
    assert list(adam.output) == ["w", "w_first_moment", "w_second_moment"]
    assert args_of(adam) == {
        "beta1": pytest.approx(0.8),
        "beta2": pytest.approx(0.999),
        "epsilon": pytest.approx(1e-8),
    }
    assert sparse.type == "SparseAdam"
    assert list(sparse.input)[3:5] == ["idx", "vals"]
    assert arg_names(sparse) == ["beta1", "beta2", "epsilon", "enableRAdam"]
    aux = opt.get_auxiliary_parameters()
    assert aux.shared == ["optimizer_iteration", "optimizer_iteration"]
    assert aux.local == ["w_first_moment", "w_second_moment", "e_first_moment", "e_second_moment"]
    with pytest.raises(ValueError, match="Smart decay"):
        optimizer.AdamOptimizer(use_smart_decay=True, rowWise=True)


def test_lr_multipliers():
    init, net = _init_and_net()
    opt = optimizer.SgdOptimizer(0.1)
    opt.add_lr_multiplier("mult")
    opt(net, init, "w", "w_grad")
    assert op_types(net) == ["AtomicIter", "LearningRate", "CopyFromCPUInput", "Mul", "WeightedSum"]
    copy, mul, update = net.Proto().op[2:]
    assert list(copy.output) == ["SgdOptimizer_0_lr_multiplier_cpu"]
    assert list(mul.output) == ["SgdOptimizer_0_scaled_lr_cpu"] and args_of(mul) == {"broadcast": 1}
    assert update.input[3] == "SgdOptimizer_0_scaled_lr_cpu"


def test_get_param_device():
    cpu = core.DeviceOption(caffe2_pb2.CPU)
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 1)
    devices = {"w": gpu, "g_vals": cpu}
    assert optimizer.get_param_device("w", "w_grad", devices) is gpu
    assert optimizer.get_param_device("e", core.GradientSlice("i", "g_vals"), devices) is cpu
    assert optimizer.get_param_device("x", "x_grad", devices, default_device=gpu) is gpu
    with pytest.raises(AssertionError, match="Cannot infer device for x"):
        optimizer.get_param_device("x", "x_grad", devices)


# ---------------------------------------------------------------- optimizer through models
def _small_model(name="m"):
    model = model_helper.ModelHelper(name=name)
    x = brew.fc(model, "data", "fc1", 4, 3)
    x = brew.relu(model, x, x)
    x = brew.fc(model, x, "fc2", 3, 2)
    loss = model.net.SumElements(x, "loss")
    model.AddGradientOperators([loss])
    return model


def test_build_sgd_updates_every_param_in_order():
    model = _small_model()
    opt = optimizer.build_sgd(model, 0.1, policy="fixed")
    assert isinstance(opt, optimizer.SgdOptimizer)
    updates = [op for op in model.net.Proto().op if op.type == "WeightedSum"]
    assert [u.output[0] for u in updates] == ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
    assert [u.input[2] for u in updates] == ["fc1_w_grad", "fc1_b_grad", "fc2_w_grad", "fc2_b_grad"]
    # Ops without a device option give an empty DeviceScope: the CPU names.
    assert updates[0].input[1] == "ONE_0_0"


def test_build_sgd_with_gradient_clipping_and_lr_injection():
    model = _small_model()
    optimizer.build_sgd(model, 0.1, max_gradient_norm=1.0, allow_lr_injection=True)
    types = op_types(model.net)
    start = types.index("SumSqrElements")
    assert types[start : start + 12] == [
        "SumSqrElements", "EnsureCPUOutput", "SumSqrElements", "EnsureCPUOutput",
        "SumSqrElements", "EnsureCPUOutput", "SumSqrElements", "EnsureCPUOutput",
        "Sum", "Pow", "Max", "Div",
    ]  # fmt: skip
    ops = model.net.Proto().op
    assert ops[start].output[0] == "norm_clipped_grad_update/grad_0_squared_sum"
    assert ops[start + 11].output[0] == "norm_clipped_grad_update/norm_ratio"
    mul = ops[start + 12]
    assert mul.type == "Mul" and list(mul.input) == [
        "norm_clipped_grad_update/norm_ratio",
        "lr_injection",
    ]
    init_outputs = [o.output[0] for o in model.param_init_net.Proto().op]
    assert "norm_clipped_grad_update/clip_norm" in init_outputs and "lr_injection" in init_outputs
    scaled = [o for o in ops if o.type == "Mul" and o.output[0] == "SgdOptimizer_0_scaled_lr_cpu"]
    assert len(scaled) == 4


def test_add_weight_decay_only_touches_weights():
    model = _small_model()
    optimizer.add_weight_decay(model, 1e-3)
    decays = [op for op in model.net.Proto().op if op.type == "WeightedSum"]
    assert [d.output[0] for d in decays] == ["fc1_w_grad", "fc2_w_grad"]
    brew.add_weight_decay(model, 0.0)
    brew.add_weight_decay(model, 1e-3)
    decays = [op for op in model.net.Proto().op if op.type == "WeightedSum"]
    assert list(decays[-1].input) == ["fc2_w_grad", "ONE", "fc2_w", "wd"]


def test_skip_sparse_optim_and_param_info_optimizers():
    model = model_helper.ModelHelper(name="sp", skip_sparse_optim=True)
    emb = model.param_init_net.GaussianFill([], "emb", shape=[10, 4])
    model.AddParameter(emb)
    special = optimizer.AdagradOptimizer(0.3)
    with UseOptimizer({"WEIGHT": special}):
        x = brew.fc(model, model.net.Gather([emb, "ids"], "g"), "fc", 4, 2)
    model.AddGradientOperators([model.net.SumElements(x, "loss")])
    assert isinstance(model.param_to_grad["emb"], core.GradientSlice)
    assert [i.name for i in model.GetOptimizationParamInfo()] == ["fc_w", "fc_b"]
    optimizer.build_sgd(model, 0.1)
    types = op_types(model.net)
    assert types.count("Adagrad") == 1 and types.count("WeightedSum") == 1
    assert "ScatterWeightedSum" not in types


def test_parameter_info_cloned_init_net_and_deprecated_param_api(caplog):
    model = model_helper.ModelHelper(name="pi")
    brew.fc(model, "x", "fc", 3, 2)
    info = model.get_param_info(model.params[0])
    init_net, blob = info.cloned_init_net()
    assert op_types(init_net) == ["XavierFill"] and str(blob) == "param_None_fc_w_init/fc_w"
    assert info.cloned_init_net()[0] is init_net
    assert info.grad_type() is None
    info.grad = core.GradientSlice("i", "v")
    assert info.grad_type() == "sparse"
    extra = model.param_init_net.ConstantFill([], "extra", shape=[5, 2], value=1.0)
    with caplog.at_level(logging.WARNING):
        deprecated = model.add_param_DEPRECATED(extra)
    assert "DEPRECATED" in caplog.text
    assert (deprecated.param_id, deprecated.shape, deprecated.size) == (2, [5, 2], 10)
    assert [i.name for i in model._param_info_deprecated] == ["fc_w", "fc_b", "extra"]
    with pytest.raises(AssertionError, match="optimizer has already been set"):
        info.optimizer = optimizer.SgdOptimizer(0.1)
        info.optimizer = optimizer.SgdOptimizer(0.1)


def test_run_all_on_gpu_and_external_initializer_names():
    model = model_helper.ModelHelper(name="gpu")
    brew.fc(model, "x", "fc", 3, 2)
    model.RunAllOnGPU(gpu_id=1)
    for net in (model.net, model.param_init_net):
        option = net.Proto().device_option
        assert (option.device_type, option.device_id) == (caffe2_pb2.CUDA, 1)
    init_net = core.Net("ext")
    with scope.NameScope("s"):
        by_name = initializers.ExternalInitializer().create_param("w", init_net, [1])
        by_ref = initializers.ExternalInitializer().create_param(
            core.BlobReference("w"), init_net, [1]
        )
    assert (str(by_name.blob), str(by_ref.blob)) == ("s/w", "w")
    assert by_name.blob.Net() is init_net and len(init_net.Proto().op) == 0
    with pytest.raises(Exception, match="overwrites are not allowed"):
        initializers.Initializer("XavierFill").update("MSRAFill", {})
    lazy = initializers.Initializer()
    lazy.update("MSRAFill", {"std": 1})
    assert (lazy.operator_name, lazy.operator_kwargs) == ("MSRAFill", {"std": 1})


# ------------------------------------------------------------ one training step, run
def _one_step(build):
    """Build a one-FC model with loss SumElements(FC(ones[3, 4])), run the init net and one
    training step; returns (fc_w before, fc_w after, fc_b after). The gradients are 3 for
    every weight and bias (three rows of ones)."""
    from ferrocaffe import workspace

    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="step")
    x = brew.fc(model, "data", "fc", 4, 2)
    model.AddGradientOperators([model.net.SumElements(x, "loss")])
    build(model)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("data", np.ones((3, 4), np.float32))
    before = workspace.FetchBlob("fc_w").copy()
    workspace.RunNetOnce(model.net)
    return before, workspace.FetchBlob("fc_w"), workspace.FetchBlob("fc_b")


@pytest.mark.parametrize(
    "build, expected_step",
    [
        # w -= lr * g
        (lambda m: optimizer.build_sgd(m, 0.1), 0.3),
        # Nesterov momentum from zero: (1 + mu) * lr * g
        (lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9), 1.9 * 0.3),
        # Adagrad: lr * g / (sqrt(g^2) + eps)
        (lambda m: optimizer.build_adagrad(m, 0.1, epsilon=1e-4), 0.1 * 3 / (3 + 1e-4)),
        # Adam at iteration 1 (t = 2): lr * sqrt(1 - b2^2) / (1 - b1^2) * m1 / sqrt(m2)
        (
            lambda m: optimizer.build_adam(m, 0.1),
            0.1 * np.sqrt(1 - 0.999**2) / (1 - 0.9**2) * 0.3 / (np.sqrt(0.009) + 1e-8),
        ),
        # Clipping to norm 1: the global norm is sqrt(10 * 9)
        (lambda m: optimizer.build_sgd(m, 0.1, max_gradient_norm=1.0), 0.3 / np.sqrt(90.0)),
    ],
)
def test_one_training_step_moves_weights_as_caffe2(build, expected_step):
    before, after, bias = _one_step(build)
    np.testing.assert_allclose(before - after, expected_step, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(-bias, expected_step, rtol=1e-4, atol=1e-6)


def test_lr_injection_scales_the_step():
    def build(model):
        optimizer.build_sgd(model, 0.1, allow_lr_injection=True)
        from ferrocaffe import workspace

        workspace.RunNetOnce(model.param_init_net)
        assert optimizer.get_lr_injection().tolist() == [1.0]
        optimizer.set_lr_injection(0.5)
        assert optimizer.get_lr_injection().tolist() == [0.5]
        # The init net below would reset the injection: drop its fill.
        ops = [o for o in model.param_init_net.Proto().op if o.output[0] != "lr_injection"]
        del model.param_init_net.Proto().op[:]
        model.param_init_net.Proto().op.extend(ops)

    before, after, _ = _one_step(build)
    np.testing.assert_allclose(before - after, 0.15, rtol=1e-5)


def test_weight_decay_adds_to_the_gradient():
    before, after, bias = _one_step(
        lambda m: (optimizer.add_weight_decay(m, 0.1), optimizer.build_sgd(m, 0.1))
    )
    np.testing.assert_allclose(before - after, 0.1 * (3 + 0.1 * before), rtol=1e-4)
    np.testing.assert_allclose(-bias, 0.3, rtol=1e-5)  # biases are not decayed
