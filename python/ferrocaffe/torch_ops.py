"""Caffe2 operators exported to PyTorch as ``torch.ops._caffe2.<Name>``, as Caffe2's library
registered them when it was loaded (``LayerNorm`` today). The kernels are ferrocaffe's: each
call runs the operator in a private workspace.

Importing torch is slow, so nothing here imports it: ``install()`` (run when
``ferrocaffe.workspace`` is imported) registers the ops at once when torch is already loaded,
and otherwise when torch is first imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading

_LOCK = threading.Lock()
_STATE = {"registered": False, "libs": [], "ws": None}

_LAYER_NORM_SCHEMA = (
    "LayerNorm(Tensor X, Tensor? gamma, Tensor? beta, int axis=1, float epsilon=1e-05, "
    "bool elementwise_affine=False) -> (Tensor Y, Tensor mean, Tensor std)"
)


def _run(op_type, inputs, n_out, **args):
    """Runs one op on numpy ``inputs`` in the private workspace; returns its outputs."""
    from ferrocaffe import _native, core

    with _LOCK:
        if _STATE["ws"] is None:
            _STATE["ws"] = _native.Workspace()
        ws = _STATE["ws"]
        names = [f"in{i}" for i in range(len(inputs))]
        for name, value in zip(names, inputs, strict=True):
            ws.feed(name, value)
        outs = [f"out{i}" for i in range(n_out)]
        op = core.CreateOperator(op_type, names, outs, **args)
        ws.run_operator_once(op.SerializeToString())
        result = [ws.fetch(o) for o in outs]
        ws.reset()
    return result


def _layer_norm(X, gamma=None, beta=None, axis=1, epsilon=1e-5, elementwise_affine=False):
    import numpy as np
    import torch

    inputs = [X.detach().cpu().numpy()]
    if elementwise_affine:
        if gamma is None or beta is None:
            raise RuntimeError("LayerNorm with elementwise_affine needs gamma and beta")
        inputs += [gamma.detach().cpu().numpy(), beta.detach().cpu().numpy()]
    outs = _run(
        "LayerNorm",
        inputs,
        3,
        axis=int(axis),
        epsilon=float(epsilon),
        elementwise_affine=bool(elementwise_affine),
    )
    return tuple(torch.from_numpy(np.array(o)) for o in outs)


def register(torch) -> None:
    """Defines the ``_caffe2`` ops in ``torch`` (once)."""
    with _LOCK:
        if _STATE["registered"]:
            return
        _STATE["registered"] = True
    try:
        lib = torch.library.Library("_caffe2", "DEF")
    except RuntimeError:
        lib = torch.library.Library("_caffe2", "FRAGMENT")
    try:
        lib.define(_LAYER_NORM_SCHEMA)
    except RuntimeError:
        return  # already defined by someone else: keep theirs
    lib.impl("LayerNorm", _layer_norm, "CPU")
    _STATE["libs"].append(lib)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Registers the ops right after ``import torch`` finishes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module):
            run_module(module)
            try:
                register(module)
            except Exception:  # a torch without torch.library: nothing to export to
                pass

        loader.exec_module = exec_module
        return spec


_HOOK = _TorchImportHook()


def install() -> None:
    """Registers the ops now if torch is loaded, else when it is first imported."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "library"):
        register(torch)
    elif torch is None and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
