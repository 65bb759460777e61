//! Wire-format behaviour decided for ferrocaffe (see README, "Wire format"): unknown fields are
//! skipped on decode, malformed bytes give `Error::Decode` naming the message, never a panic.

use ferrocaffe::proto::{self, NetDef, OperatorDef, PlanDef, TensorProto};
use ferrocaffe::Error;

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(number: u64, wire: u64, out: &mut Vec<u8>) {
    varint(number << 3 | wire, out);
}

fn len_field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
    key(number, 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// One unknown field of every wire type, numbered far beyond caffe2.proto's.
fn unknown_fields() -> Vec<u8> {
    let mut out = Vec::new();
    key(1000, 0, &mut out);
    varint(300, &mut out);
    len_field(1001, b"kept by Python, dropped by Rust", &mut out);
    key(1002, 5, &mut out);
    out.extend_from_slice(&[1, 2, 3, 4]);
    key(1003, 1, &mut out);
    out.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    key(1004, 3, &mut out); // a group holding a varint
    key(1, 0, &mut out);
    varint(7, &mut out);
    key(1004, 4, &mut out);
    out
}

fn sample_net() -> NetDef {
    let mut op = OperatorDef::new("Relu", ["x"], ["y"]);
    op.name = Some("relu".into());
    NetDef {
        name: Some("net".into()),
        op: vec![op],
        external_input: vec!["x".into()],
        external_output: vec!["y".into()],
        ..Default::default()
    }
}

fn expect_decode_error<T: std::fmt::Debug>(r: ferrocaffe::Result<T>, message: &str) -> String {
    match r {
        Err(Error::Decode { message: m, reason }) => {
            assert_eq!(m, message);
            reason
        }
        other => panic!("expected a decode error for {message}, got {other:?}"),
    }
}

#[test]
fn unknown_fields_are_skipped_on_decode_and_lost_on_encode() {
    let net = sample_net();
    let clean = proto::encode(&net);
    let mut bytes = clean.clone();
    bytes.extend(unknown_fields());
    let back: NetDef = proto::decode(&bytes).unwrap();
    assert_eq!(back, net);
    assert_eq!(proto::encode(&back), clean);
}

#[test]
fn unknown_fields_inside_nested_messages_are_skipped_too() {
    let net = sample_net();
    let mut op = proto::encode(&net.op[0]);
    op.extend(unknown_fields());
    let mut bytes = Vec::new();
    len_field(1, b"net", &mut bytes);
    len_field(2, &op, &mut bytes);
    let back: NetDef = proto::decode(&bytes).unwrap();
    assert_eq!(back.op, net.op);
    assert_eq!(proto::encode(&back.op[0]), proto::encode(&net.op[0]));
}

#[test]
fn an_enum_value_outside_the_schema_is_kept() {
    // TensorProto.data_type = 11 (no DataType has that number). Python moves it to the unknown
    // fields; Rust keeps the number. Both write the same bytes back.
    let bytes = [0x10, 11];
    let t: TensorProto = proto::decode(&bytes).unwrap();
    assert_eq!(t.data_type, Some(11));
    assert_eq!(proto::encode(&t), bytes);
}

#[test]
fn packed_and_unpacked_repeated_scalars_both_decode() {
    // TensorProto.float_data (3, packed) sent unpacked, dims (1, unpacked) sent packed.
    let mut bytes = Vec::new();
    len_field(1, &[2, 3], &mut bytes);
    for v in [1.0f32, 2.0] {
        key(3, 5, &mut bytes);
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let t: TensorProto = proto::decode(&bytes).unwrap();
    assert_eq!(t.dims, vec![2, 3]);
    assert_eq!(t.float_data, vec![1.0, 2.0]);
}

#[test]
fn truncated_input_is_a_decode_error() {
    let bytes = proto::encode(&sample_net());
    let mut errors = 0;
    for n in 0..bytes.len() {
        match proto::decode::<NetDef>(&bytes[..n]) {
            Ok(_) => {}
            Err(e) => {
                expect_decode_error::<()>(Err(e), "caffe2.NetDef");
                errors += 1;
            }
        }
    }
    // Cutting inside a length-delimited field (most cuts) must fail.
    assert!(errors > bytes.len() / 2, "{errors} of {}", bytes.len());
    // Cut in the middle of the op's bytes.
    let cut = &bytes[..bytes.len() - 4];
    expect_decode_error(proto::decode::<NetDef>(cut), "caffe2.NetDef");
}

#[test]
fn a_length_beyond_the_input_is_a_decode_error() {
    for len in [6u64, 1 << 20, u32::MAX as u64, u64::MAX >> 1, u64::MAX] {
        let mut bytes = Vec::new();
        key(2, 2, &mut bytes); // NetDef.op
        varint(len, &mut bytes);
        bytes.extend_from_slice(&[0x0a, 0x01, b'x']);
        expect_decode_error(proto::decode::<NetDef>(&bytes), "caffe2.NetDef");
    }
}

#[test]
fn overlong_varints_and_bad_tags_are_decode_errors() {
    // Eleven continuation bytes: no varint is that long.
    let mut bytes = vec![0x18];
    bytes.extend([0xff; 11]);
    expect_decode_error(proto::decode::<OperatorDef>(&bytes), "caffe2.OperatorDef");
    // Field number 0; wire types 6 and 7; an end-group with no start.
    for bad in [[0x00u8, 0x00], [0x0e, 0x00], [0x0f, 0x00], [0x0c, 0x00]] {
        expect_decode_error(proto::decode::<PlanDef>(&bad), "caffe2.PlanDef");
    }
}

#[test]
fn a_string_that_is_not_utf8_is_a_decode_error() {
    // Python's runtime accepts this for proto2 (and hands back bytes); prost requires UTF-8.
    let mut bytes = Vec::new();
    len_field(1, &[0xff, 0xfe], &mut bytes);
    let reason = expect_decode_error(proto::decode::<NetDef>(&bytes), "caffe2.NetDef");
    assert!(reason.contains("UTF-8"), "{reason}");
}

/// `Argument.n` (8) holds a NetDef, whose `op` (2) holds an OperatorDef, whose `arg` (5) holds
/// an Argument: `depth` levels of that.
fn nested_argument(depth: usize) -> Vec<u8> {
    let mut inner: Vec<u8> = Vec::new();
    for _ in 0..depth {
        let mut net = Vec::new();
        len_field(5, &inner, &mut net); // OperatorDef.arg
        let mut netdef = Vec::new();
        len_field(2, &net, &mut netdef); // NetDef.op
        let mut arg = Vec::new();
        len_field(8, &netdef, &mut arg); // Argument.n
        inner = arg;
    }
    inner
}

#[test]
fn deep_nesting_is_a_decode_error_not_a_stack_overflow() {
    let mut bytes = Vec::new();
    len_field(5, &nested_argument(3000), &mut bytes); // OperatorDef.arg
    let reason = expect_decode_error(proto::decode::<OperatorDef>(&bytes), "caffe2.OperatorDef");
    assert!(reason.contains("recursion"), "{reason}");
    // Shallow nesting of the same shape is fine.
    let mut ok = Vec::new();
    len_field(5, &nested_argument(10), &mut ok);
    let op: OperatorDef = proto::decode(&ok).unwrap();
    assert_eq!(proto::encode(&op), ok);
}

#[test]
fn deep_execution_steps_are_a_decode_error() {
    let mut step = Vec::new();
    for _ in 0..5000 {
        let mut outer = Vec::new();
        len_field(2, &step, &mut outer); // ExecutionStep.substep
        step = outer;
    }
    let mut plan = Vec::new();
    len_field(3, &step, &mut plan); // PlanDef.execution_step
    expect_decode_error(proto::decode::<PlanDef>(&plan), "caffe2.PlanDef");
}

#[test]
fn a_mistyped_field_is_skipped_like_an_unknown_one() {
    // OperatorDef.type (4, a string) sent as a varint, next to a good input.
    let mut bytes = Vec::new();
    len_field(1, b"x", &mut bytes);
    key(4, 0, &mut bytes);
    varint(5, &mut bytes);
    let op: OperatorDef = proto::decode(&bytes).unwrap();
    assert_eq!(op.input, vec!["x".to_string()]);
    assert_eq!(op.r#type, None);
    // Malformed bytes after a mistyped field still fail.
    bytes.extend_from_slice(&[0x12, 0x09, b'y']);
    expect_decode_error(proto::decode::<OperatorDef>(&bytes), "caffe2.OperatorDef");
}
