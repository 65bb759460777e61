"""core.blob (to be written; only ``GradientSlice`` so far)."""

from collections import namedtuple

__all__ = ["GradientSlice"]

# A sparse gradient: the blob of row indices and the blob of the matching values.
GradientSlice = namedtuple("GradientSlice", ["indices", "values"])
