"""One-op helpers shared by the operator test files: an autouse fixture giving each test a
workspace of its own (named after the test module, emptied before and after) and `run`, which
feeds the inputs, runs one operator and fetches its outputs.

    from op_runner import fresh_workspace, run  # noqa: F401  (the fixture applies by import)
"""

import pytest

from ferrocaffe import core, workspace


@pytest.fixture(autouse=True)
def fresh_workspace(request):
    old = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace(request.module.__name__, True)
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()
    workspace.SwitchWorkspace(old)


def run(op_type, inputs, outputs, **args):
    """Feeds ``inputs`` (name -> array), runs one op, returns its outputs."""
    for name, value in inputs.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **args))
    return [workspace.FetchBlob(o) for o in outputs]
