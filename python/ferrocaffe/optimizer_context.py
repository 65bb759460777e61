"""``UseOptimizer``: give the parameters created inside the block their own optimizer
(``optimizer._build`` runs it instead of the one passed to ``build_*``)."""

from ferrocaffe.modifier_context import DEFAULT_MODIFIER, ModifierContext, UseModifierBase

__all__ = ["DEFAULT_OPTIM", "OptimizerContext", "UseOptimizer"]

DEFAULT_OPTIM = DEFAULT_MODIFIER


class OptimizerContext(ModifierContext):
    def has_optimizer(self, name):
        return self._has_modifier(name)

    def get_optimizer(self, name):
        assert self.has_optimizer(name), f"{name} optimizer is not provided!"
        return self._get_modifier(name)


class UseOptimizer(UseModifierBase):
    def _context_class(self):
        return OptimizerContext
