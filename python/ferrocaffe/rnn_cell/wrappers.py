"""Cells built from other cells: ``DropoutCell`` (dropout on the output),
``MultiRNNCell`` (stacked layers in one step net) and ``UnrolledCell`` (the recurrence unrolled
into the main net, no RecurrentNetwork op)."""

import logging

from ferrocaffe import brew, core, scope
from ferrocaffe.modeling.parameter_sharing import ParameterSharing
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.rnn_cell.base import RNNCell, _RectifyName

__all__ = ["DropoutCell", "MultiRNNCellInitializer", "MultiRNNCell", "UnrolledCell"]


class DropoutCell(RNNCell):
    """Wraps a cell and applies dropout to its output, not to the recurrent connection.

    ``is_test`` (keyword, required) is passed to the Dropout ops; no dropout is added when the
    ratio is None or 0, or the cell is ``forward_only``.
    """

    def __init__(self, internal_cell, dropout_ratio=None, use_cudnn=False, **kwargs):
        self.internal_cell = internal_cell
        self.dropout_ratio = dropout_ratio
        assert "is_test" in kwargs, "Argument 'is_test' is required"
        self.is_test = kwargs.pop("is_test")
        self.use_cudnn = use_cudnn
        super().__init__(**kwargs)

        self.prepare_input = internal_cell.prepare_input
        self.get_output_state_index = internal_cell.get_output_state_index
        self.get_state_names = internal_cell.get_state_names
        self.get_output_dim = internal_cell.get_output_dim
        # Numbers the dropout masks of successive outputs.
        self.mask = 0

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        return self.internal_cell._apply(
            model, input_t, seq_lengths, states, timestep, extra_inputs
        )

    def _prepare_output(self, model, states):
        output = self.internal_cell._prepare_output(model, states)
        if self.dropout_ratio is not None:
            output = self._apply_dropout(model, output)
        return output

    def _prepare_output_sequence(self, model, state_outputs):
        output = self.internal_cell._prepare_output_sequence(model, state_outputs)
        if self.dropout_ratio is not None:
            output = self._apply_dropout(model, output)
        return output

    def _apply_dropout(self, model, output):
        if self.dropout_ratio and not self.forward_only:
            with core.NameScope(self.name or ""):
                output = brew.dropout(
                    model,
                    output,
                    str(output) + f"_with_dropout_mask{self.mask}",
                    ratio=float(self.dropout_ratio),
                    is_test=self.is_test,
                    use_cudnn=self.use_cudnn,
                )
                self.mask += 1
        return output


class MultiRNNCellInitializer:
    """Initial states of every layer, each from its cell's initializer in the name scope
    ``layer_<i>/<cell name>``."""

    def __init__(self, cells):
        self.cells = cells

    def create_states(self, model):
        states = []
        for i, cell in enumerate(self.cells):
            if cell.initializer is None:
                raise Exception("Either initial states or initializer have to be set")
            with core.NameScope(f"layer_{i}"), core.NameScope(cell.name):
                states.extend(cell.initializer.create_states(model))
        return states


class MultiRNNCell(RNNCell):
    """Layers of cells run in one step: the (first-state) output of layer i is the input of
    layer i + 1 (after that cell's ``prepare_input``). States of layer i are named
    ``<name>/layer_<i>/<state>``.

    residual_output_layers: layers whose input is added to their output (never layer 0).
    """

    def __init__(self, cells, residual_output_layers=None, **kwargs):
        super().__init__(**kwargs)
        self.cells = cells
        self.residual_output_layers = (
            [] if residual_output_layers is None else residual_output_layers
        )

        output_index_per_layer = []
        base_index = 0
        for cell in self.cells:
            output_index_per_layer.append(base_index + cell.get_output_state_index())
            base_index += len(cell.get_state_names())

        # The outputs summed into the cell's output: the last layer's, plus those of the
        # residual layers right below it (a non-residual layer cuts the chain).
        self.output_connected_layers = []
        self.output_indices = []
        for i in range(len(self.cells) - 1):
            if (i + 1) in self.residual_output_layers:
                self.output_connected_layers.append(i)
                self.output_indices.append(output_index_per_layer[i])
            else:
                self.output_connected_layers = []
                self.output_indices = []
        self.output_connected_layers.append(len(self.cells) - 1)
        self.output_indices.append(output_index_per_layer[-1])

        self.state_names = []
        for i, cell in enumerate(self.cells):
            self.state_names.extend(map(self.layer_scoper(i), cell.get_state_names()))

        self.initializer = MultiRNNCellInitializer(cells)

    def layer_scoper(self, layer_id):
        def helper(name):
            return f"{self.name}/layer_{layer_id}/{name}"

        return helper

    def prepare_input(self, model, input_blob):
        input_blob = _RectifyName(input_blob)
        with core.NameScope(self.name or ""):
            return self.cells[0].prepare_input(model, input_blob)

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        # The inputs become references before the per-layer scopes apply.
        input_t, seq_lengths, states, timestep, extra_inputs = self._rectify_apply_inputs(
            input_t, seq_lengths, states, timestep, extra_inputs
        )
        states_per_layer = [len(cell.get_state_names()) for cell in self.cells]
        assert len(states) == sum(states_per_layer)

        next_states = []
        states_index = 0
        layer_input = input_t
        for i, layer_cell in enumerate(self.cells):
            with core.NameScope(self.name), core.NameScope(f"layer_{i}"):
                num_states = states_per_layer[i]
                layer_states = states[states_index : states_index + num_states]
                states_index += num_states

                if i > 0:
                    prepared_input = layer_cell.prepare_input(model, layer_input)
                else:
                    prepared_input = layer_input
                layer_next_states = layer_cell._apply(
                    model,
                    prepared_input,
                    seq_lengths,
                    layer_states,
                    timestep,
                    extra_inputs=(None if i > 0 else extra_inputs),
                )
                if i != len(self.cells) - 1:
                    layer_output = layer_cell._prepare_output(model, layer_next_states)
                    if i > 0 and i in self.residual_output_layers:
                        layer_input = brew.sum(
                            model,
                            [layer_output, layer_input],
                            self.scope(f"residual_output_{i}"),
                        )
                    else:
                        layer_input = layer_output
                next_states.extend(layer_next_states)
        return next_states

    def get_state_names(self):
        return self.state_names

    def get_output_state_index(self):
        index = 0
        for cell in self.cells[:-1]:
            index += len(cell.get_state_names())
        return index + self.cells[-1].get_output_state_index()

    def _connected_output(self, model, states, states_per_cell, prepare, sum_name):
        connected_outputs = []
        state_index = 0
        for i, cell in enumerate(self.cells):
            num_states = states_per_cell * len(cell.get_state_names())
            if i in self.output_connected_layers:
                layer_states = states[state_index : state_index + num_states]
                connected_outputs.append(getattr(cell, prepare)(model, layer_states))
            state_index += num_states
        if len(connected_outputs) > 1:
            return brew.sum(model, connected_outputs, self.scope(sum_name))
        return connected_outputs[0]

    def _prepare_output(self, model, states):
        return self._connected_output(model, states, 1, "_prepare_output", "residual_output")

    def _prepare_output_sequence(self, model, states):
        return self._connected_output(
            model, states, 2, "_prepare_output_sequence", "residual_output_sequence"
        )


class UnrolledCell(RNNCell):
    """Runs ``cell`` over exactly ``T`` steps unrolled into the main net (a Split of the input,
    the step ops of timestep t in name scope ``timestep_<t>`` with shared parameters, and a
    Concat per state). No sequence lengths beyond what the cell itself handles."""

    def __init__(self, cell, T):
        self.T = T
        self.cell = cell

    def apply_over_sequence(
        self, model, inputs, seq_lengths, initial_states, outputs_with_grads=None
    ):
        inputs = self.cell.prepare_input(model, inputs)
        split_inputs = model.net.Split(
            inputs, [str(inputs) + f"_timestep_{i}" for i in range(self.T)], axis=0
        )
        if self.T == 1:
            split_inputs = [split_inputs]

        states = initial_states
        all_states = []
        for t in range(self.T):
            scope_name = f"timestep_{t}"
            # Every timestep uses the parameters of the unscoped cell.
            with ParameterSharing({scope_name: ""}), scope.NameScope(scope_name):
                timestep = model.param_init_net.ConstantFill(
                    [],
                    "timestep",
                    value=t,
                    shape=[1],
                    dtype=core.DataType.INT32,
                    device_option=core.DeviceOption(caffe2_pb2.CPU),
                )
                states = self.cell._apply(
                    model=model,
                    input_t=split_inputs[t],
                    seq_lengths=seq_lengths,
                    states=states,
                    timestep=timestep,
                )
            all_states.append(states)

        prefix_len = len("timestep_0/")
        concatenated = []
        for full_output in zip(*all_states, strict=True):
            base = str(full_output[0])[prefix_len:]
            concatenated.append(
                model.net.Concat(
                    list(full_output), [base + "_concat", base + "_concat_info"], axis=0
                )[0]
            )
        # (state_1_all, state_1_last, state_2_all, ...), as apply_over_sequence returns.
        outputs = tuple(state for pair in zip(concatenated, states, strict=False) for state in pair)
        outputs_without_grad = set(range(len(outputs))) - set(outputs_with_grads)
        for i in outputs_without_grad:
            model.net.ZeroGradient(outputs[i], [])
        logging.debug("Added 0 gradients for blobs: %s", [outputs[i] for i in outputs_without_grad])

        final_output = self.cell._prepare_output_sequence(model, outputs)
        return final_output, outputs
