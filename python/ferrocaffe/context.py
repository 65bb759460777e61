"""Caffe2's ``context`` module: classes whose instances act as thread-local ``with`` contexts.

A class deriving from :class:`Managed` gets ``Cls.current()``: the innermost instance entered
with ``with`` on this thread. Each managed class in an instance's MRO keeps its own stack, so
entering a ``Task`` (a ``Managed``) also makes it the current instance of its subclasses'
bases that are managed. :class:`DefaultManaged` classes create an instance on demand when none
is active.
"""

import functools
import threading

__all__ = ["Managed", "DefaultManaged"]


class _Stack:
    """The per-thread stack of active instances of one managed class."""

    def __init__(self, cls, allow_default):
        self.cls = cls
        self.allow_default = allow_default
        self._local = threading.local()

    def _items(self):
        items = getattr(self._local, "items", None)
        if items is None:
            items = []
            self._local.items = items
        return items

    def push(self, value):
        self._items().append(value)

    def pop(self, value):
        items = self._items()
        assert items, f"Context {self.cls} is empty."
        top = items.pop()
        assert top == value, f"Context {self.cls} exited out of order."

    def top(self, required=True):
        items = self._items()
        if items:
            return items[-1]
        if not required:
            return None
        assert self.allow_default, f"Context {self.cls} is required but none is active."
        self.push(self.cls())
        return items[-1]


_stacks = {}
_stacks_lock = threading.Lock()


def _stack_of(cls):
    stack = _stacks.get(cls)
    if stack is None:
        assert isinstance(cls, type) and issubclass(cls, Managed), (
            f"must be a context managed class, got {cls}"
        )
        with _stacks_lock:
            stack = _stacks.setdefault(cls, _Stack(cls, issubclass(cls, DefaultManaged)))
    return stack


def _managed_bases(obj):
    return [
        cls
        for cls in type(obj).__mro__
        if issubclass(cls, Managed) and cls not in (Managed, DefaultManaged)
    ]


class Managed:
    """Base of classes used as ``with`` contexts; ``Cls.current()`` is the innermost one."""

    @classmethod
    def current(cls, value=None, required=True):
        """``value`` if given (checked to be a ``cls``), else the innermost active instance
        (``None`` when none is active and ``required`` is false)."""
        if value is not None:
            assert isinstance(value, cls), (
                f"Wrong context type. Expected: {cls}, got {type(value)}."
            )
            return value
        return _stack_of(cls).top(required=required)

    def __enter__(self):
        for cls in _managed_bases(self):
            _stack_of(cls).push(self)
        return self

    def __exit__(self, *args):
        for cls in _managed_bases(self):
            _stack_of(cls).pop(self)

    def __call__(self, func):
        """Use the instance as a decorator: ``func`` runs inside ``with self``."""

        @functools.wraps(func)
        def inside(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return inside


class DefaultManaged(Managed):
    """A :class:`Managed` class whose ``current()`` creates an instance when none is active."""
