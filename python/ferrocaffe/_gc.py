"""Pausing Python's cyclic garbage collector while a native call builds large results.

Building hundreds of thousands of lists and tuples at once (an SSA of a 100k-op net) makes the
collector run over and over on objects that cannot form cycles; pausing it for the duration of
the call more than halves the cost. It is re-enabled afterwards if it was enabled before.
"""

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
