"""core.operator (to be written)."""

__all__: list[str] = []
