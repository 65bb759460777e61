"""The RNN builders (ferrocaffe.recurrent, rnn_cell, gru_cell) rebuild exactly the nets Caffe2
built: every case of the golden rnn/ corpus (init net and main net with gradient ops, step nets
compared as parsed NetDefs) and the forward-only LSTM of the models/ corpus; plus the builder
options that the corpus does not cover, checked against Caffe2's naming and op layout."""

import base64
import json
from pathlib import Path

import pytest
from conftest import golden_path, side_file
from google.protobuf import text_format

from ferrocaffe import core, gru_cell, recurrent, rnn_cell
from ferrocaffe.model_helper import ModelHelper
from ferrocaffe.proto import caffe2_pb2

REPO = Path(__file__).resolve().parents[1]
GOLDEN = golden_path()

# The arguments recurrent_net adds for the backward pass only.
BACKWARD_ARGS = {
    "param",
    "backward_link_internal",
    "backward_link_external",
    "backward_link_offset",
    "outputs_with_grads",
    "recompute_blobs_on_backward",
    "param_grads",
    "backward_step_net",
}


def _load_cases(corpus):
    with open(GOLDEN / corpus / "cases.jsonl") as f:
        return [json.loads(line) for line in f]


RNN_CASES = {case["name"]: case for case in _load_cases("rnn")}


def _netdef(b64):
    net = caffe2_pb2.NetDef()
    net.ParseFromString(base64.b64decode(b64))
    return net


@pytest.fixture(autouse=True)
def fresh_net_names(monkeypatch):
    # The corpus was recorded with an empty registry of net names before each case.
    monkeypatch.setattr(core.Net, "_net_names_used", set())


# ----------------------------------------------------------------------------- comparison
def _first_difference(expected, actual, where):
    """A description of the first difference between two NetDefs (nested nets included),
    or None when they are equal."""
    if expected == actual:
        return None
    for field in ("name", "type", "num_workers"):
        if getattr(expected, field) != getattr(actual, field):
            return f"{where}.{field}: {getattr(expected, field)!r} != {getattr(actual, field)!r}"
    for field in ("external_input", "external_output"):
        if list(getattr(expected, field)) != list(getattr(actual, field)):
            return f"{where}.{field}:\n  {list(getattr(expected, field))}\n  {list(getattr(actual, field))}"
    if len(expected.op) != len(actual.op):
        return (
            f"{where}: {len(expected.op)} ops expected, got {len(actual.op)}: "
            f"{[op.type for op in expected.op]} vs {[op.type for op in actual.op]}"
        )
    for i, (exp_op, act_op) in enumerate(zip(expected.op, actual.op, strict=True)):
        if exp_op == act_op:
            continue
        exp_args = {a.name: a for a in exp_op.arg}
        act_args = {a.name: a for a in act_op.arg}
        for name, exp_arg in exp_args.items():
            act_arg = act_args.get(name)
            if act_arg is not None and exp_arg.HasField("n") and act_arg.HasField("n"):
                inner = _first_difference(exp_arg.n, act_arg.n, f"{where}.op[{i}].{name}")
                if inner is not None:
                    return inner
        return (
            f"{where}.op[{i}] ({exp_op.type}) differs:\n--- expected\n"
            f"{text_format.MessageToString(exp_op)}--- actual\n"
            f"{text_format.MessageToString(act_op)}"
        )
    return f"{where}: arguments or device option differ"


def assert_nets_equal(expected, actual, where="net"):
    difference = _first_difference(expected, actual, where)
    assert difference is None, difference


def _without_backward_args(op):
    stripped = caffe2_pb2.OperatorDef()
    stripped.CopyFrom(op)
    del stripped.arg[:]
    stripped.arg.extend(a for a in op.arg if a.name not in BACKWARD_ARGS)
    return stripped


# ------------------------------------------------------------------- golden case builders
def _loss(model, output):
    sq = model.net.Sqr(output, "sq")
    return model.net.AveragedLoss(sq, "loss")


def _build_lstm(case, forward_only):
    sizes, layers = case["sizes"], case["layers"]
    model = ModelHelper(name="rnn_case")
    states = [f"{s}{i}" for i in range(layers) for s in ("h", "c")]
    model.net.AddExternalInputs("input", "seq_lengths", *states)
    outputs = rnn_cell.LSTM(
        model,
        "input",
        "seq_lengths",
        states,
        dim_in=sizes["D"],
        dim_out=sizes["H"] if layers == 1 else [sizes["H"]] * layers,
        scope="lstm",
        forward_only=forward_only,
    )
    return model, _loss(model, outputs[0])


def _build_gru(case, forward_only):
    sizes = case["sizes"]
    model = ModelHelper(name="rnn_case")
    model.net.AddExternalInputs("input", "seq_lengths", "h0")
    outputs = gru_cell.GRU(
        model,
        "input",
        "seq_lengths",
        ["h0"],
        dim_in=sizes["D"],
        dim_out=sizes["H"],
        scope="gru",
        forward_only=forward_only,
    )
    return model, _loss(model, outputs[0])


def _build_custom_tanh(case, forward_only):
    model = ModelHelper(name="custom_rnn_case")
    step = core.Net("step")
    x_t, h_prev = step.AddExternalInputs("x_t", "h_prev")
    fc_t = step.FC([h_prev, "W", "b"], "fc_t", axis=2)
    s_t = step.Sum([fc_t, x_t], "s_t")
    h_t = step.Tanh(s_t, "h_t")
    step.AddExternalOutput(h_t)
    h_all, _h_last = recurrent.recurrent_net(
        net=model.net,
        cell_net=step,
        inputs=[(x_t, "input")],
        initial_cell_inputs=[(h_prev, "h_init")],
        links={h_prev: h_t},
        scope="custom",
        forward_only=forward_only,
    )
    return model, _loss(model, h_all)


BUILDERS = {"LSTM": _build_lstm, "GRU": _build_gru, "custom": _build_custom_tanh}


def build_case(name, forward_only):
    case = RNN_CASES[name]
    model, loss = BUILDERS[case["kind"]](case, forward_only)
    if not forward_only:
        model.AddGradientOperators([loss])
    return model


def test_every_golden_case_has_a_builder():
    assert len(RNN_CASES) == 6
    assert {case["kind"] for case in RNN_CASES.values()} <= set(BUILDERS)


@pytest.mark.parametrize("name", sorted(RNN_CASES))
def test_init_net_matches_golden(name):
    model = build_case(name, forward_only=True)
    assert_nets_equal(_netdef(RNN_CASES[name]["init_net_b64"]), model.param_init_net.Proto())
    if RNN_CASES[name]["kind"] != "custom":  # custom: W and b are fed, not model params
        assert [str(p) for p in model.params] == RNN_CASES[name]["params"]


@pytest.mark.parametrize("name", sorted(RNN_CASES))
def test_forward_ops_match_golden(name):
    """forward_only builds the golden forward ops, minus the backward arguments of the
    RecurrentNetwork op (the step net itself included)."""
    expected = _netdef(RNN_CASES[name]["main_net_b64"])
    actual = build_case(name, forward_only=True).net.Proto()
    assert len(actual.op) < len(expected.op)
    for i, op in enumerate(actual.op):
        golden = expected.op[i]
        if golden.type == "RecurrentNetwork":
            assert {a.name for a in golden.arg} >= BACKWARD_ARGS - {"recompute_blobs_on_backward"}
            golden = _without_backward_args(golden)
        assert op == golden, f"op {i}:\n{golden}\n!=\n{op}"
    assert list(actual.external_input) == list(expected.external_input)
    assert list(actual.external_output) == list(expected.external_output)


@pytest.mark.parametrize("name", sorted(RNN_CASES))
def test_main_net_with_gradients_matches_golden(name):
    model = build_case(name, forward_only=False)
    assert_nets_equal(_netdef(RNN_CASES[name]["main_net_b64"]), model.net.Proto())
    assert_nets_equal(_netdef(RNN_CASES[name]["init_net_b64"]), model.param_init_net.Proto())


def test_memory_optimization_recomputes_the_gates_on_backward():
    """LSTM(memory_optimization=True) on the lstm_1layer case: the gate ops run again at the
    start of the backward step, so the gates are no longer kept per timestep."""
    case = RNN_CASES["rnn.lstm_1layer"]
    model = ModelHelper(name="rnn_case")
    model.net.AddExternalInputs("input", "seq_lengths", "h0", "c0")
    rnn_cell.LSTM(
        model,
        "input",
        "seq_lengths",
        ("h0", "c0"),
        dim_in=case["sizes"]["D"],
        dim_out=case["sizes"]["H"],
        scope="lstm",
        memory_optimization=True,
    )
    golden = _args(_rnn_op_of(_netdef(case["main_net_b64"])))
    actual = _args(_rnn_op(model.net))
    assert list(actual["recompute_blobs_on_backward"].strings) == [b"lstm/gates_t"]
    step = golden["step_net"].n
    expected = caffe2_pb2.NetDef()
    expected.CopyFrom(golden["backward_step_net"].n)
    del expected.op[:]
    expected.op.extend(step.op[:2])  # FC and Sum of the gates
    expected.op.extend(golden["backward_step_net"].n.op)
    expected.external_input.remove("lstm/gates_t")
    assert_nets_equal(expected, actual["backward_step_net"].n, "backward_step_net")
    assert actual["step_net"].n == step


def test_forward_only_lstm_of_the_models_corpus():
    (case,) = [c for c in _load_cases("models") if c["family"] == "lstm_lm"]
    expected = _netdef(case["predict_net_b64"])
    model = ModelHelper(name="lstm_lm")
    embedded = model.net.Gather(["embedding", "tokens"], "embedded")
    hidden_all, hidden_last, cell_all, cell_last = rnn_cell.LSTM(
        model,
        embedded,
        "seq_lengths",
        ("h0", "c0"),
        dim_in=16,
        dim_out=32,
        scope="lstm",
        forward_only=True,
    )
    actual = model.net.Proto()
    assert len(actual.op) == 3
    for i in range(3):
        assert actual.op[i] == expected.op[i], f"op {i}"
    assert expected.op[3].input[0] == str(hidden_all)
    assert {str(hidden_last), str(cell_all), str(cell_last)} <= set(expected.external_output)


# ------------------------------------------------------------------ recurrent_net details
def _rnn_op_of(netdef):
    (op,) = [op for op in netdef.op if op.type == "RecurrentNetwork"]
    return op


def _rnn_op(net):
    return _rnn_op_of(net.Proto())


def _args(op):
    return {a.name: a for a in op.arg}


def _simple_step():
    step = core.Net("step")
    x_t, h_prev = step.AddExternalInputs("x_t", "h_prev")
    h_t = step.Add([h_prev, x_t], "h_t")
    step.AddExternalOutput(h_t)
    return step, x_t, h_prev, h_t


def test_recurrent_net_default_scope_and_timestep():
    net = core.Net("main")
    step, x_t, h_prev, h_t = _simple_step()
    outputs = recurrent.recurrent_net(
        net, step, [(x_t, "seq")], [(h_prev, "h0")], {h_prev: h_t}, forward_only=True
    )
    assert [str(o) for o in outputs] == ["h_t_all", "h_t_last"]
    op = _rnn_op(net)
    assert list(op.input) == ["seq", "h0"]
    assert list(op.output) == ["h_t_all", "h_t_last", "main/recurrent/step_workspaces"]
    args = _args(op)
    assert list(args["recurrent_states"].strings) == [b"main/recurrent/h_prev_states"]
    assert args["timestep"].s == b"timestep"
    assert args["step_net"].n.type == "simple"
    assert not BACKWARD_ARGS & set(args)


def test_recurrent_net_references_and_named_timestep():
    net = core.Net("main")
    step = core.Net("step")
    x_t, h_prev, t = step.AddExternalInputs("x_t", "h_prev", "t")
    h_t = step.FC([h_prev, "w", "b"], "h_t")
    step.Sum([h_t, x_t, "bias2"], h_t)
    step.AddExternalOutput(h_t)
    recurrent.recurrent_net(
        net,
        step,
        [(x_t, "seq")],
        [(h_prev, "h0")],
        {h_prev: h_t},
        timestep=t,
        scope="r",
        forward_only=True,
    )
    op = _rnn_op(net)
    # Blobs read from outside the step follow the sequence and the initial states.
    assert list(op.input) == ["seq", "h0", "w", "b", "bias2"]
    assert _args(op)["timestep"].s == b"t"
    assert list(_args(op)["initial_recurrent_state_ids"].ints) == [1]


def test_recurrent_net_accepts_one_input_sequence_only():
    step, x_t, h_prev, h_t = _simple_step()
    with pytest.raises(AssertionError, match="Only one input blob"):
        recurrent.recurrent_net(
            core.Net("main"), step, [(x_t, "a"), (x_t, "b")], [(h_prev, "h0")], {h_prev: h_t}
        )


def test_set_rnn_executor_config():
    op = core.CreateOperator("RecurrentNetwork", ["x"], ["y"])
    recurrent.set_rnn_executor_config(op, num_threads=4, max_cuda_streams=2)
    assert [(a.name, a.i) for a in op.arg] == [
        ("rnn_executor.num_threads", 4),
        ("rnn_executor.max_cuda_streams", 2),
    ]
    gradient_op = core.CreateOperator("RecurrentNetworkGradient", ["x"], ["y"])
    recurrent.set_rnn_executor_config(gradient_op, max_cuda_streams=3)
    assert [(a.name, a.i) for a in gradient_op.arg] == [("rnn_executor.max_cuda_streams", 3)]
    with pytest.raises(AssertionError):
        recurrent.set_rnn_executor_config(core.CreateOperator("Relu", ["x"], ["y"]))


# ------------------------------------------------------------------------- cell variants
def _step_net(model):
    return _args(_rnn_op(model.net))["step_net"].n


def _lstm_model(**kwargs):
    model = ModelHelper(name="m")
    outputs = rnn_cell.LSTM(
        model,
        "x",
        "lengths",
        ("h0", "c0"),
        dim_in=3,
        dim_out=4,
        scope="lstm",
        forward_only=True,
        **kwargs,
    )
    return model, outputs


def test_lstm_without_sequence_lengths_and_with_options():
    model = ModelHelper(name="m")
    rnn_cell.LSTM(
        model,
        "x",
        None,
        ("h0", "c0"),
        dim_in=3,
        dim_out=4,
        scope="lstm",
        forward_only=True,
        forget_bias=1.0,
        drop_states=True,
    )
    (unit,) = [op for op in _step_net(model).op if op.type == "LSTMUnit"]
    assert list(unit.input) == [
        "lstm/hidden_t_prev",
        "lstm/cell_t_prev",
        "lstm/gates_t",
        "timestep",
    ]
    assert [(a.name, a.f if a.name == "forget_bias" else a.i) for a in unit.arg] == [
        ("forget_bias", 1.0),
        ("drop_states", 1),
        ("sequence_lengths", 0),
    ]
    assert "lengths" not in _rnn_op(model.net).input


def test_lstm_return_params_and_initial_states_as_parameters():
    model = ModelHelper(name="m")
    result = rnn_cell.LSTM(
        model,
        "x",
        "lengths",
        None,
        dim_in=3,
        dim_out=4,
        scope="lstm",
        forward_only=True,
        return_params=True,
    )
    assert len(result) == 5
    assert result[4] == {
        "input": {"weights": "lstm/i2h_w", "biases": "lstm/i2h_b"},
        "recurrent": {"weights": "lstm/gates_t_w", "biases": "lstm/gates_t_b"},
    }
    init_ops = model.param_init_net.Proto().op
    assert [(op.type, op.output[0]) for op in init_ops[:2]] == [
        ("ConstantFill", "lstm/initial_hidden_state"),
        ("ConstantFill", "lstm/initial_cell_state"),
    ]
    assert list(_rnn_op(model.net).input[1:3]) == [
        "lstm/initial_hidden_state",
        "lstm/initial_cell_state",
    ]


def test_multi_layer_lstm_returns_every_layer_on_request():
    model = ModelHelper(name="m")
    result = rnn_cell.LSTM(
        model,
        "x",
        "lengths",
        ["h0", "c0", "h1", "c1", "h2", "c2"],
        dim_in=3,
        dim_out=[4, 5, 6],
        scope="deep",
        forward_only=True,
        return_last_layer_only=False,
    )
    assert len(result) == 12
    assert str(result[8]) == "deep/layer_2/hidden_state_all"
    step = _step_net(model)
    fcs = [op for op in step.op if op.type == "FC"]
    assert [op.output[0] for op in fcs] == [
        "deep/layer_0/gates_t",
        "deep/layer_1/i2h",
        "deep/layer_1/gates_t",
        "deep/layer_2/i2h",
        "deep/layer_2/gates_t",
    ]
    init = {op.output[0]: list(op.arg[0].ints) for op in model.param_init_net.Proto().op}
    assert init["deep/layer_2/i2h_w"] == [24, 5]
    assert init["deep/layer_2/gates_t_w"] == [24, 6]


def test_milstm_emits_multiplicative_integration():
    model = ModelHelper(name="m")
    rnn_cell.MILSTM(
        model, "x", "lengths", ("h0", "c0"), dim_in=3, dim_out=4, scope="mi", forward_only=True
    )
    step = _step_net(model)
    assert [op.type for op in step.op] == [
        "FC",
        "ElementwiseLinear",
        "Mul",
        "ElementwiseLinear",
        "Sum",
        "LSTMUnit",
    ]
    assert [op.output[0] for op in step.op] == [
        "mi/prev_t",
        "mi/alpha_by_input_t_plus_beta_h",
        "mi/alpha_by_input_t_plus_beta_h_by_prev_t",
        "mi/beta_i_by_input_t_plus_b",
        "mi/gates_t",
        "mi/hidden_t_intermediate",
    ]
    assert list(step.external_output) == ["mi/cell_t", "mi/hidden_t_intermediate"]
    init = model.param_init_net.Proto().op
    assert [(op.type, op.output[0]) for op in init] == [
        ("XavierFill", "mi/i2h_w"),
        ("ConstantFill", "mi/i2h_b"),
        ("XavierFill", "mi/prev_t_w"),
        ("ConstantFill", "mi/prev_t_b"),
        ("ConstantFill", "mi/alpha"),
        ("ConstantFill", "mi/beta1"),
        ("ConstantFill", "mi/beta2"),
        ("ConstantFill", "mi/b"),
    ]
    assert [op.arg[1].f for op in init[4:]] == [1.0, 1.0, 1.0, 0.0]
    # The op types the catalog records for Caffe2's rnn_cell.MILSTM (forward part).
    catalog = json.load(open(side_file("op-catalog.json")))["ops"]
    used = {t for t, o in catalog.items() if "rnn_cell.MILSTM" in o.get("used_by", [])}
    emitted = {
        op.type for net in (model.net.Proto(), step, model.param_init_net.Proto()) for op in net.op
    }
    assert emitted <= used


def test_layer_norm_lstm_normalises_the_gates():
    model = ModelHelper(name="m")
    rnn_cell.LayerNormLSTM(
        model, "x", "lengths", ("h0", "c0"), dim_in=3, dim_out=4, scope="ln", forward_only=True
    )
    step = _step_net(model)
    assert [op.type for op in step.op[:3]] == ["FC", "Sum", "LayerNorm"]
    assert step.op[2].input[0] == "ln/gates_t"
    assert step.op[2].output[0] == "ln/gates_t_norm"
    unit = step.op[-1]
    assert unit.type == "LSTMUnit"
    # The gates LSTMUnit reads are what brew.layer_norm returned (its last op's output).
    assert list(unit.input) == [
        "ln/hidden_t_prev",
        "ln/cell_t_prev",
        step.op[-2].output[0],
        "lengths",
        "timestep",
    ]
    assert list(unit.output) == ["ln/hidden_t", "ln/cell_t"]
    assert [a.name for a in unit.arg] == ["forget_bias", "drop_states"]


def test_basic_rnn_masks_finished_sequences():
    model = ModelHelper(name="m")
    hidden_all, hidden_last = rnn_cell.BasicRNN(
        model,
        "x",
        "lengths",
        ["h0"],
        dim_in=3,
        dim_out=4,
        scope="rnn",
        forward_only=True,
        activation="relu",
    )
    assert str(hidden_all) == "rnn/hidden_t_all"
    step = _step_net(model)
    assert [op.type for op in step.op] == [
        "FC",
        "Sum",
        "Relu",
        "CopyFromCPUInput",
        "GT",
        "LE",
        "Cast",
        "Cast",
        "Mul",
        "Mul",
        "Add",
    ]
    assert list(step.op[-1].output) == ["rnn/hidden_t"]
    with pytest.raises(RuntimeError, match="unknown activation"):
        rnn_cell.BasicRNNCell(3, 4, 0.0, False, activation="sigmoid")


def test_gru_linear_before_reset():
    model = ModelHelper(name="m")
    gru_cell.GRU(
        model,
        "x",
        None,
        ["h0"],
        dim_in=3,
        dim_out=4,
        scope="gru",
        forward_only=True,
        linear_before_reset=True,
    )
    step = _step_net(model)
    assert [op.type for op in step.op] == [
        "Split",
        "FC",
        "FC",
        "Sum",
        "Sigmoid",
        "FC",
        "Mul",
        "Sum",
        "Sum",
        "Concat",
        "GRUUnit",
    ]
    assert list(step.op[6].output) == ["gru/output_gate_t_mul"]
    assert list(step.op[-1].input) == ["gru/hidden_t_prev", "gru/gates_t", "timestep"]


def test_dropout_cell_on_the_output_sequence():
    model = ModelHelper(name="m")
    cell = rnn_cell.DropoutCell(
        rnn_cell.LSTMCell(3, 4, 0.0, False, name="lstm"),
        dropout_ratio=0.25,
        is_test=0,
        name="drop",
    )
    output, states = cell.apply_over_sequence(model, "x", "lengths", ["h0", "c0"])
    assert str(output) == "drop/lstm/hidden_state_all_with_dropout_mask0"
    dropout = model.net.Proto().op[-1]
    assert dropout.type == "Dropout"
    assert list(dropout.output) == [
        "drop/lstm/hidden_state_all_with_dropout_mask0",
        "drop/_lstm/hidden_state_all_with_dropout_mask0_mask",
    ]
    assert str(states[0]) == "lstm/hidden_state_all"


def test_multi_rnn_cell_residual_output():
    model = ModelHelper(name="m")
    cells = [rnn_cell.LSTMCell(4, 4, 0.0, False) for _ in range(3)]
    cell = rnn_cell.MultiRNNCell(
        cells, residual_output_layers=[1, 2], name="res", forward_only=True
    )
    assert cell.output_connected_layers == [0, 1, 2]
    output, _ = cell.apply_over_sequence(model, "x", None, ["h0", "c0", "h1", "c1", "h2", "c2"])
    assert str(output) == "res/residual_output_sequence"
    summed = model.net.Proto().op[-1]
    assert summed.type == "Sum"
    assert list(summed.input) == [
        "res/layer_0/hidden_state_all",
        "res/layer_1/hidden_state_all",
        "res/layer_2/hidden_state_all",
    ]
    residual = [op for op in _step_net(model).op if op.type == "Sum" and "residual" in op.output[0]]
    assert [list(op.input) for op in residual] == [
        ["res/layer_1/hidden_state", "res/layer_0/hidden_state"],
    ]


def test_static_unroll_shares_parameters_across_timesteps():
    model = ModelHelper(name="m")
    h0, c0, lengths = (core.BlobReference(b) for b in ("h0", "c0", "lengths"))
    result = rnn_cell.LSTM(
        model,
        "x",
        lengths,
        (h0, c0),
        dim_in=3,
        dim_out=4,
        scope="lstm",
        static_rnn_unroll_size=2,
    )
    ops = [(op.type, list(op.input), list(op.output)) for op in model.net.Proto().op]
    assert ops == [
        ("FC", ["x", "lstm/i2h_w", "lstm/i2h_b"], ["lstm/i2h"]),
        ("Split", ["lstm/i2h"], ["lstm/i2h_timestep_0", "lstm/i2h_timestep_1"]),
        ("FC", ["h0", "lstm/gates_t_w", "lstm/gates_t_b"], ["timestep_0/lstm/gates_t"]),
        ("Sum", ["timestep_0/lstm/gates_t", "lstm/i2h_timestep_0"], ["timestep_0/lstm/gates_t"]),
        (
            "LSTMUnit",
            ["h0", "c0", "timestep_0/lstm/gates_t", "lengths", "timestep_0/timestep"],
            ["timestep_0/lstm/hidden_state", "timestep_0/lstm/cell_state"],
        ),
        (
            "FC",
            ["timestep_0/lstm/hidden_state", "lstm/gates_t_w", "lstm/gates_t_b"],
            ["timestep_1/lstm/gates_t"],
        ),
        ("Sum", ["timestep_1/lstm/gates_t", "lstm/i2h_timestep_1"], ["timestep_1/lstm/gates_t"]),
        (
            "LSTMUnit",
            [
                "timestep_0/lstm/hidden_state",
                "timestep_0/lstm/cell_state",
                "timestep_1/lstm/gates_t",
                "lengths",
                "timestep_1/timestep",
            ],
            ["timestep_1/lstm/hidden_state", "timestep_1/lstm/cell_state"],
        ),
        (
            "Concat",
            ["timestep_0/lstm/hidden_state", "timestep_1/lstm/hidden_state"],
            ["lstm/hidden_state_concat", "lstm/hidden_state_concat_info"],
        ),
        (
            "Concat",
            ["timestep_0/lstm/cell_state", "timestep_1/lstm/cell_state"],
            ["lstm/cell_state_concat", "lstm/cell_state_concat_info"],
        ),
        ("ZeroGradient", ["timestep_1/lstm/hidden_state"], []),
        ("ZeroGradient", ["lstm/cell_state_concat"], []),
        ("ZeroGradient", ["timestep_1/lstm/cell_state"], []),
    ]
    assert [str(r) for r in result] == [
        "lstm/hidden_state_concat",
        "timestep_1/lstm/hidden_state",
        "lstm/cell_state_concat",
        "timestep_1/lstm/cell_state",
    ]
    init = model.param_init_net.Proto().op
    assert [op.output[0] for op in init] == [
        "lstm/i2h_w",
        "lstm/i2h_b",
        "timestep_0/timestep",
        "lstm/gates_t_w",
        "lstm/gates_t_b",
        "timestep_1/timestep",
    ]
    timestep = init[5]
    assert timestep.type == "ConstantFill"
    assert timestep.device_option == core.DeviceOption(caffe2_pb2.CPU)
    assert [(a.name, a.i) for a in timestep.arg if a.name in ("value", "dtype")] == [
        ("value", 1),
        ("dtype", caffe2_pb2.TensorProto.INT32),
    ]


def test_lstm_param_names():
    assert rnn_cell.GetLSTMParamNames() == {
        "weights": ["input_gate_w", "forget_gate_w", "output_gate_w", "cell_w"],
        "biases": ["input_gate_b", "forget_gate_b", "output_gate_b", "cell_b"],
    }


def test_layered_lstm_stacks_one_op_per_layer():
    model = ModelHelper(name="m")
    output, last_output, all_states, last_state = rnn_cell.layered_LSTM(
        model, "x", "lengths", ("h0", "c0"), 3, [4, 5], "lstm", forward_only=True
    )
    rnn_ops = [op for op in model.net.Proto().op if op.type == "RecurrentNetwork"]
    assert len(rnn_ops) == 2
    assert list(rnn_ops[1].input[:3]) == [
        "lstm_layer_1/i2h",
        "lstm/hidden_state_last",
        "lstm/cell_state_last",
    ]
    assert str(output) == "lstm_layer_1/hidden_state_all"


def test_initial_state_count_must_match():
    with pytest.raises(Exception, match="Number of initial state values"):
        rnn_cell.LSTM(
            ModelHelper(name="m"),
            "x",
            None,
            ["h0"],
            dim_in=3,
            dim_out=4,
            scope="lstm",
            forward_only=True,
        )


def test_caffe2_module_names_resolve_to_the_rnn_modules():
    from ferrocaffe import compat

    was_installed = compat.is_installed()
    compat.install()
    try:
        from caffe2.python import gru_cell as c2_gru_cell
        from caffe2.python import recurrent as c2_recurrent
        from caffe2.python import rnn_cell as c2_rnn_cell

        assert c2_rnn_cell is rnn_cell
        assert c2_gru_cell is gru_cell
        assert c2_recurrent is recurrent
        assert c2_rnn_cell.LSTM.func is rnn_cell._LSTM
    finally:
        if not was_installed:
            compat.uninstall()


def _all_op_types(*nets):
    """Op types of the nets and of every net held in their ops' arguments."""
    types = set()
    pending = list(nets)
    while pending:
        net = pending.pop()
        for op in net.op:
            types.add(op.type)
            for arg in op.arg:
                if arg.HasField("n"):
                    pending.append(arg.n)
                pending.extend(arg.nets)
    return types


def _catalog_builder_ops(builder):
    catalog = json.load(open(side_file("op-catalog.json")))["ops"]
    return {t for t, o in catalog.items() if builder in o.get("used_by", [])}


@pytest.mark.parametrize(
    "builder, make, layers, forward_only",
    [
        ("rnn_cell.LSTM", rnn_cell.LSTM, 1, False),
        ("rnn_cell.LSTM(2 layers)", rnn_cell.LSTM, 2, False),
        ("rnn_cell.LSTM(forward_only)", rnn_cell.LSTM, 1, True),
        ("rnn_cell.MILSTM", rnn_cell.MILSTM, 1, False),
        ("gru_cell.GRU", gru_cell.GRU, 1, False),
    ],
)
def test_builders_emit_the_catalog_op_types(builder, make, layers, forward_only):
    """With a squared-mean loss (and its gradients unless forward_only), each builder emits
    exactly the op types the catalog recorded for Caffe2's."""
    model = ModelHelper(name="m")
    per_layer = 1 if make is gru_cell.GRU else 2
    states = [f"s{i}" for i in range(per_layer * layers)]
    outputs = make(
        model,
        "x",
        "lengths",
        states,
        dim_in=3,
        dim_out=[4] * layers,
        scope="rnn",
        forward_only=forward_only,
    )
    loss = _loss(model, outputs[0])
    if not forward_only:
        model.AddGradientOperators([loss])
    emitted = _all_op_types(model.net.Proto(), model.param_init_net.Proto())
    assert emitted == _catalog_builder_ops(builder)


def test_milstm_gradients_cover_every_parameter():
    model = ModelHelper(name="m")
    outputs = rnn_cell.MILSTM(model, "x", "lengths", ("h0", "c0"), dim_in=3, dim_out=4, scope="mi")
    model.AddGradientOperators([_loss(model, outputs[0])])
    args = _args(_rnn_op(model.net))
    step_params = ["mi/prev_t_w", "mi/prev_t_b", "mi/alpha", "mi/beta1", "mi/beta2", "mi/b"]
    assert [p + "_grad" for p in step_params] == [s.decode() for s in args["param_grads"].strings]
    op = _rnn_op(model.net)
    assert [op.input[i] for i in args["param"].ints] == step_params
    (gradient_op,) = [o for o in model.net.Proto().op if o.type == "RecurrentNetworkGradient"]
    assert set(gradient_op.output) >= {p + "_grad" for p in step_params}


@pytest.mark.parametrize(
    "method,args",
    [
        ("apply_override", (None, "x", None, [], "t")),
        ("get_state_names_override", ()),
        ("get_output_dim", ()),
    ],
)
def test_rnn_cell_base_methods_must_be_overridden(method, args):
    """Caffe2's RNNCell raises NotImplementedError from the methods a subclass must provide."""
    from ferrocaffe.rnn_cell.base import RNNCell

    class Partial(RNNCell):
        pass

    with pytest.raises(NotImplementedError, match=f"Partial.{method} is abstract in RNNCell"):
        getattr(Partial(name="p"), method)(*args)
