"""``UseRegularizer``: attach regularizers to the parameters created inside the block."""

from ferrocaffe.modifier_context import ModifierContext, UseModifierBase

__all__ = ["RegularizerContext", "UseRegularizer"]


class RegularizerContext(ModifierContext):
    def has_regularizer(self, name):
        return self._has_modifier(name)

    def get_regularizer(self, name):
        assert self.has_regularizer(name), f"{name} regularizer is not provided!"
        return self._get_modifier(name)


class UseRegularizer(UseModifierBase):
    def _context_class(self):
        return RegularizerContext
