"""Contexts that attach "modifiers" (optimizers, regularizers) to the parameters created
inside them, keyed by parameter tag (``'WEIGHT'``, ``'BIAS'``, ...) or ``'DEFAULT'``."""

import threading

__all__ = ["DEFAULT_MODIFIER", "ModifierContext", "UseModifierBase"]

DEFAULT_MODIFIER = "DEFAULT"


class ModifierContext:
    """A stack of ``{tag: modifier}`` dicts; later entries override earlier ones.

    ``current()`` returns the innermost context entered with ``with`` on this thread, or a
    per-thread default one.
    """

    _local = None

    def __init__(self):
        self._modifiers = {}
        self._modifiers_list = []

    @classmethod
    def _state(cls):
        if cls.__dict__.get("_local") is None:
            cls._local = threading.local()
        local = cls._local
        if not hasattr(local, "stack"):
            local.stack = []
            local.default = cls()
        return local

    @classmethod
    def current(cls):
        state = cls._state()
        return state.stack[-1] if state.stack else state.default

    def __enter__(self):
        type(self)._state().stack.append(self)
        return self

    def __exit__(self, *exc):
        stack = type(self)._state().stack
        assert stack and stack[-1] is self, "context exited out of order"
        stack.pop()

    def _rebuild_modifiers(self):
        self._modifiers = {}
        for modifiers in self._modifiers_list:
            self._modifiers.update(modifiers)

    def _has_modifier(self, name):
        return name in self._modifiers

    def _get_modifier(self, name):
        return self._modifiers.get(name)

    def push_modifiers(self, modifiers):
        self._modifiers_list.append(modifiers)
        self._modifiers.update(modifiers)

    def pop_modifiers(self):
        assert len(self._modifiers_list) > 0
        self._modifiers_list.pop()
        self._rebuild_modifiers()


class UseModifierBase:
    """``with UseX(modifier)`` (used for every tag as 'DEFAULT') or ``with UseX({tag: m})``."""

    def __init__(self, modifier_or_dict):
        if isinstance(modifier_or_dict, dict):
            self._modifiers = modifier_or_dict
        else:
            self._modifiers = {DEFAULT_MODIFIER: modifier_or_dict}

    def _context_class(self):
        raise TypeError(f"{type(self).__name__} does not name its context class")

    def __enter__(self):
        self._context_class().current().push_modifiers(self._modifiers)
        return self

    def __exit__(self, *exc):
        self._context_class().current().pop_modifiers()
