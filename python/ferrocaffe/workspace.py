"""Caffe2's ``workspace`` module (placeholder until the runtime lands: blob storage only)."""

__all__ = ["ResetWorkspace"]


def ResetWorkspace(root_folder=None):
    return True
