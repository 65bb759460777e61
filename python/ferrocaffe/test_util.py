"""Caffe2's ``test_util``: the ``TestCase`` base class and small helpers of its test files.

``TestCase`` starts every test from an empty default workspace (and ends it with one), after
``workspace.GlobalInit`` with the flags Caffe2's tests used; ``caffe2_flaky`` marks a test
that runs only when ``CAFFE2_RUN_FLAKY_TESTS=1`` (and the others then do not).
"""

import os
import pathlib
import shutil
import tempfile
import unittest

import numpy as np

from ferrocaffe import workspace

__all__ = [
    "TestCase",
    "caffe2_flaky",
    "get_default_test_flags",
    "is_flaky_test_mode",
    "numOps",
    "randBlob",
    "randBlobFloat32",
    "randBlobsFloat32",
    "rand_array",
    "str_compare",
]


def rand_array(*dims):
    """Uniform values in [-0.5, 0.5) as float32 (a 0-d array for no dims)."""
    return np.array(np.random.rand(*dims) - 0.5).astype(np.float32)


def randBlob(name, type, *dims, **kwargs):
    offset = kwargs.get("offset", 0.0)
    workspace.FeedBlob(name, np.random.rand(*dims).astype(type) + offset)


def randBlobFloat32(name, *dims, **kwargs):
    randBlob(name, np.float32, *dims, **kwargs)


def randBlobsFloat32(names, *dims, **kwargs):
    for name in names:
        randBlobFloat32(name, *dims, **kwargs)


def numOps(net):
    return len(net.Proto().op)


def str_compare(a, b, encoding="utf8"):
    """Equality of two strings, either of which may be bytes."""
    if isinstance(a, bytes):
        a = a.decode(encoding)
    if isinstance(b, bytes):
        b = b.decode(encoding)
    return a == b


def get_default_test_flags():
    return [
        "caffe2",
        "--caffe2_log_level=0",
        "--caffe2_cpu_allocator_do_zero_fill=0",
        "--caffe2_cpu_allocator_do_junk_fill=1",
    ]


def caffe2_flaky(test_method):
    """Mark a test as flaky: it runs only in flaky-test mode (``CAFFE2_RUN_FLAKY_TESTS=1``)."""
    test_method.__caffe2_flaky__ = True
    return test_method


def is_flaky_test_mode():
    return os.getenv("CAFFE2_RUN_FLAKY_TESTS", "0") == "1"


class TestCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        workspace.GlobalInit(get_default_test_flags())

    def setUp(self):
        method = getattr(self, self._testMethodName)
        flaky = getattr(method, "__caffe2_flaky__", False)
        if is_flaky_test_mode() and not flaky:
            raise unittest.SkipTest("Non-flaky tests are skipped in flaky test mode")
        if not is_flaky_test_mode() and flaky:
            raise unittest.SkipTest("Flaky tests are skipped in regular test mode")
        self.ws = workspace.C.Workspace()
        workspace.ResetWorkspace()

    def tearDown(self):
        workspace.ResetWorkspace()

    def make_tempdir(self) -> pathlib.Path:
        """A fresh temporary directory, removed when the test ends."""
        path = pathlib.Path(tempfile.mkdtemp(prefix="caffe2_test."))
        self.addCleanup(shutil.rmtree, str(path), True)
        return path
