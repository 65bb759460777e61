"""Inputs for the numerical gradient checks of tests/test_gradient_checker_ops.py.

``SPECS`` maps an op type to its cases. A case builds one operator and its inputs; every
float input that has a gradient is checked (or the ``check`` indices). Inputs keep the op
differentiable around them: values stay a margin away from kinks (ReLU at 0, Clip at its
bounds, ties of Max/MaxPool/ReduceMax) so that a central difference of step ``STEP`` never
crosses one, and positive where the op needs it (Log, Sqrt, Pow).

``EXCLUDED`` lists op types that have a gradient maker and kernels but cannot be checked by
``GradientChecker.CheckSimple``, each with the reason.
"""

from dataclasses import dataclass, field

import numpy as np

from ferrocaffe.proto import caffe2_pb2

STEP = 0.01
THRESHOLD = 0.01
# Smallest distance kept between an input value and a kink (> STEP, with room for rounding).
MARGIN = 0.05


@dataclass
class Case:
    """One operator to check. ``inputs``: (name, fn(rng) -> array) pairs; ``outputs``: output
    names; ``grads``: the outputs that make up the loss (indices); ``check``: the inputs whose
    gradients are checked (default: every float input that gets a gradient)."""

    op_type: str
    inputs: list
    outputs: list
    args: dict = field(default_factory=dict)
    variant: str = "default"
    grads: list = field(default_factory=lambda: [0])
    check: list | None = None
    stepsize: float = STEP
    threshold: float = THRESHOLD
    # The gradient may be identically zero (ZeroGradient, a loss that ignores an input...).
    zero_grad_ok: bool = False
    # Explicit gradient ops, (type, inputs, outputs, args) each, for gradient kernels that no
    # gradient maker emits (GRADIENT_KERNELS_WITHOUT_MAKER); None: the registry's.
    grad_ops: list | None = None

    @property
    def id(self):
        return f"{self.op_type}.{self.variant}"


# -- input generators -------------------------------------------------------------------------


def uniform(shape, lo=-1.0, hi=1.0):
    return lambda rng: rng.uniform(lo, hi, size=shape).astype(np.float32)


def away_from_zero(shape, lo=0.1, hi=1.0):
    """Values of magnitude in [lo, hi], random sign: no kink at 0 within reach."""

    def make(rng):
        mag = rng.uniform(lo, hi, size=shape)
        return (mag * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)

    return make


def avoiding(shape, kinks, lo=-1.0, hi=1.0, margin=MARGIN):
    """Uniform values in [lo, hi] at least ``margin`` away from every kink."""

    def make(rng):
        x = rng.uniform(lo, hi, size=shape)
        for _ in range(100):
            bad = np.zeros(x.shape, dtype=bool)
            for k in kinks:
                bad |= np.abs(x - k) < margin
            if not bad.any():
                break
            x[bad] = rng.uniform(lo, hi, size=int(bad.sum()))
        return x.astype(np.float32)

    return make


def distinct(shape, gap=0.1, offset=None):
    """A random permutation of values ``gap`` apart: no two elements tie, even after a step."""

    def make(rng):
        n = int(np.prod(shape))
        start = -gap * n / 2 if offset is None else offset
        return (start + gap * rng.permutation(n)).reshape(shape).astype(np.float32)

    return make


def positive(shape, lo=0.5, hi=2.0):
    return uniform(shape, lo, hi)


def probabilities(shape, axis=-1):
    def make(rng):
        x = rng.uniform(0.2, 1.0, size=shape)
        return (x / x.sum(axis=axis, keepdims=True)).astype(np.float32)

    return make


def const(value, dtype=np.int32):
    return lambda rng: np.array(value, dtype=dtype)


def labels(n, classes):
    return lambda rng: rng.integers(0, classes, size=n).astype(np.int32)


# -- cases ------------------------------------------------------------------------------------


def _c(op_type, inputs, outputs=("Y",), **kw):
    return Case(op_type, list(inputs), list(outputs), **kw)


def _binary(op_type, make_b=None):
    b = make_b or uniform
    return [
        _c(op_type, [("A", uniform((2, 3))), ("B", b((2, 3)))], ("C",)),
        _c(
            op_type,
            [("A", uniform((2, 3, 4))), ("B", b((3, 4)))],
            ("C",),
            args={"broadcast": 1},
            variant="legacy_broadcast",
        ),
        _c(
            op_type,
            [("A", uniform((2, 3, 4))), ("B", b((3,)))],
            ("C",),
            args={"broadcast": 1, "axis": 1},
            variant="legacy_broadcast_axis",
        ),
        _c(
            op_type,
            [("A", uniform((2, 1, 4))), ("B", b((3, 1)))],
            ("C",),
            variant="numpy_broadcast",
        ),
    ]


def _unary(op_type, make, **kw):
    return [_c(op_type, [("X", make((3, 4)))], **kw)]


def _min_max_cases(op_type):
    """Two and three inputs, distinct everywhere (no ties at the kinks)."""
    a, b = distinct((2, 3)), distinct((2, 3), offset=-0.27)
    return [
        _c(op_type, [("A", a), ("B", b)]),
        _c(
            op_type,
            [("A", a), ("B", b), ("C", distinct((2, 3), offset=-0.23))],
            variant="three",
        ),
    ]


def _nchw(shape=(2, 3, 4, 4)):
    return uniform(shape)


def _bn_cases():
    ins = [
        ("X", uniform((2, 3, 2, 2))),
        ("scale", uniform((3,), 0.5, 1.5)),
        ("bias", uniform((3,))),
        ("mean", uniform((3,))),
        ("var", positive((3,))),
    ]
    # No is_test=1 case: as in Caffe2, SpatialBNGradient ignores is_test and reads the
    # running mean and variance as if they were the saved mean and inverse std of a training
    # run, so the test-mode "gradient" is not the derivative of the test-mode output.
    return [
        _c(
            "SpatialBN",
            ins,
            ("Y", "mean", "var", "saved_mean", "saved_inv_std"),
            args={"is_test": 0, "epsilon": 1e-5, "momentum": 0.9},
            variant="train",
            # the batch statistics make the loss curve more: a smaller step
            stepsize=0.005,
            threshold=0.02,
        ),
        _c(
            "SpatialBN",
            [("X", uniform((2, 2, 2, 3)))] + [(n, f) for n, f in ins[1:]],
            ("Y", "mean", "var", "saved_mean", "saved_inv_std"),
            args={"is_test": 0, "epsilon": 1e-5, "order": "NHWC"},
            variant="train_nhwc",
            stepsize=0.005,
            threshold=0.02,
        ),
    ]


def _lengths_cases():
    data = uniform((5, 3))
    idx = const([0, 2, 2, 4, 1, 0])
    lengths = const([2, 3, 1])
    return {
        "Gather": [
            _c("Gather", [("DATA", data), ("INDICES", idx)]),
            _c(
                "Gather",
                [("DATA", data), ("INDICES", const([[0, 3], [3, 4]]))],
                variant="2d_indices",
            ),
            # axis > 0: a dense BatchGatherGradient; index 3 repeats, so its rows add up.
            _c(
                "Gather",
                [("DATA", uniform((2, 4, 3))), ("INDICES", const([[0, 3], [3, 1]]))],
                args={"axis": 1},
                variant="axis1",
            ),
            _c(
                "Gather",
                [("DATA", uniform((2, 3, 4))), ("INDICES", const([2, 0, 2], np.int64))],
                args={"axis": -1},
                variant="last_axis_int64",
            ),
        ],
        "SparseLengthsSum": [
            _c("SparseLengthsSum", [("DATA", data), ("INDICES", idx), ("LENGTHS", lengths)])
        ],
        "SparseLengthsMean": [
            _c("SparseLengthsMean", [("DATA", data), ("INDICES", idx), ("LENGTHS", lengths)])
        ],
        "SparseLengthsWeightedSum": [
            _c(
                "SparseLengthsWeightedSum",
                [
                    ("DATA", data),
                    ("WEIGHTS", uniform((6,))),
                    ("INDICES", idx),
                    ("LENGTHS", lengths),
                ],
            ),
            _c(
                "SparseLengthsWeightedSum",
                [
                    ("DATA", data),
                    ("WEIGHTS", uniform((6,))),
                    ("INDICES", idx),
                    ("LENGTHS", lengths),
                ],
                args={"grad_on_weights": 1},
                variant="grad_on_weights",
            ),
        ],
        "LengthsSum": [_c("LengthsSum", [("DATA", uniform((6, 3))), ("LENGTHS", lengths)])],
        "LengthsMean": [_c("LengthsMean", [("DATA", uniform((6, 3))), ("LENGTHS", lengths)])],
        "LengthsWeightedSum": [
            _c(
                "LengthsWeightedSum",
                [("DATA", uniform((6, 3))), ("WEIGHTS", uniform((6,))), ("LENGTHS", lengths)],
            )
        ],
        "UnsortedSegmentSum": [
            _c(
                "UnsortedSegmentSum",
                [("DATA", uniform((6, 3))), ("SEGMENT_IDS", const([0, 2, 1, 0, 2, 2]))],
            )
        ],
        "SparseToDense": [
            _c("SparseToDense", [("indices", const([3, 0, 3, 1])), ("values", uniform((4, 2)))]),
            _c(
                "SparseToDense",
                [
                    ("indices", const([3, 0, 1])),
                    ("values", uniform((3, 2))),
                    ("data_to_infer_dim", uniform((5,))),
                ],
                variant="infer_dim",
                check=[1],
            ),
        ],
    }


def _rnn_unit_cases():
    n, d = 3, 2
    return {
        "LSTMUnit": [
            _c(
                "LSTMUnit",
                [
                    ("hidden_t_prev", uniform((1, n, d))),
                    ("cell_t_prev", uniform((1, n, d))),
                    ("gates", uniform((1, n, 4 * d))),
                    ("seq_lengths", const([2, 1, 3])),
                    ("timestep", const([1])),
                ],
                ("hidden_t", "cell_t"),
                grads=[0, 1],
            ),
            _c(
                "LSTMUnit",
                [
                    ("hidden_t_prev", uniform((1, n, d))),
                    ("cell_t_prev", uniform((1, n, d))),
                    ("gates", uniform((1, n, 4 * d))),
                    ("seq_lengths", const([2, 1, 3])),
                    ("timestep", const([1])),
                ],
                ("hidden_t", "cell_t"),
                args={"forget_bias": 0.5, "drop_states": 1},
                variant="forget_bias_drop_states",
                grads=[0, 1],
                # with drop_states, hidden_t never reads hidden_t_prev (finished sequences
                # get zeros instead of a copy): its gradient is zero
                check=[1, 2],
            ),
        ],
        "GRUUnit": [
            _c(
                "GRUUnit",
                [
                    ("hidden_t_prev", uniform((1, n, d))),
                    ("gates", uniform((1, n, 3 * d))),
                    ("seq_lengths", const([2, 1, 3])),
                    ("timestep", const([1])),
                ],
                ("hidden_t",),
            ),
            _c(
                "GRUUnit",
                [
                    ("hidden_t_prev", uniform((1, n, d))),
                    ("gates", uniform((1, n, 3 * d))),
                    ("seq_lengths", const([2, 1, 3])),
                    ("timestep", const([1])),
                ],
                ("hidden_t",),
                args={"drop_states": 1},
                variant="drop_states",
            ),
        ],
    }


def _conv_cases():
    x = _nchw((2, 2, 5, 5))
    w = uniform((3, 2, 3, 3))
    b = uniform((3,))
    return [
        _c("Conv", [("X", x), ("W", w), ("b", b)], args={"kernel": 3}),
        _c(
            "Conv",
            [("X", x), ("W", w), ("b", b)],
            args={"kernel": 3, "stride": 2, "pad": 1},
            variant="stride2_pad1",
        ),
        _c("Conv", [("X", x), ("W", w)], args={"kernel": 3}, variant="no_bias"),
        _c(
            "Conv",
            [("X", uniform((1, 4, 4, 4))), ("W", uniform((4, 2, 2, 2))), ("b", uniform((4,)))],
            args={"kernel": 2, "group": 2},
            variant="group2",
        ),
        _c(
            "Conv",
            [("X", uniform((2, 5, 5, 2))), ("W", uniform((3, 3, 3, 2))), ("b", b)],
            args={"kernel": 3, "order": "NHWC", "pad": 1},
            variant="nhwc",
        ),
        _c(
            "Conv",
            [("X", uniform((1, 2, 5, 4))), ("W", uniform((2, 2, 3, 2))), ("b", uniform((2,)))],
            args={"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1, "dilation": 1},
            variant="rect_kernel",
        ),
    ]


def _pool_cases(op_type):
    x = distinct((2, 2, 4, 4), gap=0.05)
    cases = [
        _c(op_type, [("X", x)], args={"kernel": 2, "stride": 2}),
        _c(
            op_type,
            [("X", distinct((1, 2, 5, 5), gap=0.05))],
            args={"kernel": 3, "stride": 2, "pad": 1},
            variant="pad1",
        ),
        _c(
            op_type,
            [("X", distinct((2, 4, 4, 2), gap=0.05))],
            args={"kernel": 2, "stride": 1, "order": "NHWC"},
            variant="nhwc",
        ),
        _c(op_type, [("X", x)], args={"global_pooling": 1}, variant="global"),
    ]
    return cases


def _red_cases():
    """Front/back and norm reductions, segment reductions, BatchGather, NanCheck."""
    x4 = uniform((3, 2, 4))
    seg = const([0, 0, 1, 3, 3, 3])
    cases = {}
    for t in ("ReduceFrontSum", "ReduceFrontMean", "ReduceBackSum", "ReduceBackMean"):
        # LENGTHS: one per output, each at most the reduced size (3); a zero length leaves a
        # sum at 0 (and makes a mean 0 / 0, as in Caffe2).
        shape = (3, 4) if t.startswith("ReduceFront") else (4, 3)
        lengths = [3, 1, 0, 2] if t.endswith("Sum") else [3, 1, 2, 2]
        cases[t] = [
            _c(t, [("X", x4)], args={"num_reduce_dim": 2}),
            _c(t, [("X", uniform(shape)), ("LENGTHS", const(lengths))], variant="lengths"),
        ]
    for t in ("ReduceFrontMax", "ReduceBackMax"):
        cases[t] = [_c(t, [("X", distinct((3, 2, 4)))], args={"num_reduce_dim": 1})]
    cases["ReduceL1"] = [_c("ReduceL1", [("X", away_from_zero((2, 3)))], args={"axes": [1]})]
    cases["ReduceL2"] = [_c("ReduceL2", [("X", uniform((2, 3, 2)))], args={"axes": [0, 2]})]
    cases["RowwiseMax"] = [_c("RowwiseMax", [("X", distinct((2, 3, 4)))])]
    cases["ColwiseMax"] = [_c("ColwiseMax", [("X", distinct((2, 3, 4)))])]
    for r in ("Sum", "Mean"):
        cases["SortedSegment" + r] = [
            _c("SortedSegment" + r, [("DATA", uniform((6, 2))), ("SEGMENT_IDS", seg)])
        ]
        for order, ids in (("Sorted", seg), ("Unsorted", const([1, 0, 3, 1, 0, 1]))):
            t = f"Sparse{order}Segment{r}"
            cases[t] = [
                _c(
                    t,
                    [
                        ("DATA", uniform((4, 2))),
                        ("INDICES", const([3, 0, 3, 1, 2, 0])),
                        ("SEGMENT_IDS", ids),
                    ],
                )
            ]
    for r in ("Sum", "Mean", "LogSumExp", "LogMeanExp"):
        t = "SortedSegmentRange" + r
        cases[t] = [_c(t, [("DATA", uniform((6, 2))), ("SEGMENT_IDS", seg)])]
    cases["SortedSegmentRangeMax"] = [
        _c("SortedSegmentRangeMax", [("DATA", distinct((6, 2))), ("SEGMENT_IDS", seg)])
    ]
    cases["LengthsMax"] = [
        _c("LengthsMax", [("DATA", distinct((6, 2))), ("LENGTHS", const([2, 0, 4]))])
    ]
    cases["BatchGather"] = [
        _c("BatchGather", [("DATA", uniform((2, 4, 3))), ("INDICES", const([[0, 3], [3, 1]]))]),
        _c(
            "BatchGather",
            [("DATA", uniform((2, 4, 3))), ("INDICES", const([[0, 3, 3], [1, 1, 2]]))],
            args={"match_outer": 1},
            variant="match_outer",
        ),
    ]
    cases["UnsortedSegmentMean"] = [
        _c(
            "UnsortedSegmentMean",
            [("DATA", uniform((6, 2))), ("SEGMENT_IDS", const([2, 0, 2, 1, 0, 2]))],
        )
    ]
    cases["NanCheck"] = [_c("NanCheck", [("X", uniform((3, 2)))])]
    return cases


def _merged_cases():
    """N-d convolution and pooling, padding and masking ops, MakeTwoClass, SplitByLengths."""
    lengths = const([1, 3])
    return {
        "Conv1D": [
            _c(
                "Conv1D",
                [("X", uniform((2, 2, 5))), ("W", uniform((3, 2, 3))), ("b", uniform((3,)))],
                args={"kernels": [3], "pads": [1, 1]},
            )
        ],
        "Conv3D": [
            _c(
                "Conv3D",
                [("X", uniform((1, 2, 3, 3, 3))), ("W", uniform((2, 2, 2, 2, 2)))],
                args={"kernels": [2, 2, 2]},
            )
        ],
        "MaxPool1D": [
            _c(
                "MaxPool1D",
                [("X", distinct((1, 2, 6), gap=0.05))],
                args={"kernels": [2], "strides": [2]},
            )
        ],
        "MaxPool3D": [
            _c(
                "MaxPool3D",
                [("X", distinct((1, 1, 4, 4, 4), gap=0.05))],
                args={"kernels": [2, 2, 2], "strides": [2, 2, 2]},
            )
        ],
        "AveragePool1D": [
            _c("AveragePool1D", [("X", uniform((1, 2, 6)))], args={"kernels": [3], "strides": [1]})
        ],
        "AveragePool3D": [
            _c(
                "AveragePool3D",
                [("X", uniform((1, 1, 3, 4, 4)))],
                args={"kernels": [2, 2, 2], "strides": [1, 2, 2]},
            )
        ],
        "LpPool": [
            _c(
                "LpPool",
                [("X", away_from_zero((1, 2, 4, 4), 0.2, 1.0))],
                args={"kernel": 2, "stride": 2, "p": 2.0},
            )
        ],
        "AddPadding": [
            _c(
                "AddPadding",
                [("X", uniform((4, 2))), ("lengths", lengths), ("start", uniform((2,)))],
                ("Y", "Y_lengths"),
                args={"padding_width": 1, "end_padding_width": 2},
            ),
            _c("AddPadding", [("X", uniform((3, 2)))], variant="zeros"),
        ],
        "RemovePadding": [
            _c(
                "RemovePadding",
                [("X", uniform((8, 2))), ("lengths", const([3, 5]))],
                ("Y", "Y_lengths"),
                args={"padding_width": 1},
            )
        ],
        "SequenceMask": [
            _c(
                "SequenceMask",
                [("X", uniform((2, 3))), ("lengths", const([1, 2]))],
                args={"fill_val": 0.0},
            ),
            _c(
                "SequenceMask",
                [("X", uniform((3, 3)))],
                args={"mode": "upper", "fill_val": 0.0},
                variant="upper",
            ),
        ],
        "MakeTwoClass": [_c("MakeTwoClass", [("X", uniform((3,), 0.1, 0.9))])],
        "SplitByLengths": [
            _c(
                "SplitByLengths",
                [("X", uniform((4, 2))), ("lengths", lengths)],
                ("Y0", "Y1"),
                grads=[0, 1],
            )
        ],
    }


def _shape_suite_cases():
    """DotProductWithPadding, Im2Col / Col2Im and RoIPool (Caffe2's shape-inference suite)."""
    dot = "DotProductWithPadding"
    rois = [[0, 0.2, 0.4, 4.2, 3.6], [1, 1.2, 0.0, 3.1, 4.4], [0, -2.0, -1.0, 9.0, 8.0]]
    return {
        dot: [
            _c(
                dot,
                [("X", uniform((3, 2))), ("Y", uniform((3, 5)))],
                ("Z",),
                args={"pad_value": 0.5},
            ),
            _c(
                dot,
                [("X", uniform((3, 2, 3))), ("Y", uniform((3, 2, 1)))],
                ("Z",),
                args={"pad_value": -0.7},
                variant="x_longer",
            ),
            _c(
                dot,
                [("X", uniform((3, 2))), ("Y", uniform((3, 6)))],
                ("Z",),
                args={"replicate": 1},
                variant="replicate",
            ),
        ],
        "Im2Col": [
            _c("Im2Col", [("X", uniform((2, 2, 5, 4)))], args={"kernel": 3, "pad": 1, "stride": 2}),
            _c(
                "Im2Col",
                [("X", uniform((1, 5, 6, 2)))],
                args={"kernel_h": 2, "kernel_w": 3, "dilation": 2, "order": "NHWC"},
                variant="nhwc",
            ),
        ],
        "Col2Im": [
            _c(
                "Col2Im",
                [("C", uniform((2, 18, 3, 2))), ("X", uniform((2, 2, 5, 4)))],
                args={"kernel": 3, "pad": 1, "stride": 2},
                check=[0],
            ),
        ],
        "RoIPool": [
            _c(
                "RoIPool",
                [("X", distinct((2, 2, 5, 6), gap=0.05)), ("R", const(rois, np.float32))],
                ("Y", "argmaxes"),
                args={"pooled_h": 2, "pooled_w": 3},
                check=[0],
            ),
            _c(
                "RoIPool",
                [("X", distinct((2, 2, 5, 6), gap=0.05)), ("R", const(rois, np.float32))],
                ("Y", "argmaxes"),
                args={"pooled_h": 3, "pooled_w": 2, "spatial_scale": 0.5},
                check=[0],
                variant="scale_half",
            ),
        ],
    }


SPECS = {
    # -- elementwise arithmetic
    "Add": _binary("Add"),
    "Sub": _binary("Sub"),
    "Mul": _binary("Mul"),
    "Div": _binary("Div", lambda s: away_from_zero(s, 0.5, 1.5)),
    "Sum": [
        _c("Sum", [("A", uniform((2, 3))), ("B", uniform((2, 3)))], ("C",)),
        _c(
            "Sum",
            [("A", uniform((2, 3))), ("B", uniform((2, 3))), ("D", uniform((2, 3)))],
            ("C",),
            variant="three",
        ),
    ],
    "Max": _min_max_cases("Max"),
    "Min": _min_max_cases("Min"),
    "WeightedSum": [
        _c(
            "WeightedSum",
            [
                ("X0", uniform((2, 3))),
                ("w0", uniform((1,))),
                ("X1", uniform((2, 3))),
                ("w1", uniform((1,))),
            ],
        ),
        _c(
            "WeightedSum",
            [
                ("X0", uniform((2, 3))),
                ("w0", uniform((1,))),
                ("X1", uniform((2, 3))),
                ("w1", uniform((1,))),
            ],
            args={"grad_on_w": 1},
            variant="grad_on_w",
        ),
    ],
    "ElementwiseLinear": [
        _c(
            "ElementwiseLinear",
            [("X", uniform((3, 4))), ("a", uniform((4,))), ("b", uniform((4,)))],
        ),
        _c(
            "ElementwiseLinear",
            [("X", uniform((2, 2, 3))), ("a", uniform((3,))), ("b", uniform((3,)))],
            args={"axis": -1},
            variant="last_axis",
        ),
    ],
    "Negative": _unary("Negative", uniform),
    "Abs": _unary("Abs", away_from_zero),
    "Exp": _unary("Exp", uniform),
    "Log": _unary("Log", positive),
    "Sqr": _unary("Sqr", uniform),
    "Sqrt": _unary("Sqrt", positive),
    "Sin": _unary("Sin", uniform),
    "Cos": _unary("Cos", uniform),
    "Tan": _unary("Tan", uniform),
    "Asin": _unary("Asin", lambda shape: uniform(shape, -0.8, 0.8)),
    "Acos": _unary("Acos", lambda shape: uniform(shape, -0.8, 0.8)),
    "Atan": _unary("Atan", uniform),
    "Cbrt": _unary("Cbrt", positive),
    "Reciprocal": _unary("Reciprocal", positive),
    "Rsqrt": _unary("Rsqrt", positive),
    "RSqrt": _unary("RSqrt", positive),
    "Cube": _unary("Cube", uniform),
    "Log1p": _unary("Log1p", lambda shape: uniform(shape, -0.5, 1.0)),
    "PadImage": [
        _c("PadImage", [("X", uniform((1, 2, 3, 3)))], args={"pad": 1}),
        _c(
            "PadImage",
            [("X", uniform((1, 2, 3, 4)))],
            args={"pad_t": 2, "pad_l": 1, "pad_b": 0, "pad_r": 1, "mode": "reflect"},
            variant="reflect",
        ),
    ],
    "Moments": [
        _c(
            "Moments",
            [("X", uniform((2, 3, 4)))],
            ("mean", "var"),
            args={"axes": [1]},
            grads=[0, 1],
        )
    ],
    "GroupNorm": [
        _c(
            "GroupNorm",
            [("X", uniform((2, 4, 3))), ("gamma", uniform((4,))), ("beta", uniform((4,)))],
            ("Y", "mu", "rsig"),
            args={"group": 2, "is_test": 0},
        )
    ],
    "Scale": _unary("Scale", uniform, args={"scale": 2.5}),
    "Pow": [
        _c("Pow", [("X", uniform((3, 4)))], args={"exponent": 2.0}),
        _c("Pow", [("X", uniform((3, 4)))], args={"exponent": 3.0}, variant="cube"),
        _c("Pow", [("X", positive((3, 4)))], args={"exponent": 0.5}, variant="sqrt"),
        _c(
            "Pow",
            [("X", positive((3, 4))), ("E", uniform((3, 4), 0.5, 2.0))],
            variant="tensor_exponent",
        ),
        _c(
            "Pow",
            [("X", positive((2, 3, 4))), ("E", uniform((4,), 0.5, 2.0))],
            args={"broadcast": 1},
            variant="tensor_exponent_broadcast",
        ),
    ],
    "Cast": [
        _c(
            "Cast",
            [("X", uniform((3, 4)))],
            args={"to": caffe2_pb2.TensorProto.DOUBLE, "from_type": caffe2_pb2.TensorProto.FLOAT},
            variant="to_double",
        ),
        _c(
            "Cast",
            [("X", uniform((3, 4)))],
            args={"to": "float", "from_type": "float"},
            variant="to_float_by_name",
        ),
    ],
    # -- activations
    "Relu": _unary("Relu", away_from_zero),
    "LeakyRelu": _unary("LeakyRelu", away_from_zero, args={"alpha": 0.2}),
    "PRelu": [
        _c("PRelu", [("X", away_from_zero((2, 3, 2, 2))), ("slope", uniform((3,), 0.1, 0.5))]),
        _c(
            "PRelu",
            [("X", away_from_zero((2, 2, 2, 3))), ("slope", uniform((3,), 0.1, 0.5))],
            args={"order": "NHWC"},
            variant="nhwc",
        ),
        _c(
            "PRelu",
            [("X", away_from_zero((2, 3, 2))), ("slope", uniform((1,), 0.1, 0.5))],
            variant="shared_slope",
        ),
    ],
    "Sigmoid": _unary("Sigmoid", lambda s: uniform(s, -2.0, 2.0)),
    "Tanh": _unary("Tanh", lambda s: uniform(s, -2.0, 2.0)),
    "Softsign": _unary("Softsign", lambda s: uniform(s, -2.0, 2.0)),
    "Elu": [
        _c("Elu", [("X", away_from_zero((3, 4), 0.1, 2.0))]),
        _c("Elu", [("X", away_from_zero((3, 4), 0.1, 2.0))], args={"alpha": 0.5}, variant="alpha"),
    ],
    "Gelu": [
        _c("Gelu", [("X", uniform((3, 4), -2.0, 2.0))]),
        _c("Gelu", [("X", uniform((3, 4), -2.0, 2.0))], args={"fast_gelu": 1}, variant="fast"),
    ],
    "HardSigmoid": [
        _c("HardSigmoid", [("X", avoiding((3, 4), [-2.5, 2.5], -4.0, 4.0))]),
        _c(
            "HardSigmoid",
            [("X", avoiding((3, 4), [0.0, 0.5], -1.0, 1.0))],
            args={"alpha": -2.0, "beta": 1.0},
            variant="negative_alpha",
        ),
    ],
    "ReluN": [_c("ReluN", [("X", avoiding((3, 4), [0.0, 1.5], -1.0, 2.5))], args={"n": 1.5})],
    "Swish": _unary("Swish", lambda s: uniform(s, -2.0, 2.0)),
    "Mish": _unary("Mish", lambda s: uniform(s, -2.0, 2.0)),
    "Sinh": _unary("Sinh", lambda s: uniform(s, -2.0, 2.0)),
    "Cosh": _unary("Cosh", lambda s: uniform(s, -2.0, 2.0)),
    "Clip": [
        _c(
            "Clip",
            [("X", avoiding((3, 4), [-0.5, 0.5]))],
            args={"min": -0.5, "max": 0.5},
        )
    ],
    "Softmax": [
        _c("Softmax", [("X", uniform((3, 4)))]),
        _c("Softmax", [("X", uniform((2, 3, 2)))], args={"axis": 2}, variant="axis2"),
    ],
    "Dropout": [
        _c("Dropout", [("X", uniform((3, 4)))], args={"is_test": 1, "ratio": 0.5}, variant="test"),
        # ratio 0 keeps every element: the mask is all ones and the op is deterministic
        _c(
            "Dropout",
            [("X", uniform((3, 4)))],
            ("Y", "mask"),
            args={"is_test": 0, "ratio": 0.0},
            variant="train_ratio0",
        ),
    ],
    # -- losses
    "SoftmaxWithLoss": [
        _c(
            "SoftmaxWithLoss",
            [("logits", uniform((3, 4))), ("labels", labels(3, 4))],
            ("P", "loss"),
            grads=[1],
        ),
        _c(
            "SoftmaxWithLoss",
            [
                ("logits", uniform((3, 4))),
                ("labels", labels(3, 4)),
                ("weights", uniform((3,), 0.5, 2.0)),
            ],
            ("P", "loss"),
            grads=[1],
            check=[0],
            variant="weighted",
        ),
        _c(
            "SoftmaxWithLoss",
            [("logits", uniform((3, 4))), ("labels", probabilities((3, 4)))],
            ("P", "loss"),
            args={"label_prob": 1},
            grads=[1],
            check=[0],
            variant="label_prob",
        ),
        _c(
            "SoftmaxWithLoss",
            [("logits", uniform((3, 4))), ("labels", labels(3, 4))],
            ("P", "loss"),
            args={"scale": 0.5},
            grads=[1],
            variant="scale",
        ),
    ],
    "LabelCrossEntropy": [
        _c("LabelCrossEntropy", [("X", probabilities((3, 4))), ("label", labels(3, 4))])
    ],
    "CrossEntropy": [
        _c(
            "CrossEntropy",
            [("X", probabilities((3, 4))), ("label", probabilities((3, 4)))],
            check=[0],
        )
    ],
    "SigmoidCrossEntropyWithLogits": [
        _c(
            "SigmoidCrossEntropyWithLogits",
            [("logits", uniform((3, 4), -2, 2)), ("targets", uniform((3, 4), 0, 1))],
            check=[0],
        ),
        _c(
            "SigmoidCrossEntropyWithLogits",
            [("logits", uniform((3, 4), -2, 2)), ("targets", uniform((3, 4), 0, 1))],
            args={"log_D_trick": 1},
            check=[0],
            variant="log_D_trick",
        ),
        _c(
            "SigmoidCrossEntropyWithLogits",
            [("logits", uniform((2, 2, 3), -2, 2)), ("targets", uniform((2, 2, 3), 0, 1))],
            args={"unjoined_lr_loss": 1},
            check=[0],
            variant="unjoined_lr_loss",
        ),
    ],
    "AveragedLoss": [_c("AveragedLoss", [("X", uniform((3, 4)))])],
    "SumElements": [
        _c("SumElements", [("X", uniform((3, 4)))]),
        _c("SumElements", [("X", uniform((3, 4)))], args={"average": 1}, variant="average"),
    ],
    "SquaredL2Distance": [
        _c("SquaredL2Distance", [("X", uniform((3, 4))), ("Y", uniform((3, 4)))], ("Z",))
    ],
    "CosineSimilarity": [
        _c("CosineSimilarity", [("X", uniform((3, 4))), ("Y", uniform((3, 4)))], ("Z",))
    ],
    "L1Distance": [_c("L1Distance", [("X", distinct((3, 4))), ("Y", distinct((3, 4)))], ("Z",))],
    "WeightedSigmoidCrossEntropyWithLogits": [
        _c(
            "WeightedSigmoidCrossEntropyWithLogits",
            [
                ("logits", uniform((3, 4), -2, 2)),
                ("targets", uniform((3, 4), 0, 1)),
                ("weights", uniform((3, 4), 0.1, 1)),
            ],
            check=[0],
        )
    ],
    "SpatialSoftmaxWithLoss": [
        _c(
            "SpatialSoftmaxWithLoss",
            [
                ("X", uniform((2, 3, 2, 2))),
                ("labels", lambda rng: rng.integers(-1, 3, size=(2, 2, 2)).astype(np.int32)),
            ],
            ("P", "loss"),
            grads=[1],
            check=[0],
        ),
        _c(
            "SpatialSoftmaxWithLoss",
            [
                ("X", uniform((2, 3, 2, 2))),
                ("labels", lambda rng: rng.integers(0, 3, size=(2, 2, 2)).astype(np.int32)),
                ("weights", uniform((2, 2, 2), 0.5, 2.0)),
            ],
            ("P", "loss"),
            grads=[1],
            check=[0],
            variant="weighted",
        ),
    ],
    "DotProduct": [_c("DotProduct", [("X", uniform((3, 4))), ("Y", uniform((3, 4)))], ("Z",))],
    # -- dense layers
    "FC": [
        _c("FC", [("X", uniform((3, 4))), ("W", uniform((2, 4))), ("b", uniform((2,)))]),
        _c(
            "FC",
            [("X", uniform((3, 2, 2))), ("W", uniform((2, 4))), ("b", uniform((2,)))],
            variant="flatten_axis1",
        ),
        _c(
            "FC",
            [("X", uniform((2, 3, 2))), ("W", uniform((4, 2))), ("b", uniform((4,)))],
            args={"axis": 2},
            variant="axis2",
        ),
    ],
    "FCTransposed": [
        _c("FCTransposed", [("X", uniform((3, 4))), ("W", uniform((4, 2))), ("b", uniform((2,)))])
    ],
    "MatMul": [
        _c("MatMul", [("A", uniform((2, 3))), ("B", uniform((3, 4)))]),
        _c(
            "MatMul",
            [("A", uniform((3, 2))), ("B", uniform((4, 3)))],
            args={"trans_a": 1, "trans_b": 1},
            variant="trans_ab",
        ),
    ],
    "BatchMatMul": [
        _c("BatchMatMul", [("A", uniform((2, 2, 3))), ("B", uniform((2, 3, 4)))]),
        _c(
            "BatchMatMul",
            [("A", uniform((2, 3, 2))), ("B", uniform((2, 4, 3)))],
            args={"trans_a": 1, "trans_b": 1},
            variant="trans_ab",
        ),
    ],
    "LayerNorm": [
        _c(
            "LayerNorm",
            [("X", uniform((2, 3, 4)))],
            ("Y", "mean", "std"),
            args={"axis": 1},
        ),
        _c(
            "LayerNorm",
            [("X", uniform((3, 4)))],
            ("Y", "mean", "std"),
            args={"axis": -1, "epsilon": 1e-3},
            variant="last_axis",
        ),
    ],
    "SpatialBN": _bn_cases(),
    "InstanceNorm": [
        _c(
            "InstanceNorm",
            [("X", uniform((2, 3, 2, 2))), ("scale", uniform((3,))), ("bias", uniform((3,)))],
        ),
        # The saved mean and inverse std feed the gradient op (its six-input form).
        _c(
            "InstanceNorm",
            [("X", uniform((2, 3, 2, 3))), ("scale", uniform((3,))), ("bias", uniform((3,)))],
            ("Y", "mean", "rstd"),
            args={"epsilon": 1e-3},
            variant="saved_stats",
        ),
        _c(
            "InstanceNorm",
            [("X", uniform((2, 2, 3, 3))), ("scale", uniform((3,))), ("bias", uniform((3,)))],
            ("Y", "mean", "rstd"),
            args={"order": "NHWC"},
            variant="nhwc",
        ),
    ],
    "LRN": [
        _c("LRN", [("X", uniform((2, 5, 2, 2)))], args={"size": 3, "alpha": 0.1, "beta": 0.75}),
        _c(
            "LRN",
            [("X", uniform((2, 2, 2, 6)))],
            args={"size": 5, "alpha": 0.5, "beta": 0.6, "bias": 2.0, "order": "NHWC"},
            variant="nhwc_size5",
        ),
    ],
    # -- convolution, pooling, resizing
    "Conv": _conv_cases(),
    "ConvTranspose": [
        _c(
            "ConvTranspose",
            [("X", uniform((1, 2, 3, 3))), ("W", uniform((2, 3, 2, 2))), ("b", uniform((3,)))],
            args={"kernel": 2, "stride": 2},
        ),
        _c(
            "ConvTranspose",
            [("X", uniform((2, 2, 3, 2))), ("W", uniform((2, 3, 3, 3))), ("b", uniform((3,)))],
            args={"kernel": 3, "stride": 2, "pads": [1, 0, 0, 1], "adj": 1},
            variant="pads_adj",
        ),
        _c(
            "ConvTranspose",
            [("X", uniform((2, 3, 2, 2))), ("W", uniform((2, 3, 3, 2)))],
            args={"kernel": 3, "stride": 1, "pad": 1, "order": "NHWC"},
            variant="nhwc_no_bias",
        ),
        _c(
            "ConvTranspose",
            [("X", uniform((1, 2, 2, 3))), ("W", uniform((3, 2, 2, 2))), ("b", uniform((2,)))],
            args={"kernel": 2, "stride": 2, "order": "NHWC"},
            variant="nhwc_bias",
        ),
    ],
    "MaxPool": _pool_cases("MaxPool"),
    "AveragePool": _pool_cases("AveragePool"),
    "MaxPool2D": _pool_cases("MaxPool2D")[:1],
    "AveragePool2D": _pool_cases("AveragePool2D")[:1],
    "Conv2D": [
        _c(
            "Conv2D",
            [("X", _nchw((2, 2, 5, 5))), ("W", uniform((3, 2, 3, 3))), ("b", uniform((3,)))],
            args={"kernel": 3, "pad": 1},
        )
    ],
    "UpsampleBilinear": [
        _c(
            "UpsampleBilinear",
            [("X", uniform((1, 2, 3, 3)))],
            args={"width_scale": 2.0, "height_scale": 2.0},
        ),
        _c(
            "UpsampleBilinear",
            [("X", uniform((2, 1, 3, 4)))],
            args={"width_scale": 1.5, "height_scale": 2.5},
            variant="fractional",
        ),
        _c(
            "UpsampleBilinear",
            [("X", uniform((1, 2, 4, 3))), ("scales", const([0.5, 2.0], np.float32))],
            variant="scales_input_downsample",
        ),
    ],
    # -- layout and shape
    "Transpose": [
        _c("Transpose", [("X", uniform((2, 3, 4)))]),
        _c("Transpose", [("X", uniform((2, 3, 4)))], args={"axes": [2, 0, 1]}, variant="axes"),
    ],
    "NCHW2NHWC": [_c("NCHW2NHWC", [("X", uniform((2, 3, 2, 2)))])],
    "NHWC2NCHW": [_c("NHWC2NCHW", [("X", uniform((2, 2, 2, 3)))])],
    "Reshape": [
        _c("Reshape", [("X", uniform((2, 6)))], ("Y", "old_shape"), args={"shape": [3, -1]}),
        _c(
            "Reshape",
            [("X", uniform((2, 6))), ("new_shape", const([4, 3], np.int64))],
            ("Y", "old_shape"),
            variant="shape_input",
        ),
    ],
    "Flatten": [_c("Flatten", [("X", uniform((2, 3, 2)))])],
    "FlattenToVec": [_c("FlattenToVec", [("X", uniform((2, 3)))])],
    "ExpandDims": [_c("ExpandDims", [("X", uniform((2, 3)))], args={"dims": [0, 2]})],
    "Squeeze": [_c("Squeeze", [("X", uniform((2, 1, 3, 1)))], args={"dims": [1, 3]})],
    "Concat": [
        _c(
            "Concat",
            [("A", uniform((2, 3))), ("B", uniform((2, 2)))],
            ("Y", "split_info"),
            args={"axis": 1},
        ),
        _c(
            "Concat",
            [("A", uniform((2, 3))), ("B", uniform((2, 3)))],
            ("Y", "split_info"),
            args={"axis": 1, "add_axis": 1},
            variant="add_axis",
        ),
    ],
    "DepthConcat": [
        _c(
            "DepthConcat",
            [("A", uniform((2, 3, 2))), ("B", uniform((2, 1, 2)))],
            ("Y", "split_info"),
        ),
        _c(
            "DepthConcat",
            [("A", uniform((2, 2))), ("B", uniform((2, 3))), ("C", uniform((2, 1)))],
            ("Y", "split_info"),
            args={"axis": 1},
            variant="three",
        ),
    ],
    "DepthSplit": [
        _c("DepthSplit", [("X", uniform((2, 4, 2)))], ("Y0", "Y1"), grads=[0, 1]),
        _c(
            "DepthSplit",
            [("X", uniform((5, 2)))],
            ("Y0", "Y1"),
            args={"axis": 0, "split": [2, 3]},
            grads=[0, 1],
            variant="sizes",
        ),
    ],
    "Split": [
        _c(
            "Split", [("X", uniform((2, 6)))], ("Y0", "Y1", "Y2"), args={"axis": 1}, grads=[0, 1, 2]
        ),
        _c(
            "Split",
            [("X", uniform((5, 2)))],
            ("Y0", "Y1"),
            args={"axis": 0, "split": [2, 3]},
            grads=[0, 1],
            variant="sizes",
        ),
    ],
    "Slice": [
        _c("Slice", [("X", uniform((4, 5)))], args={"starts": [1, 0], "ends": [3, -1]}),
        _c(
            "Slice",
            [("X", uniform((4, 5))), ("starts", const([0, 2])), ("ends", const([-1, 4]))],
            variant="tensor_bounds",
            check=[0],
        ),
    ],
    "Tile": [
        _c("Tile", [("X", uniform((2, 3)))], args={"tiles": 2, "axis": 1}),
        _c("Tile", [("X", uniform((2, 3)))], args={"tiles": 3, "axis": 0}, variant="axis0"),
    ],
    "Copy": [_c("Copy", [("X", uniform((2, 3)))])],
    "Alias": [_c("Alias", [("X", uniform((2, 3)))])],
    "ZeroGradient": [_c("ZeroGradient", [("X", uniform((2, 3)))], (), grads=[], zero_grad_ok=True)],
    # -- reductions
    "ReduceSum": [
        _c("ReduceSum", [("X", uniform((2, 3, 4)))], args={"axes": [1], "keepdims": 0}),
        _c("ReduceSum", [("X", uniform((2, 3, 4)))], args={"axes": [0, 2]}, variant="keepdims"),
    ],
    "ReduceMean": [
        _c("ReduceMean", [("X", uniform((2, 3, 4)))], args={"axes": [1], "keepdims": 0}),
        _c("ReduceMean", [("X", uniform((2, 3, 4)))], variant="all"),
    ],
    "ReduceMax": [
        _c("ReduceMax", [("X", distinct((2, 3, 4)))], args={"axes": [1], "keepdims": 0}),
        _c("ReduceMax", [("X", distinct((2, 3, 4)))], args={"axes": [0, 2]}, variant="keepdims"),
    ],
    "ReduceMin": [
        _c("ReduceMin", [("X", distinct((2, 3, 4)))], args={"axes": [1], "keepdims": 0}),
        _c("ReduceMin", [("X", distinct((2, 3, 4)))], args={"axes": [0, 2]}, variant="keepdims"),
    ],
    # -- recurrent units
    **_rnn_unit_cases(),
    # -- sparse and segment ops (Gather and the SparseLengths* gradients are GradientSlices)
    **_lengths_cases(),
    **_red_cases(),
    **_merged_cases(),
    **_shape_suite_cases(),
}


EXCLUDED = {
    "Python": "runs a Python function registered when the op is created (CreatePythonOperator); "
    "its gradient, through PythonGradient, is checked in tests/test_python_op.py",
    "FloatToHalf": "a precision cast whose output is float16: finite differences through "
    "float16 rounding (step 1e-3 against a half ulp of 5e-4) are noise; its gradient op "
    "HalfToFloat is checked for values in test_ops_extra_kernels.py",
    "HalfToFloat": "a precision cast whose input is float16, which the checker cannot perturb "
    "by its float32 step; its gradient op FloatToHalf is checked for values in "
    "test_ops_extra_kernels.py",
    "Do": "control flow: its inputs include a workspace blob (not an array) that CheckSimple "
    "cannot feed; its gradient is checked at the net level (test_control_flow_gradients)",
    "If": "control flow: the condition is a bool input and the branch workspaces are inputs; "
    "checked at the net level (test_control_flow_gradients)",
    "While": "control flow: loop state and workspaces are inputs, not arrays. Caffe2's While "
    "gradient is not a true derivative for loop-invariant inputs: the backward loop writes "
    "w_grad once per iteration without summing (the golden gradient corpus, e.g. "
    "grad.control.while_mul_loop_named_ys, has no Sum op), so for y += tanh(w * x) run 3 times "
    "it yields 1/3 of the finite difference; ferrocaffe reproduces that",
    "RecurrentNetwork": "its def (step net, links, recurrent states) is built by "
    "recurrent.recurrent_net; its gradient is checked against Caffe2's in the RNN tests",
}


# -- gradient kernels that no gradient maker emits --------------------------------------------
# Checked with explicit gradient ops (Caffe2's conventions for their inputs). Sparse gradients
# are densified with SparseToDense so that the checker reads a dense <input>_grad.


def _g(op_type, inputs, outputs, **args):
    return (op_type, list(inputs), list(outputs), args)


def _to_dense(values="DATA_grad_values"):
    return _g("SparseToDense", ["INDICES", values, "DATA"], ["DATA_grad"])


def _no_maker_cases():
    data = uniform((5, 3))
    idx = const([0, 2, 2, 4, 1, 0])
    lengths = const([2, 3, 1])
    weights = uniform((6,))
    sparse = [("DATA", data), ("INDICES", idx), ("LENGTHS", lengths)]
    sparse_w = [("DATA", data), ("WEIGHTS", weights), ("INDICES", idx), ("LENGTHS", lengths)]
    dense = [("DATA", uniform((6, 3))), ("LENGTHS", lengths)]
    dense_w = [("DATA", uniform((6, 3))), ("WEIGHTS", weights), ("LENGTHS", lengths)]
    pool_x = distinct((2, 2, 4, 4), gap=0.05)
    return [
        _c(
            "ReduceMin",
            [("X", distinct((2, 3, 4)))],
            args={"axes": [1], "keepdims": 0},
            grad_ops=[_g("ReduceMinGradient", ["Y_grad", "X", "Y"], ["X_grad"], axes=[1])],
        ),
        _c(
            "LengthsSum",
            dense,
            variant="LengthsSumGradient",
            grad_ops=[_g("LengthsSumGradient", ["Y_grad", "LENGTHS"], ["DATA_grad"])],
        ),
        _c(
            "LengthsMean",
            dense,
            variant="LengthsMeanGradient",
            grad_ops=[_g("LengthsMeanGradient", ["Y_grad", "LENGTHS"], ["DATA_grad"])],
        ),
        _c(
            "LengthsMean",
            dense,
            variant="LengthsIndicesInGradientMeanGradient",
            grad_ops=[
                _g(
                    "LengthsIndicesInGradientMeanGradient",
                    ["Y_grad", "LENGTHS", "DATA"],
                    ["DATA_grad"],
                )
            ],
        ),
        _c(
            "LengthsWeightedSum",
            dense_w,
            variant="LengthsWeightedSumGradient",
            grad_ops=[
                _g("LengthsWeightedSumGradient", ["WEIGHTS", "Y_grad", "LENGTHS"], ["DATA_grad"])
            ],
        ),
        _c(
            "LengthsWeightedSum",
            dense_w,
            variant="LengthsIndicesInGradientWeightedSumGradient",
            grad_ops=[
                _g(
                    "LengthsIndicesInGradientWeightedSumGradient",
                    ["WEIGHTS", "Y_grad", "LENGTHS", "DATA"],
                    ["DATA_grad"],
                )
            ],
        ),
        _c(
            "SparseLengthsSum",
            sparse,
            variant="SparseLengthsSumGradient",
            grad_ops=[
                _g("SparseLengthsSumGradient", ["Y_grad", "LENGTHS"], ["DATA_grad_values"]),
                _to_dense(),
            ],
        ),
        _c(
            "SparseLengthsMean",
            sparse,
            variant="SparseLengthsMeanGradient",
            grad_ops=[
                _g("SparseLengthsMeanGradient", ["Y_grad", "LENGTHS"], ["DATA_grad_values"]),
                _to_dense(),
            ],
        ),
        _c(
            "SparseLengthsWeightedSum",
            sparse_w,
            variant="SparseLengthsWeightedSumGradient",
            grad_ops=[
                _g(
                    "SparseLengthsWeightedSumGradient",
                    ["WEIGHTS", "Y_grad", "LENGTHS"],
                    ["DATA_grad_values"],
                ),
                _to_dense(),
            ],
        ),
        _c(
            "MaxPool2D",
            [("X", pool_x)],
            args={"kernel": 2, "stride": 2},
            grad_ops=[
                _g("MaxPool2DGradient", ["X", "Y", "Y_grad"], ["X_grad"], kernel=2, stride=2)
            ],
        ),
        _c(
            "AveragePool2D",
            [("X", pool_x)],
            args={"kernel": 2, "stride": 1},
            grad_ops=[
                _g("AveragePool2DGradient", ["X", "Y", "Y_grad"], ["X_grad"], kernel=2, stride=1)
            ],
        ),
        _c(
            "Conv2D",
            [("X", uniform((2, 2, 4, 4))), ("W", uniform((3, 2, 2, 2))), ("b", uniform((3,)))],
            args={"kernel": 2},
            grad_ops=[
                _g(
                    "Conv2DGradient",
                    ["X", "W", "Y_grad"],
                    ["W_grad", "b_grad", "X_grad"],
                    kernel=2,
                )
            ],
        ),
    ]


GRADIENT_KERNELS_WITHOUT_MAKER = _no_maker_cases()
