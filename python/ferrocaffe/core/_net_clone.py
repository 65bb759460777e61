"""The work behind ``Net.Clone`` and ``Net.ClonePartial``."""

from ferrocaffe.proto import caffe2_pb2

__all__: list[str] = []


def _remapped(blob_remap, blob):
    blob_str = str(blob)
    return str(blob_remap.get(blob_str, blob_str))


def _remap_list(proto_list, blob_remap):
    new_list = [_remapped(blob_remap, b) for b in proto_list]
    del proto_list[:]
    proto_list.extend(new_list)


def clone_net(net, name, blob_remap, op_id_mask, remap_funcs, keep_schema, update_external_list):
    """See ``Net.Clone``."""
    from ferrocaffe.core.clone import DEFAULT_REMAP_FUNCS
    from ferrocaffe.core.net import Net

    funcs = dict(DEFAULT_REMAP_FUNCS)
    funcs.update(remap_funcs or {})
    proto = net._net
    new_proto = caffe2_pb2.NetDef()
    new_proto.CopyFrom(proto)
    new_proto.name = name

    if blob_remap is None:
        blob_remap = {}
    if op_id_mask is None:
        op_id_mask = list(range(len(proto.op)))

    def remap_op(op):
        new_op = caffe2_pb2.OperatorDef()
        new_op.CopyFrom(op)
        _remap_list(new_op.input, blob_remap)
        _remap_list(new_op.output, blob_remap)
        if new_op.type in funcs:
            funcs[new_op.type](new_op, (name + "/") if name else "", blob_remap)
        return new_op

    del new_proto.op[:]
    new_proto.op.extend([remap_op(proto.op[op_id]) for op_id in op_id_mask])
    _remap_list(new_proto.external_input, blob_remap)
    _remap_list(new_proto.external_output, blob_remap)
    new_net = Net(new_proto)

    # Schema records (Caffe2's `schema` module) are not supported by ferrocaffe: nets never
    # carry one, so `keep_schema` has nothing to keep.
    del keep_schema

    new_net._attr_dict.update(net._attr_dict)
    if update_external_list:
        existing_outputs = set()
        used_outputs = set()
        new_def = new_net.Proto()
        del new_def.external_input[:]
        del new_def.external_output[:]
        output_order = []
        for op in new_def.op:
            for ib in op.input:
                if ib not in existing_outputs:
                    new_def.external_input.extend([ib])
                else:
                    used_outputs.add(ib)
            for ob in op.output:
                if ob not in existing_outputs:
                    output_order.append(ob)
                existing_outputs.add(ob)
        # Caffe2 lists these in set order; first-definition order is one such order.
        new_def.external_output.extend(ob for ob in output_order if ob not in used_outputs)
    return new_net


def clone_partial(net, name, inputs, outputs, remap_funcs):
    """See ``Net.ClonePartial``; ``inputs`` is already a dict old name -> new name."""
    from ferrocaffe.core.ssa import get_op_ids_in_path, get_ssa, get_undefined_blobs

    input_names = {str(k): str(v) for k, v in inputs.items()}
    output_names = [str(o) for o in outputs]
    proto = net._net
    blob_versions = {str(i): 0 for i in inputs}
    ssa, blob_versions = get_ssa(proto, blob_versions)
    used_op_ids = get_op_ids_in_path(ssa, blob_versions, inputs, outputs)
    disallowed_op_ids = get_op_ids_in_path(ssa, blob_versions, [], inputs)
    assert len(set(used_op_ids) & set(disallowed_op_ids)) == 0, (
        "Cannot partially clone net: some of the ops required would generate the given input."
    )

    sub_ssa = [op for i, op in enumerate(ssa) if i in used_op_ids]
    undef_blobs = get_undefined_blobs(sub_ssa) - set(input_names.keys())
    prefix = (name + "/") if name else ""

    def remap(blob_name):
        if blob_name in input_names:
            return input_names[blob_name]
        if blob_name in undef_blobs:
            return blob_name
        return prefix + blob_name

    blob_mapping = {b: remap(b) for b in blob_versions.keys()}
    new_net = net.Clone(name, blob_mapping, used_op_ids, remap_funcs)
    # Caffe2 appends the undefined blobs in set order; sorted is one such order.
    new_in = [blob_mapping[i] for i in input_names.keys()] + sorted(undef_blobs)
    new_out = [blob_mapping[o] for o in output_names]
    new_def = new_net.Proto()
    del new_def.external_input[:]
    new_def.external_input.extend(new_in)
    new_net._external_input_map = set(new_def.external_input)
    del new_def.external_output[:]
    new_def.external_output.extend(new_out)
    return new_net, [new_net.GetBlobRef(o) for o in new_out]
