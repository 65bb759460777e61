"""Rank 1 exits before the Allreduce; rank 0 must fail with a timeout error, not hang.

Run as ``mpiexec -disable-auto-cleanup -n 2 python this`` (without that flag mpiexec kills
rank 0 as soon as rank 1 is gone, which is also bounded but tests nothing of ours).
"""

import os
import time

import numpy as np

from ferrocaffe import core, workspace

R = int(os.environ["PMI_RANK"])

init = core.Net("init")
init.CreateCommonWorld([], "grad_cw", engine="MPI", timeout_ms=2000)
workspace.RunNetOnce(init)
workspace.FeedBlob("X", np.ones(1000, np.float32))
net = core.Net("train")
net.Allreduce(["grad_cw", "X"], ["X"], engine="MPI")
workspace.CreateNet(net)

if R == 1:
    print("RANK 1 LEAVING", flush=True)
    os._exit(0)

start = time.monotonic()
try:
    workspace.RunNet(net.Proto().name)
except RuntimeError as e:
    print(f"RANK 0 ERROR after {time.monotonic() - start:.1f} s: {e}", flush=True)
else:
    print("RANK 0 NO ERROR", flush=True)
# The world is unusable from now on, and says why.
try:
    workspace.RunNet(net.Proto().name)
except RuntimeError as e:
    print(f"RANK 0 AGAIN: {e}", flush=True)
# A request MPI could not cancel is pending: leave without MPI_Finalize.
os._exit(0)
