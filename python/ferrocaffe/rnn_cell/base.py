"""The ``RNNCell`` base class: one recurrent step, applied once or over a whole sequence.

A cell describes one timestep (``_apply`` / ``apply_override``) and names its recurrent states
(``get_state_names``). ``apply_over_sequence`` builds the step net in a step model that shares
the parameters of the main model and hands it to ``recurrent.recurrent_net``, which adds one
``RecurrentNetwork`` op to the main net.
"""

import inspect

from ferrocaffe import core, recurrent, scope
from ferrocaffe.model_helper import ModelHelper

__all__ = ["RNNCell", "_RectifyName", "_RectifyNames"]


def _RectifyName(blob_reference_or_name):
    """A BlobReference for a name (scoped by the current name scope); references pass as they
    are, None stays None."""
    if blob_reference_or_name is None:
        return None
    if isinstance(blob_reference_or_name, str):
        return core.ScopedBlobReference(blob_reference_or_name)
    if not isinstance(blob_reference_or_name, core.BlobReference):
        raise Exception("Unknown blob reference type")
    return blob_reference_or_name


def _RectifyNames(blob_references_or_names):
    if blob_references_or_names is None:
        return None
    return [_RectifyName(i) for i in blob_references_or_names]


def _abstract(cell, method):
    """The deliberate error of RNNCell's methods that a subclass must override: Caffe2's base
    class raises NotImplementedError there, and code written for Caffe2 relies on that type.
    (Not abc.ABC: Caffe2's RNNCell can be instantiated, and subclasses override only what
    they use.)"""
    raise NotImplementedError(
        f"{type(cell).__name__}.{method} is abstract in RNNCell: the subclass must override it"
    )


class RNNCell:
    """Base class of recurrent cells.

    A cell implements ``apply_override`` (one step, run inside the cell's name scope) and
    ``get_state_names_override`` (its state names, scoped by ``get_state_names``), or overrides
    ``_apply`` / ``get_state_names`` directly. Optional hooks: ``prepare_input`` (work on the
    whole input sequence before the recurrence), ``_prepare_output`` and
    ``_prepare_output_sequence``.
    """

    def __init__(self, name=None, forward_only=False, initializer=None):
        self.name = name
        self.recompute_blobs = []
        self.forward_only = forward_only
        self._initializer = initializer

    @property
    def initializer(self):
        return self._initializer

    @initializer.setter
    def initializer(self, value):
        self._initializer = value

    def scope(self, name):
        """``<cell name>/name`` (``name`` alone for an unnamed cell)."""
        return self.name + "/" + name if self.name is not None else name

    def apply_over_sequence(
        self,
        model,
        inputs,
        seq_lengths=None,
        initial_states=None,
        outputs_with_grads=None,
    ):
        """Run the cell over the sequence ``inputs`` (T x N x D) with one RecurrentNetwork op.

        Without ``initial_states`` the cell's initializer creates them as parameters.
        Returns ``(output sequence, states)`` where ``states`` alternates the whole sequence
        and the last value of each state: ``(s1_all, s1_last, s2_all, s2_last, ...)``.
        """
        if initial_states is None:
            with scope.NameScope(self.name):
                if self.initializer is None:
                    raise Exception("Either initial states or initializer have to be set")
                initial_states = self.initializer.create_states(model)

        preprocessed_inputs = self.prepare_input(model, inputs)
        step_model = ModelHelper(name=self.name, param_model=model)
        input_t, timestep = step_model.net.AddScopedExternalInputs("input_t", "timestep")
        state_names = self.get_state_names()
        if len(initial_states) != len(state_names):
            raise Exception(
                "Number of initial state values provided doesn't match the number of "
                f"states. {len(initial_states)} != {len(state_names)}"
            )
        states_prev = step_model.net.AddScopedExternalInputs(*[s + "_prev" for s in state_names])
        states = self._apply(
            model=step_model,
            input_t=input_t,
            seq_lengths=seq_lengths,
            states=states_prev,
            timestep=timestep,
        )

        external_outputs = set(step_model.net.Proto().external_output)
        for state in states:
            if state not in external_outputs:
                step_model.net.AddExternalOutput(state)

        if outputs_with_grads is None:
            outputs_with_grads = [self.get_output_state_index() * 2]

        states_for_all_steps = recurrent.recurrent_net(
            net=model.net,
            cell_net=step_model.net,
            inputs=[(input_t, preprocessed_inputs)],
            initial_cell_inputs=list(zip(states_prev, initial_states, strict=True)),
            links=dict(zip(states_prev, states, strict=False)),
            timestep=timestep,
            scope=self.name,
            forward_only=self.forward_only,
            outputs_with_grads=outputs_with_grads,
            recompute_blobs_on_backward=self.recompute_blobs,
        )

        output = self._prepare_output_sequence(model, states_for_all_steps)
        return output, states_for_all_steps

    def apply(self, model, input_t, seq_lengths, states, timestep):
        """One step on ``model`` directly (no RecurrentNetwork): returns (output, new states)."""
        input_t = self.prepare_input(model, input_t)
        states = self._apply(model, input_t, seq_lengths, states, timestep)
        output = self._prepare_output(model, states)
        return output, states

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        """Run ``apply_override`` inside the cell's name scope. The inputs are turned into
        references first, so that scope does not rename them."""
        args = self._rectify_apply_inputs(input_t, seq_lengths, states, timestep, extra_inputs)
        with core.NameScope(self.name):
            return self.apply_override(model, *args)

    def _rectify_apply_inputs(self, input_t, seq_lengths, states, timestep, extra_inputs):
        input_t, seq_lengths, timestep = _RectifyNames([input_t, seq_lengths, timestep])
        states = _RectifyNames(states)
        if extra_inputs:
            # As in Caffe2, the extra inputs keep the names they were given.
            extra_input_names, extra_input_sizes = zip(*extra_inputs, strict=True)
            extra_inputs = list(zip(extra_input_names, extra_input_sizes, strict=True))

        rectified = [input_t, seq_lengths, states, timestep]
        if "extra_inputs" in inspect.signature(self.apply_override).parameters:
            rectified.append(extra_inputs)
        return rectified

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        """One step of the cell, to be implemented by subclasses.

        model: the step model new operators go to.
        input_t: this step's input (1 x N x D, after prepare_input).
        seq_lengths: the sequence lengths blob (or None), for the unit ops.
        states: the previous states.
        timestep: the current timestep blob.
        extra_inputs: [(blob, dim)] inputs not passed through prepare_input.
        Returns the new states.
        """
        _abstract(self, "apply_override")

    def prepare_input(self, model, input_blob):
        """Work that depends only on the input, done once over the whole sequence."""
        return input_blob

    def get_output_state_index(self):
        """Index in the state list of the step's primary output."""
        return 0

    def get_state_names(self):
        """The state names, scoped by the cell name."""
        return [self.scope(name) for name in self.get_state_names_override()]

    def get_state_names_override(self):
        """The unscoped names of the recurrent states, to be implemented by subclasses."""
        _abstract(self, "get_state_names_override")

    def get_output_dim(self):
        """Size of the step's output, to be implemented by subclasses."""
        _abstract(self, "get_output_dim")

    def _prepare_output(self, model, states):
        return states[self.get_output_state_index()]

    def _prepare_output_sequence(self, model, state_outputs):
        # state_outputs alternates (all steps, last step) for each state.
        return state_outputs[2 * self.get_output_state_index()]
