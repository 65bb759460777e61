"""The ``ferrocaffe`` command.

    ferrocaffe                     inspect the bundled example net (LeNet-style predict net)
    ferrocaffe inspect [FILE]      inspect a NetDef: .pb (binary) or .pbtxt (text format)
    ferrocaffe FILE                same as ``inspect FILE``
    ferrocaffe demo [OPTIONS]      train a character-level LSTM and generate text (char_rnn)

``inspect`` prints the ops, the external inputs and outputs, the SSA form (every blob read or
written, with its version, as ``core.get_ssa`` numbers them) and the undefined blobs (read
before any op writes them, ``core.get_undefined_blobs``). ``--json`` prints the same as JSON.

Subcommands are registered in ``SUBCOMMANDS``; the first one is the default.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from ferrocaffe.proto import caffe2_pb2

EXAMPLE = "lenet_predict.pbtxt"
TEXT_SUFFIXES = {".pbtxt", ".prototxt", ".txt"}


class UsageError(Exception):
    """A problem with what the user gave (missing file, not a NetDef): reported without a
    traceback, exit status 2."""


def example_text() -> str:
    return resources.files("ferrocaffe").joinpath("examples", EXAMPLE).read_text()


def load_netdef(path: str | None) -> tuple[str, caffe2_pb2.NetDef]:
    """The NetDef in ``path`` (binary or text format), or the bundled example for ``None``.
    Returns a label for it and the message."""
    if path is None:
        return f"bundled example {EXAMPLE}", _parse_text(example_text(), EXAMPLE)
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}")
    if file.suffix in TEXT_SUFFIXES:
        return path, _parse_text(_utf8(data, path), path)
    try:
        return path, caffe2_pb2.NetDef.FromString(data)
    except DecodeError as binary_error:
        try:
            return path, _parse_text(data.decode("utf-8"), path)
        except (UnicodeDecodeError, UsageError):
            raise UsageError(f"{path} is not a binary or text-format NetDef: {binary_error}")


def _utf8(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text: {e}")


def _parse_text(text: str, label: str) -> caffe2_pb2.NetDef:
    try:
        return text_format.Parse(text, caffe2_pb2.NetDef())
    except text_format.ParseError as e:
        raise UsageError(f"{label} is not a text-format NetDef: {e}")


def _format_value(arg: caffe2_pb2.Argument) -> str:
    if arg.HasField("f"):
        return repr(arg.f)
    if arg.HasField("i"):
        return str(arg.i)
    if arg.HasField("s"):
        return repr(arg.s.decode("utf-8", "backslashreplace"))
    if arg.HasField("n"):
        return f"<net {arg.n.name!r}, {len(arg.n.op)} ops>"
    if arg.HasField("t"):
        return f"<tensor {list(arg.t.dims)}>"
    if arg.floats:
        return repr(list(arg.floats))
    if arg.ints:
        return repr(list(arg.ints))
    if arg.strings:
        return repr([s.decode("utf-8", "backslashreplace") for s in arg.strings])
    if arg.nets:
        return f"<{len(arg.nets)} nets>"
    return "<empty>"


def _op_summary(op: caffe2_pb2.OperatorDef) -> dict:
    out = {
        "type": op.type,
        "name": op.name,
        "inputs": list(op.input),
        "outputs": list(op.output),
        "args": {a.name: _format_value(a) for a in op.arg},
    }
    if op.engine:
        out["engine"] = op.engine
    if op.HasField("device_option"):
        out["device"] = text_format.MessageToString(op.device_option, as_one_line=True)
    return out


def inspect_report(net: caffe2_pb2.NetDef) -> dict:
    """Everything ``inspect`` prints, as plain data."""
    from ferrocaffe.core import get_ssa, get_undefined_blobs

    ssa, blob_versions = get_ssa(net)
    undefined = set(get_undefined_blobs(ssa))
    declared = set(net.external_input)
    return {
        "name": net.name,
        "type": net.type,
        "num_ops": len(net.op),
        "external_input": list(net.external_input),
        "external_output": list(net.external_output),
        "ops": [_op_summary(op) for op in net.op],
        # As core.get_ssa returns it: per op [inputs, outputs], each a list of [blob, version].
        "ssa": [[[list(b) for b in ins], [list(b) for b in outs]] for ins, outs in ssa],
        "blob_versions": {str(k): v for k, v in blob_versions.items()},
        "undefined_blobs": sorted(undefined),
        "undeclared_inputs": sorted(undefined - declared),
        "missing_outputs": [b for b in net.external_output if b not in blob_versions],
    }


def _versioned(blobs) -> str:
    return ", ".join(f"{name}@{version}" for name, version in blobs) or "-"


def render_text(label: str, r: dict) -> str:
    lines = [f"net {r['name']!r} from {label}: {r['num_ops']} ops, type {r['type'] or 'simple'}"]
    lines.append(
        f"external inputs ({len(r['external_input'])}): " + (", ".join(r["external_input"]) or "-")
    )
    lines.append(
        f"external outputs ({len(r['external_output'])}): "
        + (", ".join(r["external_output"]) or "-")
    )
    lines.append("")
    lines.append("ops:")
    width = max((len(op["type"]) for op in r["ops"]), default=0)
    for i, op in enumerate(r["ops"]):
        args = " ".join(f"{k}={v}" for k, v in op["args"].items())
        extra = "".join(f" [{k} {op[k]}]" for k in ("engine", "device") if k in op)
        named = f" ({op['name']})" if op["name"] else ""
        lines.append(
            f"  [{i}] {op['type']:<{width}} {', '.join(op['inputs']) or '-'} -> "
            f"{', '.join(op['outputs']) or '-'}{named}{('  ' + args) if args else ''}{extra}"
        )
    lines.append("")
    lines.append("SSA (blob@version; a write makes a new version):")
    for i, (op, (ins, outs)) in enumerate(zip(r["ops"], r["ssa"], strict=True)):
        lines.append(f"  [{i}] {op['type']:<{width}} {_versioned(ins)} -> {_versioned(outs)}")
    lines.append(
        "final versions: " + (", ".join(f"{b}@{v}" for b, v in r["blob_versions"].items()) or "-")
    )
    lines.append("")
    lines.append(
        f"undefined blobs (read before any op writes them) ({len(r['undefined_blobs'])}): "
        + (", ".join(r["undefined_blobs"]) or "-")
    )
    lines.append(
        "  not declared in external_input: " + (", ".join(r["undeclared_inputs"]) or "none")
    )
    lines.append("external outputs no op writes: " + (", ".join(r["missing_outputs"]) or "none"))
    return "\n".join(lines)


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        help="NetDef file: .pb (binary) or .pbtxt (text format); default: a bundled example",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _inspect(args: argparse.Namespace) -> int:
    label, net = load_netdef(args.file)
    report = inspect_report(net)
    if args.json:
        print(json.dumps({"source": label, **report}, indent=2))
    else:
        print(render_text(label, report))
    return 0


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from ferrocaffe.char_rnn import Config

    d = Config()
    parser.add_argument(
        "--corpus",
        metavar="PATH",
        help="a UTF-8 text file to train on (default: the package's own sources and docs)",
    )
    parser.add_argument("--hidden-size", type=int, default=d.hidden_size)
    parser.add_argument("--seq-length", type=int, default=d.seq_length)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--iterations", type=int, default=d.iterations)
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=d.max_seconds,
        help="stop training after this long (0: no limit)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=d.threads,
        help="RNN executor (and GEMM) threads; 0: automatic",
    )
    parser.add_argument(
        "--sample-length",
        type=int,
        default=d.sample_length,
        help="characters of text to generate after training",
    )
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument("--seed", type=int, default=d.seed)


def _demo(args: argparse.Namespace) -> int:
    from ferrocaffe.char_rnn import Config, run

    for name in ("hidden_size", "seq_length", "batch_size", "iterations"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    config = Config(
        hidden_size=args.hidden_size,
        seq_length=args.seq_length,
        batch_size=args.batch_size,
        iterations=args.iterations,
        learning_rate=args.learning_rate,
        threads=args.threads,
        max_seconds=args.max_seconds,
        sample_length=args.sample_length,
        temperature=args.temperature,
        seed=args.seed,
    )
    try:
        run(config, args.corpus)
    except OSError as e:
        raise UsageError(f"cannot read {args.corpus}: {e.strerror or e}")
    except ValueError as e:
        raise UsageError(str(e))
    return 0


# name -> (help, add arguments, run). The first entry is the default subcommand.
SUBCOMMANDS: dict[
    str,
    tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]],
] = {
    "inspect": (
        "inspect a NetDef (ops, external blobs, SSA, undefined blobs)",
        _inspect_arguments,
        _inspect,
    ),
    "demo": (
        "train a character-level LSTM (on the package's own sources by default) and generate text",
        _demo_arguments,
        _demo,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from ferrocaffe import __version__

    parser = argparse.ArgumentParser(
        prog="ferrocaffe",
        description="ferrocaffe: Caffe2, maintained. With no subcommand: "
        f"{next(iter(SUBCOMMANDS))}.",
    )
    parser.add_argument("--version", action="version", version=f"ferrocaffe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, run) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in {"-h", "--help", "--version"}):
        argv.insert(0, next(iter(SUBCOMMANDS)))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as e:
        parser.exit(2, f"ferrocaffe {args.command}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
