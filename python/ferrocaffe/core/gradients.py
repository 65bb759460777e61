"""Caffe2's gradient machinery: ``GradientRegistry`` and the backward-pass ``IR``.

The work happens in Rust (``ferrocaffe.autodiff``); this module converts between Caffe2's
Python shapes and the native call. Behaviour follows ``caffe2.python.core``:

* ``GradientRegistry.GetBackwardPass(operators, ys)`` returns ``(gradient ops, {blob:
  gradient})``, gradients being blob names or ``GradientSlice(indices, values)``.
* ``GradientRegistry.GetGradientForOp(op, g_output)`` returns ``(gradient ops, g_input)``.
* ``GradientRegistry.RegisterGradient(op_type)`` registers a Python gradient function
  ``f(op, g_output) -> (gradient ops, g_input)``. It is used where the op type has no native
  gradient maker, or where the native one fails, as in Caffe2; the ``Do``/``If``/``While``
  gradients are registered here too and can be replaced.
* ``IR(operators)`` exposes the same state as Caffe2's (``ssa``, ``frontier``,
  ``input_usages``, ``gradient_frontier``, ``gradient_generators``, version histories).
"""

import gc
from collections import defaultdict, namedtuple
from contextlib import contextmanager

from ferrocaffe import _native
from ferrocaffe.core.blob import BlobReference, GradientSlice
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "GradientMap",
    "GradientRegistry",
    "IR",
    "GradientWrapper",
    "OpSSA",
    "GradGenMeta",
    "SparseGradGenMeta",
    "GetIndexFromGradientList",
    "gen_do_gradient",
    "gen_if_gradient",
    "gen_while_gradient",
]

OpSSA = namedtuple("OpSSA", ["op", "in_versions", "out_versions"])
GradGenMeta = namedtuple("GradGenMeta", ["grad_op", "idx", "gradient", "device_option"])
SparseGradGenMeta = namedtuple(
    "SparseGradGenMeta",
    ["grad_op_indices", "idx_indices", "grad_op_values", "idx_values", "gradient", "device_option"],
)


def GetIndexFromGradientList(g_list, name):
    """Index of the first gradient in ``g_list`` that is ``name`` or whose indices or values
    are ``name``; None if there is none."""
    for i, g in enumerate(g_list):
        if g == name:
            return i
        if type(g) is GradientSlice and (g.indices == name or g.values == name):
            return i
    return None


class GradientWrapper:
    """A gradient as Caffe2's C++ layer saw it: empty, dense (``dense``) or sparse
    (``indices`` + ``values``)."""

    def __init__(self):
        self.dense = ""
        self.indices = ""
        self.values = ""

    def is_empty(self):
        return not self.dense and not self.indices and not self.values

    def is_dense(self):
        return bool(self.dense)

    def is_sparse(self):
        return bool(self.indices) or bool(self.values)

    def __repr__(self):
        if self.is_sparse():
            return f"GradientWrapper(indices={self.indices!r}, values={self.values!r})"
        if self.is_dense():
            return f"GradientWrapper(dense={self.dense!r})"
        return "GradientWrapper()"


# -- conversions between Caffe2's Python shapes and the native call -------------------------


def _name(x):
    if isinstance(x, bytes):
        return x.decode("utf-8")
    return str(x)


def _ys_grad(g):
    """A gradient given in ``ys`` (``_GetInitGradients``: a GradientSlice, else ``str(g)``)."""
    if g is None:
        return None
    if isinstance(g, GradientSlice):
        return (_name(g[0]), _name(g[1]))
    return _name(g)


def _output_grad(g):
    """An output gradient handed to ``GetGradientForOp``: anything that unpacks into two
    values is a slice (Caffe2's ``from_untyped``; a 2-character name too, handled natively)."""
    if g is None:
        return None
    if isinstance(g, (str, bytes)):
        return _name(g)
    if isinstance(g, (tuple, list)) and len(g) == 2:
        return (_name(g[0]), _name(g[1]))
    return _name(g)


def _input_grad(g, where):
    """An input gradient returned by a Python gradient function."""
    if g is None:
        return None
    if isinstance(g, (str, bytes)):
        return _name(g)
    if isinstance(g, (tuple, list)):
        if len(g) != 2:
            raise TypeError(
                f"{where}: a sparse gradient must be an (indices, values) pair, got {g!r}"
            )
        return (_name(g[0]), _name(g[1]))
    if isinstance(g, BlobReference):
        return _name(g)
    raise TypeError(
        f"{where}: an input gradient must be None, a blob name or a GradientSlice, "
        f"got {type(g).__name__} {g!r}"
    )


def _grad_from_native(g):
    if isinstance(g, tuple):
        return GradientSlice(g[0], g[1])
    return g


def _ops_from_net(net_bytes):
    return caffe2_pb2.NetDef.FromString(net_bytes).op[:]


def _call_gradient_function(func, op_bytes, g_output):
    """Runs a registered Python gradient function for the native backward pass and returns
    ``(serialized gradient ops, input gradients)``."""
    op = caffe2_pb2.OperatorDef.FromString(op_bytes)
    name = getattr(func, "__qualname__", repr(func))
    where = f"gradient function {name} of operator {op.type} ({op.name!r})"
    result = func(op, [_grad_from_native(g) for g in g_output])
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"{where} must return (gradient_ops, g_input), got {type(result).__name__}")
    grad_ops, g_input = result
    if grad_ops is None:
        grad_ops = []
    elif not isinstance(grad_ops, (list, tuple)):
        grad_ops = [grad_ops]
    ops = []
    for o in grad_ops:
        if not isinstance(o, caffe2_pb2.OperatorDef):
            if not hasattr(o, "SerializeToString"):
                raise TypeError(
                    f"{where} returned {type(o).__name__} {o!r} as a gradient op, expected an "
                    "OperatorDef"
                )
        ops.append(o.SerializeToString())
    if g_input is None or isinstance(g_input, (str, bytes)):
        raise TypeError(f"{where} returned {g_input!r} as g_input, expected a list")
    try:
        grads = [_input_grad(g, where) for g in g_input]
    except TypeError as e:
        if "input gradient" in str(e) or "sparse gradient" in str(e):
            raise
        raise TypeError(f"{where} returned {g_input!r} as g_input, expected a list") from e
    if len(grads) > len(op.input):
        raise TypeError(
            f"{where} returned {len(grads)} input gradients for an operator with "
            f"{len(op.input)} inputs"
        )
    return ops, grads


_FALLBACK_NET_NAMES = set()


def _next_net_name(base):
    """A unique net name, from ``core.Net``'s registry when it has one."""
    try:
        from ferrocaffe.core import net as _net
    except ImportError:  # pragma: no cover
        _net = None
    net_cls = getattr(_net, "Net", None)
    fn = getattr(net_cls, "_get_next_net_name", None)
    if fn is not None:
        return fn(base)
    used = getattr(net_cls, "_net_names_used", None)
    if not isinstance(used, set):
        used = _FALLBACK_NET_NAMES
    name, k = base, 1
    while name in used:
        name = f"{base}_{k}"
        k += 1
    used.add(name)
    return name


def _scopes():
    """The current name scope and device scope (serialized), when ``ferrocaffe.scope``
    exists."""
    try:
        from ferrocaffe import scope
    except ImportError:
        return "", None
    ns = getattr(scope, "CurrentNameScope", lambda: "")() or ""
    dev = getattr(scope, "CurrentDeviceScope", lambda: None)()
    return ns, (dev.SerializeToString() if dev is not None else None)


@contextmanager
def _no_gc():
    """Pauses the cyclic garbage collector while a large result is built: creating hundreds
    of thousands of objects otherwise triggers full collections that scan every object (the
    forward ops included), making big backward passes superlinear. Nothing created here is
    cyclic garbage."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _ys_items(ys):
    if isinstance(ys, list):
        return [(_name(y), None) for y in ys]
    if isinstance(ys, dict):
        return [(_name(y), _ys_grad(g)) for y, g in ys.items()]
    raise TypeError("ys should either be a list or a dict.")


def _backward(operators, ys, with_state, functions=None):
    items = _ys_items(ys)
    ns, dev = _scopes()
    if functions is None:
        functions = GradientRegistry._functions()
    with _no_gc():
        ops_bytes = [op.SerializeToString() for op in operators]
        net_bytes, grads, state = _native.backward_pass(
            ops_bytes,
            items,
            functions,
            _call_gradient_function,
            _next_net_name,
            ns,
            dev,
            with_state,
            GradientSlice,
            # The native code builds the map's references itself, through BlobName's
            # constructor (BlobReference's __init__ adds nothing for a plain name).
            BlobReference,
        )
        grad_ops = _ops_from_net(net_bytes)
    return grad_ops, grads, state


class GradientMap(dict):
    """The gradient map of ``Net.AddGradientOperators``: a dict ``{BlobReference: gradient}``
    whose entries are made, all at once, when it is first used (many thousands of references
    for a large net, often looked at only in part, or not at all).

    Every dict method sees the entries; so do ``dict(m)``, ``{**m}`` and ``d.update(m)``
    (they go through ``keys()``), comparisons with other dicts, ``copy()`` (a plain dict), and
    pickling and copying (which give a plain dict). Only C code reading the dict's storage
    directly before any use would see it empty.
    """

    __slots__ = ("_pending",)

    def __init__(self, pending=None):
        super().__init__()
        self._pending = pending

    def _fill(self):
        pending = self._pending
        if pending is not None:
            # Filled before it is marked done: a thread that looks meanwhile fills it too
            # (setting the same entries) rather than seeing it empty.
            with _no_gc():
                pending.fill(self)
            self._pending = None
        return self

    def __eq__(self, other):
        if type(other) is GradientMap:
            other._fill()
        return dict.__eq__(self._fill(), other)

    def __ne__(self, other):
        if type(other) is GradientMap:
            other._fill()
        return dict.__ne__(self._fill(), other)

    __hash__ = None

    def __reduce_ex__(self, protocol):
        return (dict, (dict(self._fill()),))

    def __reduce__(self):
        return self.__reduce_ex__(2)

    def __copy__(self):
        return dict(self._fill())


def _filled(name):
    base = getattr(dict, name)

    def method(self, *args, **kwargs):
        return base(self._fill(), *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method


for _method in (
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__iter__",
    "__reversed__",
    "__len__",
    "__repr__",
    "__or__",
    "__ror__",
    "__ior__",
    "__sizeof__",
    "get",
    "keys",
    "values",
    "items",
    "copy",
    "pop",
    "popitem",
    "setdefault",
    "update",
    "clear",
):
    setattr(GradientMap, _method, _filled(_method))
del _method


def add_gradient_operators(net_proto, ys, skip=0, outputs=None):
    """Appends the gradient ops of ``net_proto.op[skip:]`` to the NetDef ``net_proto`` and
    returns the gradient map: what ``core.Net.AddGradientOperators(ys, skip)`` does, without
    creating a Python object per operator (the net crosses to Rust and back as one message).
    With ``outputs`` (a set), the output names of the gradient ops are added to it; with a list,
    they are appended to it as one ``(names, ends)`` pair for ``add_output_names`` to add to a
    set later.
    """
    items = _ys_items(ys)
    ns, dev = _scopes()
    with _no_gc():
        grad_net, grads = _native.backward_pass_net(
            net_proto.SerializeToString(),
            skip,
            items,
            GradientRegistry._functions(),
            _call_gradient_function,
            _next_net_name,
            ns,
            dev,
            GradientSlice,
            BlobReference,
            outputs,
            True,
        )
        net_proto.MergeFromString(grad_net)
    return GradientMap(grads)


def add_output_names(names, pending):
    """Adds to the set ``names`` the output names held in the ``(names, ends)`` pairs that
    ``add_gradient_operators`` appended to its ``outputs`` list ``pending``."""
    for text, ends in pending:
        _native.add_names(names, text, ends)


def _gradient_for_op(op, g_output, functions):
    ns, dev = _scopes()
    net_bytes, g_input = _native.gradient_for_op(
        op.SerializeToString(),
        [_output_grad(g) for g in g_output],
        functions,
        _call_gradient_function,
        _next_net_name,
        ns,
        dev,
    )
    return _ops_from_net(net_bytes), [_grad_from_native(g) for g in g_input]


class GradientRegistry:
    """Gradient functions registered from Python, and the entry points of gradient
    generation."""

    gradient_registry_ = {}

    @classmethod
    def RegisterGradient(cls, op_type):
        """A decorator registering ``func(op, g_output) -> (gradient_ops, g_input)`` as the
        gradient function of ``op_type``."""

        def Wrapper(func):
            cls.gradient_registry_[op_type] = func
            return func

        return Wrapper

    @classmethod
    def _functions(cls, exclude=None):
        return [
            (t, f)
            for t, f in cls.gradient_registry_.items()
            if _BUILTIN.get(t) is not f and t != exclude
        ]

    @classmethod
    def GetGradientForOp(cls, op, g_output):
        """The gradient ops of ``op`` and the gradients of its inputs, given the gradients of
        its outputs (None, a name, or a GradientSlice each)."""
        return _gradient_for_op(op, g_output, cls._functions())

    @classmethod
    def GetBackwardPass(cls, operators, ys, ys_generate_gradient=False):
        """The backward pass of ``operators``: ``(gradient ops, {blob: gradient})``.

        ``ys`` is a list of blobs (their gradients are seeded with ones) or a dict from blob to
        its gradient (None: seeded with ones)."""
        grad_ops, grads, _ = _backward(operators, ys, with_state=False)
        return grad_ops, grads


def _builtin(op_type):
    def gradient(op, g_output):
        return _gradient_for_op(op, g_output, GradientRegistry._functions(exclude=op_type))

    gradient.__name__ = gradient.__qualname__ = f"gen_{op_type.lower()}_gradient"
    gradient.__doc__ = f"The built-in gradient of {op_type} (Caffe2's control_ops_grad)."
    return gradient


gen_do_gradient = _builtin("Do")
gen_if_gradient = _builtin("If")
gen_while_gradient = _builtin("While")
_BUILTIN = {"Do": gen_do_gradient, "If": gen_if_gradient, "While": gen_while_gradient}
GradientRegistry.gradient_registry_.update(_BUILTIN)


class IR:
    """Caffe2's backward-pass IR of a list of forward operators."""

    IS_AUTO_GEN_SUM_OPS_TAG = "is_auto_gen_sum_ops"
    ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG = "only_keep_is_auto_gen_sum_ops_tag"
    AUTOGEN_GRAD_SUFFIX = "_autogen_grad"

    def __init__(self, operators):
        self._operators = list(operators)
        self._load(self._native_state(check=True), [])

    def _native_state(self, check):
        return _native.ir_state([op.SerializeToString() for op in self._operators], check)

    def Play(self, op):
        """Adds ``op`` to the IR and updates the versions."""
        self._operators.append(op)
        self._load(self._native_state(check=False), [])

    def SanityCheck(self, operators):
        """Raises ValueError when a StopGradient output is not read by any op."""
        for op in operators:
            if op.type == "StopGradient" and op.output[0] not in self.input_usages:
                raise ValueError(
                    f"StopGradient's output '{op.output[0]}' is orphan.\nYou typically want to "
                    f"specify same input and output for\nStopGradient. Op:\n\n{op}"
                )

    def GetBackwardPass(self, ys):
        """The backward pass: ``(gradient ops, {blob: gradient})``; updates the IR state."""
        grad_ops, grads, state = _backward(self._operators, ys, with_state=True)
        self._load(state, grad_ops)
        return grad_ops, grads

    def _load(self, state, grad_ops):
        ops = self._operators
        self.ssa = [
            OpSSA(op, dict(ins), dict(outs))
            for op, (ins, outs) in zip(ops, state["ssa"], strict=True)
        ]
        self.frontier = defaultdict(int, state["frontier"])
        self.input_usages = defaultdict(lambda: defaultdict(list))
        for name, version, users in state["input_usages"]:
            self.input_usages[name][version] = list(users)
        self.gradient_frontier = dict(state["gradient_frontier"])
        self.gradient_generators = defaultdict(lambda: defaultdict(list))
        for name, version, gens in state["gradient_generators"]:
            self.gradient_generators[name][version] = [_generator(g, grad_ops) for g in gens]
        self.in_version_history = defaultdict(list)
        for name, hist in state["in_version_history"]:
            self.in_version_history[name] = [(ops[k], v) for k, v in hist]
        self.out_version_history = defaultdict(list)
        for name, hist in state["out_version_history"]:
            self.out_version_history[name] = [(ops[k], v) for k, v in hist]


def _generator(g, grad_ops):
    def op_at(k):
        return None if k is None else grad_ops[k]

    if g[0] == "dense":
        _, k, i, grad, dev = g
        return GradGenMeta(op_at(k), i, grad, caffe2_pb2.DeviceOption.FromString(dev))
    _, ki, ii, kv, iv, ind, val, dev = g
    return SparseGradGenMeta(
        op_at(ki),
        ii,
        op_at(kv),
        iv,
        GradientSlice(ind, val),
        caffe2_pb2.DeviceOption.FromString(dev),
    )
