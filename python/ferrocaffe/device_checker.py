"""Caffe2's ``device_checker``: run an operator or a net on several devices and compare.

``DeviceChecker(threshold, device_options)`` runs everything in the workspace
``_device_check_`` (emptied after each device in ``CheckSimple``) and compares each device's
results with the first device's, ``np.allclose`` with ``threshold`` as both the absolute and
the relative tolerance. The checks return True or False and print the differing values; the
workspace that was current before is current again afterwards.
"""

import copy

import numpy as np

from ferrocaffe import workspace
from ferrocaffe.core import InferOpBlobDevicesAsDict

__all__ = ["DeviceChecker"]

_CHECK_WORKSPACE = "_device_check_"


class DeviceChecker:
    """Checks that an operator (``CheckSimple``) or a net (``CheckNet``) computes the same
    values on every device of ``device_options``."""

    def __init__(self, threshold, device_options):
        self._threshold = threshold
        self._device_options = device_options

    def _agree(self, results, names):
        success = True
        for i in range(1, len(results)):
            for j, name in enumerate(names):
                x, y = results[i][j], results[0][j]
                if not np.allclose(x, y, atol=self._threshold, rtol=self._threshold):
                    print(
                        f"Failure in checking device option {i} and output {name}. The outputs are:"
                    )
                    print(np.asarray(x).flatten())
                    print(np.asarray(y).flatten())
                    print(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                    success = False
        return success

    def CheckSimple(self, op, inputs, outputs_to_check, input_device_options=None):
        """Runs ``op`` with ``inputs`` (one array per input) on each device and compares the
        outputs numbered in ``outputs_to_check``. ``input_device_options`` maps input names
        to the device they are fed on (default: where the op reads them). Returns whether
        all devices agree."""
        op = copy.deepcopy(op)
        previous = workspace.CurrentWorkspace()
        results = []
        workspace.SwitchWorkspace(_CHECK_WORKSPACE, True)
        try:
            for device_option in self._device_options:
                op.device_option.CopyFrom(device_option)
                placement = input_device_options or InferOpBlobDevicesAsDict(op)[0]
                for name, value in zip(op.input, inputs, strict=False):
                    workspace.FeedBlob(name, np.array(value), placement.get(name, device_option))
                workspace.RunOperatorOnce(op)
                results.append([workspace.FetchBlob(op.output[k]) for k in outputs_to_check])
                workspace.ResetWorkspace()
        finally:
            workspace.SwitchWorkspace(previous)
        return self._agree(results, [op.output[k] for k in outputs_to_check])

    def CheckNet(self, net, inputs=None, blobs_to_check=None, ignore=None):
        """Runs the NetDef ``net`` (its ops are placed on each device in turn) after feeding
        ``inputs`` (name -> array) and compares ``blobs_to_check`` (default: every op output,
        less ``ignore``). Returns whether all devices agree."""
        inputs = inputs or {}
        ignore = set(ignore or ())
        if blobs_to_check is None:
            blobs_to_check = [out for op in net.op for out in op.output]
        blobs_to_check = [b for b in blobs_to_check if b not in ignore]
        previous = workspace.CurrentWorkspace()
        results = []
        workspace.SwitchWorkspace(_CHECK_WORKSPACE, True)
        try:
            for device_option in self._device_options:
                for name, value in inputs.items():
                    workspace.FeedBlob(name, value, device_option)
                for op in net.op:
                    op.device_option.CopyFrom(device_option)
                workspace.RunNetOnce(net)
                results.append([workspace.FetchBlob(name) for name in blobs_to_check])
        finally:
            workspace.SwitchWorkspace(previous)
        return self._agree(results, blobs_to_check)
