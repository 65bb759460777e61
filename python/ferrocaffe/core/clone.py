"""core.clone (to be written)."""

__all__: list[str] = []
