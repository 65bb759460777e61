"""Straightforward pure-Python versions of ``core.ssa`` and ``ferrocaffe.graph``.

They define the expected results in tests/test_graph.py (property tests against random nets)
and are the baseline that benchmarks/bench_graph.py times the Rust versions against. They are
written for clarity, following the documented semantics, not for speed.
"""

import copy
from collections import defaultdict


def get_ssa(net, blob_versions=None):
    if blob_versions is None:
        blob_versions = {}
    for name in net.external_input:
        if name not in blob_versions:
            blob_versions[name] = 0
    declared = len(net.external_input) > 0
    ssa = []
    for op in net.op:
        if not declared:
            for name in op.input:
                if name not in blob_versions:
                    blob_versions[name] = 0
        inputs = [(name, blob_versions.get(name, 0)) for name in op.input]
        for name in op.output:
            blob_versions[name] = blob_versions.get(name, 0) + 1
        outputs = [(name, blob_versions[name]) for name in op.output]
        ssa.append((inputs, outputs))
    return ssa, blob_versions


def get_undefined_blobs(ssa):
    return {name for inputs, _ in ssa for name, version in inputs if version == 0}


def get_output_producers(ssa):
    producers = {}
    for i, (_, outputs) in enumerate(ssa):
        for versioned in outputs:
            producers[versioned] = i
    return producers


def get_op_ids_in_path(ssa, blob_versions, inputs, outputs):
    stop = {(name, blob_versions[name]) for name in inputs}
    producers = get_output_producers(ssa)
    queue = [(name, blob_versions[name]) for name in outputs]
    used = set()
    while queue:
        versioned = queue.pop()
        if versioned in stop or versioned not in producers:
            continue
        op = producers[versioned]
        if op not in used:
            used.add(op)
            queue.extend(ssa[op][0])
    return sorted(used)


def producer_map(net):
    ssa, _ = get_ssa(net)
    out = {}
    for i, (_, outputs) in enumerate(ssa):
        for j, versioned in enumerate(outputs):
            out[versioned] = (i, j)
    return out


def consumer_map(net):
    ssa, _ = get_ssa(net)
    out = defaultdict(list)
    for i, (inputs, _) in enumerate(ssa):
        for j, versioned in enumerate(inputs):
            out[versioned].append((i, j))
    return out


def versioned_external_outputs(net):
    ssa, versions = get_ssa(net)
    touched = {v for inputs, outputs in ssa for v in inputs + outputs}
    out = []
    for name in net.external_output:
        versioned = (name, versions.get(name, 0))
        if versioned in touched and versioned not in out:
            out.append(versioned)
    return out


def _replace_entry(entries, old, new):
    if old == new or old not in entries:
        return
    if new in entries:
        kept = [e for e in entries if e != old]
    else:
        kept = [new if e == old else e for e in entries]
    del entries[:]
    entries.extend(kept)


def _rename_version(net, ssa, old, version, new, start_version, end_version):
    for op, (inputs, outputs) in zip(net.op, ssa, strict=True):
        for j, versioned in enumerate(inputs):
            if versioned == (old, version):
                op.input[j] = new
        for j, versioned in enumerate(outputs):
            if versioned == (old, version):
                op.output[j] = new
    if version == start_version:
        _replace_entry(net.external_input, old, new)
    if version == end_version:
        _replace_entry(net.external_output, old, new)


class Refused(ValueError):
    pass


def rename_op_input(net, op_id, input_id, new_name, init_net=None, from_producer=False):
    net = copy.deepcopy(net)
    init_net = copy.deepcopy(init_net)
    init_ssa, init_versions = get_ssa(init_net) if init_net is not None else ([], {})
    ssa, versions = get_ssa(net, dict(init_versions))
    old, version = ssa[op_id][0][input_id]
    if not from_producer:
        readers = {i for i, (inputs, _) in enumerate(ssa) if (old, version) in inputs}
        if readers - {op_id}:
            raise Refused(old)
    if old == new_name:
        return net, init_net
    start = init_versions.get(old, 0)
    if init_net is not None and version == start:
        _rename_version(init_net, init_ssa, old, version, new_name, 0, init_versions.get(old, 0))
    _rename_version(net, ssa, old, version, new_name, start, versions.get(old, 0))
    return net, init_net


def rename_op_output(net, op_id, output_id, new_name):
    net = copy.deepcopy(net)
    ssa, versions = get_ssa(net)
    old, version = ssa[op_id][1][output_id]
    if old != new_name:
        _rename_version(net, ssa, old, version, new_name, None, versions.get(old, 0))
    return net


def remove_ops(net, op_ids):
    net = copy.deepcopy(net)
    drop = set(op_ids)
    kept = [op for i, op in enumerate(net.op) if i not in drop]
    del net.op[:]
    net.op.extend(kept)
    return net


def remove_dead_end_ops(net):
    ssa, _ = get_ssa(net)
    live = set(versioned_external_outputs(net))
    removed = []
    for i in reversed(range(len(ssa))):
        inputs, outputs = ssa[i]
        if any(o in live for o in outputs):
            live.update(inputs)
        else:
            removed.append(i)
    removed.reverse()
    return remove_ops(net, removed), removed


def sub_graph_external_io(net, op_ids):
    ssa, _ = get_ssa(net)
    ops = list(dict.fromkeys(op_ids))
    inside = set(ops)
    produced = {o for i in ops for o in ssa[i][1]}
    inputs = []
    for i in ops:
        for versioned in ssa[i][0]:
            if versioned not in produced and versioned not in inputs:
                inputs.append(versioned)
    read_outside = {v for i, (ins, _) in enumerate(ssa) if i not in inside for v in ins}
    external = set(versioned_external_outputs(net))
    outputs = []
    for i in ops:
        for versioned in ssa[i][1]:
            if versioned in outputs:
                continue
            if versioned in read_outside or versioned in external:
                outputs.append(versioned)
    return inputs, outputs


def find_chains(net, op_type, min_length=2):
    ssa, _ = get_ssa(net)
    consumers = consumer_map(net)
    external = set(versioned_external_outputs(net))
    typed = [op.type == op_type for op in net.op]
    nxt = {}
    for a, (_, outputs) in enumerate(ssa):
        if not typed[a] or any(o in external for o in outputs):
            continue
        readers = {i for o in outputs for i, _ in consumers.get(o, [])}
        if len(readers) == 1:
            (b,) = readers
            if typed[b]:
                nxt[a] = b
    preds = defaultdict(int)
    for b in nxt.values():
        preds[b] += 1
    chains = []
    for a in range(len(ssa)):
        if not typed[a] or preds[a] == 1:
            continue
        chain = [a]
        while chain[-1] in nxt and preds[nxt[chain[-1]]] == 1:
            chain.append(nxt[chain[-1]])
        if len(chain) >= max(min_length, 1):
            chains.append(chain)
    return chains
