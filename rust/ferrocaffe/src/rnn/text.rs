//! NetDefs given as protobuf text format (a string argument such as `step_net: "name: ..."`,
//! as older Caffe2 Python code passed step nets), parsed by reflection over the compiled schema.

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

use crate::err;
use crate::error::{Error, Result};
use crate::proto::{decode, NetDef, FILE_DESCRIPTOR_SET};

fn net_descriptor() -> Result<&'static MessageDescriptor> {
    static DESC: OnceLock<std::result::Result<MessageDescriptor, String>> = OnceLock::new();
    DESC.get_or_init(|| {
        let pool = DescriptorPool::decode(FILE_DESCRIPTOR_SET).map_err(|e| e.to_string())?;
        pool.get_message_by_name("caffe2.NetDef")
            .ok_or_else(|| "caffe2.NetDef is not in the compiled schema".to_string())
    })
    .as_ref()
    .map_err(|e| err!(Runtime: "protobuf schema unavailable: {e}"))
}

/// Parses a `NetDef` written in protobuf text format.
pub fn parse_net(text: &str) -> Result<NetDef> {
    let msg = DynamicMessage::parse_text_format(net_descriptor()?.clone(), text)
        .map_err(|e| Error::InvalidArgument(format!("Invalid NetDef in text format: {e}")))?;
    decode::<NetDef>(&prost::Message::encode_to_vec(&msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ops_and_nested_args() {
        let net = parse_net(
            r#"name: "step" op { input: "a" output: "b" type: "Relu" arg { name: "k" i: 2 } }
               external_input: "a""#,
        )
        .unwrap();
        assert_eq!(net.name(), "step");
        assert_eq!(net.op[0].r#type(), "Relu");
        assert_eq!(net.op[0].arg[0].i, Some(2));
        assert_eq!(net.external_input, vec!["a"]);
        let e = parse_net("op { bogus: 1 }").unwrap_err().to_string();
        assert!(e.contains("Invalid NetDef"), "{e}");
    }
}
