"""Caffe2's ``core.Net``: a builder around a ``NetDef``.

Operators are added by attribute access (``net.Relu('x', 'y')``); inputs that nothing in the net
defines become external inputs, and omitted outputs get generated names (``<net>/<OpType>``,
``<net>/<OpType>_2``, ...). Net names are unique per process through the class attribute
``Net._net_names_used``.
"""

import sys
from collections import OrderedDict, defaultdict

import numpy as np

from ferrocaffe import utils
from ferrocaffe.core.blob import (
    BlobReference,
    DataType,
    GradientSlice,
    ScopedBlobReference,
    ScopedName,
    _get_blob_ref,
)
from ferrocaffe.core.operator import (
    CreateOperator,
    IsOperator,
    _GetRegisteredOperators,
    _not_registered_message,
    _RectifyInputOutput,
)
from ferrocaffe.proto import caffe2_pb2

__all__ = ["Net", "_extract_stacktrace"]


def _extract_stacktrace():
    """The call stack that created an operator, innermost first, as (file, line, function)
    tuples, without the frames of this module. Read from the frames only (no source access)."""
    result = []
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    while frame is not None:
        result.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return result


def _record_traceback(net_name, op_index):
    from ferrocaffe import workspace

    tracebacks = getattr(workspace, "operator_tracebacks", None)
    if tracebacks is not None:
        tracebacks[net_name][op_index] = _extract_stacktrace()


class Net:
    # Every net name handed out in this process (replaced wholesale by test runners, so it is
    # always read through the class at call time).
    _net_names_used = set()

    @staticmethod
    def current_prefix():
        """Prefix for new net names (Caffe2's NetBuilder scope; none in ferrocaffe)."""
        return ""

    # (the used-names set it describes, {basename: the first suffix not known to be taken}):
    # names are only ever added to the set, so the search for a free name resumes where the
    # last one stopped instead of walking every taken suffix again (a test making thousands
    # of "opnet" nets was quadratic). Starts over when the set is replaced.
    _next_suffix = (None, {})

    @staticmethod
    def _get_next_net_name(basename):
        name = basename = "/".join(x for x in [Net.current_prefix(), basename] if x)
        used = Net._net_names_used
        known, suffixes = Net._next_suffix
        if known is not used:
            suffixes = {}
            Net._next_suffix = (used, suffixes)
        next_idx = 1
        if name in used:
            next_idx = suffixes.get(basename, 1)
            name = basename + "_" + str(next_idx)
            while name in used:
                next_idx += 1
                name = basename + "_" + str(next_idx)
            next_idx += 1
        suffixes[basename] = next_idx
        used.add(name)
        return name

    def __init__(self, name_or_proto, inplace=False):
        """Create an empty net named ``name_or_proto`` (made unique), or a net holding a copy of
        a NetDef (the NetDef itself with ``inplace=True``), renamed if its name is taken."""
        self._input_record = None
        self._output_record = None
        # Names returned by NextBlob/NextScopedBlob, so later calls never repeat one.
        self._registered_blob_names = set()
        self._recreate_lookup_tables = False
        self._op_outputs = set()
        self._external_input_map = set()
        self._attr_dict = defaultdict(list)
        if type(name_or_proto) is caffe2_pb2.NetDef:
            proto = name_or_proto
            if inplace:
                self._net = proto
            else:
                self._net = caffe2_pb2.NetDef()
                self._net.CopyFrom(proto)
            self._external_input_map.update(self._net.external_input)
            existing_names = set()
            for op in self._net.op:
                existing_names.update(op.input)
                existing_names.update(op.output)
                self._op_outputs.update(op.output)
            self._next_name_index = self._first_free_autogen_index(existing_names)
            name = self._net.name
        else:
            name = name_or_proto
            self._net = caffe2_pb2.NetDef()
            self._next_name_index = 0

        self._net.name = Net._get_next_net_name(name)
        # Next suffix to try per NextName() prefix.
        self._next_blob_name_ids = {}

    def _first_free_autogen_index(self, existing_names):
        # As in Caffe2, only the first digit after `<name>_blob_` is read.
        prefix = self._net.name + "_blob_"
        indices = []
        for s in existing_names:
            if s.startswith(prefix):
                try:
                    indices.append(int(s[len(prefix)]))
                except (ValueError, IndexError):
                    pass
        return max(indices) + 1 if indices else 0

    # ----------------------------------------------------------------- records & attributes
    def input_record(self):
        """The schema record of the net's inputs (``set_input_record``), or None."""
        return self._input_record

    def output_record(self):
        """The schema record of the net's outputs (``set_output_record``), or None."""
        return self._output_record

    def set_input_record(self, input_record):
        """Declare a schema record as the net's inputs: its blobs become external inputs. A
        record without blobs gets new ones, named after its columns under the net's name scope.
        Once set, it can only be set again to a record of the same blobs. Returns the record."""
        from ferrocaffe import schema
        from ferrocaffe.scope import NameScope

        assert self._input_record is None or (
            input_record.has_blobs()
            and set(input_record.field_blobs()) == set(self._input_record.field_blobs())
        ), "Input schema cannot be reset"
        if input_record.has_blobs():
            self._input_record = input_record
        else:
            with NameScope(self.Name()):
                self._input_record = schema.NewRecord(self, input_record)
        for blob in self._input_record.field_blobs():
            if not self.is_external_input(blob):
                self.AddExternalInput(blob)
        return self._input_record

    def recover_input_record_by_prefix(self, prefix):
        """Set the input record from the external inputs named ``prefix<column>``, if any."""
        record = _recover_record_by_prefix(self._net.external_input, prefix)
        if record:
            self.set_input_record(record)

    def set_output_record(self, record):
        """Declare a schema record as the net's outputs: every blob must be defined by the net;
        those not yet external outputs become so. Once set, it can only be set again to a
        record of the same blobs."""
        assert self._output_record is None or (
            record.has_blobs()
            and set(record.field_blobs()) == set(self._output_record.field_blobs())
        ), "Output schema cannot be reset"
        for blob in record.field_blobs():
            assert self.BlobIsDefined(blob), f"{blob} is not defined in net {self.Proto()}"
        for blob in record.field_blobs():
            if blob not in self.external_outputs:
                self.AddExternalOutput(blob)
        self._output_record = record

    def recover_output_record_by_prefix(self, prefix):
        """Set the output record from the external outputs named ``prefix<column>``, if any."""
        record = _recover_record_by_prefix(self._net.external_output, prefix)
        if record:
            self.set_output_record(record)

    def AppendOutputRecordField(self, field_name, record):
        """Add ``record`` (blobs the net defines) to the output record as field
        ``field_name``; its blobs become external outputs."""
        from ferrocaffe import schema

        assert self._output_record is not None, "Tried to append to missing output record"
        for blob in record.field_blobs():
            assert self.BlobIsDefined(blob), f"{blob} is not defined"
        for blob in record.field_blobs():
            self.AddExternalOutput(blob)
        self._output_record = self._output_record + schema.Struct((field_name, record))

    def add_attribute(self, name, obj):
        """Attach ``obj`` to this net under ``name`` (several objects per name)."""
        self._attr_dict[name].append(obj)

    def get_attributes(self, name):
        """The objects attached under ``name`` ([] if none)."""
        return self._attr_dict.get(name, [])

    # ----------------------------------------------------------------------- lookups
    def _InvalidateLookupTables(self):
        self._recreate_lookup_tables = True

    def _CheckLookupTables(self):
        """Assert that the lookup tables know every op output and external input of the
        NetDef (for tests: a table missing a name would make BlobIsDefined wrong)."""
        missing_outputs = {o for op in self._net.op for o in op.output} - self._op_outputs
        missing_inputs = set(self._net.external_input) - self._external_input_map
        assert not missing_outputs, f"op outputs missing from the lookup table: {missing_outputs}"
        assert not missing_inputs, (
            f"external inputs missing from the lookup table: {missing_inputs}"
        )

    def _RecreateLookupTables(self):
        self._op_outputs = {o for op in self._net.op for o in op.output}
        self._external_input_map = set(self._net.external_input)
        self._recreate_lookup_tables = False

    def BlobIsDefined(self, blob):
        """Whether an op of this net outputs ``blob`` or it is an external input."""
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        name = str(blob)
        return name in self._op_outputs or name in self._external_input_map

    def UsesBlob(self, blob):
        """Whether an op of this net reads ``blob`` or it is an external input."""
        blob_name = str(blob)
        for op in self._net.op:
            if blob_name in op.input:
                return True
        return blob_name in self._external_input_map

    def UsedBlobNames(self):
        """Every blob name read or written by an op, or listed as external input/output."""
        names = set()
        for op in self._net.op:
            names.update(op.input)
            names.update(op.output)
        names.update(self._net.external_input)
        names.update(self._net.external_output)
        return names

    def GetBlobRef(self, blob_name):
        """A reference (bound to this net) to a blob the net defines; KeyError otherwise."""
        blob_name = str(blob_name)
        if not self.BlobIsDefined(blob_name):
            raise KeyError(f"Net does not define blob {blob_name}")
        return BlobReference(blob_name, self)

    def is_external_input(self, blob):
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        return str(blob) in self._external_input_map

    @property
    def external_inputs(self):
        return [_get_blob_ref(x) for x in self._net.external_input]

    @property
    def external_outputs(self):
        return [_get_blob_ref(x) for x in self._net.external_output]

    # ------------------------------------------------------------------------ naming
    def Name(self):
        return self._net.name

    def __str__(self):
        return self.Name()

    def NextName(self, prefix=None, output_id=None):
        """A blob name for an op output: ``<net>/<prefix>[:<output_id>]``, with ``_2``, ``_3``...
        appended to the prefix while the (scoped) name is defined; ``<net>_blob_<i>`` without a
        prefix. Deprecated in Caffe2 in favour of NextBlob/NextScopedBlob."""
        if prefix:
            output_name_base = self._net.name + "/" + prefix
            output_name = output_name_base
            if output_id is not None:
                output_name += ":" + str(output_id)
            key = output_name
            index = self._next_blob_name_ids.get(key, 2)
            while self.BlobIsDefined(str(ScopedBlobReference(output_name))):
                output_name = output_name_base + "_" + str(index)
                if output_id is not None:
                    output_name += ":" + str(output_id)
                index += 1
                self._next_blob_name_ids[key] = index
        else:
            output_name = self._net.name + "_blob_" + str(self._next_name_index)
            self._next_name_index += 1
        return str(output_name)

    def NextBlob(self, prefix="unnamed"):
        """A reference to ``prefix`` or, if that is defined or was handed out before,
        ``prefix_auto_<i>`` for the first free i. Never returns the same name twice."""
        output_blob_base = BlobReference(prefix)
        output_blob = output_blob_base
        index = 0
        while str(output_blob) in self._registered_blob_names or self.BlobIsDefined(output_blob):
            output_blob = output_blob_base + "_auto_" + str(index)
            index += 1
        self._registered_blob_names.add(str(output_blob))
        return output_blob

    def NextScopedBlob(self, prefix="unnamed"):
        """NextBlob of the prefix within the current name scope."""
        return self.NextBlob(ScopedName(prefix))

    # ------------------------------------------------------------- external inputs/outputs
    def AddExternalInput(self, *inputs):
        """Declare external inputs; returns one reference, or a list for several names.
        A name that is already an external input (or given twice) is an AssertionError and
        nothing is added."""
        assert len(inputs) > 0
        refs = []
        input_name_set = set()
        for blob in inputs:
            input_name = str(blob)
            assert (
                input_name not in self._external_input_map and input_name not in input_name_set
            ), f"Net already contains an input named {input_name}"
            input_name_set.add(input_name)
        for blob in inputs:
            input_name = str(blob)
            self._net.external_input.extend([input_name])
            self._external_input_map.update([input_name])
            refs.append(_get_blob_ref(input_name))
        return refs[0] if len(refs) == 1 else refs

    AddExternalInputs = AddExternalInput

    def AddExternalOutput(self, *outputs):
        """Declare external outputs: each must be a BlobReference that the net defines."""
        for output in outputs:
            assert isinstance(output, BlobReference)
            assert self.BlobIsDefined(output), f"{output} is not defined"
        for output in outputs:
            self.Proto().external_output.extend([str(output)])

    AddExternalOutputs = AddExternalOutput

    def AddScopedExternalInputs(self, *inputs):
        res = self.AddExternalInput(*[ScopedBlobReference(b) for b in inputs])
        if not isinstance(res, list):
            res = [res]
        return res

    def AddScopedExternalOutputs(self, *outputs):
        return self.AddExternalOutput(*[ScopedBlobReference(b) for b in outputs])

    # ---------------------------------------------------------------------- proto access
    def PopulateProtoWithFileName(self):
        """Name each op of the NetDef after the place that added it (``file:line:function``
        of the innermost caller outside ``core``), for ops whose creation stack was recorded."""
        from ferrocaffe import workspace

        tracebacks = getattr(workspace, "operator_tracebacks", {}).get(self.Name())
        if not tracebacks:
            return
        for index, op in enumerate(self.Proto().op):
            stack = tracebacks.get(index)
            if stack:
                op.name = ":".join(str(part) for part in stack[0])

    def Proto(self):
        """The live NetDef. The lookup tables are rebuilt on next use, since the caller may
        edit it."""
        self._InvalidateLookupTables()
        return self._net

    def AddArgument(self, arg_name, arg_value):
        self._net.arg.extend([utils.MakeArgument(arg_name, arg_value)])

    def _ExtendOps(self, new_ops):
        self._net.op.extend(new_ops)
        for op in new_ops:
            self._op_outputs.update(str(o) for o in op.output)

    def extend_ops(self, new_ops):
        """Append copies of ``new_ops``."""
        self._ExtendOps(new_ops)

    def insert_op_at_idx(self, op, op_idx):
        """Insert a copy of ``op`` before position ``op_idx`` (at the end if past it)."""
        assert op_idx >= 0
        temp_ops = self.Proto().op[op_idx:]
        del self.Proto().op[op_idx:]
        self.Proto().op.extend([op])
        self.Proto().op.extend(temp_ops)
        # Caffe2 extends the temporary lists returned by these properties: no effect.
        self.external_outputs.extend(op.output)
        self.external_inputs.extend(op.input)

    def reroute_tensor(self, tensor, new_producer, can_modify=None):
        """Insert ``new_producer`` (reading ``tensor``, writing output 0) right after the
        producer of ``tensor`` (first if it is an external input), make the ops in
        ``can_modify`` read its output instead, and replace ``tensor`` in the external
        outputs. Returns how many ops were changed."""
        new_tensor = new_producer.output[0]
        if tensor in self.external_outputs:
            new_list = [new_tensor if b == tensor else str(b) for b in self.external_outputs]
            del self.Proto().external_output[:]
            self.Proto().external_output.extend(new_list)

        reroute_cnt = 0
        if can_modify:
            for op in self.Proto().op:
                if op in can_modify:
                    renamed = [new_tensor if b == tensor else b for b in op.input]
                    del op.input[:]
                    op.input.extend(renamed)
                    reroute_cnt += 1

        if tensor in self.external_inputs:
            self.insert_op_at_idx(new_producer, 0)
        else:
            for i, op in enumerate(self.Proto().op):
                if tensor in op.output:
                    self.insert_op_at_idx(new_producer, i + 1)
                    break
        return reroute_cnt

    # ------------------------------------------------------------------- op creation
    def _CreateAndAddToSelf(self, op_type, inputs, outputs=None, **kwargs):
        """Create an ``op_type`` operator, append it and return its output reference(s).

        Undefined inputs become external inputs (a reference bound to this very net must be
        defined). ``outputs``: None -> one generated name; an int n -> n generated names
        ``<net>/<op_type>:<i>``; else names/references. Returns None, one reference or a tuple.
        """
        inputs = _RectifyInputOutput(inputs)
        for blob in inputs:
            if not self.BlobIsDefined(blob):
                assert blob.Net() != self
                self.AddExternalInput(blob)
        if outputs is None:
            outputs = self.NextName(prefix=op_type)
        elif type(outputs) is int:
            outputs = [self.NextName(prefix=op_type, output_id=i) for i in range(outputs)]
        outputs = _RectifyInputOutput(outputs, net=self)
        op = CreateOperator(op_type, inputs, outputs, **kwargs)
        self._ExtendOps([op])
        _record_traceback(self.Name(), len(self._net.op) - 1)

        if len(op.output) == 0:
            return None
        if len(op.output) == 1:
            return BlobReference(op.output[0], self)
        return tuple(BlobReference(o, self) for o in op.output)

    def __getattr__(self, op_type):
        if op_type.startswith("__"):
            raise AttributeError(f"Attribute {op_type} not found.")
        if not IsOperator(op_type):
            raise AttributeError(_not_registered_message(op_type))
        return lambda *args, **kwargs: self._CreateAndAddToSelf(op_type, *args, **kwargs)

    def __dir__(self):
        additional = [op for op in _GetRegisteredOperators() if "_ENGINE_" not in op]
        return sorted(set(dir(type(self))) | set(self.__dict__) | set(additional))

    def Python(
        self,
        f,
        grad_f=None,
        python_func_type=None,
        pass_workspace=False,
        grad_output_indices=None,
        grad_input_indices=None,
    ):
        """A maker of ``Python`` ops calling ``f`` (see ``core.CreatePythonOperator``):
        ``net.Python(f)(inputs, outputs, **kwargs)``. ``f``/``grad_f`` may be
        ``(builder, args, kwargs)`` tuples: each op instance then calls
        ``builder(*args, **kwargs)`` once, when it is created, for its function."""
        from ferrocaffe.core import python_op

        return python_op._net_python(
            self,
            f,
            grad_f,
            python_func_type,
            pass_workspace,
            grad_output_indices,
            grad_input_indices,
        )

    def Const(self, array, blob_out=None, dtype=None):
        """Add a fill op holding ``array``: ConstantFill for a Python bool, otherwise a
        GivenTensor*Fill chosen by the numpy dtype (int32, int64, bool, else float)."""
        if isinstance(array, bool):
            return self._CreateAndAddToSelf(
                "ConstantFill", [], blob_out or 1, dtype=DataType.BOOL, value=array
            )
        array = np.array(array) if dtype is None else np.array(array, dtype=dtype)

        if array.dtype == np.int32:
            op_type = "GivenTensorIntFill"
        elif array.dtype == np.int64:
            op_type = "GivenTensorInt64Fill"
        elif array.dtype == np.dtype(str):
            # Only the zero-length unicode dtype compares equal here, as in Caffe2: string
            # arrays normally end up in GivenTensorFill with a `strings` values argument.
            op_type = "GivenTensorStringFill"
        elif array.dtype == np.bool_:
            op_type = "GivenTensorBoolFill"
        else:
            op_type = "GivenTensorFill"
        return self._CreateAndAddToSelf(
            op_type, [], blob_out or 1, shape=array.shape, values=array.flatten().tolist()
        )

    def LogInfo(self, *msg_or_blobs):
        """Add Print ops for each blob or message (messages are first put in a string tensor)."""
        for msg_or_blob in msg_or_blobs:
            if not isinstance(msg_or_blob, BlobReference):
                blob = self._CreateAndAddToSelf(
                    "GivenTensorStringFill",
                    [],
                    self.NextName("log"),
                    shape=[],
                    values=[msg_or_blob],
                )
            else:
                blob = msg_or_blob
            self._CreateAndAddToSelf("Print", blob, [])

    def DeduplicateGradientSlices(self, g, aggregator="sum"):
        """Add ops merging the rows of a GradientSlice that share an index (summed or averaged)."""
        assert isinstance(g, GradientSlice)
        unique, remapping = self._CreateAndAddToSelf("Unique", [g.indices], 2, engine="SparseHash")
        if aggregator.lower() == "sum":
            new_g = self._CreateAndAddToSelf("UnsortedSegmentSum", [g.values, remapping], 1)
        elif aggregator.lower() == "mean":
            new_g = self._CreateAndAddToSelf("UnsortedSegmentMean", [g.values, remapping], 1)
        else:
            raise ValueError(f"{aggregator} is not supported")
        return GradientSlice(indices=unique, values=new_g)

    # ------------------------------------------------------------------- net editing
    def AppendNet(self, net, device_option=None):
        """Append ``net``'s ops (copies; with ``device_option`` set on each, step nets of
        RecurrentNetwork ops included), its external inputs not defined here and its new
        external outputs. Returns self."""
        assert isinstance(net, Net)
        for i in net.Proto().external_input:
            if i not in self.Proto().external_input and i not in self._op_outputs:
                self.Proto().external_input.append(i)

        self.Proto().external_output.extend(
            [o for o in net.Proto().external_output if o not in self.Proto().external_output]
        )
        ops = net.Proto().op
        if device_option is not None:
            copied = []
            for op in ops:
                new_op = caffe2_pb2.OperatorDef()
                new_op.CopyFrom(op)
                new_op.device_option.CopyFrom(device_option)
                if new_op.type == "RecurrentNetwork":
                    for arg in new_op.arg:
                        if arg.name.endswith("step_net"):
                            for step_op in arg.n.op:
                                step_op.device_option.CopyFrom(device_option)
                copied.append(new_op)
            ops = copied
        self._ExtendOps(ops)
        return self

    def set_rand_seed(self, seed=100, sequence_seed=True, seed_on_op_def=False):
        """Set ``device_option.random_seed`` on every op: ``seed + i`` for op i by default, a
        hash of the op text with ``seed_on_op_def``, else ``seed`` itself."""
        assert not (sequence_seed and seed_on_op_def), (
            "sequence_seed and seed_on_op_def cannot be both set to True."
        )
        for i, op in enumerate(self.Proto().op):
            if sequence_seed:
                curr_seed = seed + i
            elif seed_on_op_def:
                curr_seed = hash(str(op) + str(seed)) % np.iinfo(np.uint32).max
            else:
                curr_seed = seed
            op.device_option.random_seed = curr_seed

    def RunAllOnGPU(self, gpu_id=0, use_cudnn=False):
        """Set the net's device option to GPU ``gpu_id`` (and engine CUDNN on every op with
        ``use_cudnn``), also in the step nets of RecurrentNetwork ops."""
        _run_all_on_gpu(self._net, gpu_id, use_cudnn)

    def RunAllOnMKL(self):
        """Set the net's device option to the MKLDNN device."""
        device_option = caffe2_pb2.DeviceOption()
        device_option.device_type = caffe2_pb2.MKLDNN
        self._net.device_option.CopyFrom(device_option)

    def RunAllOnIDEEP(self):
        """Set the net's device option to the IDEEP device."""
        device_option = caffe2_pb2.DeviceOption()
        device_option.device_type = caffe2_pb2.IDEEP
        self._net.device_option.CopyFrom(device_option)

    # ------------------------------------------------------------------------- cloning
    def Clone(
        self,
        name,
        blob_remap=None,
        op_id_mask=None,
        remap_funcs=None,
        keep_schema=True,
        update_external_list=False,
    ):
        """A new net ``name`` with copies of the ops (those in ``op_id_mask`` if given), blob
        names renamed by ``blob_remap``, and sub-nets of control-flow / recurrent ops remapped
        by ``remap_funcs`` (Caffe2's DEFAULT_REMAP_FUNCS plus the given ones)."""
        from ferrocaffe.core import _net_clone

        return _net_clone.clone_net(
            self, name, blob_remap, op_id_mask, remap_funcs, keep_schema, update_external_list
        )

    def ClonePartial(self, name, inputs, outputs, remap_funcs=None):
        """Clone only the ops needed to compute ``outputs`` from ``inputs``.

        ``inputs``: names (kept), a dict or a list of pairs (renamed to the values). Internal
        blobs get the prefix ``name + '/'``; blobs the sub-net reads but does not produce stay
        as they are. Returns (new_net, references to the new outputs).
        """
        from ferrocaffe.core import _net_clone

        input_is_pair_list = isinstance(inputs, list) and all(
            isinstance(i, tuple) and len(i) == 2 for i in inputs
        )
        if isinstance(inputs, dict | OrderedDict):
            pass
        elif input_is_pair_list:
            inputs = OrderedDict(inputs)
        else:
            inputs = OrderedDict(zip(inputs, inputs, strict=False))
        for output in outputs:
            assert self.BlobIsDefined(output), f"{output} is not defined"
        return _net_clone.clone_partial(self, name, inputs, outputs, remap_funcs)

    # ------------------------------------------------------------------------ gradients
    def AddGradientOperators(self, ys, skip=0):
        """Append the gradient ops of this net's ops (from op ``skip`` on) for ``ys`` (a list,
        or a dict blob -> given gradient / None) and return the blob -> gradient map."""
        from ferrocaffe.core.gradients import add_gradient_operators

        # The output names come back packed; `_op_outputs` takes them when it is next read.
        pending = []
        grads = add_gradient_operators(self._net, ys, skip, outputs=pending)
        if pending:
            self.__dict__.setdefault("_pending_op_outputs", []).extend(pending)
        return grads

    @property
    def _op_outputs(self):
        """The output names of the ops (a set), with those of the gradient ops added last."""
        if "_op_outputs_set" not in self.__dict__:
            # A net restored without it (pickled before the names were kept this way).
            self._op_outputs_set = {o for op in self._net.op for o in op.output}
        pending = self.__dict__.get("_pending_op_outputs")
        if pending:
            from ferrocaffe.core.gradients import add_output_names

            add_output_names(self._op_outputs_set, pending)
            pending.clear()
        return self._op_outputs_set

    @_op_outputs.setter
    def _op_outputs(self, names):
        self._op_outputs_set = names
        self.__dict__.pop("_pending_op_outputs", None)


def _recover_record_by_prefix(names, prefix=""):
    """The schema record whose columns are the ``names`` starting with ``prefix`` (the rest of
    each name is the column), holding references to those blobs; None if there are none."""
    from ferrocaffe import schema

    columns = [name[len(prefix) :] for name in names if name.startswith(prefix)]
    if not columns:
        return None
    return schema.from_column_list(
        columns, col_blobs=[BlobReference(prefix + column) for column in columns]
    )


def _run_all_on_gpu(net, gpu_id, use_cudnn):
    device_option = caffe2_pb2.DeviceOption()
    device_option.device_type = caffe2_pb2.CUDA
    device_option.device_id = gpu_id
    net.device_option.CopyFrom(device_option)
    if use_cudnn:
        for op in net.op:
            op.engine = "CUDNN"
    for op in net.op:
        if op.type != "RecurrentNetwork":
            continue
        for arg in op.arg:
            if arg.name == "step_net":
                _run_all_on_gpu(arg.n, gpu_id, use_cudnn)
