"""Caffe2's ``recurrent`` module: build a ``RecurrentNetwork`` operator from a step net.

``recurrent_net`` turns a *cell net* (the ops of one timestep) into one ``RecurrentNetwork`` op
on the main net. Everything the op needs is passed as arguments, named and ordered as Caffe2
did, so the NetDefs built here equal Caffe2's:

* links ``(internal blob, external blob, offset)``: at timestep ``t`` the internal blob is a view
  of row ``t + offset`` of the external one. Each recurrent state ``s`` gets an external buffer
  ``<scope>/<s>_states`` of T + 1 rows: the state input reads row ``t``, the state output writes
  row ``t + 1``. The sequence input is linked row by row (offset 0).
* aliases ``(buffer, exposed name, offset)`` publish ``<output>_all`` (rows 1..T) and
  ``<output>_last`` (the last row, offset -1) for every state.
* unless ``forward_only``: the gradient of the step net (``backward_step_net``), the backward
  links of the state and input gradients, the parameter positions and their gradient names.
"""

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["recurrent_net", "set_rnn_executor_config", "retrieve_step_blobs"]


def _split_triples(triples):
    """Three parallel sequences from a list of 3-tuples ([], [], [] for an empty list)."""
    if not triples:
        return [], [], []
    first, second, third = zip(*triples, strict=True)
    return first, second, third


def _step_gradient(cell_proto, output_grads):
    """The gradient ops of one timestep and the blob -> gradient map (the gradient registry's
    backward pass over the step net's ops, seeded with ``<output>_grad`` for every output)."""
    from ferrocaffe.core.gradients import GradientRegistry

    return GradientRegistry.GetBackwardPass(cell_proto.op, output_grads)


def _build_backward_step_net(cell_net, recompute_blobs_on_backward):
    """The backward step net (ops only, plus the forward blobs it reads that the forward step
    computes: the "scratches"), its blob versions and the blob -> gradient map."""
    from ferrocaffe.core.ssa import get_ssa, get_undefined_blobs

    cell_proto = cell_net.Proto()
    output_grads = {o: o + "_grad" for o in cell_proto.external_output}
    backward_ops, backward_mapping = _step_gradient(cell_proto, output_grads)
    backward_mapping = {str(blob): grad for blob, grad in backward_mapping.items()}

    backward_cell_net = core.Net("RecurrentBackwardStep")
    backward_proto = backward_cell_net.Proto()
    del backward_proto.op[:]
    if recompute_blobs_on_backward is not None:
        # Forward ops that produce a recomputed blob run again, in forward order, before the
        # gradient ops; they must produce nothing but recomputed blobs.
        recompute = {str(b) for b in recompute_blobs_on_backward}
        for op in cell_proto.op:
            if not recompute.isdisjoint(op.output):
                backward_proto.op.extend([op])
                assert set(op.output).issubset(recompute)
    backward_proto.op.extend(backward_ops)

    backward_ssa, backward_versions = get_ssa(backward_proto)
    undefined = get_undefined_blobs(backward_ssa)
    _, forward_versions = get_ssa(cell_proto)
    forward_outputs = set(cell_proto.external_output)
    scratches = [
        blob
        for blob, version in forward_versions.items()
        if version > 0 and blob in undefined and blob not in forward_outputs
    ]
    backward_proto.external_input.extend(scratches)
    backward_proto.type = "simple"
    return backward_cell_net, backward_versions, backward_mapping


def _accumulate_external_gradients(backward_cell_net):
    """Make gradient ops add to, not overwrite, gradients that also arrive from outside the
    step (a blob listed as external input of the backward step): such an output is renamed
    ``<blob>_accum`` and a ``Sum`` into ``<blob>`` follows the op. In-place outputs already
    take the incoming value into account and are left alone."""
    proto = backward_cell_net.Proto()
    operators = [caffe2_pb2.OperatorDef() for _ in proto.op]
    for copy, op in zip(operators, proto.op, strict=True):
        copy.CopyFrom(op)
    del proto.op[:]
    for op in operators:
        proto.op.extend([op])
        for j, output in enumerate(op.output):
            if output not in proto.external_input or output in op.input:
                continue
            output_ref = core.BlobReference(output)
            accum_ref = output_ref + "_accum"
            proto.op[-1].output[j] = str(accum_ref)
            backward_cell_net.Sum([output_ref, accum_ref], [output_ref])


def recurrent_net(
    net,
    cell_net,
    inputs,
    initial_cell_inputs,
    links,
    timestep=None,
    scope=None,
    outputs_with_grads=(0,),
    recompute_blobs_on_backward=None,
    forward_only=False,
):
    """Add a ``RecurrentNetwork`` op running ``cell_net`` once per timestep to ``net``.

    net: the net the op is added to.
    cell_net: the net of one timestep; its external inputs are the step inputs, the states,
        the timestep blob and the blobs read from outside (parameters, sequence lengths...);
        its external outputs are the new states.
    inputs: ``[(cell_net input, sequence blob)]``, the sequence being T x N x ...; exactly one.
    initial_cell_inputs: ``[(cell_net state input, blob with its value before step 0)]``.
    links: cell_net state input -> the cell_net output that becomes it at the next step.
    timestep: the name of the timestep blob in the cell net ("timestep" if None).
    scope: prefix of the internal buffers ``<scope>/<state>_states`` (an automatic name
        ``<net>/recurrent`` if None).
    outputs_with_grads: positions of the op outputs that receive a gradient from outside.
    recompute_blobs_on_backward: blobs recomputed during the backward pass instead of being
        kept for every timestep.
    forward_only: build no backward step (no gradient arguments).

    Returns the op's outputs but the last (the step workspaces): ``<output>_all`` and
    ``<output>_last`` for each state, in the order of ``initial_cell_inputs``.
    """
    assert len(inputs) == 1, "Only one input blob is supported so far"

    input_blobs = [str(i[0]) for i in inputs]
    initial_input_blobs = [str(x[1]) for x in initial_cell_inputs]
    op_name = net.NextName("recurrent")
    scope_name = str(op_name if scope is None else scope)

    def scoped(name):
        # Internal blobs are scoped by hand: the op links them to names outside any scope.
        return scope_name + "/" + str(name)

    # Blobs the step reads from outside: every cell_net input that is neither a sequence
    # input, a state, an initial value nor the timestep.
    known_inputs = [str(b) for b in input_blobs + initial_input_blobs]
    known_inputs += [str(x[0]) for x in initial_cell_inputs]
    if timestep is not None:
        known_inputs.append(str(timestep))
    references = [
        core.BlobReference(b) for b in cell_net.Proto().external_input if b not in known_inputs
    ]

    if forward_only:
        backward_cell_net = None
    else:
        backward_cell_net, backward_versions, backward_mapping = _build_backward_step_net(
            cell_net, recompute_blobs_on_backward
        )

    all_inputs = [i[1] for i in inputs] + [x[1] for x in initial_cell_inputs] + references
    all_outputs = []
    cell_net.Proto().type = "simple"

    forward_links = []
    backward_links = []
    aliases = []
    recurrent_states = []
    for cell_input, _ in initial_cell_inputs:
        cell_input = str(cell_input)
        # T + 1 rows: the state before step 0, then the state after each step (or, backward,
        # their gradients).
        state = scoped(cell_input + "_states")
        states_grad = state + "_grad"
        cell_output = links[str(cell_input)]
        forward_links.append((cell_input, state, 0))
        forward_links.append((cell_output, state, 1))
        aliases.append((state, cell_output + "_all", 1))
        aliases.append((state, cell_output + "_last", -1))
        all_outputs.extend([cell_output + "_all", cell_output + "_last"])
        recurrent_states.append(state)

        if backward_cell_net is not None:
            backward_links.append((cell_output + "_grad", states_grad, 1))
            backward_cell_net.Proto().external_input.append(str(cell_output) + "_grad")
            recurrent_input_grad = cell_input + "_grad"
            if not backward_versions.get(recurrent_input_grad, 0):
                # No op writes the state input's gradient under its usual name (e.g. it is
                # passed straight through by a Sum): link the name the backward pass uses.
                backward_links.append((backward_mapping[cell_input], states_grad, 0))
            else:
                backward_links.append((recurrent_input_grad, states_grad, 0))

    for input_t, input_blob in inputs:
        forward_links.append((str(input_t), str(input_blob), 0))

    if backward_cell_net is not None:
        for input_t, input_blob in inputs:
            backward_links.append((backward_mapping[str(input_t)], str(input_blob) + "_grad", 0))
        backward_proto = backward_cell_net.Proto()
        backward_proto.external_input.extend(cell_net.Proto().external_input)
        backward_proto.external_input.extend(cell_net.Proto().external_output)

    link_internal, link_external, link_offset = _split_triples(forward_links)
    alias_src, alias_dst, alias_offset = _split_triples(aliases)
    recurrent_inputs = [str(x[1]) for x in initial_cell_inputs]

    backward_args = {}
    if backward_cell_net is not None:
        _accumulate_external_gradients(backward_cell_net)
        params = [x for x in references if x in backward_mapping]
        param_grads = [str(backward_mapping[x]) for x in references if x in backward_mapping]
        bw_internal, bw_external, bw_offset = _split_triples(backward_links)
        if recompute_blobs_on_backward is None:
            recompute_blobs_on_backward = set()
        backward_args = {
            "param": [all_inputs.index(p) for p in params],
            "backward_link_internal": [str(b) for b in bw_internal],
            "backward_link_external": [str(b) for b in bw_external],
            "backward_link_offset": bw_offset,
            "outputs_with_grads": outputs_with_grads,
            "recompute_blobs_on_backward": [str(b) for b in recompute_blobs_on_backward],
            "param_grads": param_grads,
        }
        if len(backward_cell_net.Proto().op) != 0:
            backward_args["backward_step_net"] = backward_cell_net.Proto()

    results = net.RecurrentNetwork(
        all_inputs,
        all_outputs + [scoped("step_workspaces")],
        alias_src=alias_src,
        alias_dst=[str(a) for a in alias_dst],
        alias_offset=alias_offset,
        recurrent_states=recurrent_states,
        initial_recurrent_state_ids=[all_inputs.index(i) for i in recurrent_inputs],
        link_internal=[str(b) for b in link_internal],
        link_external=[str(b) for b in link_external],
        link_offset=link_offset,
        enable_rnn_executor=1,
        step_net=cell_net.Proto(),
        timestep="timestep" if timestep is None else str(timestep),
        **backward_args,
    )
    cell_net.Proto().type = "simple"
    # The last output holds the step workspaces, for the gradient op only.
    return results[:-1]


def set_rnn_executor_config(rnn_op, num_threads=None, max_cuda_streams=None):
    """Append the RNN executor settings ``rnn_executor.num_threads`` /
    ``rnn_executor.max_cuda_streams`` (those given) to a RecurrentNetwork(Gradient) OperatorDef."""
    assert rnn_op.type in {"RecurrentNetwork", "RecurrentNetworkGradient"}

    def add_arg(name, value):
        arg = caffe2_pb2.Argument()
        arg.name = "rnn_executor." + name
        arg.i = value
        rnn_op.arg.extend([arg])

    if num_threads is not None:
        add_arg("num_threads", num_threads)
    if max_cuda_streams is not None:
        add_arg("max_cuda_streams", max_cuda_streams)


def retrieve_step_blobs(net, prefix="rnn"):
    """Copy the blobs of the step workspaces of every RecurrentNetwork op of ``net`` into the
    current workspace (``RecurrentNetworkBlobFetcher`` with ``prefix``) and return their names.
    The name lists are fetched into ``<prefix>_1``, ``<prefix>_2``... (one per op)."""
    count = 1
    output_list = []
    for op in net.Proto().op:
        if op.type != "RecurrentNetwork":
            continue
        blob_name = prefix + "_" + str(count)
        count += 1
        workspace.RunOperatorOnce(
            core.CreateOperator(
                "RecurrentNetworkBlobFetcher", [op.output[-1]], [blob_name], prefix=prefix
            )
        )
        output_list += workspace.FetchBlob(blob_name).tolist()
    return output_list
