//! Every serialized message in the golden corpus (tests/golden) decodes in Rust, and
//! re-encodes to bytes that decode to an equal message. For the corpus these bytes are even
//! identical to what Caffe2's Python runtime wrote.

mod proto_support;

use ferrocaffe::proto::{self, Named};
use ferrocaffe::proto::{
    Argument, BlobProto, DeviceOption, ExecutionStep, NetDef, OperatorDef, PlanDef, TensorProto,
    TensorProtos,
};
use proto_support::Sample;
use std::collections::BTreeMap;
use std::fmt::Debug;

/// Decodes, re-encodes, decodes again; returns whether the re-encoding equals the input bytes.
fn check<M: Named + PartialEq + Debug>(s: &Sample) -> bool {
    let first: M = proto::decode(&s.bytes)
        .unwrap_or_else(|e| panic!("{}: {} does not decode: {e}", s.origin, s.kind));
    let bytes = proto::encode(&first);
    let second: M = proto::decode(&bytes)
        .unwrap_or_else(|e| panic!("{}: re-encoded {} does not decode: {e}", s.origin, s.kind));
    // `==` fails on NaN floats (the corpus has some); equal encodings mean bit-equal messages.
    assert!(
        first == second || proto::encode(&second) == bytes,
        "{}: changed by a round trip:\n{first:?}\n{second:?}",
        s.origin
    );
    assert_eq!(
        proto::encode(&second),
        bytes,
        "{}: encoding not stable",
        s.origin
    );
    bytes == s.bytes
}

fn check_sample(s: &Sample) -> bool {
    match s.kind {
        "caffe2.NetDef" => check::<NetDef>(s),
        "caffe2.OperatorDef" => check::<OperatorDef>(s),
        "caffe2.PlanDef" => check::<PlanDef>(s),
        "caffe2.ExecutionStep" => check::<ExecutionStep>(s),
        "caffe2.Argument" => check::<Argument>(s),
        "caffe2.DeviceOption" => check::<DeviceOption>(s),
        "caffe2.TensorProto" => check::<TensorProto>(s),
        "caffe2.TensorProtos" => check::<TensorProtos>(s),
        "caffe2.BlobProto" => check::<BlobProto>(s),
        other => panic!("{}: no check for {other}", s.origin),
    }
}

#[test]
fn every_golden_message_round_trips() {
    let samples = proto_support::samples();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut different = Vec::new();
    for s in &samples {
        *counts.entry(s.kind).or_default() += 1;
        if !check_sample(s) {
            different.push(s.origin.clone());
        }
    }
    eprintln!("round-tripped {} messages: {counts:?}", samples.len());
    // The corpus as recorded: catches a walker that silently stops finding messages.
    let at_least = [
        ("caffe2.NetDef", 945),
        ("caffe2.OperatorDef", 1031),
        ("caffe2.PlanDef", 25),
        ("caffe2.ExecutionStep", 26),
        ("caffe2.Argument", 36),
        ("caffe2.DeviceOption", 58),
        ("caffe2.TensorProto", 11),
        ("caffe2.TensorProtos", 17),
        ("caffe2.BlobProto", 14),
    ];
    for (kind, n) in at_least {
        let got = counts.get(kind).copied().unwrap_or(0);
        assert!(
            got >= n,
            "only {got} {kind} found in the corpus, expected {n}"
        );
    }
    // Files a failed Save left behind hold a field with the wrong wire type, which protobuf
    // keeps as an unknown field and Rust drops; every other message is written back byte for
    // byte as Caffe2's Python runtime wrote it.
    assert!(
        different.iter().all(|o| o.contains("protodb_save")),
        "re-encoded bytes differ from the recorded ones: {different:?}"
    );
    assert_eq!(different.len(), 8, "{different:?}");
}

#[test]
fn deployed_model_files_decode_to_the_nets_of_their_cases() {
    let root = proto_support::golden_dir();
    let samples = proto_support::samples();
    for model in ["lenet.mnist", "resnet_like.nchw", "squeezenet_like.fire"] {
        for net in ["init_net", "predict_net"] {
            let path = root.join(format!("models/files/{model}/{net}.pb"));
            let file: NetDef = proto::decode(&std::fs::read(&path).unwrap()).unwrap();
            let origin = format!("models/model.{model}/{net}_b64");
            let case = samples
                .iter()
                .find(|s| s.origin == origin)
                .unwrap_or_else(|| panic!("no {origin} in models/cases.jsonl"));
            assert_eq!(
                file,
                proto::decode::<NetDef>(&case.bytes).unwrap(),
                "{origin}"
            );
            assert!(!file.op.is_empty(), "{origin} has ops");
        }
    }
}

#[test]
fn a_protodb_left_behind_by_a_failed_save_reads_as_caffe2_read_it() {
    // ProtoDB parsed BlobProto bytes as a TensorProto and wrote back what it got: the blob name
    // (field 1, a string) landed in `dims` (field 1, packed int64s), the type string (field 2)
    // clashes with `data_type` (field 2, an enum): protobuf keeps it as an unknown field, and
    // so the entry's name is "" (golden: `tensor_protos: [{name: "", bytes: 86}]`).
    let root = proto_support::golden_dir();
    let path = root.join("checkpoints/files/ckpt.protodb_save.int32.protodb");
    let bytes = std::fs::read(path).unwrap();
    let protos: TensorProtos = proto::decode(&bytes).unwrap();
    assert_eq!(protos.protos.len(), 1);
    let t = &protos.protos[0];
    let name_bytes: Vec<i64> = b"int32_blob".iter().map(|&b| i64::from(b)).collect();
    assert_eq!(t.dims, name_bytes);
    assert_eq!(
        t.data_type, None,
        "the mistyped field is dropped, not misread"
    );
    assert_eq!(t.name, None);
    assert_eq!(t.float_data.len(), 14);
    // 86 bytes of entry less the dropped field: tag, length and "Tensor".
    assert_eq!(proto::encode(t).len(), 86 - 8);
}
