"""Parameter sharing between name scopes.

Inside ``with ParameterSharing({'scope_b': 'scope_a'}):`` a parameter that ``create_param``
would name ``scope_b/w`` is named ``scope_a/w`` instead, so both scopes use one blob.
Overrides are applied repeatedly (the longest matching prefix first) until none applies.
"""

import contextlib
import logging

from ferrocaffe import scope

__all__ = ["ParameterSharing", "ParameterSharingContext", "parameter_sharing_context"]

logger = logging.getLogger(__name__)


def _with_separator(namescope):
    if namescope and not namescope.endswith(scope._NAMESCOPE_SEPARATOR):
        return namescope + scope._NAMESCOPE_SEPARATOR
    return namescope


class ParameterSharingContext:
    def __init__(self):
        self._scope_overrides = {}
        self._contexts = []

    def _resolve_scope_overrides(self, candidate_scope):
        sep = scope._NAMESCOPE_SEPARATOR
        parts = candidate_scope.split(sep)
        best_scope, best_idx = candidate_scope, 0
        prefix = ""
        for idx, part in enumerate(parts):
            prefix += part + sep
            if prefix in self._scope_overrides:
                best_scope, best_idx = self._scope_overrides[prefix], idx
        if best_scope == candidate_scope:
            return candidate_scope
        return self._resolve_scope_overrides(best_scope) + sep.join(parts[best_idx + 1 :])

    def get_parameter_name(self, name):
        """``name`` in the current name scope after the sharing overrides."""
        candidate_scope = scope.CurrentNameScope()
        best_scope = self._resolve_scope_overrides(candidate_scope)
        if best_scope != candidate_scope:
            logger.info("Overwriting scope %s with scope %s", candidate_scope, best_scope)
        return best_scope + name

    def add_scope_overrides(self, shared_scopes):
        self._contexts.append(shared_scopes)
        self._scope_overrides.update(shared_scopes)

    def pop(self):
        assert len(self._contexts) > 0
        self._contexts.pop()
        self._scope_overrides = {}
        for overrides in self._contexts:
            self._scope_overrides.update(overrides)


parameter_sharing_context = ParameterSharingContext()


@contextlib.contextmanager
def ParameterSharing(shared_scopes):
    """Map name scopes to the scopes whose parameters they use (``{'b': 'a'}``). Both sides
    are relative to the name scope current when the context is entered: within scope ``g``,
    ``{'b': 'a'}`` makes ``g/b/w`` resolve to ``g/a/w``."""
    if not isinstance(shared_scopes, dict):
        raise AssertionError(f"ParameterSharing takes a dict of scopes, not {shared_scopes!r}")
    current = scope.CurrentNameScope()
    overrides = {}
    for shared, owner in shared_scopes.items():
        if owner.startswith(shared):
            raise AssertionError(
                f"Illegal override for parameter sharing. {shared} is prefix of {owner}"
            )
        overrides[_with_separator(current + shared)] = _with_separator(current + owner)
    parameter_sharing_context.add_scope_overrides(overrides)
    try:
        yield
    finally:
        parameter_sharing_context.pop()
