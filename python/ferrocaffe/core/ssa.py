"""core.ssa (to be written)."""

__all__: list[str] = []
