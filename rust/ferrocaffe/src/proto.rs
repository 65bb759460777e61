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
    ($($t:ident),*) => { $(impl Named for $t { const FULL_NAME: &'static str = concat!("caffe2.", stringify!($t)); })* };
}
named!(
    TensorProto,
    QTensorProto,
    TensorProtos,
    TensorShape,
    TensorShapes,
    Argument,
    DeviceOption,
    OperatorDef,
    NetDef,
    ExecutionStep,
    PlanDef,
    BlobProto,
    DbReaderProto
);

/// Decodes a binary protobuf. Unknown fields are skipped (not preserved; see the README).
pub fn decode<M: Named>(bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|e| Error::Decode {
        message: M::FULL_NAME,
        reason: e.to_string(),
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
