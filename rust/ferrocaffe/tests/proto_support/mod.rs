//! Lists every serialized caffe2 message in it. Shared by `proto_golden.rs` and
//! `proto_fuzz.rs`.

use base64::Engine;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One serialized message from the corpus.
pub struct Sample {
    /// Where it came from: `<corpus>/<case name>/<json path>` or a file path.
    pub origin: String,
    /// Full message name, e.g. `caffe2.NetDef`.
    pub kind: &'static str,
    pub bytes: Vec<u8>,
}

#[path = "../golden_data/mod.rs"]
mod golden_data;
pub use golden_data::golden_dir;

/// The message held by a `<prefix>_b64` field (golden/README.md, "Common format", plus the
/// checkpoint corpus's own fields), or `None` for fields that hold raw bytes.
fn kind_of_prefix(prefix: &str) -> Option<Option<&'static str>> {
    Some(Some(match prefix {
        "op" | "typical_def" => "caffe2.OperatorDef",
        "forward"
        | "grad_ops"
        | "init_net"
        | "main_net"
        | "predict_net"
        | "param_init_net"
        | "net"
        | "checkpoint_sync_net"
        | "setup_net" => "caffe2.NetDef",
        "plan" => "caffe2.PlanDef",
        "tensor_proto" => "caffe2.TensorProto",
        "serialized" => "caffe2.BlobProto",
        "bytes" | "strings" | "value" => return Some(None),
        _ => return None,
    }))
}

/// The `caffe2.<Name>` constant for a full name found in the data (api_examples records).
fn static_kind(name: &str) -> &'static str {
    match name {
        "caffe2.NetDef" => "caffe2.NetDef",
        "caffe2.OperatorDef" => "caffe2.OperatorDef",
        "caffe2.PlanDef" => "caffe2.PlanDef",
        "caffe2.ExecutionStep" => "caffe2.ExecutionStep",
        "caffe2.Argument" => "caffe2.Argument",
        "caffe2.DeviceOption" => "caffe2.DeviceOption",
        "caffe2.TensorProto" => "caffe2.TensorProto",
        "caffe2.BlobProto" => "caffe2.BlobProto",
        other => panic!("golden data holds a {other}, which this test does not know"),
    }
}

fn b64(s: &str, origin: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("{origin}: bad base64: {e}"))
}

fn walk(v: &Value, path: &str, out: &mut Vec<Sample>) {
    match v {
        Value::Object(map) => {
            if let (Some(Value::String(name)), Some(Value::String(data))) =
                (map.get("proto"), map.get("b64"))
            {
                out.push(Sample {
                    origin: path.to_string(),
                    kind: static_kind(name),
                    bytes: b64(data, path),
                });
                return;
            }
            for (key, val) in map {
                let here = format!("{path}/{key}");
                match (key.strip_suffix("_b64"), val) {
                    (Some(prefix), Value::String(data)) => match kind_of_prefix(prefix) {
                        Some(Some(kind)) => out.push(Sample {
                            origin: here.clone(),
                            kind,
                            bytes: b64(data, &here),
                        }),
                        Some(None) => {}
                        None => {
                            panic!("{here}: unknown *_b64 field; classify it in kind_of_prefix")
                        }
                    },
                    _ => walk(val, &here, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}. The golden corpus ships in the repository at tests/golden; \
             FERROCAFFE_GOLDEN, when set, must name a copy of it",
            path.display()
        )
    })
}

fn jsonl(path: &Path, corpus: &str, out: &mut Vec<Sample>) {
    let text = String::from_utf8(read(path)).expect("cases are UTF-8");
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let case: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), n + 1));
        let name = case["name"].as_str().unwrap_or("?").to_string();
        walk(&case, &format!("{corpus}/{name}"), out);
    }
}

fn sorted_dir(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    entries
}

/// Every serialized message in the corpus: the `*_b64` fields of every corpus's cases.jsonl,
/// the protos recorded in api_examples.jsonl, the `.pb` NetDefs under models/files, and the
/// protodb files (one TensorProtos each) under checkpoints/files.
pub fn samples() -> Vec<Sample> {
    let root = golden_dir();
    let mut out = Vec::new();
    for dir in sorted_dir(&root) {
        let cases = dir.join("cases.jsonl");
        if cases.is_file() {
            let corpus = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
            jsonl(&cases, corpus, &mut out);
        }
    }
    jsonl(&root.join("api_examples.jsonl"), "api_examples", &mut out);
    for model in sorted_dir(&root.join("models/files")) {
        for file in sorted_dir(&model) {
            if file.extension().is_some_and(|e| e == "pb") {
                out.push(Sample {
                    origin: file.display().to_string(),
                    kind: "caffe2.NetDef",
                    bytes: read(&file),
                });
            }
        }
    }
    out.extend(protodb_files(&root));
    out
}

/// The binary protodb files of checkpoints/ (the one in text format excluded), as recorded in
/// the cases' `files` blocks.
fn protodb_files(root: &Path) -> Vec<Sample> {
    let corpus = root.join("checkpoints");
    let text = String::from_utf8(read(&corpus.join("cases.jsonl"))).expect("cases are UTF-8");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: Value = serde_json::from_str(line).expect("valid JSON");
        for file in case["files"].as_array().into_iter().flatten() {
            let origin = file["origin"].as_str().unwrap_or("");
            if file["db_type"] == "protodb" && !origin.contains("text format") {
                let path = corpus.join(file["path"].as_str().expect("files[].path"));
                out.push(Sample {
                    origin: path.display().to_string(),
                    kind: "caffe2.TensorProtos",
                    bytes: read(&path),
                });
            }
        }
    }
    out
}
