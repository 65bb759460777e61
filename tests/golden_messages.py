"""Every serialized caffe2 message in the golden corpus (same walk as the Rust tests'
``proto_support``): the ``*_b64`` fields of every corpus's cases.jsonl (golden/README.md,
"Common format"), the protos recorded in api_examples.jsonl, the ``.pb`` NetDefs under
models/files and the binary protodb files (one TensorProtos each) under checkpoints/files."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

# Message held by a ``<prefix>_b64`` field; None for fields that hold raw bytes.
PREFIX_KIND: dict[str, str | None] = {
    "op": "OperatorDef",
    "typical_def": "OperatorDef",
    "plan": "PlanDef",
    "tensor_proto": "TensorProto",
    "serialized": "BlobProto",
    "bytes": None,
    "strings": None,
    "value": None,
}
for _p in (
    "forward grad_ops init_net main_net predict_net param_init_net net "
    "checkpoint_sync_net setup_net"
).split():
    PREFIX_KIND[_p] = "NetDef"


@dataclass(frozen=True)
class Sample:
    origin: str  # <corpus>/<case>/<json path>, or a file path
    kind: str  # short message name, e.g. "NetDef"
    data: bytes
    text: str | None = None  # the ``<prefix>_text`` beside it, when there is one

    def __repr__(self) -> str:
        return f"<{self.kind} from {self.origin}, {len(self.data)} bytes>"


def _walk(value, path: str, out: list[Sample]) -> None:
    if isinstance(value, dict):
        if isinstance(value.get("proto"), str) and isinstance(value.get("b64"), str):
            kind = value["proto"].removeprefix("caffe2.")
            out.append(Sample(path, kind, base64.b64decode(value["b64"]), value.get("text")))
            return
        for key, val in value.items():
            here = f"{path}/{key}"
            if key.endswith("_b64") and isinstance(val, str):
                prefix = key[: -len("_b64")]
                if prefix not in PREFIX_KIND:
                    raise AssertionError(f"{here}: unknown *_b64 field; classify it in PREFIX_KIND")
                kind = PREFIX_KIND[prefix]
                if kind is not None:
                    text = value.get(f"{prefix}_text")
                    out.append(Sample(here, kind, base64.b64decode(val), text))
            else:
                _walk(val, here, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]", out)


def _jsonl(path: Path, corpus: str, out: list[Sample]) -> None:
    for line in path.read_text().splitlines():
        if line.strip():
            case = json.loads(line)
            _walk(case, f"{corpus}/{case.get('name', '?')}", out)


def samples(golden: Path) -> list[Sample]:
    out: list[Sample] = []
    for corpus in sorted(p for p in golden.iterdir() if (p / "cases.jsonl").is_file()):
        _jsonl(corpus / "cases.jsonl", corpus.name, out)
    _jsonl(golden / "api_examples.jsonl", "api_examples", out)
    for pb in sorted((golden / "models" / "files").glob("*/*.pb")):
        out.append(Sample(str(pb), "NetDef", pb.read_bytes()))
    ckpt = golden / "checkpoints"
    for line in (ckpt / "cases.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        for f in json.loads(line).get("files", []):
            if f["db_type"] == "protodb" and "text format" not in f.get("origin", ""):
                path = ckpt / f["path"]
                out.append(Sample(str(path), "TensorProtos", path.read_bytes()))
    return out
