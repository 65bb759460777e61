"""Run unmodified Caffe2 code on ferrocaffe.

``install()`` makes the ``caffe2`` import names resolve to ferrocaffe's modules::

    import ferrocaffe.compat
    ferrocaffe.compat.install()

    from caffe2.python import core, workspace   # ferrocaffe.core, ferrocaffe.workspace
    from caffe2.proto import caffe2_pb2         # ferrocaffe.proto.caffe2_pb2

``caffe2.python.<name>`` maps to ``ferrocaffe.<name>`` and ``caffe2.proto.<name>`` to
``ferrocaffe.proto.<name>``, for every module ferrocaffe has (``core``, ``scope``,
``workspace``, ...); the modules are the same objects (``caffe2.python.core is
ferrocaffe.core``). The packages ``caffe2``, ``caffe2.python`` and ``caffe2.proto`` are
stand-ins that load their submodules on first attribute access, as Caffe2's did by importing
them eagerly. A name ferrocaffe lacks raises ``ModuleNotFoundError`` naming both modules.

Caffe2's GPU extension modules (``caffe2.python.caffe2_pybind11_state_gpu`` and ``_hip``) are
absent as on a CPU-only Caffe2 build: ``importlib.util.find_spec`` returns None for them and
importing them raises the plain ``ModuleNotFoundError``, so code probing for them goes on.

Caffe2's code of 2021 calls ``inspect.getargspec``, which Python 3.11 removed: ``install()``
puts back an equivalent built on ``inspect.getfullargspec`` where it is missing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__all__ = ["install", "uninstall", "is_installed", "target_of"]

# caffe2 package -> the ferrocaffe package its submodules come from.
_PACKAGES = {
    "caffe2": None,
    "caffe2.python": "ferrocaffe",
    "caffe2.proto": "ferrocaffe.proto",
}


# Caffe2's CUDA and ROCm builds of its C extension; a CPU-only Caffe2 had neither.
_ABSENT = frozenset(
    {"caffe2.python.caffe2_pybind11_state_gpu", "caffe2.python.caffe2_pybind11_state_hip"}
)


def target_of(name: str) -> str | None:
    """The ferrocaffe module that the caffe2 module ``name`` stands for, if it is a mapped
    (non-package) name: ``caffe2.python.core`` -> ``ferrocaffe.core``."""
    for package, target in _PACKAGES.items():
        if target is not None and name.startswith(package + "."):
            return target + name[len(package) :]
    return None


def _package_getattr(package: str):
    def __getattr__(attr: str):
        # Caffe2's package __init__s imported their submodules; load ours on first use.
        child = f"{package}.{attr}"
        is_package = child in _PACKAGES
        if not attr.startswith("_") and (is_package or _target_exists(target_of(child))):
            return importlib.import_module(child)
        raise AttributeError(f"module {package!r} has no attribute {attr!r}")

    return __getattr__


def _target_exists(target: str | None) -> bool:
    if target is None:
        return False
    try:
        return importlib.util.find_spec(target) is not None
    except ModuleNotFoundError:
        return False


class _PackageLoader(importlib.abc.Loader):
    """Creates the stand-in package modules ``caffe2``, ``caffe2.python``, ``caffe2.proto``."""

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__doc__ = f"ferrocaffe stand-in for Caffe2's {spec.name} package."
        module.__getattr__ = _package_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


class _AliasLoader(importlib.abc.Loader):
    """Hands out the ferrocaffe module itself for a caffe2 name."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        # The import system overwrites __spec__ of what we return; keep the real one.
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in _PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _PackageLoader(), is_package=True)
        real = target_of(fullname)
        if real is None or fullname in _ABSENT:
            return None
        if not _target_exists(real):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: ferrocaffe has no {real!r}", name=fullname
            )
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


_FINDER = _Finder()


def _caffe2_modules() -> list[str]:
    return [n for n in sys.modules if n == "caffe2" or n.startswith("caffe2.")]


def is_installed() -> bool:
    return _FINDER in sys.meta_path


def _is_ours(name: str) -> bool:
    module = sys.modules[name]
    if name in _PACKAGES:
        return isinstance(getattr(module.__spec__, "loader", None), _PackageLoader)
    return module is sys.modules.get(target_of(name) or "")


def install() -> None:
    """Make ``import caffe2...`` resolve to ferrocaffe. Idempotent. Raises ``RuntimeError`` if
    a real Caffe2 was already imported in this process (install before importing caffe2)."""
    if is_installed():
        return
    foreign = [n for n in _caffe2_modules() if not _is_ours(n)]
    if foreign:
        raise RuntimeError(
            "ferrocaffe.compat.install() must run before Caffe2 is imported; already imported: "
            + ", ".join(sorted(foreign))
        )
    sys.meta_path.insert(0, _FINDER)
    _restore_getargspec()


def _restore_getargspec() -> None:
    """``inspect.getargspec`` (removed in Python 3.11) as Caffe2's code used it: the named
    tuple ``ArgSpec(args, varargs, keywords, defaults)`` of ``getfullargspec``."""
    import collections
    import inspect

    if hasattr(inspect, "getargspec"):
        return
    arg_spec = collections.namedtuple("ArgSpec", ["args", "varargs", "keywords", "defaults"])

    def getargspec(func):
        spec = inspect.getfullargspec(func)
        return arg_spec(spec.args, spec.varargs, spec.varkw, spec.defaults)

    inspect.getargspec = getargspec


def uninstall() -> None:
    """Undo ``install()``: remove the finder and forget the ``caffe2`` names already imported
    (the ferrocaffe modules themselves stay loaded)."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in _caffe2_modules():
        del sys.modules[name]
