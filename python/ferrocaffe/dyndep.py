"""Caffe2's ``dyndep``: loading operator libraries at run time.

Caffe2 loaded a shared library of C++ operators into its registry. ferrocaffe's operators are
compiled into its native module, so there is nothing to load: a name that is not an existing
file is ignored with a notice, as Caffe2 did (its tests name built-in libraries as
``@/caffe2/...``), and an existing file is refused, since a Caffe2 C++ library cannot register
operators here.
"""

import os
import threading

__all__ = ["InitOpsLibrary", "GetImportedOpsLibraries"]

_IMPORTED_DYNDEPS = set()
_lock = threading.Lock()


def InitOpsLibrary(name, trigger_lazy=True):
    """Ignore ``name`` (with a notice) unless it is a file; a file raises ``RuntimeError``."""
    if not os.path.exists(name):
        print(f"Ignoring {name} as it is not a valid file.")
        return
    raise RuntimeError(
        f"InitOpsLibrary({name!r}): ferrocaffe cannot load operator libraries built for "
        "Caffe2; its operators are compiled into ferrocaffe._native"
    )


def GetImportedOpsLibraries():
    with _lock:
        return set(_IMPORTED_DYNDEPS)
