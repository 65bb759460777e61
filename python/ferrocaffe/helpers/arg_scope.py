"""``brew.arg_scope``: default keyword arguments for chosen helpers within a block.

    with brew.arg_scope([brew.conv, brew.fc], order="NHWC"):
        brew.conv(model, ...)   # gets order="NHWC" unless given explicitly

Scopes nest (inner values win) and are kept per thread.
"""

import contextlib
import copy
import threading

__all__ = ["arg_scope", "get_current_scope"]

_threadlocal_scope = threading.local()


def get_current_scope():
    """{helper name: {argument: value}} in force on this thread."""
    if not hasattr(_threadlocal_scope, "current_scope"):
        _threadlocal_scope.current_scope = {}
    return _threadlocal_scope.current_scope


@contextlib.contextmanager
def arg_scope(single_helper_or_list, **kwargs):
    if not isinstance(single_helper_or_list, list):
        assert callable(single_helper_or_list), (
            "arg_scope is only supporting single or a list of helper functions."
        )
        single_helper_or_list = [single_helper_or_list]
    old_scope = copy.deepcopy(get_current_scope())
    current = get_current_scope()
    for helper in single_helper_or_list:
        assert callable(helper), "arg_scope is only supporting a list of callable helper functions."
        current.setdefault(helper.__name__, {}).update(kwargs)
    try:
        yield
    finally:
        _threadlocal_scope.current_scope = old_scope
