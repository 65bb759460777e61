"""Caffe2's ``functional``: run one operator as a Python function.

    relu_out = Functional.Relu(x)             # a named tuple: relu_out[0], relu_out["output_0"]
    parts = Functional.Split(x, axis=0, split=[1, 2], num_output=2)

Inputs are fed as ``input_0``, ``input_1``, ... into a fresh private workspace, the op runs
once, and its outputs ``output_0``, ... come back as numpy arrays. How many outputs there are
comes from ``num_output`` (checked against the op's schema) or the schema itself; outputs the
schema enforces in place take the name of their input.
"""

from collections import namedtuple

from ferrocaffe import _native, core, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["OpSchema", "namedtupledict", "Functional"]

_INPUT_PREFIX = "input_"
_OUTPUT_PREFIX = "output_"


class OpSchema:
    """The schema facts of one operator type, under the names Caffe2's ``C.OpSchema`` used
    (``min_input``, ``max_input``, ``num_inputs_allowed(n)``, ``CalculateOutput(n)``, ...),
    read from ferrocaffe's schema table."""

    # Caffe2 wrote an unbounded count as the largest C++ int.
    inf = 2**31 - 1

    def __init__(self, op_type, facts):
        self.name = op_type
        self.min_input, max_input = facts["inputs"]
        self.min_output, max_output = facts["outputs"]
        self.max_input = OpSchema.inf if max_input is None else max_input
        self.max_output = OpSchema.inf if max_output is None else max_output
        self._input_mask = int(facts.get("input_count_mask", 0) or 0)
        self._output_mask = int(facts.get("output_count_mask", 0) or 0)
        self._inplace_enforced = {tuple(p) for p in facts["inplace_enforced"]}
        self._inplace_allowed = {tuple(p) for p in facts["inplace_allowed"]}
        self.args = list(facts["args"])
        self.input_names = list(facts["input_names"])
        self.output_names = list(facts["output_names"])
        self.private = bool(facts["private"])

    @staticmethod
    def get(op_type):
        """The schema of ``op_type``, or None when ferrocaffe has none."""
        facts = _native.op_schema(str(op_type))
        return None if facts is None else OpSchema(str(op_type), facts)

    @staticmethod
    def _allowed(n, lo, hi, mask):
        if n < lo or n > hi:
            return False
        if mask and n < 8:
            return bool(mask >> n & 1)
        return True

    def num_inputs_allowed(self, n):
        return self._allowed(n, self.min_input, self.max_input, self._input_mask)

    def num_outputs_allowed(self, n):
        return self._allowed(n, self.min_output, self.max_output, self._output_mask)

    def num_inputs_outputs_allowed(self, num_inputs, num_outputs):
        return self.num_inputs_allowed(num_inputs) and self.num_outputs_allowed(num_outputs)

    def CalculateOutput(self, num_input):
        """The number of outputs the op has with ``num_input`` inputs: the fixed output
        count when there is one, else -1 (unknown)."""
        if self.min_output == self.max_output:
            return self.max_output
        return -1

    def inplace_enforced(self, input_index, output_index):
        return (input_index, output_index) in self._inplace_enforced

    def inplace_allowed(self, input_index, output_index):
        pair = (input_index, output_index)
        return pair in self._inplace_allowed or pair in self._inplace_enforced

    def __repr__(self):
        return f"OpSchema({self.name})"


def namedtupledict(typename, field_names, *args, **kwargs):
    """A namedtuple class whose instances are also indexed by field name (names that are not
    identifiers are allowed: they are renamed as attributes only)."""
    index_of = {name: i for i, name in enumerate(field_names)}
    kwargs.setdefault("rename", True)
    cls = namedtuple(typename, field_names, *args, **kwargs)
    base_getitem = tuple.__getitem__

    def getitem(self, key):
        if isinstance(key, str):
            key = index_of[key]
        return base_getitem(self, key)

    cls.__getitem__ = getitem
    return cls


def _names(prefix, count, limit):
    return [f"{prefix}{i}" for i in range(min(count, limit))]


def _output_names(op_type, schema, num_input, args):
    if "num_output" in args:
        num_output = args.pop("num_output")
        if not schema.num_inputs_outputs_allowed(num_input, num_output):
            raise ValueError(
                f"Functional C2: Number of output not in range: "
                f"{schema.min_output} - {schema.max_output} or not allowed"
            )
        names = _names(_OUTPUT_PREFIX, num_output, schema.max_output)
        if names:
            return names
    calculated = schema.CalculateOutput(num_input)
    if calculated != -1:
        names = _names(_OUTPUT_PREFIX, calculated, schema.max_output)
        if names:
            return names
    if schema.max_output == OpSchema.inf:
        raise ValueError(
            f"{op_type} has no bound on its number of outputs: pass num_output explicitly."
        )
    return _names(_OUTPUT_PREFIX, schema.max_output, schema.max_output)


def _run(op_type, inputs, args):
    schema = OpSchema.get(op_type)
    if schema is None:
        raise ValueError(f"Functional C2: no operator schema for '{op_type}'.")
    input_names = _names(_INPUT_PREFIX, len(inputs), schema.max_input)
    num_input = len(input_names)
    if len(inputs) > schema.max_input or not schema.num_inputs_allowed(num_input):
        raise ValueError(
            f"Functional C2: Number of inputs not in range: "
            f"{schema.min_input} - {schema.max_input} or not allowed."
        )
    args = dict(args)
    output_names = _output_names(op_type, schema, num_input, args)
    for i in range(len(input_names)):
        for j in range(len(output_names)):
            if schema.inplace_enforced(i, j):
                output_names[j] = input_names[i]

    op = core.CreateOperator(op_type, input_names, output_names, **args)
    device = args.get("device_option") or core.DeviceOption(caffe2_pb2.CPU)
    ws = _native.Workspace()
    for name, value in zip(input_names, inputs, strict=True):
        workspace._feed(ws, name, value)
        if device.device_type == caffe2_pb2.CUDA:
            ws.to_device(name, int(device.device_id))
    ws.run_operator_once(op.SerializeToString())
    values = [ws.fetch(name) for name in output_names]
    return namedtupledict("output", output_names)(*values)


class _Functional:
    """``Functional.<OpType>(*inputs, **args)`` runs one ``OpType`` op (see the module)."""

    def __getattribute__(self, op_type):
        def op_func(*inputs, **args):
            return _run(op_type, inputs, args)

        op_func.__name__ = op_type
        return op_func


Functional = _Functional()
