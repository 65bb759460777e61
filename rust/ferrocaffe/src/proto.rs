//! Caffe2's protobuf messages (generated at build time from `proto/caffe2.proto`) and helpers.

#![allow(missing_docs, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/caffe2.rs"));

use crate::error::{Error, Result};

/// The encoded `FileDescriptorSet` of `caffe2.proto`, for reflection (the Python message classes
/// are built from it).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/caffe2_descriptor.bin"));

/// A message type with its Caffe2 full name, for error messages.
pub trait Named: prost::Message + Default {
    /// Full protobuf name, e.g. `caffe2.NetDef`.
    const FULL_NAME: &'static str;
}

macro_rules! named {
    ($($t:ty => $n:literal),* $(,)?) => {
        $(impl Named for $t { const FULL_NAME: &'static str = concat!("caffe2.", $n); })*

        /// Full names of every message in `caffe2.proto`, in schema order.
        pub const MESSAGE_NAMES: &[&str] = &[$(concat!("caffe2.", $n)),*];

        fn reencoder(full_name: &str) -> Option<fn(&[u8]) -> Result<Vec<u8>>> {
            match full_name {
                $(concat!("caffe2.", $n) => Some(reencode_as::<$t>),)*
                _ => None,
            }
        }
    };
}
named!(
    TensorProto => "TensorProto",
    tensor_proto::Segment => "TensorProto.Segment",
    QTensorProto => "QTensorProto",
    TensorProtos => "TensorProtos",
    TensorShape => "TensorShape",
    TensorShapes => "TensorShapes",
    TensorBoundShape => "TensorBoundShape",
    TensorBoundShapes => "TensorBoundShapes",
    AotConfig => "AOTConfig",
    Argument => "Argument",
    DeviceOption => "DeviceOption",
    OperatorDef => "OperatorDef",
    MapFieldEntry => "MapFieldEntry",
    BackendOptions => "BackendOptions",
    PartitionInfo => "PartitionInfo",
    NetDef => "NetDef",
    ExecutionStep => "ExecutionStep",
    PlanDef => "PlanDef",
    BlobProto => "BlobProto",
    DbReaderProto => "DBReaderProto",
    BlobSerializationOptions => "BlobSerializationOptions",
    SerializationOptions => "SerializationOptions",
);

fn reencode_as<M: Named>(bytes: &[u8]) -> Result<Vec<u8>> {
    decode::<M>(bytes).map(|m| encode(&m))
}

/// Decodes `bytes` as the message named `message` (full name such as `caffe2.NetDef`, or the
/// bare `NetDef`) and encodes it again. Fields the schema does not know are dropped, so this is
/// how a message looks after a trip through Rust (see the README, "Wire format").
pub fn reencode(message: &str, bytes: &[u8]) -> Result<Vec<u8>> {
    let full = if message.starts_with("caffe2.") {
        message.to_string()
    } else {
        format!("caffe2.{message}")
    };
    let f = reencoder(&full).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "unknown message type '{message}'; expected one of {}",
            MESSAGE_NAMES.join(", ")
        ))
    })?;
    f(bytes)
}

pub(crate) mod lenient;
pub(crate) mod wire;

/// Decodes a binary protobuf. Unknown fields are skipped (not preserved; see the README), and,
/// as in protobuf's C++ and Python runtimes, so is a known field that arrives with the wrong
/// wire type.
pub fn decode<M: Named>(bytes: &[u8]) -> Result<M> {
    M::decode(bytes).or_else(|e| {
        lenient::strip_mistyped(M::FULL_NAME, bytes)
            .and_then(|clean| M::decode(clean.as_slice()).ok())
            .ok_or_else(|| Error::Decode {
                message: M::FULL_NAME,
                reason: e.to_string(),
            })
    })
}

/// Encodes a message to its binary protobuf form.
pub fn encode<M: prost::Message>(msg: &M) -> Vec<u8> {
    msg.encode_to_vec()
}

impl OperatorDef {
    /// An operator of type `op_type` with the given inputs and outputs and nothing else set.
    pub fn new<I, O, S, T>(op_type: &str, inputs: I, outputs: O) -> Self
    where
        I: IntoIterator<Item = S>,
        O: IntoIterator<Item = T>,
        S: Into<String>,
        T: Into<String>,
    {
        OperatorDef {
            r#type: Some(op_type.to_string()),
            input: inputs.into_iter().map(Into::into).collect(),
            output: outputs.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }
}

impl Argument {
    /// An integer argument (`i`).
    pub fn int(name: &str, v: i64) -> Self {
        Argument {
            name: Some(name.into()),
            i: Some(v),
            ..Default::default()
        }
    }

    /// A float argument (`f`).
    pub fn float(name: &str, v: f32) -> Self {
        Argument {
            name: Some(name.into()),
            f: Some(v),
            ..Default::default()
        }
    }

    /// A string argument (`s`, UTF-8 bytes).
    pub fn string(name: &str, v: &str) -> Self {
        Argument {
            name: Some(name.into()),
            s: Some(v.as_bytes().to_vec()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Full names of all messages (nested ones included) declared in the compiled schema.
    fn schema_messages() -> Vec<String> {
        fn walk(prefix: &str, msgs: &[prost_types::DescriptorProto], out: &mut Vec<String>) {
            for m in msgs {
                let name = format!("{prefix}.{}", m.name());
                out.push(name.clone());
                walk(&name, &m.nested_type, out);
            }
        }
        let fds = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
        let mut out = Vec::new();
        for f in &fds.file {
            walk(f.package(), &f.message_type, &mut out);
        }
        out
    }

    #[test]
    fn every_schema_message_has_a_name_and_a_reencoder() {
        let mut schema = schema_messages();
        let mut named: Vec<String> = MESSAGE_NAMES.iter().map(|s| s.to_string()).collect();
        schema.sort();
        named.sort();
        assert_eq!(schema, named);
        for name in MESSAGE_NAMES {
            let once = reencode(name, b"").unwrap();
            assert_eq!(reencode(name, &once).unwrap(), once, "{name}");
        }
        assert_eq!(reencode("NetDef", b"").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn missing_required_fields_are_written_as_zero() {
        // proto2 `required` fields are plain values in Rust: a Segment without them decodes
        // (as the Python runtime also allows) and is written back with explicit zeros.
        assert_eq!(
            reencode("TensorProto.Segment", b"").unwrap(),
            vec![0x08, 0x00, 0x10, 0x00]
        );
    }

    #[test]
    fn reencode_accepts_bare_and_full_names() {
        let net = NetDef {
            name: Some("n".into()),
            op: vec![OperatorDef::new("Relu", ["x"], ["y"])],
            ..Default::default()
        };
        let bytes = encode(&net);
        assert_eq!(reencode("NetDef", &bytes).unwrap(), bytes);
        assert_eq!(reencode("caffe2.NetDef", &bytes).unwrap(), bytes);
    }

    #[test]
    fn reencode_rejects_unknown_names_and_bad_bytes() {
        match reencode("Bogus", b"") {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("'Bogus'") && m.contains("caffe2.NetDef"))
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        // Field 1 (name), length 5, but only one byte follows.
        match reencode("OperatorDef", &[0x0a, 0x05, b'x']) {
            Err(Error::Decode { message, .. }) => assert_eq!(message, "caffe2.OperatorDef"),
            other => panic!("expected Decode, got {other:?}"),
        }
    }

    #[test]
    fn decode_names_the_message_in_its_error() {
        let err = decode::<PlanDef>(&[0xff]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("malformed caffe2.PlanDef protobuf: "),
            "{err}"
        );
    }
}
