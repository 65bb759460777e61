"""Caffe2's ``memonger``: memory optimization of nets by letting blobs share storage.

Three families of tools, as in Caffe2:

* **Blob recycling in the Rust core** (``ferrocaffe.graph::memonger``):
  ``share_grad_blobs`` (gradient blobs of a training net, optionally activations too),
  ``optimize_inference_for_dag`` (activations of an inference net that may run its ops in
  parallel) and ``optimize_inference_fast`` (a sequential net). They rename blobs to shared
  names (``__m0_shared``, ``<namescope>__m0_shared``, ...) exactly as Caffe2 did and keep the
  op order; the first two check that the result computes the same graph.
* **Interval assignment** (``optimize_interference``): orders the ops topologically
  (``topological_sort_traversal`` or ``topological_sort_traversal_longest_path``), computes
  each blob's live range (``compute_ranges``), groups blobs whose ranges do not overlap
  (``compute_assignments``: greedy, or dynamic programming for the least memory) and renames
  each group to its last blob.
* **Helpers**: ``release_blobs_when_used`` (insert ``Free`` ops after last uses),
  ``estimate_memory_usage``, ``compute_statistics`` / ``collect_blob_sizes`` (sizes fetched
  from the current workspace), ``verify_graph_equality`` and ``verify_inplace_blobs``.

Example::

    from ferrocaffe import memonger
    optim = memonger.share_grad_blobs(
        model.net, ["loss"], set(model.param_to_grad.values()), "",
        share_activations=True)
    model.net._net = optim
"""

import collections
import copy
import enum
import logging
import time

import numpy as np

from ferrocaffe import _native, core, workspace
from ferrocaffe.proto import caffe2_pb2


def _networkx():
    """networkx, which the graph traversals use (as Caffe2's memonger did); imported when one
    of them runs, so the rest of the module works without it."""
    try:
        import networkx
    except ImportError as e:
        raise ImportError(
            "memonger: this function needs networkx (pip install networkx), as Caffe2's did"
        ) from e
    return networkx


__all__ = [
    "LiveRange",
    "Optimization",
    "Statistics",
    "AssignmentAlgorithm",
    "share_grad_blobs",
    "optimize_inference_for_dag",
    "optimize_inference_fast",
    "optimize_interference",
    "estimate_memory_usage",
    "release_blobs_when_used",
    "topological_sort_traversal",
    "topological_sort_traversal_longest_path",
    "compute_interference_graph",
    "compute_ranges",
    "compute_assignments",
    "compute_assignments_greedy",
    "compute_assignments_dp",
    "compute_blob_assignments",
    "get_updated_ranges",
    "get_memory_usage",
    "is_compatible",
    "verify_assignments",
    "apply_assignments",
    "apply_recurrent_blob_assignments",
    "verify_graph_equality",
    "verify_inplace_blobs",
    "blob_nbytes",
    "compute_statistics",
    "collect_blob_sizes",
]

log = logging.getLogger("memonger")
log.setLevel(logging.INFO)

LiveRange = collections.namedtuple("LiveRange", ["defined", "used", "size"])
Optimization = collections.namedtuple("Optimization", ["net", "assignments", "blob_assignments"])
Statistics = collections.namedtuple("Statistics", ["baseline_nbytes", "optimized_nbytes"])


class AssignmentAlgorithm(enum.Enum):
    GREEDY = 0
    DYNAMIC_PROGRAMMING = 1


def _proto(net):
    """The NetDef of a ``core.Net`` (or the NetDef itself)."""
    return net.Proto() if hasattr(net, "Proto") else net


def _names(blobs):
    return [str(b) for b in blobs]


def _parse_net(data):
    out = caffe2_pb2.NetDef()
    out.ParseFromString(data)
    return out


def _check_same_graph(original, optimized):
    if not verify_graph_equality(original, optimized):
        raise AssertionError("Memonger graph is not equal to original.")
    if not verify_inplace_blobs(original, optimized):
        raise AssertionError("Inplace assignments differ in memonger net.")


# ------------------------------------------------------------------ recycling in the core


def share_grad_blobs(
    net,
    losses,
    param_grads,
    namescope,
    dont_share_blobs=None,
    share_activations=False,
    blob_shapes=None,
):
    """Lets the gradient blobs passed between the layers of ``net`` (those ending in
    ``_grad`` under ``namescope``, parameter gradients excepted) share storage, walking the
    backward pass from ``losses``. With ``share_activations``, the activations of the layers
    (outputs ``X`` of ops that read ``X_w``, the last two excepted) are shared too.
    ``dont_share_blobs`` keep their own storage; ``blob_shapes`` (name -> shape) makes the
    choice among free blobs size-aware. Returns the optimized NetDef (assign it to
    ``net._net``)."""
    log.warning("NOTE: Executing memonger to optimize gradient memory")
    proto = _proto(net)
    if namescope != "" and not namescope.endswith("/"):
        namescope += "/"
    param_grad_names = {str(g) for g in param_grads if isinstance(g, (str, core.BlobReference))}

    def is_grad_blob(name):
        return (
            name.endswith("_grad")
            and (name.startswith(namescope) or name.startswith("_" + namescope))
            and name not in param_grad_names
        )

    external_output = set(proto.external_output)
    activations = []
    for op in proto.op:
        inputs = set(op.input)
        activations.extend(b for b in op.output if b + "_w" in inputs and b not in external_output)
    # The last activations are usually read from outside the net: keep them.
    activations = set(activations[:-2])

    grad_ops = []
    shared = set()
    for index, op in enumerate(proto.op):
        blobs = list(op.input) + list(op.output)
        if any(is_grad_blob(b) for b in blobs):
            grad_ops.append(index)
        shared.update(
            b for b in blobs if is_grad_blob(b) or (share_activations and b in activations)
        )

    start = time.time()
    optimized = _parse_net(
        _native.memonger_compute_blob_recycling_for_dag(
            proto.SerializeToString(),
            _names(losses),
            grad_ops,
            shared,
            namescope,
            set(_names(dont_share_blobs or ())),
            {str(k): [int(d) for d in v] for k, v in (blob_shapes or {}).items()},
        )
    )
    log.info("Memonger memory optimization took %s secs", time.time() - start)
    _check_same_graph(proto, optimized)
    return optimized


def optimize_inference_for_dag(net, input_blobs, namescope=""):
    """Lets the activations of an inference net (every blob that is neither an external input
    nor an external output) share storage where no two ops that may run concurrently use
    them, walking the net from ``input_blobs``. Returns the optimized NetDef."""
    proto = _proto(net)
    external = set(proto.external_input) | set(proto.external_output)
    activations = set()
    written = set()
    for op in proto.op:
        for b in op.input:
            if b in external:
                continue
            activations.add(b)
            if b not in written:
                raise AssertionError(f"{b} not in external input")
        activations.update(b for b in op.output if b not in external)
        written.update(op.output)
        if op.is_gradient_op:
            raise AssertionError(
                "You can only pass inference-only nets to optimize_inference_for_dag"
            )

    start = time.time()
    optimized = _parse_net(
        _native.memonger_compute_blob_recycling_for_dag(
            proto.SerializeToString(),
            _names(input_blobs),
            list(range(len(proto.op))),
            activations,
            namescope,
            set(),
            {},
        )
    )
    log.info("Memonger memory optimization took %s secs", time.time() - start)
    _check_same_graph(proto, optimized)
    return optimized


def optimize_inference_fast(net, static_blobs):
    """Recycles the blobs of a sequential NetDef ``net`` (nets of another type, or with a
    ``RecurrentNetwork`` op, come back unchanged), keeping ``static_blobs``."""
    return _parse_net(
        _native.memonger_optimize_inference_net(
            _proto(net).SerializeToString(), _names(static_blobs)
        )
    )


# -------------------------------------------------------------------------------- helpers


_SIZEOF = {
    caffe2_pb2.TensorProto.DOUBLE: 8,
    caffe2_pb2.TensorProto.FLOAT: 4,
    caffe2_pb2.TensorProto.FLOAT16: 2,
    caffe2_pb2.TensorProto.INT32: 4,
    caffe2_pb2.TensorProto.INT8: 1,
    caffe2_pb2.TensorProto.UINT8: 1,
    caffe2_pb2.TensorProto.UINT16: 2,
    caffe2_pb2.TensorProto.INT16: 2,
    caffe2_pb2.TensorProto.BOOL: 1,
    caffe2_pb2.TensorProto.INT64: 8,
}


def estimate_memory_usage(protos, shapes, types, devicescope):
    """Estimates the memory the NetDefs ``protos`` allocate on ``devicescope`` when run one
    after another on one thread, from each blob's final shape (``shapes``) and data type
    (``types``, ``TensorProto`` enums). ``Free`` and ``Alias`` ops release their outputs.
    Returns ``(total bytes allocated, high-water mark, {op type: bytes allocated})``; blobs
    of unknown shape or type count as 0 bytes."""

    def nbytes(blob):
        if blob not in shapes or blob not in types:
            log.warning("Unknown blob encountered: %s", blob)
            return 0
        if types[blob] not in _SIZEOF:
            raise ValueError(
                f"estimate_memory_usage: blob {blob} has data type {types[blob]}, whose size is not known"
            )
        return _SIZEOF[types[blob]] * int(np.prod(shapes[blob]))

    by_op_type = collections.defaultdict(lambda: 0)
    total = current = highest = 0
    live = set()
    for proto in protos:
        for op in proto.op:
            releases = op.type in ("Free", "Alias")
            if not releases and op.device_option != devicescope:
                continue
            if releases:
                for b in op.output:
                    if b in live:
                        current -= nbytes(b)
                        live.discard(b)
                continue
            for b in op.output:
                if b in live:
                    continue
                n = nbytes(b)
                total += n
                current += n
                highest = max(highest, current)
                live.add(b)
                by_op_type[op.type] += n
    return total, highest, by_op_type


def release_blobs_when_used(netproto, dont_free_blobs, selector_fun=None):
    """A copy of ``netproto`` with a ``Free`` op after the last read of each blob that an op
    of the net writes (and some op reads), except external outputs, ``dont_free_blobs``, the
    inputs of ``Alias`` ops and blobs for which ``selector_fun(name)`` is false. Meant for
    caching memory allocators."""
    netproto = copy.deepcopy(netproto)
    read = set()
    releasable = set()
    aliased = set()
    for op in netproto.op:
        if op.type == "Alias":
            aliased.add(op.input[0])
            continue
        read.update(op.input)
        releasable.update(
            b for b in op.output if b not in read and (selector_fun is None or selector_fun(b))
        )
    releasable = (
        ((releasable - set(netproto.external_output)) & read) - set(dont_free_blobs) - aliased
    )

    ops = list(netproto.op)
    # From the end: the first read seen is the last one. Later inserts at the same place go
    # in front of earlier ones.
    for j in range(len(netproto.op) - 1, -1, -1):
        for b in netproto.op[j].input:
            if b in releasable:
                releasable.discard(b)
                ops.insert(j + 1, core.CreateOperator("Free", [b], [b]))
    del netproto.op[:]
    netproto.op.extend(ops)
    return netproto


# ------------------------------------------------------------------------ op orderings


def _sources(g):
    return [n for n in g if not any(True for _ in g.predecessors(n))]


def _sinks(g):
    return [n for n in g if not any(True for _ in g.successors(n))]


def _with_single_sink(g):
    sinks = _sinks(g)
    if not sinks:
        raise ValueError("the op graph has no node without successors (is it empty?)")
    if len(sinks) == 1:
        return g
    out = copy.deepcopy(g)
    sink = max(g) + 1
    out.add_node(sink)
    for n in sinks:
        out.add_edge(n, sink)
    return out


def _longest_path_from(g, source):
    """The longest path from ``source`` (Bellman-Ford on weights -1), as networkx reports it:
    from the farthest node back along the first recorded predecessor."""
    nx = _networkx()
    pred, dist = nx.bellman_ford_predecessor_and_distance(g, source, weight="weight")
    node = min(dist, key=lambda n: dist[n])
    path = [node]
    while pred.get(node):
        node = pred[node][0]
        path.append(node)
    path.reverse()
    return path


def _leaves_by_height(paths):
    """Merges the paths (which end at one root) into a tree whose edges point from the root to
    the sources, and returns its leaves, the children of every node visited lowest first."""
    nx = _networkx()
    tree = nx.DiGraph()
    tree.add_nodes_from({n for p in paths for n in p})
    for p in paths:
        for a, b in zip(p[:-1], p[1:], strict=True):
            tree.add_edge(b, a)
    root = paths[0][-1]

    height = {}

    def measure(n):
        kids = list(tree.successors(n))
        height[n] = max(measure(k) for k in kids) + 1 if kids else 0
        return height[n]

    measure(root)

    def leaves(n):
        kids = list(tree.successors(n))
        if not kids:
            return [n]
        out = []
        for k in sorted(kids, key=lambda k: height[k]):
            out += leaves(k)
        return out

    return leaves(root)


def topological_sort_traversal(g):
    """A topological order of the op graph ``g``: the order networkx 2 (which Caffe2 used)
    gave, Kahn's algorithm with the ready nodes on a stack (the last one ready runs first)."""
    nx = _networkx()
    waiting = {n: d for n, d in g.in_degree() if d > 0}
    ready = [n for n, d in g.in_degree() if d == 0]
    order = []
    while ready:
        node = ready.pop()
        for _, child in g.edges(node):
            waiting[child] -= 1
            if waiting[child] == 0:
                del waiting[child]
                ready.append(child)
        order.append(node)
    if waiting:
        raise nx.NetworkXUnfeasible("the op graph has a cycle")
    return order


def topological_sort_traversal_longest_path(g):
    """A topological order of the op graph ``g`` that starts the sources with the longest path
    to the end of the graph first, so that blobs live shorter on average."""
    nx = _networkx()
    single = _with_single_sink(g)
    weighted = copy.deepcopy(single)
    for a, b in weighted.edges():
        weighted[a][b]["weight"] = -1
    paths = {s: _longest_path_from(weighted, s) for s in _sources(single)}
    sources = _leaves_by_height(list(paths.values()))
    if sorted(sources) != sorted(paths):
        raise AssertionError("the longest paths do not reach every source of the graph")

    order = list(sources)
    seen = set(sources)
    for s in sources:
        for d in nx.descendants(g, s):
            if d not in seen:
                seen.add(d)
                order.append(d)
    rank = {n: len(order) - i for i, n in enumerate(order)}
    out = list(nx.algorithms.dag.lexicographical_topological_sort(g, key=lambda n: rank[n]))
    if len(out) != len(g.nodes):
        raise AssertionError("the ordering lost nodes of the graph")
    return out


def compute_interference_graph(ops):
    """The dependency graph of ``ops``: node ``i`` (attribute ``op``) for each op, and an edge
    ``i -> j`` (attribute ``deps``, the blobs passed) when a later op ``j`` reads an output of
    op ``i``."""
    nx = _networkx()
    g = nx.DiGraph()
    for i, op in enumerate(ops):
        g.add_node(i, op=op)
    readers = collections.defaultdict(set)
    for j, op in enumerate(ops):
        for b in op.input:
            readers[b].add(j)
    for i, op in enumerate(ops):
        outputs = set(op.output)
        later = sorted({j for b in outputs for j in readers.get(b, ()) if j > i})
        for j in later:
            g.add_edge(i, j, deps=set(ops[j].input) & outputs)
    return g


# ------------------------------------------------------------------- interval assignment


def compute_ranges(linearized_ops, blob_sizes=None):
    """Each blob's live range over ``linearized_ops``: the first op writing it (``defined``),
    the last op reading it (``used``), None where there is none, and its size from
    ``blob_sizes`` (None without)."""
    if not blob_sizes:
        log.warning("Provide blob sizes to get more accurate assignments.")

    def size_of(blob):
        if not blob_sizes:
            return None
        if blob not in blob_sizes or blob_sizes[blob] is None:
            raise KeyError(f"compute_ranges: no size given for blob {blob}")
        return blob_sizes[blob]

    ranges = collections.defaultdict(lambda: LiveRange(defined=None, used=None, size=None))
    for i, op in enumerate(linearized_ops):
        for b in op.input:
            r = ranges[b]
            used = i if r.used is None else max(r.used, i)
            ranges[b] = r._replace(used=used, size=size_of(b))
        for b in op.output:
            r = ranges[b]
            defined = i if r.defined is None else min(r.defined, i)
            ranges[b] = r._replace(defined=defined, size=size_of(b))
    return ranges


def is_compatible(candidate_range, assignment, static_blobs):
    """Whether a blob living over ``candidate_range`` may join ``assignment`` (a list of
    ``(name, LiveRange)``): its last blob is not static and is dead before the candidate is
    written."""
    name, last = assignment[-1]
    if name in static_blobs:
        return False
    if candidate_range.defined is None or last.defined is None or last.used is None:
        return False
    return candidate_range.defined > last.used


def compute_blob_assignments(assignments):
    """``{blob: the last blob of its group}`` for the groups of more than one blob."""
    out = {}
    for group in assignments:
        if len(group) > 1:
            last = group[-1][0]
            for name, _ in group:
                out[name] = last
    return out


def _group_size(group):
    if not group:
        return 0
    biggest = max(r.size for _, r in group)
    return 0 if biggest is None else biggest


def get_memory_usage(assignments):
    """The memory the groups take: the sum of each group's largest blob size."""
    return sum(_group_size(g) for g in assignments)


def compute_assignments_greedy(ranges_sorted, init_assignments=None):
    """Puts each blob (in the given order) into the compatible group whose size is closest to
    its own, or into a new group. Extends ``init_assignments`` when given."""
    assignments = init_assignments or []
    placed = {name for group in assignments for name, _ in group}
    for name, rng in ranges_sorted:
        if name in placed:
            continue
        best = None
        best_dist = float("inf")
        size = rng.size or 0
        for index, group in enumerate(assignments):
            if not is_compatible(rng, group, []):
                continue
            dist = abs(_group_size(group) - size)
            if dist < best_dist:
                best, best_dist = index, dist
        if best is None:
            assignments.append([(name, rng)])
        else:
            assignments[best].append((name, rng))
    return assignments


def _blob_count(assignments):
    return sum(len(g) for g in assignments) if assignments else 0


def _copy_groups(assignments):
    # The entries are immutable tuples: copying the lists copies the assignment.
    return [list(g) for g in assignments]


def compute_assignments_dp(ranges_sorted, init_assignment, counter=None):
    """The assignment of the blobs ``ranges_sorted`` (sorted by last use) on top of
    ``init_assignment`` that takes the least memory, by dynamic programming: the best
    assignment of the first ``k`` blobs extends the best assignment of the longest prefix
    whose groups can all take blob ``k``, by the best placement of the blobs in between
    (each tried in every group it fits, or in a new one; recursively)."""
    if not counter:
        counter = [0]
    counter[0] += 1
    if counter[0] % 5000 == 0 and ranges_sorted:
        log.info(
            "Finding assignments %s (%s -> %s)...",
            counter[0],
            ranges_sorted[0][1].defined,
            ranges_sorted[-1][1].used,
        )
    init = init_assignment or []
    if not ranges_sorted:
        return _copy_groups(init)

    def fits_all(rng, assignment):
        return all(is_compatible(rng, g, []) for g in assignment)

    def place_last(part, base, prev_best):
        """The best assignment of ``part`` on top of ``base``; the blobs before the last one
        all overlap it. ``prev_best`` is the best assignment of all blobs but the last."""
        last = part[-1]
        if any(is_compatible(r, [last], []) for _, r in part[:-1]):
            raise AssertionError("compute_assignments_dp: blobs are not sorted by last use")
        candidates = []
        for index, group in enumerate(base):
            if not is_compatible(last[1], group, []):
                continue
            candidate = _copy_groups(base)
            candidate[index].append(last)
            if len(part) > 1:
                others = [g for i, g in enumerate(candidate) if i != index]
                others = compute_assignments_dp(part[:-1], others, counter)
                candidate = others + [candidate[index]]
            candidates.append(candidate)
        candidates.append(prev_best + [[last]])
        return min(candidates, key=get_memory_usage)

    best = []  # best[k]: the best assignment of ranges_sorted[:k + 1]
    for k, item in enumerate(ranges_sorted):
        j = k - 1
        while j >= 0 and not fits_all(item[1], best[j]):
            j -= 1
        base = _copy_groups(init if j < 0 else best[j])
        part = ranges_sorted[j + 1 : k + 1]
        current = place_last(part, base, best[-1] if best else init)
        if _blob_count(current) != _blob_count(base) + len(part):
            raise AssertionError("compute_assignments_dp: blobs were lost or duplicated")
        best.append(_copy_groups(current))
    return best[-1]


def get_updated_ranges(ranges, max_live=None):
    """``ranges`` with the unknowns filled: ``defined`` -1, ``used`` ``max_live`` (one past
    the last use seen, by default), ``size`` 1."""
    if max_live is None:
        max_live = max((r.used for _, r in ranges if r.used), default=0) + 1

    def fill(item):
        name, r = item
        if r.defined is None:
            r = r._replace(defined=-1)
        if r.used is None:
            r = r._replace(used=max_live)
        if r.size is None:
            r = r._replace(size=1)
        return (name, r)

    return [fill(x) for x in ranges]


def compute_assignments(ranges, static_blobs, algo):
    """Groups the blobs of ``ranges`` (``{name: LiveRange}``) whose live ranges do not
    overlap, each static blob alone, with ``algo`` (an ``AssignmentAlgorithm``)."""
    if algo not in (AssignmentAlgorithm.GREEDY, AssignmentAlgorithm.DYNAMIC_PROGRAMMING):
        raise ValueError(f"Invalid algo name {algo}")
    # By last use; blobs never read (perhaps read from outside) last, so they can be shared.
    items = sorted(ranges.items(), key=lambda p: (p[1].used is None, p[1].used))
    items = get_updated_ranges(items)
    static_blobs = set(_names(static_blobs))
    sharable = [x for x in items if x[0] not in static_blobs]
    static = [x for x in items if x[0] in static_blobs]
    log.info("Total sharable blobs %s", len(sharable))
    if algo == AssignmentAlgorithm.DYNAMIC_PROGRAMMING:
        best = compute_assignments_dp(sharable, [])
    else:
        best = compute_assignments_greedy(sharable, [])
    return best + [[x] for x in static]


def verify_assignments(assignments):
    """Raises AssertionError unless each group's blobs live one after another."""
    for group in assignments:
        for (a, ra), (b, rb) in zip(group[:-1], group[1:], strict=True):
            if not ra.used < rb.defined:
                raise AssertionError(
                    f"blobs {a} and {b} share storage but their live ranges overlap"
                )


def apply_assignments(net, blob_assignments):
    """Renames, in place, the blobs of NetDef ``net`` by ``blob_assignments``, inside the step
    nets of recurrent network ops too."""

    def canonical(blob):
        return blob_assignments.get(blob, blob)

    for op in net.op:
        if op.type.startswith("RecurrentNetwork"):
            apply_recurrent_blob_assignments(op, blob_assignments, canonical)
        op.input[:] = [canonical(b) for b in op.input]
        op.output[:] = [canonical(b) for b in op.output]


def apply_recurrent_blob_assignments(op, blob_assignments, canonical_name):
    """Renames the blobs of a recurrent network op's step nets and records each renaming of
    the op's own blobs as a ``<blob>.rename`` argument."""
    log.debug("Applying assignments to recurrent op: %s", op.type)
    for arg in op.arg:
        if not arg.name.endswith("step_net"):
            continue
        apply_assignments(arg.n, blob_assignments)
        arg.n.external_input[:] = [canonical_name(b) for b in arg.n.external_input]
    own = set(op.input) | set(op.output)
    for blob, renamed in blob_assignments.items():
        if blob in own:
            a = op.arg.add()
            a.name = blob + ".rename"
            a.s = str(renamed).encode("ascii")


def optimize_interference(
    net,
    static_blobs,
    ordering_function=topological_sort_traversal,
    blob_sizes=None,
    algo=AssignmentAlgorithm.GREEDY,
):
    """Orders the ops of NetDef ``net`` with ``ordering_function``, groups the blobs whose
    live ranges in that order do not overlap (``algo``; ``blob_sizes`` makes it size-aware)
    and renames each group to its last blob. ``static_blobs`` are left alone. Returns an
    ``Optimization(net, assignments, blob_assignments)``; the net is a reordered copy."""
    net = copy.deepcopy(net)
    g = compute_interference_graph(net.op)
    ordered = [net.op[i] for i in ordering_function(g)]
    # Ranges are computed in this order: the net must run in it.
    ordered = [copy.deepcopy(op) for op in ordered]
    del net.op[:]
    net.op.extend(ordered)
    ranges = compute_ranges(net.op, blob_sizes)
    assignments = compute_assignments(ranges, static_blobs, algo)
    blob_assignments = compute_blob_assignments(assignments)
    apply_assignments(net, blob_assignments)
    return Optimization(net=net, assignments=assignments, blob_assignments=blob_assignments)


# -------------------------------------------------------------------------- verification


def _inplace_pairs(op):
    outputs = list(op.output)
    return [[j, outputs.index(b)] for j, b in enumerate(op.input) if b in outputs]


def verify_inplace_blobs(net_a, net_b):
    """Whether the ops of the two nets have the same types and the same (input, output)
    in-place pairs, op by op: the memonger must not make an op run in place."""
    # Like Caffe2, ops past the shorter net are not compared.
    for a, b in zip(net_a.op, net_b.op, strict=False):
        if a.type != b.type or _inplace_pairs(a) != _inplace_pairs(b):
            return False
    return True


def _producers(ops):
    """For each op, the index of the op that last wrote each of its inputs (inputs written by
    no earlier op skipped)."""
    writer = {}
    out = []
    for i, op in enumerate(ops):
        out.append([writer[b] for b in op.input if b in writer])
        for b in op.output:
            writer[b] = i
    return out


def verify_graph_equality(net_a, net_b):
    """Whether the two nets compute the same graph: same op types, devices and engines op by
    op, and each input of each op produced by the same earlier op, whatever the blob names."""
    if len(net_a.op) != len(net_b.op):
        return False
    for a, b in zip(net_a.op, net_b.op, strict=True):
        if a.type != b.type or a.device_option != b.device_option or a.engine != b.engine:
            return False
    pa = _producers(net_a.op)
    pb = _producers(net_b.op)
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x != y:
            log.info(
                "Difference at op %s: parents %s vs %s\n%s\nvs\n%s",
                i,
                x,
                y,
                net_a.op[i],
                net_b.op[i],
            )
    return pa == pb


# ---------------------------------------------------------------------------- statistics


def blob_nbytes(blob):
    """The size in bytes of ``blob`` in the current workspace (0, with a warning, if it cannot
    be fetched)."""
    try:
        return workspace.FetchBlob(blob).nbytes
    except Exception:
        log.warning("Error when fetching blob %s", blob)
        return 0


def compute_statistics(assignments):
    """``Statistics(baseline_nbytes, optimized_nbytes)`` of an assignment, from the blob sizes
    in the current workspace: every blob on its own vs. one blob (the largest) per group."""
    nbytes = {name: blob_nbytes(name) for group in assignments for name, _ in group}
    return Statistics(
        baseline_nbytes=sum(nbytes.values()),
        optimized_nbytes=sum(max(nbytes[name] for name, _ in g) for g in assignments if g),
    )


def collect_blob_sizes(net):
    """``{blob: bytes}`` for every blob the ops of NetDef ``net`` read or write, from the
    current workspace."""
    sizes = {}
    for op in net.op:
        for b in list(op.input) + list(op.output):
            sizes[b] = blob_nbytes(b)
    return sizes
