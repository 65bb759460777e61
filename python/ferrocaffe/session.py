"""Caffe2's ``session`` module: sessions that run nets, steps, plans, tasks and task groups.

A :class:`Session` compiles what it is given into a task group (once per object, cached)
and runs it. :class:`LocalSession` runs everything on one node, in one workspace: the group
becomes a single task whose step goes into a plan named ``task_group_plan``; the task's
outputs are created as blobs of the session's workspace and fetched from there.
"""

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.task import Cluster, Task, TaskGroup, WorkspaceType

__all__ = ["CompiledRunnable", "Session", "LocalSession"]


class CompiledRunnable:
    """What ``Session.compile`` returns: the compiled object and the session class."""

    def __init__(self, obj, session_class):
        self.obj = obj
        self.session_class = session_class


def _as_task_group(runnable, workspace_type):
    if isinstance(runnable, TaskGroup):
        if workspace_type:
            if runnable.workspace_type():
                assert runnable.workspace_type() == workspace_type, (
                    f"Require {workspace_type} but already have {runnable.workspace_type()}"
                )
            else:
                runnable._workspace_type = workspace_type
        return runnable
    group = TaskGroup(workspace_type=workspace_type or WorkspaceType.GLOBAL)
    if isinstance(runnable, Task):
        group.add(runnable)
    elif isinstance(runnable, core.ExecutionStep):
        group.add(Task(step=runnable))
    elif isinstance(runnable, core.Plan):
        steps = runnable.Steps()
        assert steps, "Cannot run a plan without steps."
        group.add(Task(step=steps[0] if len(steps) == 1 else steps))
    else:
        group.add(Task(step=core.execution_step("runnable", runnable)))
    return group


class Session:
    """Runs nets, execution steps, plans, tasks and task groups (``run``) until closed.

    Tasks on different nodes may not see each other's blobs; tasks on one node share the
    session's workspace, directly (``WorkspaceType.GLOBAL``) or through private child
    workspaces dropped after each run (``WorkspaceType.PRIVATE``).
    """

    _compiled_cache = {}

    def __init__(self):
        self._open = True

    def is_open(self):
        return self._open

    @classmethod
    def compile(cls, runnable, workspace_type=None, setup_net_list=None):
        if isinstance(runnable, CompiledRunnable):
            assert cls == runnable.session_class, (
                "Runnable was compiled for different session type. "
                f"Need: {cls.__name__}, got: {runnable.session_class.__name__}"
            )
            return runnable
        if runnable in cls._compiled_cache:
            return cls._compiled_cache[runnable]
        group = _as_task_group(runnable, workspace_type)
        compiled = CompiledRunnable(
            cls._compile_task_group(group, setup_net_list), session_class=cls
        )
        cls._compiled_cache[runnable] = compiled
        return compiled

    def run(self, runnable, workspace_type=None, setup_net_list=None):
        """Compile ``runnable`` (a TaskGroup, Task, Plan, ExecutionStep or Net) and run it."""
        assert self.is_open(), "Session is closed."
        assert runnable is not None, "Got a none runnable."
        self._run_compiled(self.compile(runnable, workspace_type, setup_net_list).obj)

    def close(self):
        if self.is_open():
            self._do_close()
            self._open = False

    # Deliberate, as in Caffe2: Session is a base class; LocalSession (below) and other
    # sessions implement these two, and Caffe2 raised NotImplementedError for the base.
    def fetch_output(self, output):
        raise NotImplementedError(f"{type(self).__name__} does not implement fetch_output")

    def _run_compiled(self, task_group):
        raise NotImplementedError(f"{type(self).__name__} does not implement _run_compiled")

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        return task_group

    def _do_close(self):
        pass

    def __enter__(self):
        assert self._open, "Session already closed."
        return self

    def __exit__(self, ex_type, value, traceback):
        if ex_type is None:
            self.close()


def _in_private_workspace(plan):
    """``plan`` with its steps inside one step that creates a child workspace: what running
    it in a private child workspace of the session's does."""
    proto = caffe2_pb2.PlanDef()
    proto.CopyFrom(plan.Proto())
    outer = caffe2_pb2.ExecutionStep(name=proto.name + ":private", create_workspace=True)
    outer.substep.extend(proto.execution_step)
    del proto.execution_step[:]
    proto.execution_step.append(outer)
    return proto


class LocalSession(Session):
    """A session on one node: every task of a group is remapped to node ``'local'`` and runs
    in the workspace ``ws`` (by default the workspace current when the session is made)."""

    def __init__(self, ws=None):
        Session.__init__(self)
        self._ws = ws if ws is not None else workspace._ws()

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        with Cluster():
            task = task_group.to_task()
        plan = core.Plan("task_group_plan")
        plan.AddStep(task.get_step())
        return (plan, task.output_list(), task.workspace_type())

    def _run_compiled(self, compiled):
        plan, output_list, workspace_type = compiled
        refs = []
        for name in output_list.names():
            self._ws.create_blob(str(name))
            refs.append(core.BlobReference(str(name)))
        output_list.set_values(refs, _fetch_func=self._fetch_output)
        if workspace_type == WorkspaceType.PRIVATE:
            data = _in_private_workspace(plan).SerializeToString()
        else:
            data = plan.Proto().SerializeToString()
        if hasattr(self._ws, "run_plan"):
            self._ws.run_plan(data)
        else:
            self._ws.run(caffe2_pb2.PlanDef.FromString(data))

    def _fetch_output(self, output):
        if hasattr(self._ws, "fetch"):
            return self._ws.fetch(str(output))
        return self._ws.blobs[str(output)].fetch()
