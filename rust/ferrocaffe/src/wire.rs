//! Lenient protobuf parsing with the C++ runtime's rules, for DB records whose bytes may belong
//! to another message type (a minidb read as a protodb, BlobProto bytes parsed as a TensorProto):
//! a known field with an unexpected wire type is kept as an unknown field (dropped here) instead
//! of failing; only malformed bytes, invalid wire types and missing required fields fail.
//!
//! [`sanitize`] rewrites bytes to the fields prost can decode for a schema.

use prost::Message;

use crate::proto::{BlobProto, TensorProto, TensorProtos};

/// What a field holds.
#[derive(Clone, Copy)]
enum Kind {
    /// varint scalar (or packed repeated varints when `repeated`).
    Varint { repeated: bool },
    /// 32-bit fixed (or packed).
    Fixed32 { repeated: bool },
    /// 64-bit fixed (or packed).
    Fixed64 { repeated: bool },
    /// bytes / string (strings get invalid UTF-8 replaced).
    Bytes { utf8: bool },
    /// A nested message.
    Message(&'static Schema),
}

/// Field table of one message type.
pub struct Schema {
    fields: &'static [(u32, Kind)],
    required: &'static [u32],
}

const SEGMENT: Schema = Schema {
    fields: &[
        (1, Kind::Varint { repeated: false }),
        (2, Kind::Varint { repeated: false }),
    ],
    required: &[1, 2],
};

const DEVICE_OPTION: Schema = Schema {
    fields: &[
        (1, Kind::Varint { repeated: false }),
        (2, Kind::Varint { repeated: false }),
        (3, Kind::Varint { repeated: false }),
        (4, Kind::Bytes { utf8: true }),
        (5, Kind::Varint { repeated: false }),
        (6, Kind::Bytes { utf8: true }),
    ],
    required: &[],
};

/// `caffe2.TensorProto`.
pub const TENSOR: Schema = Schema {
    fields: &[
        (1, Kind::Varint { repeated: true }),
        (2, Kind::Varint { repeated: false }),
        (15, Kind::Varint { repeated: false }),
        (3, Kind::Fixed32 { repeated: true }),
        (4, Kind::Varint { repeated: true }),
        (5, Kind::Bytes { utf8: false }),
        (6, Kind::Bytes { utf8: false }),
        (9, Kind::Fixed64 { repeated: true }),
        (10, Kind::Varint { repeated: true }),
        (13, Kind::Bytes { utf8: false }),
        (7, Kind::Bytes { utf8: true }),
        (8, Kind::Message(&DEVICE_OPTION)),
        (11, Kind::Message(&SEGMENT)),
    ],
    required: &[],
};

/// `caffe2.TensorProtos`.
pub const TENSORS: Schema = Schema {
    fields: &[(1, Kind::Message(&TENSOR))],
    required: &[],
};

/// `caffe2.BlobProto` (the quantized tensor field is dropped).
pub const BLOB: Schema = Schema {
    fields: &[
        (1, Kind::Bytes { utf8: true }),
        (2, Kind::Bytes { utf8: true }),
        (3, Kind::Message(&TENSOR)),
        (4, Kind::Bytes { utf8: false }),
        (6, Kind::Varint { repeated: false }),
        (7, Kind::Varint { repeated: false }),
    ],
    required: &[],
};

fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        if shift < 64 {
            v |= u64::from(byte & 0x7f) << shift;
        }
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Skips one field value of wire type `wt`, returning its bytes range; None when malformed.
fn skip(b: &[u8], pos: &mut usize, wt: u32) -> Option<(usize, usize)> {
    let start = *pos;
    match wt {
        0 => {
            varint(b, pos)?;
        }
        1 => *pos = pos.checked_add(8).filter(|&p| p <= b.len())?,
        2 => {
            let len = usize::try_from(varint(b, pos)?).ok()?;
            let s = *pos;
            *pos = s.checked_add(len).filter(|&p| p <= b.len())?;
            return Some((s, *pos));
        }
        5 => *pos = pos.checked_add(4).filter(|&p| p <= b.len())?,
        _ => return None,
    }
    Some((start, *pos))
}

/// The next field of `b` at `pos`: `(field, wire type, value start, value end)`.
pub fn next_field(b: &[u8], pos: &mut usize) -> Option<(u32, u32, usize, usize)> {
    let key = varint(b, pos)?;
    let wt = (key & 7) as u32;
    let (s, e) = skip(b, pos, wt)?;
    Some(((key >> 3) as u32, wt, s, e))
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
    let mut out = Vec::with_capacity(b.len());
    let mut unknown = Vec::new();
    let mut pos = 0;
    let mut seen_required: Vec<u32> = Vec::new();
    let fail = |out: Vec<u8>, unknown: Vec<u8>| Scan {
        known: out,
        unknown,
        ok: false,
    };
    while pos < b.len() {
        let Some(key) = varint(b, &mut pos) else {
            return fail(out, unknown);
        };
        let (field, wt) = ((key >> 3) as u32, (key & 7) as u32);
        if stream && (key == 0 || wt == 4) {
            break;
        }
        if field == 0 {
            return fail(out, unknown);
        }
        let field_start = pos;
        let Some((s, e)) = skip(b, &mut pos, wt) else {
            return fail(out, unknown);
        };
        let raw = |dst: &mut Vec<u8>| {
            put_varint(dst, key);
            if wt == 2 {
                put_varint(dst, (e - s) as u64);
            }
            dst.extend_from_slice(&b[s..e]);
        };
        let _ = field_start;
        let Some(&(_, kind)) = schema.fields.iter().find(|(f, _)| *f == field) else {
            raw(&mut unknown);
            continue;
        };
        let matches = match kind {
            Kind::Varint { repeated } => wt == 0 || (repeated && wt == 2),
            Kind::Fixed32 { repeated } => wt == 5 || (repeated && wt == 2),
            Kind::Fixed64 { repeated } => wt == 1 || (repeated && wt == 2),
            Kind::Bytes { .. } | Kind::Message(_) => wt == 2,
        };
        if !matches {
            raw(&mut unknown);
            continue;
        }
        if schema.required.contains(&field) {
            seen_required.push(field);
        }
        match kind {
            Kind::Message(inner) => {
                let sub = scan(&b[s..e], inner);
                if !sub.ok {
                    return fail(out, unknown);
                }
                let mut body = sub.known;
                body.extend_from_slice(&sub.unknown);
                put_varint(&mut out, key);
                put_varint(&mut out, body.len() as u64);
                out.extend_from_slice(&body);
            }
            Kind::Bytes { utf8: true } => {
                let text = String::from_utf8_lossy(&b[s..e]).into_owned();
                put_varint(&mut out, key);
                put_varint(&mut out, text.len() as u64);
                out.extend_from_slice(text.as_bytes());
            }
            Kind::Varint { .. } | Kind::Fixed32 { .. } | Kind::Fixed64 { .. } if wt == 2 => {
                // Packed values must split evenly into whole elements. Like the C++ runtime,
                // a parse that fails inside the list keeps the whole elements before the
                // failure (ProtoDB writes them back when it closes).
                let body = &b[s..e];
                let whole_len = match kind {
                    Kind::Fixed32 { .. } => body.len() - body.len() % 4,
                    Kind::Fixed64 { .. } => body.len() - body.len() % 8,
                    _ => {
                        let mut p = 0;
                        let mut last = 0;
                        while p < body.len() {
                            if varint(body, &mut p).is_none() {
                                break;
                            }
                            last = p;
                        }
                        last
                    }
                };
                if whole_len < body.len() {
                    if whole_len > 0 {
                        put_varint(&mut out, key);
                        put_varint(&mut out, whole_len as u64);
                        out.extend_from_slice(&body[..whole_len]);
                    }
                    return fail(out, unknown);
                }
                raw(&mut out);
            }
            _ => raw(&mut out),
        }
    }
    let ok = schema.required.iter().all(|r| seen_required.contains(r));
    Scan {
        known: out,
        unknown,
        ok,
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
