"""Replay of the golden corpora recorded from Caffe2 (``tests/golden``) with ferrocaffe's own
public API. One module per corpus; each exposes ``replay(case) -> list[str]`` (the differences
from what Caffe2 recorded; empty means the case passes). ``common`` holds what they share."""
