"""Hostile arguments and inputs: nothing a user sends aborts the process, hangs it, or panics.

Every case runs its op in a child process (an abort or a hang there fails the test instead of
killing pytest) through ``workspace.RunOperatorOnce``, then checks that the child's workspace
still runs an op. Sizes no memory can hold are a ``MemoryError`` naming the op and its output;
arithmetic that overflows is a ``RuntimeError``; zero-sized dimensions give empty outputs of
Caffe2's shape.

The "huge" sizes are past any address space (more than 2^47 bytes), so the allocation fails
on every machine, overcommitting or not.
"""

import json
import subprocess
import sys
import textwrap

import pytest

PRELUDE = textwrap.dedent(
    """
    import json
    import numpy as np
    from ferrocaffe import core, workspace

    f32 = np.float32

    def outcome(op_type, inputs, outputs, **args):
        workspace.ResetWorkspace()
        for name, value in inputs.items():
            workspace.FeedBlob(name, value)
        op = core.CreateOperator(op_type, list(inputs), outputs, **args)
        try:
            workspace.RunOperatorOnce(op)
            res = {"error": None, "shapes": [], "values": []}
            for o in outputs:
                y = np.asarray(workspace.FetchBlob(o))
                res["shapes"].append(list(y.shape))
                res["values"].append(y.ravel().tolist() if y.size <= 64 else None)
        except Exception as e:  # noqa: BLE001 - the class is what the test checks
            res = {"error": type(e).__name__, "message": str(e)}
        workspace.FeedBlob("alive_x", np.array([-1.0, 2.0], dtype=f32))
        workspace.RunOperatorOnce(core.CreateOperator("Relu", ["alive_x"], ["alive_y"]))
        res["alive"] = workspace.FetchBlob("alive_y").tolist() == [0.0, 2.0]
        print("RESULT " + json.dumps(res))
    """
)


def run_isolated(body: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"child died with {proc.returncode}:\n{proc.stderr[-3000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result from the child:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    res = json.loads(lines[-1][len("RESULT ") :])
    assert res["alive"], "the workspace no longer runs ops after the failure"
    return res


def assert_memory_error(res: dict, op_type: str, output: str):
    assert res["error"] == "MemoryError", res
    assert f"type {op_type}" in res["message"], res["message"]
    assert output in res["message"], res["message"]


# --- allocations sized by arguments or input values ----------------------------------------


def test_conv_with_a_huge_pad_is_a_memory_error():
    res = run_isolated(
        """
        outcome("Conv", {"X": np.ones((1, 1, 1, 1), f32), "W": np.ones((1, 1, 1, 1), f32)},
                ["Y"], kernel=1, pad=1 << 24)
        """
    )
    assert_memory_error(res, "Conv", "Y")


def test_conv_geometry_beyond_an_int_is_refused():
    for arg in ("pad", "stride", "dilation"):
        res = run_isolated(
            f"""
            outcome("Conv", {{"X": np.ones((1, 1, 3, 3), f32), "W": np.ones((1, 1, 1, 1), f32)}},
                    ["Y"], kernel=1, {arg}=1 << 40)
            """
        )
        assert res["error"] == "RuntimeError", (arg, res)
        assert "cannot be represented" in res["message"], res["message"]


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pooling_with_a_huge_kernel_and_pad_is_a_memory_error(op_type):
    res = run_isolated(
        f"""
        outcome("{op_type}", {{"X": np.ones((1, 1, 2, 2), f32)}}, ["Y"],
                kernel=1 << 30, pad=1 << 30)
        """
    )
    assert_memory_error(res, op_type, "Y")


@pytest.mark.parametrize(("op_type", "want"), [("MaxPool", 8.0), ("AveragePool", 4.0)])
def test_pooling_with_a_huge_kernel_over_a_small_output_runs(op_type, want):
    # The window buffer was sized kernel_h * kernel_w (2^48 indices, past any address space:
    # an abort) whatever the image.
    res = run_isolated(
        f"""
        outcome("{op_type}", {{"X": np.arange(9, dtype=f32).reshape(1, 1, 3, 3)}}, ["Y"],
                kernel=1 << 24, stride=1 << 24, pad=1 << 23)
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [[1, 1, 1, 1]]
    assert res["values"] == [[want]]


def test_pad_image_with_a_huge_pad_is_a_memory_error():
    res = run_isolated(
        """
        outcome("PadImage", {"X": np.ones((1, 1, 1, 1), f32)}, ["Y"], pad=1 << 24)
        """
    )
    assert_memory_error(res, "PadImage", "Y")


@pytest.mark.parametrize(
    ("op_type", "args"),
    [
        ("ConstantFill", "value=1.0"),
        ("ConstantFill", "value=3, dtype=core.DataType.INT64"),
        ("ConstantFill", "value='s', dtype=core.DataType.STRING"),
        ("UniformFill", "min=0.0, max=1.0"),
        ("XavierFill", ""),
        ("RangeFill", ""),
        ("Float16ConstantFill", "value=1.0"),
    ],
)
def test_fills_no_memory_holds_are_memory_errors(op_type, args):
    # 2^50 elements: the byte count fits a usize, the allocation fails.
    res = run_isolated(
        f"""
        outcome("{op_type}", {{}}, ["Y"], shape=[1 << 25, 1 << 25], {args})
        """
    )
    assert_memory_error(res, op_type, "Y")


def test_upsample_bilinear_with_a_huge_scale_is_a_memory_error():
    res = run_isolated(
        """
        outcome("UpsampleBilinear", {"X": np.ones((1, 1, 2, 2), f32)}, ["Y"],
                height_scale=1e12, width_scale=1e12)
        """
    )
    assert_memory_error(res, "UpsampleBilinear", "Y")


def test_sparse_to_dense_with_a_huge_index_is_a_memory_error():
    res = run_isolated(
        """
        outcome("SparseToDense", {"I": np.array([1 << 50], np.int64),
                                  "V": np.ones(1, f32)}, ["Y"])
        """
    )
    assert_memory_error(res, "SparseToDense", "Y")


def test_conv_transpose_with_a_huge_adj_is_a_memory_error():
    # adj must stay below the stride (Caffe2's check), so both are large.
    res = run_isolated(
        """
        outcome("ConvTranspose", {"X": np.ones((1, 1, 2, 2), f32),
                                  "W": np.ones((1, 1, 1, 1), f32)}, ["Y"],
                kernel=1, stride=1 << 30, adj=1 << 29)
        """
    )
    assert_memory_error(res, "ConvTranspose", "Y")


# --- loops bounded by the data -----------------------------------------------------------


def test_tile_with_huge_tiles_on_an_empty_tensor_returns_at_once():
    res = run_isolated(
        """
        outcome("Tile", {"X": np.ones((2, 0), f32)}, ["Y"], tiles=1 << 40, axis=0)
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [[2 << 40, 0]]


def test_tile_gradient_with_huge_tiles_on_an_empty_gradient_returns_at_once():
    res = run_isolated(
        """
        outcome("TileGradient", {"dY": np.ones((0, 0), f32)}, ["dX"], tiles=1 << 40, axis=0)
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [[0, 0]]


def test_tile_whose_output_dimension_overflows_is_refused():
    res = run_isolated(
        """
        outcome("Tile", {"X": np.ones((4, 0), f32)}, ["Y"], tiles=1 << 62, axis=0)
        """
    )
    assert res["error"] == "RuntimeError", res
    assert "overflows" in res["message"], res["message"]


def test_lengths_whose_sum_wraps_are_refused():
    # The sum wraps to 0, the number of rows: the segment loops would run 2^62 times each.
    res = run_isolated(
        """
        outcome("LengthsSum", {"D": np.ones((0, 0), f32),
                               "L": np.array([1 << 62] * 4, np.int64)}, ["Y"])
        """
    )
    assert res["error"] == "RuntimeError", res
    assert "overflows" in res["message"], res["message"]


def test_split_sizes_whose_sum_wraps_are_refused():
    res = run_isolated(
        """
        outcome("Split", {"X": np.ones((3, 0), f32)}, ["A", "B", "C"], axis=1,
                split=[(1 << 63) - 1, (1 << 63) - 1, 2])
        """
    )
    assert res["error"] == "RuntimeError", res
    assert "overflows" in res["message"], res["message"]


# --- zero-sized dimensions -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "x", "w", "y"),
    [
        # 0 output channels, with bias
        ("NHWC", (1, 3, 3, 2), (0, 1, 1, 2), (1, 3, 3, 0)),
        ("NCHW", (1, 2, 3, 3), (0, 2, 1, 1), (1, 0, 3, 3)),
        # 0 images
        ("NHWC", (0, 3, 3, 2), (4, 1, 1, 2), (0, 3, 3, 4)),
        ("NCHW", (0, 2, 3, 3), (4, 2, 1, 1), (0, 4, 3, 3)),
        # 0 rows of pixels
        ("NHWC", (1, 0, 3, 2), (4, 1, 1, 2), (1, 0, 3, 4)),
        ("NCHW", (1, 2, 0, 3), (4, 2, 1, 1), (1, 4, 0, 3)),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_with_zero_sized_dims_gives_an_empty_output(order, x, w, y, bias):
    res = run_isolated(
        f"""
        inputs = {{"X": np.ones({x}, f32), "W": np.ones({w}, f32)}}
        if {bias}:
            inputs["b"] = np.ones({w[0]}, f32)
        outcome("Conv", inputs, ["Y"], kernel=1, order="{order}")
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [list(y)]


@pytest.mark.parametrize(
    ("order", "x", "w", "dy"),
    [
        ("NHWC", (1, 3, 3, 2), (0, 1, 1, 2), (1, 3, 3, 0)),
        ("NCHW", (1, 2, 3, 3), (0, 2, 1, 1), (1, 0, 3, 3)),
        ("NHWC", (0, 3, 3, 2), (4, 1, 1, 2), (0, 3, 3, 4)),
    ],
)
def test_conv_gradient_with_zero_sized_dims_gives_zero_gradients(order, x, w, dy):
    res = run_isolated(
        f"""
        outcome("ConvGradient", {{"X": np.ones({x}, f32), "W": np.ones({w}, f32),
                                  "dY": np.ones({dy}, f32)}},
                ["dW", "db", "dX"], kernel=1, order="{order}")
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [list(w), [w[0]], list(x)]
    for vals in res["values"]:
        assert vals is not None and all(v == 0.0 for v in vals), res


@pytest.mark.parametrize(
    ("order", "x", "w", "y"),
    [
        ("NHWC", (1, 2, 2, 3), (3, 1, 1, 0), (1, 2, 2, 0)),
        ("NCHW", (1, 3, 2, 2), (3, 0, 1, 1), (1, 0, 2, 2)),
        ("NCHW", (0, 3, 2, 2), (3, 4, 1, 1), (0, 4, 2, 2)),
    ],
)
def test_conv_transpose_with_zero_sized_dims_gives_an_empty_output(order, x, w, y):
    cout = w[3] if order == "NHWC" else w[1]
    res = run_isolated(
        f"""
        outcome("ConvTranspose", {{"X": np.ones({x}, f32), "W": np.ones({w}, f32),
                                   "b": np.ones({cout}, f32)}},
                ["Y"], kernel=1, order="{order}")
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [list(y)]


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(("x", "y"), [((0, 2, 4, 4), (0, 2, 2, 2)), ((1, 0, 4, 4), (1, 0, 2, 2))])
def test_pooling_with_zero_sized_dims_gives_an_empty_output(op_type, x, y):
    res = run_isolated(
        f"""
        outcome("{op_type}", {{"X": np.ones({x}, f32)}}, ["Y"], kernel=2, stride=2)
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [list(y)]


@pytest.mark.parametrize(("n", "d"), [(2, 0), (0, 3)])
@pytest.mark.parametrize("seq", [True, False])
def test_lstm_unit_with_no_hidden_unit_or_no_row_gives_empty_outputs(n, d, seq):
    res = run_isolated(
        f"""
        inputs = {{"h": np.ones((1, {n}, {d}), f32), "c": np.ones((1, {n}, {d}), f32),
                   "g": np.ones((1, {n}, 4 * {d}), f32)}}
        if {seq}:
            inputs["len"] = np.full({n}, 2, np.int32)
        inputs["t"] = np.array([0], np.int32)
        outcome("LSTMUnit", inputs, ["h_t", "c_t"], sequence_lengths={int(seq)})
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [[1, n, d], [1, n, d]]


@pytest.mark.parametrize(("n", "d"), [(2, 0), (0, 3)])
def test_lstm_unit_gradient_with_no_hidden_unit_or_no_row_gives_empty_outputs(n, d):
    res = run_isolated(
        f"""
        s = (1, {n}, {d})
        inputs = {{"h": np.ones(s, f32), "c": np.ones(s, f32),
                   "g": np.ones((1, {n}, 4 * {d}), f32), "len": np.full({n}, 2, np.int32),
                   "t": np.array([0], np.int32), "h_t": np.ones(s, f32),
                   "c_t": np.ones(s, f32), "dh_t": np.ones(s, f32), "dc_t": np.ones(s, f32)}}
        outcome("LSTMUnitGradient", inputs, ["dh", "dc", "dg"])
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [[1, n, d], [1, n, d], [1, n, 4 * d]]


@pytest.mark.parametrize(("n", "d"), [(2, 0), (0, 3)])
def test_gru_unit_with_no_hidden_unit_or_no_row_gives_an_empty_output(n, d):
    res = run_isolated(
        f"""
        inputs = {{"h": np.ones((1, {n}, {d}), f32), "g": np.ones((1, {n}, 3 * {d}), f32),
                   "len": np.full({n}, 2, np.int32), "t": np.array([0], np.int32)}}
        outcome("GRUUnit", inputs, ["h_t"])
        """
    )
    assert res["error"] is None, res
    assert res["shapes"] == [[1, n, d]]
