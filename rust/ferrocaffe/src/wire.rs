//! Caffe2's DB records read as its C++ runtime reads them, for records whose bytes may belong
//! to another message type (a minidb read as a protodb, BlobProto bytes parsed as a
//! TensorProto): a known field with an unexpected wire type is kept as an unknown field
//! instead of failing; only malformed bytes, invalid wire types and missing required fields
//! fail, and a failed parse keeps what it read (ProtoDB writes it back).
//!
//! The parsing is the crate's one lenient decoder (`proto::lenient`, with its `RECORDS`
//! policy) over its one wire layer (`proto::wire`), both hand-written because no protobuf
//! crate keeps unknown fields and fails where the C++ runtime does (see `proto::wire`).
//! [`sanitize`] rewrites bytes to the fields prost can decode for a schema.

use prost::Message;

use crate::proto::lenient::{self, Policy};
use crate::proto::wire::{read_value, varint, Rules};
use crate::proto::{BlobProto, TensorProto, TensorProtos};

/// A message type a record is read as.
pub struct Schema {
    /// Full name in `caffe2.proto`.
    name: &'static str,
}

/// `caffe2.TensorProto`.
pub const TENSOR: Schema = Schema {
    name: "caffe2.TensorProto",
};

/// `caffe2.TensorProtos`.
pub const TENSORS: Schema = Schema {
    name: "caffe2.TensorProtos",
};

/// `caffe2.BlobProto` (the quantized tensor field is not read: it is kept as unknown).
pub const BLOB: Schema = Schema {
    name: "caffe2.BlobProto",
};

/// The next field of `b` at `pos`: `(field, wire type, value start, value end)`, the value
/// being the payload of a length-delimited field; None when malformed (groups included).
pub fn next_field(b: &[u8], pos: &mut usize) -> Option<(u32, u32, usize, usize)> {
    let key = varint(b, pos)?;
    let wt = (key & 7) as u8;
    let value = read_value(b, pos, (key >> 3) as u32, wt, Rules::NO_GROUPS).ok()?;
    Some(((key >> 3) as u32, u32::from(wt), value.start, value.end))
}

/// Result of scanning a message: the fields prost can decode, the unknown (or mismatched)
/// fields kept raw in their original order, and whether the whole input parsed.
pub struct Scan {
    /// Known fields with matching wire types (nested messages sanitized).
    pub known: Vec<u8>,
    /// Raw unknown fields, in input order (the C++ runtime keeps and re-serializes them).
    pub unknown: Vec<u8>,
    /// False when parsing stopped at malformed bytes or a required field is missing.
    pub ok: bool,
}

/// Scans `b` as a message of `schema` (see [`Scan`]).
pub fn scan(b: &[u8], schema: &Schema) -> Scan {
    scan_with(b, schema, false)
}

/// Reads a whole file as a message the way `ParseFromCodedStream` does: an end-group tag (or a
/// zero tag) ends the message successfully even before the end of the bytes.
pub fn scan_stream(b: &[u8], schema: &Schema) -> Scan {
    scan_with(b, schema, true)
}

fn scan_with(b: &[u8], schema: &Schema, stream: bool) -> Scan {
    let Some((tables, id)) =
        lenient::Schema::records().and_then(|t| Some((t, t.message(schema.name)?)))
    else {
        return Scan {
            known: Vec::new(),
            unknown: Vec::new(),
            ok: false,
        };
    };
    let s = lenient::scan(tables, id, b, Policy::RECORDS, stream);
    Scan {
        known: s.known,
        unknown: s.unknown,
        ok: s.ok,
    }
}

/// The bytes of a message of `schema` that prost can decode (mismatched and unknown fields
/// dropped); None when the C++ runtime would fail to parse them.
pub fn sanitize(b: &[u8], schema: &Schema) -> Option<Vec<u8>> {
    let s = scan(b, schema);
    s.ok.then_some(s.known)
}

/// What the C++ runtime writes back after parsing `b` as a TensorProto (as far as it parsed):
/// the known fields re-encoded, then the unknown fields as they came. Also returns the parsed
/// message and whether parsing succeeded.
pub fn tensor_round_trip(b: &[u8]) -> (TensorProto, Vec<u8>, bool) {
    let s = scan(b, &TENSOR);
    let t = TensorProto::decode(s.known.as_slice()).unwrap_or_default();
    let mut bytes = t.encode_to_vec();
    bytes.extend_from_slice(&s.unknown);
    (t, bytes, s.ok)
}

/// Parses a TensorProto as the C++ runtime would.
pub fn tensor(b: &[u8]) -> Option<TensorProto> {
    TensorProto::decode(sanitize(b, &TENSOR)?.as_slice()).ok()
}

/// Parses a TensorProtos as the C++ runtime would.
pub fn tensors(b: &[u8]) -> Option<TensorProtos> {
    TensorProtos::decode(sanitize(b, &TENSORS)?.as_slice()).ok()
}

/// Parses a BlobProto as the C++ runtime would.
pub fn blob(b: &[u8]) -> Option<BlobProto> {
    BlobProto::decode(sanitize(b, &BLOB)?.as_slice()).ok()
}

/// Parses a `TensorProtos` written in protobuf text format (what the C++ runtime falls back to
/// when a protodb file is not binary). Only the fields of `TensorProto` are understood.
pub fn text_tensors(text: &str) -> Option<TensorProtos> {
    let toks = tokenize(text)?;
    let mut pos = 0;
    let mut out = TensorProtos::default();
    while pos < toks.len() {
        if toks[pos] != "protos" {
            return None;
        }
        pos += 1;
        if toks.get(pos).map(String::as_str) == Some(":") {
            pos += 1;
        }
        if toks.get(pos).map(String::as_str) != Some("{") {
            return None;
        }
        pos += 1;
        out.protos.push(text_tensor(&toks, &mut pos)?);
    }
    Some(out)
}

fn tokenize(text: &str) -> Option<Vec<String>> {
    let mut toks = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '#' {
            for c in chars.by_ref() {
                if c == '\n' {
                    break;
                }
            }
        } else if "{}:".contains(c) {
            toks.push(c.to_string());
            chars.next();
        } else if c == '"' || c == '\'' {
            chars.next();
            let mut s = String::from("\"");
            loop {
                let ch = chars.next()?;
                if ch == c {
                    break;
                }
                if ch == '\\' {
                    let e = chars.next()?;
                    s.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                } else {
                    s.push(ch);
                }
            }
            toks.push(s);
        } else {
            let mut s = String::new();
            while let Some(&ch) = chars.peek() {
                if ch.is_whitespace() || "{}:\"'#".contains(ch) {
                    break;
                }
                s.push(ch);
                chars.next();
            }
            toks.push(s);
        }
    }
    Some(toks)
}

fn text_tensor(toks: &[String], pos: &mut usize) -> Option<TensorProto> {
    use crate::proto::{tensor_proto, DeviceOption};
    let mut t = TensorProto::default();
    loop {
        let name = toks.get(*pos)?.clone();
        *pos += 1;
        if name == "}" {
            return Some(t);
        }
        if toks.get(*pos).map(String::as_str) == Some(":") {
            *pos += 1;
        }
        let value = toks.get(*pos)?.clone();
        *pos += 1;
        let num = |v: &str| v.parse::<f64>().ok();
        let string = |v: &str| v.strip_prefix('"').map(|s| s.as_bytes().to_vec());
        match name.as_str() {
            "dims" => t.dims.push(num(&value)? as i64),
            "data_type" => {
                let v = tensor_proto::DataType::from_str_name(&value)
                    .map(|d| d as i32)
                    .or_else(|| value.parse().ok())?;
                t.data_type = Some(v);
            }
            "data_format" => t.data_format = Some(num(&value)? as u32),
            "float_data" => t.float_data.push(num(&value)? as f32),
            "int32_data" => t.int32_data.push(num(&value)? as i32),
            "double_data" => t.double_data.push(num(&value)?),
            "int64_data" => t.int64_data.push(value.parse().ok()?),
            "byte_data" => t.byte_data = Some(string(&value)?),
            "raw_data" => t.raw_data = Some(string(&value)?),
            "string_data" => t.string_data.push(string(&value)?),
            "name" => t.name = Some(String::from_utf8(string(&value)?).ok()?),
            "device_detail" | "segment" if value == "{" => {
                let mut fields = Vec::new();
                loop {
                    let k = toks.get(*pos)?.clone();
                    *pos += 1;
                    if k == "}" {
                        break;
                    }
                    if toks.get(*pos).map(String::as_str) == Some(":") {
                        *pos += 1;
                    }
                    let v = toks.get(*pos)?.clone();
                    *pos += 1;
                    fields.push((k, v));
                }
                let get = |k: &str| {
                    fields
                        .iter()
                        .find(|(n, _)| n == k)
                        .and_then(|(_, v)| v.parse::<i64>().ok())
                };
                if name == "segment" {
                    t.segment = Some(tensor_proto::Segment {
                        begin: get("begin")?,
                        end: get("end")?,
                    });
                } else {
                    t.device_detail = Some(DeviceOption {
                        device_type: get("device_type").map(|v| v as i32),
                        device_id: get("device_id").map(|v| v as i32),
                        ..Default::default()
                    });
                }
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatched_wire_types_are_dropped_not_fatal() {
        // BlobProto bytes read as a TensorProto: name (field 1, bytes) lands on dims as a packed
        // field of varints, type (field 2, bytes) on data_type (varint): dropped.
        let bp = BlobProto {
            name: Some("x".into()),
            r#type: Some("Tensor".into()),
            ..Default::default()
        };
        let t = tensor(&bp.encode_to_vec()).unwrap();
        assert_eq!(t.dims, vec![i64::from(b'x')]);
        assert_eq!(t.data_type, None);
        // Truncated bytes and invalid wire types fail.
        assert!(tensor(&[0x0a, 0x05, 0x01]).is_none());
        assert!(tensor(&[0x0f]).is_none());
        // A segment without its required end fails.
        let seg = [0x5a, 0x02, 0x08, 0x00];
        assert!(tensor(&seg).is_none());
    }

    #[test]
    fn text_format_tensors() {
        let t = text_tensors("protos {\n dims: 2\n data_type: INT32\n int32_data: 1\n int32_data: 2\n name: \"w\"\n}\n").unwrap();
        assert_eq!(t.protos.len(), 1);
        assert_eq!(t.protos[0].int32_data, vec![1, 2]);
        assert_eq!(t.protos[0].name(), "w");
        assert!(text_tensors("protos { nonsense: 1 }").is_none());
    }
}
