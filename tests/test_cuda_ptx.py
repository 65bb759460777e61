"""Every CUDA kernel compiles to PTX with NVRTC and assembles with ptxas for sm_80 and sm_90,
on any machine: a broken kernel is caught without a GPU. NVRTC and ptxas come from the
``nvidia-cuda-nvrtc-cu12`` and ``nvidia-cuda-nvcc-cu12`` wheels (the test extra installs
them)."""

from __future__ import annotations

import subprocess
import sys

from ferrocaffe import _native, cuda_check


def test_nvrtc_and_ptxas_are_found():
    assert cuda_check.find_nvrtc(), "no NVRTC: pip install nvidia-cuda-nvrtc-cu12"
    assert cuda_check.find_ptxas(), "no ptxas: pip install nvidia-cuda-nvcc-cu12"


def test_every_kernel_compiles_and_assembles():
    lines = []
    ok, failed = cuda_check.check_ptx(out=lines.append)
    report = "\n".join(lines)
    assert failed == 0, report
    modules = _native.cuda_kernel_sources()
    assert all(f"ok   {name}:" in report for name, _ in modules), report
    assert ok >= len(modules)


def test_a_broken_kernel_is_reported():
    prelude = next(src for name, src in _native.cuda_kernel_sources() if name == "elementwise")
    bad = prelude + '\nextern "C" __global__ void broken(float* y) { y[0] = undefined_name; }\n'
    lines = []
    ok, failed = cuda_check.check_ptx([("broken", bad)], out=lines.append)
    assert failed == 2 and ok == 0
    assert "undefined_name" in "\n".join(lines)
    assert lines[-1] == "ptx: 0 kernels ok, 2 failed"


def test_the_command_ends_with_the_count_line():
    r = subprocess.run(
        [sys.executable, "-m", "ferrocaffe.cuda_check", "--ptx"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0, r.stdout + r.stderr
    assert last.startswith("ptx: ") and last.endswith(" kernels ok, 0 failed"), last
