"""Caffe2's ``task`` module: tasks, task groups, nodes and their outputs.

A :class:`Task` is an execution step plus the blobs it hands back (its outputs); tasks are
gathered in a :class:`TaskGroup` and placed on named :class:`Node` s. A session turns a group
into one step per node whose tasks run as concurrent substeps, wrapped in the setup and exit
nets their nets asked for (``Task.TASK_SETUP`` runs once per task, ``TASK_INSTANCE_SETUP``
once per concurrent instance, ``TaskGroup.LOCAL_SETUP`` once per node).
"""

from collections import defaultdict
from copy import copy

from ferrocaffe import context, core

__all__ = [
    "Cluster",
    "Node",
    "WorkspaceType",
    "get_setup_nets",
    "add_setup_steps",
    "TaskGroup",
    "TaskOutput",
    "final_output",
    "TaskOutputList",
    "Task",
    "SetupNets",
]


def _merged_kwargs(newer, older):
    if newer is None:
        return older
    if older is None:
        return newer
    merged = copy(newer)
    merged.update(older)
    return merged


class Cluster(context.DefaultManaged):
    """Records the node names (and their keyword arguments) used while it is active. One is
    created on first use of a :class:`Node` when none is active."""

    def __init__(self):
        self._nodes = []
        self._node_kwargs = {}

    def add_node(self, node):
        name = str(node)
        if name not in self._nodes:
            self._nodes.append(name)
        self._node_kwargs[name] = _merged_kwargs(node.kwargs(), self._node_kwargs.get(name))

    def nodes(self):
        """The distinct node names used, in order of first use."""
        return self._nodes

    def node_kwargs(self):
        return self._node_kwargs

    def __repr__(self):
        return f"Cluster(nodes={self.nodes()}, node_kwargs={self.node_kwargs()})"


class Node(context.DefaultManaged):
    """Names the node that tasks created inside it run on (``'local'`` by default). Tasks on
    one node share a workspace; only the name matters, ``kwargs`` are kept for sessions."""

    def __init__(self, node="local", **kwargs):
        self._name = str(node)
        self._kwargs = kwargs
        Cluster.current().add_node(self)

    def __str__(self):
        return self._name

    def __repr__(self):
        return f"Node(name={self._name}, kwargs={self._kwargs})"

    def kwargs(self):
        return self._kwargs


class WorkspaceType:
    """Where a task group runs: ``GLOBAL`` (the session's workspace, kept across runs) or
    ``PRIVATE`` (a child workspace dropped after the run)."""

    PRIVATE = "private"
    GLOBAL = "global"


def _as_net_list(nets, what):
    if nets is None:
        return []
    if isinstance(nets, (list, tuple)):
        return list(nets)
    if isinstance(nets, (core.Net, core.ExecutionStep)):
        return [nets]
    raise TypeError(f"Unsupported type for {what}: {type(nets)}")


def get_setup_nets(key, steps_or_nets, target):
    """The init and exit nets (or steps) that the attributes ``key`` of ``steps_or_nets``
    ask for. Each setup object runs once: it is marked used, and objects bound to another
    target (``_setup_target``) are skipped. Ops the objects add to the shared
    ``<key>/init`` and ``<key>/exit`` nets come first."""
    init_net = core.Net(key + "/init")
    exit_net = core.Net(key + "/exit")
    init_nets = []
    exit_nets = []
    setups = []
    for item in steps_or_nets:
        if hasattr(item, "get_all_attributes"):
            setups.extend(item.get_all_attributes(key))
        elif hasattr(item, "get_attributes"):
            setups.extend(item.get_attributes(key))
    for setup in setups:
        if getattr(setup, "_setup_used", False):
            continue
        if hasattr(setup, "_setup_target") and setup._setup_target != target:
            continue
        if hasattr(setup, "setup"):
            init_nets.extend(_as_net_list(setup.setup(init_net), "setup"))
            setup._setup_used = True
        if hasattr(setup, "exit"):
            exit_nets.extend(_as_net_list(setup.exit(exit_net), "setup"))
            setup._setup_used = True
    if init_net.Proto().op:
        init_nets.insert(0, init_net)
    if exit_net.Proto().op:
        exit_nets.insert(0, exit_net)
    return init_nets, exit_nets


def add_setup_steps(step, init_nets, exit_nets, name):
    """``step`` alone, or a step ``name`` running ``<name>:init``, ``step``, ``<name>:exit``."""
    if not init_nets and not exit_nets:
        return step
    parts = []
    if init_nets:
        parts.append(core.execution_step(f"{name}:init", init_nets))
    parts.append(step)
    if exit_nets:
        parts.append(core.execution_step(f"{name}:exit", exit_nets))
    return core.execution_step(name, parts)


class TaskGroup(context.Managed):
    """Tasks that run concurrently, possibly on several nodes; tasks created inside
    ``with TaskGroup()`` join it. The group finishes when its last task does."""

    LOCAL_SETUP = "local_setup"

    def __init__(self, workspace_type=None):
        self._plan_cache = None
        self._tasks = []
        self._already_used = False
        self._prev_active = None
        self._tasks_to_add = []
        self._report_nets = {}
        self._report_steps = []
        self._workspace_type = workspace_type
        self._tasks_by_node = None
        self._remote_nets = []

    def add_remote_net(self, net):
        self._remote_nets.append(net)

    def remote_nets(self):
        return self._remote_nets

    def add(self, task):
        assert not self._already_used, "Cannot add Task to an already used TaskGroup."
        assert (
            self._workspace_type is None
            or task._workspace_type is None
            or self._workspace_type == task._workspace_type
        ), "Task and TaskGroup have different workspace types."
        if task._workspace_type is None:
            task._workspace_type = self._workspace_type or WorkspaceType.PRIVATE
        if self._workspace_type is None:
            self._workspace_type = task._workspace_type
        task._notify_used()
        self._tasks.append(task)

    def tasks(self):
        """The group's tasks; adds the pending ones and freezes the group."""
        pending, self._tasks_to_add = self._tasks_to_add, []
        for task in pending:
            self.add(task)
        self._already_used = True
        return self._tasks

    def num_registered_tasks(self):
        return len(self._tasks) + len(self._tasks_to_add)

    def used_nodes(self):
        nodes = []
        for task in self._tasks + self._tasks_to_add:
            if task.node not in nodes:
                nodes.append(task.node)
        return nodes

    def report_step(self, step=None, node=None, interval_ms=1000):
        """Run ``step`` every ``interval_ms`` ms on ``node`` while the group runs (and once
        after every task of the node finished)."""
        step = core.to_execution_step(step)
        step.RunEveryMillis(interval_ms)
        self._report_steps.append((str(node or Node.current(node)), step))

    def report_net(self, net=None, node=None, report_interval=5):
        """Deprecated form of :meth:`report_step` (interval in seconds); returns the net."""
        node = str(node or Node.current(node))
        assert net is None or node not in self._report_nets
        if node not in self._report_nets:
            self._report_nets[node] = (net or core.Net(f"{node}/reporter"), report_interval)
        return self._report_nets[node][0]

    def tasks_by_node(self, node_remap=None):
        """A new group with one task per (remapped) node running the node's tasks
        concurrently inside the node's setup steps. Computed once."""
        node_map = {}
        for task in self.tasks():
            node_map[task.node] = node_remap(task.node) if node_remap else task.node
        if self._tasks_by_node is not None:
            grouped, previous_map = self._tasks_by_node
            assert previous_map == node_map, "Cannot call tasks_by_node multiple times."
            return grouped

        for node, (net, interval) in self._report_nets.items():
            self.report_step(net, node=node, interval_ms=interval * 1000)
        self._report_nets = {}

        tasks_of = defaultdict(list)
        for task in self.tasks():
            tasks_of[node_map[task.node]].append(task)
        reports_of = defaultdict(list)
        for node, step in self._report_steps:
            reports_of[node_map[node]].append(step)

        grouped = TaskGroup()
        for node, tasks in tasks_of.items():
            reports = reports_of[node]
            node_inits, node_exits = get_setup_nets(
                TaskGroup.LOCAL_SETUP, [t.get_step() for t in tasks] + reports, self
            )
            steps = reports
            outputs = []
            ws_type = WorkspaceType.PRIVATE
            for task in tasks:
                task_step = task.get_step()
                task_step.SetCreateWorkspace(task.workspace_type() == WorkspaceType.PRIVATE)
                steps.append(task_step)
                outputs += task.outputs()
                if task.workspace_type() == WorkspaceType.GLOBAL:
                    ws_type = WorkspaceType.GLOBAL
            if not steps:
                steps.append(core.execution_step("empty", []))
            if len(steps) == 1:
                body = steps[0]
            else:
                body = core.execution_step(f"{node}:body", steps, concurrent_substeps=True)
            if node_inits or node_exits:
                parts = []
                if node_inits:
                    parts.append(core.execution_step(f"{node}:init", node_inits))
                parts.append(body)
                if node_exits:
                    parts.append(core.execution_step(f"{node}:exit", node_exits))
                body = core.execution_step(node, parts)
            Task(
                node=node,
                step=body,
                outputs=outputs,
                name="grouped_by_node",
                group=grouped,
                workspace_type=ws_type,
            )
        self._tasks_by_node = (grouped, node_map)
        return grouped

    def to_task(self, node=None):
        """All the group's tasks merged into one task on ``node``."""
        node = str(Node.current(node))
        tasks = self.tasks_by_node(lambda _: node).tasks()
        return tasks[0] if tasks else Task()

    def workspace_type(self):
        return self._workspace_type

    def __repr__(self):
        return (
            f"TaskGroup(tasks={self._tasks + self._tasks_to_add}, "
            f"workspace_type={self.workspace_type()}, remote_nets={self.remote_nets()})"
        )


def _is_record(value):
    # A ``schema.Field`` (record); tested by its interface so that this module does not
    # need ``ferrocaffe.schema`` unless records are used.
    return hasattr(value, "field_blobs") and hasattr(value, "field_names")


def _record_from_blobs(record, values):
    from ferrocaffe.schema import from_blob_list

    return from_blob_list(record, values)


class TaskOutput:
    """An output of a task: a blob, a list of blobs or a record, read back after the run."""

    def __init__(self, names):
        self._schema = None
        if _is_record(names):
            self._schema = names
            names = names.field_blobs()
        self._is_scalar = type(names) not in (tuple, list)
        self.names = [names] if self._is_scalar else names
        self._values = None
        self._fetch_func = None

    def set(self, values, _fetch_func=None):
        assert len(values) == len(self.names), "Wrong number of output values."
        self._values = values
        self._fetch_func = _fetch_func

    def _shaped(self, values):
        if self._is_scalar:
            return values[0]
        if self._schema:
            return _record_from_blobs(self._schema, values)
        return values

    def get(self):
        """The output's blob references (set by the session)."""
        assert self._values is not None, "Output value not set yet."
        return self._shaped(self._values)

    def fetch(self):
        """The output's values, fetched from the session's workspace."""
        assert self._fetch_func is not None, "Cannot fetch value for this output."
        return self._shaped([self._fetch_func(v) for v in self._values])

    def __repr__(self):
        return f"TaskOutput(names={self.names}, values={self._values})"


def final_output(blob_or_record):
    """Make ``blob_or_record`` an output of the current task (a new task when none is
    active); its value is available once the task group finished."""
    task = Task.current(required=False) or Task()
    return task.add_output(blob_or_record)


class TaskOutputList:
    """The outputs of a task, set from one flat list of values."""

    def __init__(self, outputs=None):
        self.outputs = outputs or []

    def names(self):
        return [name for output in self.outputs for name in output.names]

    def set_values(self, values, _fetch_func=None):
        start = 0
        for output in self.outputs:
            end = start + len(output.names)
            output.set(values[start:end], _fetch_func)
            start = end
        assert start == len(values), "Wrong number of output values."

    def __repr__(self):
        return f"TaskOutputList(outputs={self.outputs})"


class Task(context.Managed):
    """An execution step and the outputs it returns, placed on a node and (when one is
    active) in a task group. Used as a context, the ops built inside (``net_builder.ops``)
    become its step. ``num_instances`` > 1 runs that many concurrent copies of the step,
    each in its own workspace, between the task's init and exit nets."""

    TASK_SETUP = "task_setup"
    TASK_INSTANCE_SETUP = "task_instance_setup"
    REPORT_STEP = "report_step"
    _global_names_used = set()

    @staticmethod
    def _get_next_name(node, group, name):
        base = f"{node}/{name}"
        if group is None:
            taken = Task._global_names_used
        else:
            taken = {t.name for t in group._tasks_to_add}
        candidate = base
        suffix = 0
        while candidate in taken:
            suffix += 1
            candidate = f"{base}:{suffix}"
        return candidate

    def __init__(
        self,
        step=None,
        outputs=None,
        workspace_type=None,
        group=None,
        node=None,
        name=None,
        num_instances=None,
    ):
        if not name and isinstance(step, core.ExecutionStep):
            name = step.Proto().name
        name = name or "task"
        self.node = str(Node.current(None if node is None else Node(node)))
        self.group = TaskGroup.current(group, required=False)
        self.name = Task._get_next_name(self.node, self.group, name)
        if self.group is not None:
            self.group._tasks_to_add.append(self)

        self._already_used = False
        self._step = None
        self._step_with_setup = None
        self._outputs = []
        if step is not None:
            self.set_step(step)
        if outputs is not None:
            self.add_outputs(outputs)

        self._pipeline = None
        self._is_pipeline_context = False
        self._workspace_type = workspace_type
        self._report_net = None
        self._num_instances = num_instances
        self._net_builder = None

    def __enter__(self):
        super().__enter__()
        # Re-added on exit, so that tasks created inside come first in the group.
        if self.group is not None:
            self.group._tasks_to_add.remove(self)
        self._assert_not_used()
        assert self._step is None, "This Task already has an execution step."
        from ferrocaffe import net_builder

        self._net_builder = net_builder.NetBuilder(_fullname=self.name)
        self._net_builder.__enter__()
        return self

    def __exit__(self, etype, value, traceback):
        super().__exit__(etype, value, traceback)
        self._net_builder.__exit__(etype, value, traceback)
        if etype is None:
            self.set_step(self._net_builder)
        if self.group is not None:
            self.group._tasks_to_add.append(self)
        self._net_builder = None

    def workspace_type(self):
        return self._workspace_type

    def _assert_not_used(self):
        assert not self._already_used, "Cannot modify task since it is already been used."

    def add_output(self, output):
        self._assert_not_used()
        if not isinstance(output, TaskOutput):
            output = TaskOutput(output)
        self._outputs.append(output)
        return output

    def add_outputs(self, outputs):
        self._assert_not_used()
        if type(outputs) not in (list, tuple):
            return self.add_output(outputs)
        return [self.add_output(output) for output in outputs]

    def set_step(self, step):
        self._assert_not_used()
        self._step = core.to_execution_step(step)

    def get_step(self):
        """The task's full step: setup nets, report steps, concurrent instances and an
        output net (a dummy output when the task has none). Built once."""
        if self._step_with_setup is not None:
            return self._step_with_setup
        if self._step is None:
            self._step_with_setup = core.execution_step(self.name, [])
            return self._step_with_setup

        reports = [
            s
            for s in self._step.get_all_attributes(Task.REPORT_STEP)
            if not hasattr(s, "_report_step_used")
        ]
        for report in reports:
            report._report_step_used = True
            if not report.Proto().run_every_ms:
                report.RunEveryMillis(1000)
        task_inits, task_exits = get_setup_nets(Task.TASK_SETUP, [self._step] + reports, self)
        instance_inits, instance_exits = get_setup_nets(
            Task.TASK_INSTANCE_SETUP, [self._step] + reports, self
        )
        if not self._outputs:
            output_net = core.Net(f"{self.name}:output")
            self.add_output(output_net.ConstantFill([], 1, dtype=core.DataType.INT32, value=0))
            task_exits.append(output_net)

        if reports:
            body = core.execution_step(f"{self.name}:body", reports + [self._step])
        else:
            body = self._step
        instance = add_setup_steps(body, instance_inits, instance_exits, self.name + ":instance")
        if self._num_instances and self._num_instances > 1:
            instance.SetCreateWorkspace(True)
            # Caffe2 named this step with the unformatted '%s:parallel'; kept.
            instance = core.execution_step(
                "%s:parallel", [instance], num_concurrent_instances=self._num_instances
            )
        self._step_with_setup = add_setup_steps(instance, task_inits, task_exits, self.name)
        return self._step_with_setup

    def output_list(self):
        return TaskOutputList(self._outputs)

    def outputs(self):
        return self._outputs

    def _notify_used(self):
        self.get_step()
        self._already_used = True

    def __repr__(self):
        return f"Task(name={self.name}, node={self.node}, outputs={self.outputs()})"


class SetupNets:
    """Nets to run when a task (attribute ``Task.TASK_SETUP``) or a node of a task group
    (``TaskGroup.LOCAL_SETUP``) starts and finishes; attach it to a net with
    ``net.add_attribute``. Runs once per task or group run even if attached to several
    nets."""

    def __init__(self, init_nets=None, exit_nets=None):
        self.init_nets = init_nets
        self.exit_nets = exit_nets

    def setup(self, init_net):
        return self.init_nets

    def exit(self, exit_net):
        return self.exit_nets

    def __repr__(self):
        return f"SetupNets(init_nets={self.init_nets}, exit_nets={self.exit_nets})"
