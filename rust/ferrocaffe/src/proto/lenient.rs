//! Protobuf's rule for a known field that arrives with the wrong wire type (a string field
//! encoded as a varint, say): the C++ and Python runtimes — and so Caffe2 — keep it as an
//! unknown field and parse the rest; prost rejects the whole message. To read what Caffe2
//! read, [`strip_mistyped`] rewrites such bytes without the mistyped fields, recursing into
//! nested messages, so prost can decode the remainder. Unknown fields are dropped at the same
//! time (prost would skip them anyway).

use prost::bytes::Buf;
use prost::encoding::{decode_varint, encode_varint};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Same depth limit as prost's decoder.
const MAX_DEPTH: usize = 100;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

#[derive(Debug, Clone)]
enum Field {
    /// A scalar or string/bytes field: the wire types it may arrive with.
    Plain(&'static [u8]),
    /// A message field, by full name.
    Message(String),
}

type Schema = HashMap<String, HashMap<u32, Field>>;

fn schema() -> Option<&'static Schema> {
    static SCHEMA: OnceLock<Option<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(build_schema).as_ref()
}

fn build_schema() -> Option<Schema> {
    let fds = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).ok()?;
    let mut out = Schema::new();
    fn add(prefix: &str, msgs: &[prost_types::DescriptorProto], out: &mut Schema) {
        for m in msgs {
            let name = format!("{prefix}.{}", m.name());
            let fields = m
                .field
                .iter()
                .map(|f| {
                    let repeated = f.label() == Label::Repeated;
                    let kind = match f.r#type() {
                        Type::Message => {
                            Field::Message(f.type_name().trim_start_matches('.').to_string())
                        }
                        Type::String | Type::Bytes => Field::Plain(&[LEN]),
                        Type::Group => Field::Plain(&[START_GROUP]),
                        Type::Double | Type::Fixed64 | Type::Sfixed64 if repeated => {
                            Field::Plain(&[FIXED64, LEN])
                        }
                        Type::Double | Type::Fixed64 | Type::Sfixed64 => Field::Plain(&[FIXED64]),
                        Type::Float | Type::Fixed32 | Type::Sfixed32 if repeated => {
                            Field::Plain(&[FIXED32, LEN])
                        }
                        Type::Float | Type::Fixed32 | Type::Sfixed32 => Field::Plain(&[FIXED32]),
                        _ if repeated => Field::Plain(&[VARINT, LEN]),
                        _ => Field::Plain(&[VARINT]),
                    };
                    (f.number() as u32, kind)
                })
                .collect();
            out.insert(name.clone(), fields);
            add(&name, &m.nested_type, out);
        }
    }
    for f in &fds.file {
        add(f.package(), &f.message_type, &mut out);
    }
    Some(out)
}

/// `bytes` (a `message`) without the fields whose wire type does not fit the schema, or `None`
/// when there were none or the bytes are malformed in some other way (then prost's own error
/// is the one to report).
pub(crate) fn strip_mistyped(message: &str, bytes: &[u8]) -> Option<Vec<u8>> {
    let schema = schema()?;
    let mut out = Vec::with_capacity(bytes.len());
    let mut dropped = 0usize;
    rewrite(schema, message, bytes, 0, &mut out, &mut dropped)?;
    (dropped > 0).then_some(out)
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if n > buf.len() {
        return None;
    }
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    Some(head)
}

/// Skips one field's value of wire type `wire` (the tag already read). Groups nest.
fn skip(buf: &mut &[u8], wire: u8, number: u32, depth: usize) -> Option<()> {
    match wire {
        VARINT => decode_varint(buf).ok().map(drop),
        FIXED64 => take(buf, 8).map(drop),
        FIXED32 => take(buf, 4).map(drop),
        LEN => {
            let n = usize::try_from(decode_varint(buf).ok()?).ok()?;
            take(buf, n).map(drop)
        }
        START_GROUP => {
            if depth >= MAX_DEPTH {
                return None;
            }
            loop {
                let (inner_number, inner_wire) = tag(buf)?;
                if inner_wire == END_GROUP {
                    return (inner_number == number).then_some(());
                }
                skip(buf, inner_wire, inner_number, depth + 1)?;
            }
        }
        _ => None,
    }
}

/// Reads a field key with prost's rules (at most 32 bits, field number ≥ 1, wire type ≤ 5),
/// so that this pass never accepts what prost itself would reject.
fn tag(buf: &mut &[u8]) -> Option<(u32, u8)> {
    let key = u32::try_from(decode_varint(buf).ok()?).ok()?;
    let (number, wire) = (key >> 3, (key & 7) as u8);
    (number != 0 && wire <= FIXED32).then_some((number, wire))
}

fn rewrite(
    schema: &Schema,
    message: &str,
    mut buf: &[u8],
    depth: usize,
    out: &mut Vec<u8>,
    dropped: &mut usize,
) -> Option<()> {
    if depth >= MAX_DEPTH {
        return None;
    }
    let fields = schema.get(message)?;
    while buf.has_remaining() {
        let start = buf;
        let (number, wire) = tag(&mut buf)?;
        if wire == END_GROUP {
            return None;
        }
        match fields.get(&number) {
            Some(Field::Message(inner)) if wire == LEN => {
                let n = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
                let payload = take(&mut buf, n)?;
                let mut nested = Vec::with_capacity(payload.len());
                rewrite(schema, inner, payload, depth + 1, &mut nested, dropped)?;
                encode_varint(u64::from(number) << 3 | u64::from(LEN), out);
                encode_varint(nested.len() as u64, out);
                out.extend_from_slice(&nested);
            }
            Some(Field::Plain(wires)) if wires.contains(&wire) => {
                skip(&mut buf, wire, number, depth)?;
                out.extend_from_slice(&start[..start.len() - buf.len()]);
            }
            Some(_) => {
                skip(&mut buf, wire, number, depth)?;
                *dropped += 1;
            }
            None => skip(&mut buf, wire, number, depth)?,
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_of_the_schema_is_known() {
        let schema = schema().expect("descriptor set decodes");
        for name in crate::proto::MESSAGE_NAMES {
            assert!(schema.contains_key(*name), "{name}");
        }
    }

    #[test]
    fn well_typed_bytes_are_left_alone() {
        // NetDef { name: "n" }
        assert_eq!(strip_mistyped("caffe2.NetDef", &[0x0a, 0x01, b'n']), None);
    }

    #[test]
    fn a_mistyped_field_is_dropped_at_any_depth() {
        // NetDef { op: [OperatorDef { type: "R", name: <varint 5, mistyped> }] }
        let op = [0x1a, 0x01, b'R', 0x10, 0x05];
        let mut net = vec![0x12, op.len() as u8];
        net.extend_from_slice(&op);
        let clean = strip_mistyped("caffe2.NetDef", &net).expect("something to drop");
        assert_eq!(clean, vec![0x12, 0x03, 0x1a, 0x01, b'R']);
    }

    #[test]
    fn keys_beyond_32_bits_give_none() {
        // A mistyped field (so there is something to drop) after a 35-bit key.
        let bytes = [0x9d, 0xb6, 0xa6, 0xee, 0x12, 0x01, 0x4a, 0x01];
        assert!(prost::encoding::decode_key(&mut &bytes[..]).is_err());
        assert_eq!(strip_mistyped("caffe2.NetDef", &bytes), None);
    }

    #[test]
    fn truncated_bytes_give_none() {
        assert_eq!(strip_mistyped("caffe2.NetDef", &[0x0a, 0x05, b'n']), None);
        assert_eq!(strip_mistyped("caffe2.NetDef", &[0x0b]), None);
    }
}
