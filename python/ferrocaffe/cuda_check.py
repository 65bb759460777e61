"""Checks of the CUDA backend.

``python -m ferrocaffe.cuda_check --ptx``
    Compiles every CUDA kernel module with NVRTC (the ``nvidia-cuda-nvrtc-cu12`` wheel's when
    installed, else the system's) for compute_80 and compute_90, assembles the PTX with
    ``ptxas`` for sm_80 and sm_90 when one is found (the ``nvidia-cuda-nvcc-cu12`` wheel ships
    it), and ends with ``ptx: N kernels ok, M failed``. Needs no GPU. ``--sources DIR`` reads
    the modules from a source tree (``rust/ferrocaffe/src/cuda/kernels``) instead of the
    installed package.

``python -m ferrocaffe.cuda_check [--golden DIR]``
    On a machine with a GPU: replays the ``ops``, ``models`` and ``rnn`` golden corpora with
    every op placed on CUDA, compares with Caffe2's recorded results (the corpus tolerances),
    and prints the comparison and timings beside the same replay on the CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ferrocaffe import _native

ARCHES = ("80", "90")


# -- NVRTC and ptxas -------------------------------------------------------------------------


def _site_dirs():
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.append(user)
    dirs.extend(p for p in sys.path if p.endswith("site-packages"))
    seen = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def find_nvrtc() -> str | None:
    """The path or name of an NVRTC library: the pip wheel's first, then the system's."""
    for d in _site_dirs():
        for lib in sorted(
            glob.glob(os.path.join(d, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
        ):
            if "builtins" not in lib and ".alt." not in lib:
                return lib
    for name in ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"):
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            pass
    found = ctypes.util.find_library("nvrtc")
    return found


def find_ptxas() -> str | None:
    """ptxas from the ``nvidia-cuda-nvcc-cu12`` wheel, else the PATH, else CUDA's usual home."""
    for d in _site_dirs():
        p = os.path.join(d, "nvidia", "cuda_nvcc", "bin", "ptxas")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    p = shutil.which("ptxas")
    if p:
        return p
    p = "/usr/local/cuda/bin/ptxas"
    return p if os.path.isfile(p) else None


class Nvrtc:
    """The few NVRTC calls the check needs, through ctypes."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def compile(self, name: str, source: str, options: list[str]) -> tuple[str | None, str]:
        """(PTX or None, log)."""
        prog = ctypes.c_void_p()
        rc = self.lib.nvrtcCreateProgram(
            ctypes.byref(prog), source.encode(), (name + ".cu").encode(), 0, None, None
        )
        if rc != 0:
            return None, "nvrtcCreateProgram: " + self.lib.nvrtcGetErrorString(rc).decode()
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, log)
            log_text = log.value.decode(errors="replace").strip()
            if rc != 0:
                return None, log_text or self.lib.nvrtcGetErrorString(rc).decode()
            self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetPTX(prog, ptx)
            return ptx.value.decode(), log_text
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def sources_from_dir(directory: str) -> list[tuple[str, str]]:
    """(name, full source) of every ``*.cu`` in a kernel source folder, prelude first."""
    d = Path(directory)
    prelude = (d / "prelude.cuh").read_text()
    out = []
    for f in sorted(d.glob("*.cu")):
        out.append((f.stem, f'{prelude}\n#line 1 "{f.name}"\n{f.read_text()}'))
    return out


def check_ptx(sources=None, out=print) -> tuple[int, int]:
    """Compiles and assembles every module; returns (kernels ok, failures)."""
    if sources is None:
        sources = list(_native.cuda_kernel_sources())
    nvrtc_path = find_nvrtc()
    if nvrtc_path is None:
        out("ptx: no NVRTC library found (pip install nvidia-cuda-nvrtc-cu12)")
        return 0, 1
    nvrtc = Nvrtc(nvrtc_path)
    ptxas = find_ptxas()
    out(f"nvrtc {nvrtc.version[0]}.{nvrtc.version[1]} ({nvrtc_path})")
    out(f"ptxas {ptxas}" if ptxas else "ptxas: not found; PTX is compiled but not assembled")
    base_opts = list(getattr(_native, "cuda_nvrtc_options", lambda: ["--std=c++17"])())
    ok = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in sources:
            for arch in ARCHES:
                ptx, log = nvrtc.compile(
                    name, src, base_opts + [f"--gpu-architecture=compute_{arch}"]
                )
                if ptx is None:
                    failed += 1
                    out(f"FAIL {name} compute_{arch}: NVRTC\n{log}")
                    continue
                kernels = re.findall(r"^\.(?:visible\s+)?\.entry\s+(\w+)", ptx, re.M)
                if not kernels:
                    failed += 1
                    out(f"FAIL {name} compute_{arch}: no kernel in the PTX")
                    continue
                if ptxas:
                    path = os.path.join(tmp, f"{name}_{arch}.ptx")
                    with open(path, "w") as f:
                        f.write(ptx)
                    r = subprocess.run(
                        [ptxas, f"-arch=sm_{arch}", path, "-o", os.devnull],
                        capture_output=True,
                        text=True,
                    )
                    if r.returncode != 0:
                        failed += 1
                        out(f"FAIL {name} sm_{arch}: ptxas\n{r.stderr.strip()}")
                        continue
                if arch == ARCHES[-1]:
                    ok += len(kernels)
                    out(f"ok   {name}: {len(kernels)} kernels")
    out(f"ptx: {ok} kernels ok, {failed} failed")
    return ok, failed


# -- replay on the GPU -----------------------------------------------------------------------


def _cuda_option(device_id=0, seed=None):
    from ferrocaffe.proto import caffe2_pb2

    d = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA, device_id=device_id)
    if seed is not None:
        d.random_seed = seed
    return d


def _place_net(net, device_id=0):
    from ferrocaffe.proto import caffe2_pb2

    net.device_option.device_type = caffe2_pb2.CUDA
    net.device_option.device_id = device_id
    for op in net.op:
        _place_op(op, device_id)


def _place_op(op, device_id=0):
    from ferrocaffe.proto import caffe2_pb2

    op.device_option.device_type = caffe2_pb2.CUDA
    op.device_option.device_id = device_id
    for a in op.arg:
        if a.HasField("n"):
            _place_net(a.n, device_id)
        for n in a.nets:
            _place_net(n, device_id)


class on_cuda:
    """While active, ``workspace`` runs every op, net and feed on CUDA device 0."""

    def __enter__(self):
        from ferrocaffe import workspace
        from ferrocaffe.proto import caffe2_pb2

        self.ws = workspace
        self.saved = {
            k: getattr(workspace, k)
            for k in ("RunOperatorOnce", "RunNetOnce", "CreateNet", "FeedBlob")
        }
        saved = self.saved

        def copy(msg, cls):
            m = cls()
            m.CopyFrom(msg if isinstance(msg, cls) else msg.Proto())
            return m

        def run_op(op):
            op = copy(op, caffe2_pb2.OperatorDef)
            _place_op(op)
            return saved["RunOperatorOnce"](op)

        def run_net(net):
            net = copy(net, caffe2_pb2.NetDef)
            _place_net(net)
            return saved["RunNetOnce"](net)

        def create_net(net, overwrite=False, *a, **k):
            net = copy(net, caffe2_pb2.NetDef)
            _place_net(net)
            return saved["CreateNet"](net, overwrite, *a, **k)

        def feed(name, arr, device_option=None):
            return saved["FeedBlob"](name, arr, _cuda_option())

        workspace.RunOperatorOnce = run_op
        workspace.RunNetOnce = run_net
        workspace.CreateNet = create_net
        workspace.FeedBlob = feed
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(self.ws, k, v)
        return False


def _replay_corpus(corpus: str, replay, cases) -> tuple[int, list[str], float]:
    passed, failures = 0, []
    t0 = time.perf_counter()
    for case in cases:
        try:
            diffs = replay(case)
        except Exception as e:  # noqa: BLE001 - a crash of the replay is a failure
            diffs = [f"replay raised {type(e).__name__}: {e}"]
        if diffs:
            failures.append(f"{case.get('name', '?')}: {diffs[0][:300]}")
        else:
            passed += 1
    return passed, failures, time.perf_counter() - t0


def _op_types(corpus: str, case: dict, parse) -> list[str]:
    if corpus == "ops":
        return [parse("OperatorDef", case["op_b64"]).type]
    types = []
    for key, value in case.items():
        if key.endswith("net_b64"):
            types += [op.type for op in parse("NetDef", value).op]
    return types


def coverage(corpus: str, cases, parse) -> str:
    """Which op types of a corpus have CUDA kernels, and which run their CPU kernel."""
    placement = {}
    seen: dict[str, int] = {}
    for case in cases:
        try:
            for t in _op_types(corpus, case, parse):
                seen[t] = seen.get(t, 0) + 1
        except (KeyError, Exception):  # noqa: BLE001 - a corpus without nets
            continue
    if not seen:
        return ""
    for t in seen:
        placement[t] = _native.cuda_placement(t)
    ops = sum(seen.values())

    def listed(kind):
        found = {t: c for t, c in seen.items() if placement[t] == kind}
        names = ", ".join(f"{t} x{c}" for t, c in sorted(found.items(), key=lambda kv: -kv[1]))
        return sum(found.values()), names or "none"

    native, _ = listed("kernel")
    shape_n, shape = listed("shape")
    host_n, host = listed("host")
    fb_n, fb = listed("fallback")
    return (
        f"  coverage: {native}/{ops} ops with CUDA kernels; {shape_n} shape-only (no copy): "
        f"{shape}; {host_n} on the host: {host}; {fb_n} through the CPU fallback: {fb}"
    )


def replay_corpora(golden: str, corpora=("ops", "models", "rnn"), out=print, show=20) -> dict:
    os.environ["FERROCAFFE_GOLDEN"] = golden
    tests_dir = str(Path(golden).resolve().parent)
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from replay import common  # noqa: PLC0415 - the repository's replay code

    results = {}
    for corpus in corpora:
        mod = __import__(f"replay.{corpus}", fromlist=["replay"])
        cases = common.load_cases(corpus)
        cpu = _replay_corpus(corpus, mod.replay, cases)
        with on_cuda():
            gpu = _replay_corpus(corpus, mod.replay, cases)
        results[corpus] = (len(cases), cpu, gpu)
        out(
            f"{corpus}: {len(cases)} cases; CPU {cpu[0]} pass in {cpu[2]:.2f} s; "
            f"CUDA {gpu[0]} pass in {gpu[2]:.2f} s"
        )
        cov = coverage(corpus, cases, common.parse)
        if cov:
            out(cov)
        cpu_fail = {f.split(":")[0] for f in cpu[1]}
        for f in gpu[1][:show]:
            mark = " (fails on CPU too)" if f.split(":")[0] in cpu_fail else ""
            out(f"  CUDA fail{mark}: {f}")
        if len(gpu[1]) > show:
            out(f"  ... {len(gpu[1]) - show} more")
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ferrocaffe.cuda_check", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--ptx", action="store_true", help="compile and assemble every kernel (no GPU needed)"
    )
    p.add_argument("--sources", help="read the kernel modules from this folder instead")
    p.add_argument("--golden", default=None, help="golden corpus folder (default tests/golden)")
    p.add_argument("--corpora", default="ops,models,rnn")
    a = p.parse_args(argv)
    if a.ptx:
        sources = sources_from_dir(a.sources) if a.sources else None
        _, failed = check_ptx(sources)
        return 1 if failed else 0
    from ferrocaffe import workspace

    n = workspace.NumCudaDevices()
    if n == 0:
        print(f"no CUDA device: {_native.cuda_unavailable_reason()}")
        return 2
    golden = a.golden or os.environ.get("FERROCAFFE_GOLDEN") or "tests/golden"
    replay_corpora(golden, tuple(c for c in a.corpora.split(",") if c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
