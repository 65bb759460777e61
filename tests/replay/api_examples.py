"""Replay of ``api_examples.jsonl``: small snippets of Caffe2's Python builder API, each run
against ferrocaffe in a fresh interpreter state, with what they record compared with what they
recorded on Caffe2. The snippet protocol, the encoding of recorded values and the comparison
rules are those of the golden ``API_EXAMPLES.md``.

Fresh interpreter state: a fork server (a new Python process that has only imported ferrocaffe
and this module) forks one child per case; the child runs the snippet and sends its records
back through a pipe, and is killed if it runs past ``CASE_TIMEOUT_S``. The server is started on
the first ``replay`` and lives as long as the process that started it."""

from __future__ import annotations

import atexit
import base64
import collections.abc
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from .common import golden_path

CASE_TIMEOUT_S = 60
REL_TOL = 1e-6
ABS_TOL = 1e-12
MATCH_LEN = 40
TESTS_DIR = Path(__file__).resolve().parent.parent


def load_cases() -> list[dict]:
    """The cases of ``api_examples.jsonl``, in file order."""
    with open(golden_path() / "api_examples.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# -- encoding (runs in the case's child process) ----------------------------------------------


def _builtin_classes(cls) -> list[str]:
    return [k.__name__ for k in cls.__mro__ if k.__module__ == "builtins"]


def match_text(message: str) -> str:
    """The implementation-independent start of a message: its first line without a C++
    ``[enforce fail at f.cc:N] condition. `` prefix, cut to 40 characters."""
    line = message.split("\n", 1)[0].strip()
    if line.startswith("[enforce fail at "):
        close = line.find("] ")
        rest = line[close + 2 :] if close >= 0 else line
        dot = rest.find(". ")
        if dot >= 0:
            rest = rest[dot + 2 :]
        elif rest.endswith("."):
            rest = ""
        line = rest.strip()
    return line[:MATCH_LEN]


def encode_exception(e: BaseException) -> dict:
    msg = str(e)
    cut = msg.find("\nframe #0")
    if cut >= 0:
        msg = msg[:cut]
    builtin = _builtin_classes(type(e))
    return {
        "type": type(e).__name__,
        "base": builtin[0] if builtin else "BaseException",
        "mro": builtin,
        "message": msg,
        "match": match_text(msg),
    }


def canonical(v) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _is_repeated_field(v) -> bool:
    """A protobuf repeated field container (of the pure-Python, C++ or upb runtime)."""
    t = type(v)
    if "Repeated" not in t.__name__ and not t.__module__.startswith("google."):
        return False
    return isinstance(v, collections.abc.Iterable) and not hasattr(v, "items")


class Encoder:
    """Encodes recorded values as API_EXAMPLES.md's table says, with ferrocaffe's classes."""

    def __init__(self, core):
        from google.protobuf.message import Message

        self.message = Message
        self.tagged = [
            (core.BlobReference, "blobref"),
            (core.Net, "net"),
            (core.ExecutionStep, "step"),
            (core.Plan, "plan"),
        ]

    def __call__(self, v, depth: int = 0):
        if depth > 50:
            raise ValueError("record(): value nested too deeply")

        def enc(x):
            return self(x, depth + 1)

        if v is None or isinstance(v, bool):
            return v
        for cls, tag in self.tagged:
            if isinstance(v, cls):
                if tag == "blobref":
                    return {"blobref": str(v)}
                if tag == "plan":
                    return {"plan": v.Proto().name}
                return {tag: v.Name()}
        if isinstance(v, np.ndarray):
            return {
                "ndarray": {"dtype": str(v.dtype), "shape": list(v.shape), "data": enc(v.tolist())}
            }
        if isinstance(v, np.generic):
            return {"npscalar": {"dtype": str(v.dtype), "value": enc(v.item())}}
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, str):
            return v
        if isinstance(v, (bytes, bytearray)):
            return {"bytes": base64.b64encode(bytes(v)).decode("ascii")}
        if isinstance(v, BaseException):
            return {"exception": encode_exception(v)}
        if isinstance(v, self.message):
            from google.protobuf import text_format

            return {
                "proto": v.DESCRIPTOR.full_name,
                "b64": base64.b64encode(v.SerializeToString()).decode("ascii"),
                "text": text_format.MessageToString(v),
            }
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return {
                "namedtuple": type(v).__name__,
                "fields": list(v._fields),
                "items": [enc(x) for x in v],
            }
        if isinstance(v, tuple):
            return {"tuple": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, dict):
            return {"dict": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, (set, frozenset)):
            return {"set": sorted((enc(x) for x in v), key=canonical)}
        if _is_repeated_field(v):
            return [enc(x) for x in v]
        return {"object": type(v).__name__}


def run_snippet(case: dict) -> dict:
    """Run one snippet here, in a namespace with only the protocol's names; its records and
    the exception that escaped it (or None)."""
    from ferrocaffe import core, scope, workspace
    from ferrocaffe.proto import caffe2_pb2

    encode = Encoder(core)
    records: list = []

    def record(key, value):
        records.append([str(key), encode(value)])

    namespace = {
        "__name__": "__api_example__",
        "core": core,
        "scope": scope,
        "workspace": workspace,
        "caffe2_pb2": caffe2_pb2,
        "np": np,
        "record": record,
    }
    error = None
    try:
        exec(compile(case["source"], f"<case {case['name']}>", "exec"), namespace)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001
        error = encode_exception(e)
    return {"records": records, "error": error}


# -- fork server (a separate process) ---------------------------------------------------------


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything written to ``fd`` until EOF, or None when the deadline passes first."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def run_forked(case: dict, timeout: float = CASE_TIMEOUT_S) -> dict:
    """``run_snippet`` in a forked child of this process; ``{'crash': why}`` if the child dies
    or runs past ``timeout`` seconds (it is killed then)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(r)
            try:
                result = run_snippet(case)
            except BaseException:  # noqa: BLE001
                result = {"crash": traceback.format_exc()}
            data = json.dumps(result).encode()
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = _read_all(r, time.monotonic() + timeout)
    finally:
        os.close(r)
    if data is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"crash": f"timed out after {timeout} s (child killed)"}
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"crash": f"the child died without a result (wait status {status})"}
    return json.loads(data)


def serve() -> None:
    """The fork server's loop: one JSON case per stdin line in, one JSON result per line out.
    Anything the package or a snippet prints goes to stderr, not into the answers."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import ferrocaffe.core  # noqa: F401  (imported once, before any fork)
    import ferrocaffe.scope  # noqa: F401
    import ferrocaffe.workspace  # noqa: F401

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        result = run_forked(request["case"], request.get("timeout", CASE_TIMEOUT_S))
        out.write(json.dumps(result) + "\n")
        out.flush()


class _Server:
    def __init__(self):
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONHASHSEED="0")
        code = (
            f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r}); "
            "from replay.api_examples import serve; serve()"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=tempfile.gettempdir(),
        )

    def ask(self, case: dict, timeout: float) -> dict:
        self.proc.stdin.write((json.dumps({"case": case, "timeout": timeout}) + "\n").encode())
        self.proc.stdin.flush()
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout + 60)
        if not ready:
            raise RuntimeError("the fork server did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server died: {self.log_tail()}")
        return json.loads(line)

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:].decode("utf-8", "replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


_server: _Server | None = None


def _fork_server() -> _Server:
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = _Server()
        atexit.register(_server.close)
    return _server


def execute(case: dict, timeout: float = CASE_TIMEOUT_S) -> dict:
    """The snippet's records and error, run in a fresh fork of the fork server."""
    global _server
    server = _fork_server()
    try:
        return server.ask(case, timeout)
    except RuntimeError as e:
        server.proc.kill()
        server.proc.wait()
        _server = None
        return {"crash": str(e)}


# -- comparison -------------------------------------------------------------------------------

_TAGS = ("proto", "exception", "ndarray", "npscalar", "namedtuple")


def _tag(d: dict) -> str:
    for k in _TAGS:
        if k in d:
            return k
    return next(iter(d))


def _short(v, n: int = 160) -> str:
    s = repr(v) if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return s if len(s) <= n else s[:n] + "..."


def compare_exception(path: str, want: dict, got) -> list[str]:
    """The same class name, or an instance of the expected one's builtin base; and the match
    text inside the message."""
    if not isinstance(got, dict) or "type" not in got:
        return [f"{path}: expected exception {want['type']}, got {_short(got)}"]
    diffs = []
    if got["type"] != want["type"] and want.get("base") not in got.get("mro", []):
        diffs.append(
            f"{path}: exception {got['type']} (builtin classes {got.get('mro')}), "
            f"expected {want['type']} (builtin base {want.get('base')})"
        )
    if want.get("match") and want["match"] not in got.get("message", ""):
        diffs.append(
            f"{path}: exception message {got.get('message', '')[:300]!r} lacks {want['match']!r}"
        )
    return diffs


def _proto_class(full_name: str):
    from ferrocaffe.proto import caffe2_pb2

    parts = full_name.split(".")
    if parts[0] == "caffe2":
        parts = parts[1:]
    obj = caffe2_pb2
    for p in parts:
        obj = getattr(obj, p, None)
        if obj is None:
            return None
    return obj


def compare(want, got, path: str = "$") -> list[str]:
    """Differences between an expected and an actual encoded value."""
    if want is None or isinstance(want, (bool, str)):
        if type(got) is not type(want) or got != want:
            return [f"{path}: expected {_short(want)}, got {_short(got)}"]
        return []
    if isinstance(want, int):
        if type(got) is not int or got != want:
            return [f"{path}: expected int {want!r}, got {_short(got)}"]
        return []
    if isinstance(want, float):
        if type(got) is not float:
            return [f"{path}: expected float {want!r}, got {_short(got)}"]
        if not math.isclose(want, got, rel_tol=REL_TOL, abs_tol=ABS_TOL):
            return [f"{path}: expected {want!r}, got {got!r}"]
        return []
    if isinstance(want, list):
        if not isinstance(got, list):
            return [f"{path}: expected a list, got {_short(got)}"]
        diffs = []
        if len(want) != len(got):
            diffs.append(f"{path}: {len(got)} items, expected {len(want)}: {_short(got)}")
        for i, (x, y) in enumerate(zip(want, got, strict=False)):
            diffs += compare(x, y, f"{path}[{i}]")
        return diffs
    tag = _tag(want)
    if not isinstance(got, dict) or not got or _tag(got) != tag:
        return [f"{path}: expected {_short(want)}, got {_short(got)}"]
    if tag in ("float", "bytes", "blobref", "net", "step", "plan", "object"):
        if want[tag] != got[tag]:
            return [f"{path}: expected {tag} {want[tag]!r}, got {got[tag]!r}"]
        return []
    if tag == "exception":
        return compare_exception(path, want["exception"], got["exception"])
    if tag == "tuple":
        return compare(want["tuple"], got["tuple"], path + "(tuple)")
    if tag == "namedtuple":
        diffs = []
        if (want["namedtuple"], want["fields"]) != (got["namedtuple"], got["fields"]):
            diffs.append(
                f"{path}: namedtuple {got['namedtuple']}{got['fields']}, "
                f"expected {want['namedtuple']}{want['fields']}"
            )
        return diffs + compare(want["items"], got["items"], path)
    if tag in ("ndarray", "npscalar"):
        x, y = want[tag], got[tag]
        diffs = []
        if x["dtype"] != y["dtype"]:
            diffs.append(f"{path}: dtype {y['dtype']}, expected {x['dtype']}")
        if tag == "npscalar":
            return diffs + compare(x["value"], y["value"], path)
        if x["shape"] != y["shape"]:
            return diffs + [f"{path}: shape {y['shape']}, expected {x['shape']}"]
        return diffs + compare(x["data"], y["data"], path + ".data")
    if tag == "set":
        w = {canonical(v): v for v in want["set"]}
        g = {canonical(v): v for v in got["set"]}
        if len(w) != len(want["set"]) or len(g) != len(got["set"]) or set(w) != set(g):
            missing = [w[k] for k in w if k not in g]
            extra = [g[k] for k in g if k not in w]
            return [f"{path}: set differs: missing {_short(missing)}, unexpected {_short(extra)}"]
        return []
    if tag == "dict":
        w = {canonical(k): (k, v) for k, v in want["dict"]}
        g = {canonical(k): (k, v) for k, v in got["dict"]}
        diffs = []
        if len(g) != len(got["dict"]):
            diffs.append(f"{path}: dict with repeated keys: {_short(got)}")
        missing = [w[k][0] for k in w if k not in g]
        extra = [g[k][0] for k in g if k not in w]
        if missing or extra:
            diffs.append(
                f"{path}: dict keys differ: missing {_short(missing)}, unexpected {_short(extra)}"
            )
        for k, (_, v) in w.items():
            if k in g:
                diffs += compare(v, g[k][1], f"{path}[{k}]")
        return diffs
    if tag == "proto":
        if want["proto"] != got["proto"]:
            return [f"{path}: a {got['proto']} message, expected {want['proto']}"]
        cls = _proto_class(want["proto"])
        if cls is None:
            return [f"{path}: ferrocaffe's caffe2_pb2 has no message {want['proto']}"]
        mw, mg = cls(), cls()
        mw.ParseFromString(base64.b64decode(want["b64"]))
        mg.ParseFromString(base64.b64decode(got["b64"]))
        if mw == mg:
            return []
        return [f"{path}: {want['proto']} differs:\nexpected:\n{mw}\nactual:\n{mg}"]
    return [f"{path}: unknown tag {tag!r} in the expected data"]


def compare_case(case: dict, result: dict) -> list[str]:
    if "crash" in result:
        return [f"the case did not complete: {result['crash'].strip()}"]
    diffs = []
    want, got = case["records"], result["records"]
    for i, (x, y) in enumerate(zip(want, got, strict=False)):
        if x[0] != y[0]:
            diffs.append(f"record #{i}: key {y[0]!r}, expected {x[0]!r}")
            break
        diffs += compare(x[1], y[1], x[0])
    if len(want) != len(got):
        diffs.append(
            f"{len(got)} records ({', '.join(k for k, _ in got)}), expected {len(want)} "
            f"({', '.join(k for k, _ in want)})"
        )
    ew, eg = case["error"], result["error"]
    if ew is None and eg is not None:
        diffs.append(f"unexpected exception {eg['type']}: {eg['message'][:500]}")
    elif ew is not None and eg is None:
        diffs.append(f"expected exception {ew['type']} ({ew.get('match')!r}) was not raised")
    elif ew is not None:
        diffs += compare_exception("error", ew, eg)
    return diffs


def replay(case: dict) -> list[str]:
    """Run the case's snippet in a fresh fork and compare; the differences (empty: pass)."""
    return compare_case(case, execute(case))
