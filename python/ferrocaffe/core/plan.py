"""Execution steps and plans (Caffe2's ``core.ExecutionStep``, ``core.Plan`` and helpers).

An ``ExecutionStep`` runs either a list of nets or a list of substeps (never both), some
number of iterations or until a stop blob turns true. A ``Plan`` is a list of top-level
steps plus a copy of every net they use, in order of first use.
"""

from collections import OrderedDict

from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "get_net_name",
    "ExecutionStep",
    "add_nets_in_order",
    "Plan",
    "to_execution_step",
    "execution_step",
    "scoped_execution_step",
]


def _net_class():
    from ferrocaffe.core.net import Net

    return Net


def _blob_reference_class():
    from ferrocaffe.core.blob import BlobReference

    return BlobReference


def get_net_name(netlike):
    """The name of a ``Net`` or ``NetDef``; anything else (a name) is returned unchanged."""
    if isinstance(netlike, _net_class()):
        return netlike.Proto().name
    if isinstance(netlike, caffe2_pb2.NetDef):
        return netlike.name
    return netlike


def _add_net_to_dict(net_dict, net):
    """Record ``net`` under its name; False if that name was already recorded.

    Only ``Net`` objects are kept (names and NetDefs are recorded as ``None``). Two
    different ``Net`` objects under one name are an error.
    """
    name = get_net_name(net)
    if name in net_dict:
        assert net_dict[name] is None or net == net_dict[name], (
            "Different nets with same name: " + name
        )
        return False
    net_dict[name] = net if isinstance(net, _net_class()) else None
    return True


class ExecutionStep:
    # Names given to unnamed steps, process-wide. Always read through the class: test
    # harnesses reset it between cases.
    _step_names_used = set()

    @staticmethod
    def _get_next_step_name(basename):
        used = ExecutionStep._step_names_used
        name = basename
        next_idx = 1
        while name in used:
            name = basename + "_" + str(next_idx)
            next_idx += 1
        ExecutionStep._step_names_used.add(name)
        return name

    def __init__(self, name, nets=None, num_iter=None):
        self._step = caffe2_pb2.ExecutionStep()
        self._step.name = name or ExecutionStep._get_next_step_name("step")
        self._net_dict = OrderedDict()
        self._is_used = False
        self._substeps = []
        if nets is not None:
            if isinstance(nets, _net_class()):
                nets = [nets]
            for net in nets:
                if _add_net_to_dict(self._net_dict, net):
                    self._step.network.extend([get_net_name(net)])
        if num_iter is not None:
            self._step.num_iter = num_iter

    def get_net(self, name):
        return self._net_dict[name]

    def Name(self):
        return self._step.name

    def __str__(self):
        return self._step.name

    def _assert_can_mutate(self):
        assert not self._is_used, "Cannot mutate a step that has already been added to a plan/step."

    def _notify_is_used(self):
        self._is_used = True

    def Proto(self):
        return self._step

    def HasNets(self):
        return len(self._step.network) > 0

    def HasSubsteps(self):
        return len(self._step.substep) > 0

    def Nets(self):
        return list(self._net_dict.values())

    def Substeps(self):
        return self._substeps

    def SetIter(self, num_iter):
        self._assert_can_mutate()
        self._step.num_iter = num_iter

    def SetCreateWorkspace(self, create_workspace):
        self._assert_can_mutate()
        self._step.create_workspace = create_workspace

    def SetNumConcurrentInstances(self, num_concurrent_instances):
        self._assert_can_mutate()
        self._step.num_concurrent_instances = num_concurrent_instances

    def SetOnlyOnce(self, only_once):
        self._assert_can_mutate()
        self._step.only_once = only_once

    def SetShouldStopBlob(self, should_stop_blob):
        assert isinstance(should_stop_blob, _blob_reference_class()), (
            f"expects BlobReference here, got {type(should_stop_blob)}"
        )
        self._assert_can_mutate()
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval):
        """Rerun this step every ``interval`` ms while its sibling substeps run (it runs at
        least once after they finish). Ignored for top-level steps."""
        self._step.run_every_ms = interval

    def SetReportNet(self, report_net, report_interval):
        """Deprecated in Caffe2 in favour of :meth:`RunEveryMillis`."""
        self._assert_can_mutate()
        _add_net_to_dict(self._net_dict, report_net)
        self._step.report_net = get_net_name(report_net)
        self._step.report_interval = report_interval

    def AddSubstep(self, substep):
        """Append a substep (an ``ExecutionStep`` or a raw ``caffe2_pb2.ExecutionStep``).

        An ``ExecutionStep`` that has neither nets nor substeps is silently dropped; one
        that is added becomes immutable. Returns ``self``.
        """
        self._assert_can_mutate()
        assert not self.HasNets(), "Cannot have both network and substeps."
        if isinstance(substep, ExecutionStep):
            substep._notify_is_used()
            if not substep.HasNets() and not substep.HasSubsteps():
                return self
            for net in substep.Nets():
                _add_net_to_dict(self._net_dict, net)
            self._substeps.append(substep)
            proto = substep.Proto()
        else:
            proto = substep
        self._step.substep.add().CopyFrom(proto)
        return self

    def SetConcurrentSubsteps(self, concurrent_substeps):
        self._assert_can_mutate()
        assert not self.HasNets(), "Cannot have both network and substeps."
        self._step.concurrent_substeps = concurrent_substeps

    def AddNet(self, net):
        """Append a net (a ``Net`` object; it may repeat). Returns ``self``."""
        self._assert_can_mutate()
        assert not self.HasSubsteps(), "Cannot have both network and substeps."
        assert isinstance(net, _net_class())
        _add_net_to_dict(self._net_dict, net)
        self._step.network.extend([get_net_name(net)])
        return self

    def get_all_attributes(self, name):
        """Every attribute ``name`` of the nets this step (and its substeps) uses."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(cls, step_proto, net_obj_dict, net_proto_dict):
        """Rebuild a step (recursively) from its proto.

        Nets are looked up by name in ``net_obj_dict`` (``Net`` objects), else built from
        ``net_proto_dict`` (NetDefs) and added to ``net_obj_dict``. Nets built here get
        fresh unique names, which the rebuilt step refers to.
        """
        Net = _net_class()
        assert isinstance(step_proto, caffe2_pb2.ExecutionStep)
        assert (len(step_proto.network) > 0 and len(step_proto.substep) == 0) or (
            len(step_proto.network) == 0 and len(step_proto.substep) > 0
        )

        steps_or_nets = []
        if len(step_proto.substep) > 0:
            for substep_proto in step_proto.substep:
                steps_or_nets.append(
                    ExecutionStep.create_from_proto(substep_proto, net_obj_dict, net_proto_dict)
                )
        else:
            for net_name in step_proto.network:
                if net_name not in net_obj_dict:
                    assert net_name in net_proto_dict
                    net_obj_dict[net_name] = Net(net_proto_dict[net_name])
                net = net_obj_dict[net_name]
                assert isinstance(net, Net)
                steps_or_nets.append(net)

        def optional(field):
            return getattr(step_proto, field) if step_proto.HasField(field) else None

        should_stop_blob = None
        if step_proto.HasField("should_stop_blob"):
            should_stop_blob = _blob_reference_class()(step_proto.should_stop_blob)

        return execution_step(
            step_proto.name,
            steps_or_nets,
            num_iter=optional("num_iter"),
            report_net=None,
            report_interval=None,
            concurrent_substeps=optional("concurrent_substeps"),
            should_stop_blob=should_stop_blob,
            only_once=optional("only_once"),
            num_concurrent_instances=optional("num_concurrent_instances"),
            create_workspace=optional("create_workspace"),
            run_every_ms=optional("run_every_ms"),
        )


def add_nets_in_order(step, net_list):
    """Append to ``net_list`` the names of the nets ``step`` uses, in order of first use
    (substeps first, then the step's own nets, then its report net)."""
    proto = step.Proto()
    for substep in step.Substeps():
        add_nets_in_order(substep, net_list)
    for net in proto.network:
        if net not in net_list:
            net_list.append(net)
    # Caffe2 appended the report net last although it may run before the substeps;
    # kept for the same net order.
    if proto.report_net and proto.report_net not in net_list:
        net_list.append(proto.report_net)


class Plan:
    def __init__(self, name_or_step):
        self._plan = caffe2_pb2.PlanDef()
        self._net_dict = OrderedDict()
        self._steps = []
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Name()
            self.AddStep(name_or_step)
        elif isinstance(name_or_step, str):
            self._plan.name = name_or_step
        else:
            raise ValueError("name_or_step must be a string or ExecutionStep")

    def __str__(self):
        return self._plan.name

    def Proto(self):
        return self._plan

    def AddNets(self, nets):
        """Copy each new ``Net`` (by name) into the plan; later changes to it are not seen."""
        for net in nets:
            if _add_net_to_dict(self._net_dict, net):
                assert isinstance(net, _net_class())
                self._plan.network.add().CopyFrom(net.Proto())

    def Nets(self):
        return list(self._net_dict.values())

    def AddStep(self, step):
        """Append a top-level step and the nets it uses (a step with neither nets nor
        substeps is dropped). The step becomes immutable."""
        assert isinstance(step, ExecutionStep)
        step._notify_is_used()
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self._steps.append(step)
        net_list = []
        add_nets_in_order(step, net_list)
        self.AddNets([step.get_net(n) for n in net_list])

    def Steps(self):
        return self._steps

    def get_all_attributes(self, name):
        """Every attribute ``name`` of the nets in this plan."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(cls, plan_proto):
        """Rebuild a plan, its steps and its nets (under fresh unique names) from a PlanDef."""
        assert isinstance(plan_proto, caffe2_pb2.PlanDef)
        plan = Plan(plan_proto.name)
        plan._plan.CopyFrom(plan_proto)
        del plan._plan.network[:]
        del plan._plan.execution_step[:]

        net_obj_dict = {}
        net_proto_dict = {}
        for net_proto in plan_proto.network:
            assert net_proto.name not in net_proto_dict
            net_proto_dict[net_proto.name] = net_proto

        for step_proto in plan_proto.execution_step:
            step = ExecutionStep.create_from_proto(step_proto, net_obj_dict, net_proto_dict)
            plan.AddStep(step)
        return plan


def to_execution_step(step_or_nets, default_name=None):
    """Return ``step_or_nets`` if it is an ``ExecutionStep``, else wrap it with
    :func:`execution_step` (named ``default_name``, or the object's ``name`` attribute)."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets
    stop_blob = None
    if not default_name and hasattr(step_or_nets, "name"):
        default_name = step_or_nets.name
    # A NetBuilder-like object brings its own stop blob and nets.
    if hasattr(step_or_nets, "_stop_blob") and hasattr(step_or_nets, "get"):
        stop_blob = step_or_nets._stop_blob
        step_or_nets = step_or_nets.get()
    return execution_step(default_name, step_or_nets, should_stop_blob=stop_blob)


def execution_step(
    default_name,
    steps_or_nets,
    num_iter=None,
    report_net=None,
    report_interval=None,
    concurrent_substeps=None,
    should_stop_blob=None,
    only_once=None,
    num_concurrent_instances=None,
    create_workspace=False,
    run_every_ms=None,
):
    """Build an ``ExecutionStep`` from ``None``, a ``Net``, an ``ExecutionStep``, or a list of
    nets or steps (a list that is not all nets becomes substeps, each wrapped with
    :func:`to_execution_step`). Without ``should_stop_blob`` or ``num_iter`` the step runs
    once (``num_iter=1``); giving both is an error.
    """
    Net = _net_class()
    assert should_stop_blob is None or num_iter is None, (
        "Cannot set both should_stop_blob and num_iter."
    )
    if should_stop_blob is None and num_iter is None:
        num_iter = 1

    step = ExecutionStep(default_name)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if num_iter is not None:
        step.SetIter(num_iter)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubsteps(concurrent_substeps)
    if report_net is not None:
        assert report_interval is not None
        step.SetReportNet(report_net, report_interval)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)

    if isinstance(steps_or_nets, ExecutionStep):
        step.AddSubstep(steps_or_nets)
    elif isinstance(steps_or_nets, Net):
        step.AddNet(steps_or_nets)
    elif isinstance(steps_or_nets, list):
        if all(isinstance(x, Net) for x in steps_or_nets):
            for x in steps_or_nets:
                step.AddNet(x)
        else:
            for x in steps_or_nets:
                step.AddSubstep(to_execution_step(x))
    elif steps_or_nets:
        raise ValueError("steps_or_nets must be a step, a net, or a list of nets or steps.")
    return step


def scoped_execution_step(name, *args, **kwargs):
    """:func:`execution_step` with ``name`` prefixed by the current name scope."""
    from ferrocaffe.core.blob import ScopedName

    default_name = ScopedName(name) if name else name
    return execution_step(default_name, *args, **kwargs)
