"""core.net (to be written)."""

__all__: list[str] = []
