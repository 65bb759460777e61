"""Caffe2's ``net_builder``: build nets, loops and conditionals with ``with`` blocks.

Inside ``with NetBuilder()``, ``ops.X(...)`` adds operator ``X`` to the builder's current
net; ``ops.loop``, ``ops.If``, ``ops.stop_guard``, ... open nested builders that become
substeps (stopping through a *stop blob* that the step's ``should_stop_blob`` watches), and
``ops.IfNet`` / ``ops.WhileNet`` build single nets with ``If`` / ``While`` operators. The
builder's children (nets and nested builders) become an execution step through
``core.to_execution_step(builder)``.
"""

from ferrocaffe import context, core
from ferrocaffe.control_ops_util import add_if_op, add_while_op
from ferrocaffe.task import Task, TaskGroup

__all__ = ["NetBuilder", "Operations", "ops"]


class NetBuilder(context.Managed):
    """Collects nets and nested builders (its children) built inside ``with``.

    Args:
        name: the builder's name (joined to its parent's with ``/``).
        initial_scope: blob names readable and writable inside, beside the parent's scope.
    """

    def __init__(
        self,
        name=None,
        initial_scope=None,
        _stop_blob_required=False,
        _stop_blob=None,
        _fullname=None,
        _use_control_ops=False,
    ):
        parent = NetBuilder.current(required=False)
        assert not _fullname or not name, "Cannot set both _fullname and name"
        assert not _use_control_ops or (not _stop_blob_required and not _stop_blob), (
            "Stop blobs are not used with control operators"
        )
        if _fullname:
            self.name = _fullname
        else:
            self.name = "/".join(p for p in (parent.name if parent else None, name) if p)
        self._frozen = False
        self._current_net = None
        self._children = []
        if parent:
            parent._update_lexical_scope()
            self._init_lexical_scope = set(parent._lexical_scope)
        else:
            self._init_lexical_scope = set()
        if initial_scope:
            self._init_lexical_scope.update(str(b) for b in initial_scope)
        self._lexical_scope = set(self._init_lexical_scope)
        self._stop_blob = _stop_blob
        self._stop_blob_required = _stop_blob_required
        self._use_control_ops = _use_control_ops

    def stop_blob(self):
        """The blob that stops this builder's step (created on first use, false at the
        start of every run of the step)."""
        assert not self._use_control_ops, "Stop blobs are not used with control operators"
        if self._stop_blob is None:
            net = self.current_net()
            self._stop_blob = core.BlobReference(net.NextName("stop_blob"), net=net)
            net.Const(False, blob_out=self._stop_blob)
            if self._current_net is not self._children[0]:
                # Reset it before the first child too: a step reruns its nets in order.
                init = core.Net("stop_blob_init")
                init.Const(False, blob_out=self._stop_blob)
                self._children.insert(0, init)
        return self._stop_blob

    def stop_if(self, blob):
        """Stop this builder's step after the current net when ``blob`` is true."""
        assert not self._use_control_ops, "Stop blobs are not used with control operators"
        stop = self.stop_blob()
        ops.Or([stop, blob], [stop])
        # The step checks its stop blob between nets: later ops go to a new net.
        self._current_net = None

    def _assert_mutable(self):
        assert not self._frozen, f"This NetBuilder ({self.name}) has been built already."

    def _update_lexical_scope(self):
        """Recompute the names visible here: the initial scope plus every blob used by a
        child net or by a child builder of control ops."""
        scope = set(self._init_lexical_scope)
        for child in self._children:
            if isinstance(child, core.Net):
                scope |= child.UsedBlobNames()
            elif isinstance(child, NetBuilder) and child._use_control_ops:
                scope |= child._lexical_scope
        self._lexical_scope = scope

    def _reset_children(self):
        self._current_net = None
        self._children = []
        self._lexical_scope = set(self._init_lexical_scope)

    def add(self, child):
        """Append a net or a nested builder; a net becomes the current net."""
        self._assert_mutable()
        if self._use_control_ops:
            assert isinstance(child, core.Net) or (
                isinstance(child, NetBuilder) and child._use_control_ops
            ), "Expected Net or NetBuilder with control ops"
        self._children.append(child)
        self._current_net = child if isinstance(child, core.Net) else None
        self._update_lexical_scope()
        return child

    def current_net(self, name=None):
        """The net ops go to; a new one when there is none or ``name`` is given."""
        self._assert_mutable()
        if self._current_net is None or name is not None:
            self.add(core.Net(name))
        return self._current_net

    def freeze(self):
        for child in self._children:
            if hasattr(child, "freeze"):
                child.freeze()
        self._current_net = None
        self._frozen = True

    def get(self):
        """The children (nets and builders); the builder can no longer change."""
        self.freeze()
        return self._children

    def __exit__(self, etype, *args):
        super().__exit__(etype, *args)
        if self._use_control_ops and self._children:
            children = self._children
            self._reset_children()
            merged = NetBuilder.merge_nets(children, self._lexical_scope)
            assert merged, "Expected a non-empty merge of children"
            self._children = [merged]
        self.freeze()
        if etype is not None:
            return
        assert not self._stop_blob_required or self._stop_blob is not None, (
            f"This NetBuilder ({self.name}) requires a stop condition "
            "to be set with `stop` or `stop_if`"
        )

    @staticmethod
    def merge_nets(nets_or_builders, outer_blob_names):
        """One net with the ops of ``nets_or_builders`` (nets, or builders of control ops
        each holding one net), in order; its external outputs keep only the names in
        ``outer_blob_names`` (the rest are local to the merged net). ``None`` if empty."""
        merged = None
        for item in nets_or_builders:
            if isinstance(item, NetBuilder):
                assert item._use_control_ops, "Merging of NetBuilder supported only for control ops"
                nets = item.get()
                assert len(nets) == 1 and isinstance(nets[0], core.Net), (
                    "Invalid control op net builder"
                )
                net = nets[0]
            else:
                assert isinstance(item, core.Net)
                net = item
            if merged is None:
                merged = net
            else:
                merged.AppendNet(net)
        if merged is not None:
            proto = merged.Proto()
            kept = [o for o in proto.external_output if o in outer_blob_names]
            proto.external_output[:] = kept
        return merged

    def __str__(self):
        return self.name or "Un-named NetBuilder"


class Operations:
    """``ops``: operators and control blocks for the active :class:`NetBuilder`."""

    def net(self, net=None, name=None):
        """Add ``net`` to the active builder (and return it), or return the builder's
        current net (a new one named ``name`` when given)."""
        assert name is None or net is None, "Cannot provide both `net` and `name`."
        if net is not None:
            NetBuilder.current().add(net)
            return net
        return NetBuilder.current().current_net(name=name)

    def __getattr__(self, op_type):
        """``ops.X`` is ``X`` of the active builder's current net."""
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        if NetBuilder.current(required=False) is None:
            raise AttributeError("No active NetBuilder.")
        return getattr(self.net(), op_type)

    def task_group(self):
        """A task group on node ``'local'`` run as the builder's next step."""
        from ferrocaffe import task

        builder = NetBuilder.current()
        with task.Cluster(), task.Node("local"):
            group = task.TaskGroup()
            builder.add(group)
            return group

    def stop(self):
        """Stop the current step here."""
        return self.stop_if(ops.Const(True))

    def stop_if(self, blob):
        """Stop the current step here when the scalar bool ``blob`` is true."""
        return NetBuilder.current().stop_if(blob)

    def loop(self, iters=None, name=None):
        """A nested builder run as a loop: ``iters`` times (a number or a blob; ``iter()``
        is the index blob), or until ``stop``/``stop_if`` when ``iters`` is None."""
        return NetBuilder.current().add(_Loop(iters, name=name))

    def stop_guard(self, has_stopped_blob=None, name=None):
        """A nested builder run once; its ``has_stopped()`` blob says whether it was
        stopped early."""
        return NetBuilder.current().add(_StopGuard(has_stopped_blob=has_stopped_blob, name=name))

    def If(self, cond, name=None):
        """A nested builder run once when the scalar bool ``cond`` is true (steps and stop
        blobs; ``Elif``/``Else`` on the result)."""
        return NetBuilder.current().add(_RunIf(cond, name=name))

    def IfNet(self, cond, name=None):
        """Like :meth:`If`, built as one net with an ``If`` operator."""
        return NetBuilder.current().add(_RunIfNet(cond, name=name))

    def Else(self, name=None):
        """The else branch of the :meth:`IfNet` just closed."""
        return _RunElseNet(name=name)

    def WhileNet(self, name=None):
        """A loop built as one net with a ``While`` operator; its condition comes from a
        :meth:`Condition` block opened first."""
        return NetBuilder.current().add(_RunWhileNet(name=name))

    def Condition(self, name=None):
        """The condition of the enclosing :meth:`WhileNet`: its last op writes the scalar
        bool condition."""
        assert isinstance(NetBuilder.current(), _RunWhileNet), (
            "Use of Condition outside of WhileNet"
        )
        return _RunWhileCondition(name=name)

    def _setup(self, kind, key, name=None):
        setup = _SetupBuilder(kind, name)
        self.net().add_attribute(key, setup)
        return setup

    def task_init(self):
        """Ops run once when the task starts, before any instance."""
        return self._setup(_SetupBuilder.INIT, Task.TASK_SETUP)

    def task_exit(self):
        """Ops run once when the task ends, after every instance."""
        return self._setup(_SetupBuilder.EXIT, Task.TASK_SETUP)

    def task_instance_init(self):
        """Ops run when each concurrent instance of the task starts."""
        return self._setup(_SetupBuilder.INIT, Task.TASK_INSTANCE_SETUP)

    def task_instance_exit(self):
        """Ops run when each concurrent instance of the task ends."""
        return self._setup(_SetupBuilder.EXIT, Task.TASK_INSTANCE_SETUP)

    def local_init(self):
        """Ops run once per node when the task group starts."""
        return self._setup(_SetupBuilder.INIT, TaskGroup.LOCAL_SETUP)

    def local_exit(self, name=None):
        """Ops run once per node when the task group ends."""
        return self._setup(_SetupBuilder.EXIT, TaskGroup.LOCAL_SETUP, name)

    def task_reporter(self, interval_ms=1000, name=None):
        """Ops run every ``interval_ms`` ms while the task runs, and once after it."""
        return _ReporterBuilder(interval_ms, net=self.net(), name=name)

    def local_reporter(self, interval_ms=1000, name=None):
        """Ops run every ``interval_ms`` ms while any task of the group runs."""
        return _ReporterBuilder(interval_ms, name=name)


ops = Operations()


class _ReporterBuilder(NetBuilder):
    def __init__(self, interval_ms, net=None, name=None):
        NetBuilder.__init__(self, name)
        self._net = net
        self.interval_ms = interval_ms

    def __exit__(self, etype, *args):
        if etype is None:
            step = core.to_execution_step(self)
            step.RunEveryMillis(self.interval_ms)
            if self._net:
                self._net.add_attribute(Task.REPORT_STEP, step)
            else:
                TaskGroup.current().report_step(step, interval_ms=self.interval_ms)
        NetBuilder.__exit__(self, etype, *args)


class _SetupBuilder(NetBuilder):
    INIT = "init"
    EXIT = "exit"

    def __init__(self, type, name=None):
        NetBuilder.__init__(self, name)
        self.type = type

    def setup(self, net):
        if self.type == _SetupBuilder.INIT:
            return core.to_execution_step(self)
        return None

    def exit(self, net):
        if self.type == _SetupBuilder.EXIT:
            return core.to_execution_step(self)
        return None


class _RunOnce(NetBuilder):
    """A builder whose step runs once: a stop blob, if any, is set at the end so the step
    does not repeat."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name)

    def __exit__(self, etype, *args):
        if etype is None and self._stop_blob is not None:
            ops.stop()
        NetBuilder.__exit__(self, etype, *args)


class _StopGuard(_RunOnce):
    def __init__(self, has_stopped_blob=None, name=None):
        _RunOnce.__init__(self, name)
        self._stopped = has_stopped_blob
        self._ran = False

    def __enter__(self):
        entered = _RunOnce.__enter__(self)
        # True unless the last net (below) runs.
        self._stopped = ops.Const(True, blob_out=self._stopped)
        return entered

    def __exit__(self, etype, *args):
        if etype is None:
            self._ran = True
            ops.Const(False, blob_out=self._stopped)
        _RunOnce.__exit__(self, etype, *args)

    def has_stopped(self):
        """A scalar bool blob: true after the run iff the block was stopped early."""
        assert self._ran, "Context not used yet."
        return self._stopped


class _Loop(NetBuilder):
    def __init__(self, iters=None, name=None):
        NetBuilder.__init__(self, name, _stop_blob_required=True)
        self._iter = None
        if iters is None:
            self._num_iters = None
            return
        # Built in the enclosing builder's current net.
        self._inc = ops.Const(1)
        self._iter = ops.Const(0)
        if isinstance(iters, core.BlobReference):
            self._num_iters = iters
        else:
            self._num_iters = ops.Const(iters)

    def iter(self):
        """The blob holding the current iteration's index (0-based)."""
        assert self._num_iters is not None, "This loop does not have a number of iterations."
        assert self._iter is not None, "iter() must be called from inside the loop context"
        return self._iter

    def __enter__(self):
        entered = NetBuilder.__enter__(self)
        if self._num_iters is not None:
            ops.stop_if(ops.GE([self._iter, self._num_iters]))
        return entered

    def __exit__(self, etype, *args):
        if etype is None and self._num_iters is not None:
            self.current_net().Add([self._iter, self._inc], [self._iter])
        NetBuilder.__exit__(self, etype, *args)


class _RunIf(_RunOnce):
    def __init__(self, cond_blob=None, name=None, _already_ran=None):
        _RunOnce.__init__(self, name)
        assert cond_blob or _already_ran
        self._is_else = cond_blob is None
        if _already_ran is None:
            self._else_blob = ops.Not(cond_blob)
            self._already_ran = ops.Const(False)
        else:
            self._already_ran = _already_ran
            if cond_blob is None:
                self._else_blob = _already_ran
            else:
                self._else_blob = ops.Or([_already_ran, ops.Not(cond_blob)])

    def __enter__(self):
        entered = _RunOnce.__enter__(self)
        ops.stop_if(self._else_blob)
        ops.Const(True, blob_out=self._already_ran)
        return entered

    def Elif(self, cond, name=None):
        assert not self._is_else, "Else not allowed for an Else."
        return NetBuilder.current().add(
            _RunIf(cond, name=name or self.name, _already_ran=self._already_ran)
        )

    def Else(self, name=None):
        assert not self._is_else, "Elif not allowed for an Else."
        return NetBuilder.current().add(
            _RunIf(name=name or self.name, _already_ran=self._already_ran)
        )


class _RunIfNet(NetBuilder):
    """One net holding an ``If`` operator over the block's ops."""

    def __init__(self, cond_blob, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        assert cond_blob, "Conditional blob is not specified for an If net"
        self._cond_blob = cond_blob
        self._then_net = None
        self._else_net = None

    def __exit__(self, etype, *args):
        if etype is None:
            then_children = self._children
            self._reset_children()
            self._then_net = NetBuilder.merge_nets(then_children, self._lexical_scope)
            if not self._then_net:
                self._then_net = core.Net("empty_then_net")
            if_net = core.Net(self.name + "/if_net")
            add_if_op(if_net, self._cond_blob, self._lexical_scope, self._then_net, self._else_net)
            self._current_net = if_net
            self._children = [if_net]
        NetBuilder.__exit__(self, etype, *args)


class _RunElseNet(NetBuilder):
    """The else branch of the preceding :class:`_RunIfNet`: rebuilds its ``If`` net with
    both branches."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        assert parent and parent._children and isinstance(parent._children[-1], _RunIfNet), (
            "Invalid use of Else builder"
        )
        self._if_builder = parent._children[-1]

    def __exit__(self, etype, *args):
        if etype is None:
            else_children = self._children
            self._reset_children()
            if_builder = self._if_builder
            if_builder._else_net = NetBuilder.merge_nets(else_children, self._lexical_scope)
            if if_builder._else_net:
                if_else_net = core.Net(self.name + "/if_else_net")
                add_if_op(
                    if_else_net,
                    if_builder._cond_blob,
                    self._lexical_scope,
                    if_builder._then_net,
                    if_builder._else_net,
                )
                if_builder._current_net = if_else_net
                if_builder._children = [if_else_net]
        NetBuilder.__exit__(self, etype, *args)


class _RunWhileNet(NetBuilder):
    """One net holding a ``While`` operator over the block's ops."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        self._cond_builder = None

    def __exit__(self, etype, *args):
        if etype is None:
            assert self._cond_builder, "Condition builder must be specified in While op"
            cond_blob = self._cond_builder._cond_blob
            cond_net = self._cond_builder._cond_net
            body_children = self._children
            self._reset_children()
            body = NetBuilder.merge_nets(body_children, self._lexical_scope)
            if not body:
                body = core.Net("empty_loop_body_net")
            while_net = core.Net(self.name + "/while_net")
            add_while_op(while_net, cond_blob, self._lexical_scope, body, cond_net)
            self._current_net = while_net
            self._children = [while_net]
        NetBuilder.__exit__(self, etype, *args)


class _RunWhileCondition(NetBuilder):
    """The condition of a :class:`_RunWhileNet`: its last op has one output, the scalar bool
    condition; other blobs it creates stay local to it."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        assert parent and isinstance(parent, _RunWhileNet), "Invalid use of loop condition builder"
        assert not parent._cond_builder, "Multiple loop condition builders specified"
        assert not parent._children, "Condition definition must be specified before the loop's body"
        parent._cond_builder = self
        self._cond_blob = None
        self._cond_net = None

    def __exit__(self, etype, *args):
        if etype is None:
            children = self._children
            self._reset_children()
            self._cond_net = NetBuilder.merge_nets(children, self._lexical_scope)
            assert self._cond_net, "Invalid loop condition specified"
            assert len(self._cond_net.Proto().op) > 0, "Invalid condition net"
            last_op = self._cond_net.Proto().op[-1]
            assert len(last_op.output) == 1, "Invalid condition net"
            self._cond_blob = core.BlobReference(name=last_op.output[0], net=None)
            self._current_net = self._cond_net
            self._children = [self._cond_net]
        NetBuilder.__exit__(self, etype, *args)
