# ruff: noqa: I001  (import order sets which submodule wins a shared name; keep it explicit)
"""Caffe2's ``core`` module: blob references, operators, nets, execution steps and plans,
device helpers, SSA and gradients. Each concept lives in its own submodule; this package
re-exports them under the names Caffe2 users know (``core.Net``, ``core.CreateOperator``, ...).
"""

from ferrocaffe.proto import caffe2_pb2  # noqa: F401  (Caffe2 exposed it as core.caffe2_pb2)
from ferrocaffe.core.blob import *  # noqa: F401,F403
from ferrocaffe.core.operator import *  # noqa: F401,F403
from ferrocaffe.core.net import *  # noqa: F401,F403
from ferrocaffe.core.device import *  # noqa: F401,F403
from ferrocaffe.core.plan import *  # noqa: F401,F403
from ferrocaffe.core.clone import *  # noqa: F401,F403
from ferrocaffe.core.ssa import *  # noqa: F401,F403
from ferrocaffe.core.gradients import *  # noqa: F401,F403
from ferrocaffe.core.engine import *  # noqa: F401,F403
from ferrocaffe.core.python_op import *  # noqa: F401,F403
from ferrocaffe import scope, utils, workspace  # noqa: E402,F401  (core.scope/utils/workspace)
from ferrocaffe.scope import DeviceScope, NameScope  # noqa: E402,F401  (core.NameScope is scope.NameScope)
