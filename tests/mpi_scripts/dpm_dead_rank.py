"""data_parallel_model over MPI: rank 1 exits after iteration 1; rank 0 must fail with an
error naming the collective, not hang.

Run as ``mpiexec -disable-auto-cleanup -n 2 python this`` (without that flag mpiexec kills
rank 0 as soon as rank 1 is gone). Rank 0 then tries twice, each on a world of its own:
``data_parallel_model.RunNet`` (the barrier net first: ``Barrier`` times out after
``barrier_net_timeout_sec``), then the training net alone (its ``Allreduce`` times out after the
rendezvous's ``timeout_ms``).
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import data_parallel_mpi as ex  # noqa: E402

from ferrocaffe import data_parallel_model, workspace  # noqa: E402

rank, size = ex.mpi_rank_size()
assert size == 2, size
devices = [0, 1]
rendezvous = dict(engine="MPI", shard_id=rank, num_shards=size, kv_handler=None, timeout_ms=3000)
model = ex.build_model("dpm_dead_rank", devices, rendezvous, barrier_net_timeout_sec=2)
ex.start_model(model, devices, 0, (ex.INPUT, ex.HIDDEN, ex.CLASSES), None, rank)
data, label = ex.global_batch(0, 0, 16)
ex.feed_slices(data, label, devices, rank * 2, 4)
data_parallel_model.RunNet(model, 1)
print(f"RANK {rank} ITERATION 1 DONE", flush=True)

if rank == 1:
    print("RANK 1 LEAVING", flush=True)
    os._exit(0)

for what, run in (
    ("RUNNET", lambda: data_parallel_model.RunNet(model, 1)),
    ("TRAIN_NET", lambda: workspace.RunNet(model.net.Proto().name)),
):
    start = time.monotonic()
    try:
        run()
    except RuntimeError as e:
        msg = " ".join(str(e).split())
        print(f"RANK 0 {what} ERROR after {time.monotonic() - start:.1f} s: {msg}", flush=True)
    else:
        print(f"RANK 0 {what} NO ERROR", flush=True)
print(
    "RANK 0 PARAMS FINITE", bool(np.isfinite(workspace.FetchBlob("cpu_0/fc1_w")).all()), flush=True
)
# A collective MPI cannot cancel is pending: leave without MPI_Finalize.
os._exit(0)
