//! Reading a serialized `caffe2.NetDef` without decoding it into owned messages.
//!
//! The graph algorithms only need, per op, its type, inputs and outputs, plus the net's external
//! inputs and outputs. [`scan_net`] walks the protobuf encoding once, hands those strings
//! (borrowed from the buffer) to a [`NetVisitor`], and records where every top-level field
//! and every op lies, so an edited net can be written back by copying the untouched bytes
//! ([`NetLayout`]). Decoding a 100k-op net this way costs a few milliseconds; a full decode
//! into `NetDef` costs ten times that.

use crate::error::{Error, Result};

/// Wire types of the protobuf encoding.
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const SGROUP: u8 = 3;
const EGROUP: u8 = 4;
const I32: u8 = 5;

/// `NetDef` field numbers used here.
pub(crate) const NET_OP: u32 = 2;
pub(crate) const NET_EXTERNAL_INPUT: u32 = 7;
pub(crate) const NET_EXTERNAL_OUTPUT: u32 = 8;
/// `OperatorDef` field numbers used here.
pub(crate) const OP_INPUT: u32 = 1;
pub(crate) const OP_OUTPUT: u32 = 2;
const OP_TYPE: u32 = 4;

/// Receives the blob-level content of a net, in wire order.
pub trait NetVisitor {
    /// Op number `index` starts (ops are numbered from 0 in the order they appear).
    fn begin_op(&mut self, index: usize);
    /// An input of the current op.
    fn op_input(&mut self, name: &str);
    /// An output of the current op.
    fn op_output(&mut self, name: &str);
    /// The type of the current op (may be called more than once: the last value wins).
    fn op_type(&mut self, name: &str);
    /// The current op ends.
    fn end_op(&mut self);
    /// An entry of `external_input`.
    fn external_input(&mut self, name: &str);
    /// An entry of `external_output`.
    fn external_output(&mut self, name: &str);
}

/// Where the fields of a serialized net lie, for writing an edited copy.
///
/// Offsets are `u32`: protobuf messages are limited to 2 GiB.
#[derive(Debug, Clone, Default)]
pub struct NetLayout {
    /// The top-level fields in wire order: field number and byte range (tags included). A run
    /// of consecutive `op` fields is one entry (field 2) covering the whole run.
    pub fields: Vec<(u32, std::ops::Range<u32>)>,
    /// The payload (without tag and length) of every op, in order.
    pub ops: Vec<std::ops::Range<u32>>,
}

impl NetLayout {
    /// The payload range of op `i`.
    pub fn op(&self, i: usize) -> std::ops::Range<usize> {
        let r = &self.ops[i];
        r.start as usize..r.end as usize
    }
}

fn malformed(reason: String) -> Error {
    Error::Decode {
        message: "caffe2.NetDef",
        reason,
    }
}

#[cold]
fn truncated_varint(pos: usize) -> Error {
    malformed(format!("truncated or over-long varint at byte {pos}"))
}

#[inline(always)]
fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64> {
    // One-byte varints (tags, short lengths) are by far the most common.
    if let Some(&b) = buf.get(*pos) {
        if b < 0x80 {
            *pos += 1;
            return Ok(u64::from(b));
        }
    }
    read_varint_slow(buf, pos)
}

fn read_varint_slow(buf: &[u8], pos: &mut usize) -> Result<u64> {
    let start = *pos;
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&b) = buf.get(*pos) else {
            return Err(truncated_varint(start));
        };
        *pos += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(value);
        }
    }
    Err(truncated_varint(start))
}

#[cold]
fn past_end(len: u64, start: usize, total: usize) -> Error {
    malformed(format!(
        "length {len} at byte {start} runs past the end ({total} bytes)"
    ))
}

/// Reads a length prefix and returns the payload range.
#[inline(always)]
fn read_len(buf: &[u8], pos: &mut usize) -> Result<std::ops::Range<usize>> {
    let len = read_varint(buf, pos)?;
    let start = *pos;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| start.checked_add(l))
        .filter(|&e| e <= buf.len())
        .ok_or_else(|| past_end(len, start, buf.len()))?;
    *pos = end;
    Ok(start..end)
}

#[inline]
fn read_tag(buf: &[u8], pos: &mut usize) -> Result<(u32, u8)> {
    let at = *pos;
    let key = read_varint(buf, pos)?;
    let field = key >> 3;
    if field == 0 || field > u64::from(u32::MAX >> 3) {
        return Err(malformed(format!(
            "invalid field number {field} at byte {at}"
        )));
    }
    Ok((field as u32, (key & 7) as u8))
}

/// Skips the value of a field of wire type `wire` (whose tag was just read).
fn skip_value(buf: &[u8], pos: &mut usize, field: u32, wire: u8, depth: u32) -> Result<()> {
    match wire {
        VARINT => {
            read_varint(buf, pos)?;
        }
        I64 | I32 => {
            let n = if wire == I64 { 8 } else { 4 };
            if *pos + n > buf.len() {
                return Err(malformed(format!("truncated fixed-width field {field}")));
            }
            *pos += n;
        }
        LEN => {
            read_len(buf, pos)?;
        }
        SGROUP => {
            if depth > 64 {
                return Err(malformed("groups nested too deeply".into()));
            }
            loop {
                let (f, w) = read_tag(buf, pos)?;
                if w == EGROUP {
                    if f != field {
                        return Err(malformed(format!("group {field} closed by end-group {f}")));
                    }
                    break;
                }
                skip_value(buf, pos, f, w, depth + 1)?;
            }
        }
        _ => {
            return Err(malformed(format!(
                "invalid wire type {wire} for field {field} before byte {}",
                *pos
            )))
        }
    }
    Ok(())
}

#[inline(always)]
fn utf8<'a>(
    buf: &'a [u8],
    range: std::ops::Range<usize>,
    what: &dyn Fn() -> String,
) -> Result<&'a str> {
    let b = &buf[range];
    if b.is_ascii() {
        // SAFETY: ASCII bytes are valid UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(b) });
    }
    std::str::from_utf8(b).map_err(|_| malformed(format!("{} is not valid UTF-8", what())))
}

fn expect_len(wire: u8, what: &dyn Fn() -> String) -> Result<()> {
    if wire == LEN {
        Ok(())
    } else {
        Err(malformed(format!(
            "{} has wire type {wire}, expected a length-delimited string",
            what()
        )))
    }
}

/// Walks a serialized `caffe2.NetDef`, reporting its ops' types, inputs and outputs and its
/// external inputs and outputs to `visitor`, and returns where its fields lie.
///
/// Fields other than those are skipped (and kept in the layout), whatever their content; the
/// strings that are reported must be valid UTF-8, as protobuf requires.
///
/// ```
/// use ferrocaffe::graph::wire::{scan_net, NetVisitor};
/// use ferrocaffe::proto::{encode, NetDef, OperatorDef};
///
/// #[derive(Default)]
/// struct Count { inputs: usize, outputs: usize, ops: usize }
/// impl NetVisitor for Count {
///     fn begin_op(&mut self, _: usize) { self.ops += 1 }
///     fn op_input(&mut self, _: &str) { self.inputs += 1 }
///     fn op_output(&mut self, _: &str) { self.outputs += 1 }
///     fn op_type(&mut self, _: &str) {}
///     fn end_op(&mut self) {}
///     fn external_input(&mut self, _: &str) {}
///     fn external_output(&mut self, _: &str) {}
/// }
///
/// let mut net = NetDef::default();
/// net.op.push(OperatorDef::new("Sum", ["a", "b"], ["c"]));
/// let mut count = Count::default();
/// let layout = scan_net(&encode(&net), &mut count).unwrap();
/// assert_eq!((count.ops, count.inputs, count.outputs), (1, 2, 1));
/// assert_eq!(layout.ops.len(), 1);
/// ```
pub fn scan_net<V: NetVisitor>(buf: &[u8], visitor: &mut V) -> Result<NetLayout> {
    let mut layout = NetLayout::default();
    scan(buf, visitor, Some(&mut layout))?;
    Ok(layout)
}

/// [`scan_net`] without recording the layout (for read-only uses).
pub fn visit_net<V: NetVisitor>(buf: &[u8], visitor: &mut V) -> Result<()> {
    scan(buf, visitor, None)
}

fn scan<V: NetVisitor>(
    buf: &[u8],
    visitor: &mut V,
    mut layout: Option<&mut NetLayout>,
) -> Result<()> {
    if u32::try_from(buf.len()).is_err() {
        return Err(malformed(format!(
            "{} bytes is more than a protobuf message may hold",
            buf.len()
        )));
    }
    if let Some(l) = layout.as_deref_mut() {
        // About 30 bytes per op in typical nets; over-reserving only costs address space.
        l.ops.reserve(buf.len() / 16);
    }
    let mut pos = 0;
    let mut num_ops = 0;
    while pos < buf.len() {
        let start = pos;
        let (field, wire) = read_tag(buf, &mut pos)?;
        match field {
            NET_OP => {
                expect_len(wire, &|| format!("op #{num_ops}"))?;
                let payload = read_len(buf, &mut pos)?;
                visitor.begin_op(num_ops);
                scan_op(buf, payload.clone(), num_ops, visitor)?;
                visitor.end_op();
                num_ops += 1;
                if let Some(l) = layout.as_deref_mut() {
                    l.ops.push(payload.start as u32..payload.end as u32);
                    match l.fields.last_mut() {
                        Some((NET_OP, run)) if run.end as usize == start => run.end = pos as u32,
                        _ => l.fields.push((NET_OP, start as u32..pos as u32)),
                    }
                }
                continue;
            }
            NET_EXTERNAL_INPUT | NET_EXTERNAL_OUTPUT => {
                let what = if field == NET_EXTERNAL_INPUT {
                    "external_input"
                } else {
                    "external_output"
                };
                expect_len(wire, &|| what.to_string())?;
                let r = read_len(buf, &mut pos)?;
                let name = utf8(buf, r, &|| format!("an {what} entry"))?;
                if field == NET_EXTERNAL_INPUT {
                    visitor.external_input(name);
                } else {
                    visitor.external_output(name);
                }
            }
            _ => skip_value(buf, &mut pos, field, wire, 0)?,
        }
        if let Some(l) = layout.as_deref_mut() {
            l.fields.push((field, start as u32..pos as u32));
        }
    }
    Ok(())
}

/// The top-level fields of a serialized `caffe2.NetDef`, split into the `op` entries and the
/// rest, without looking inside any of them.
#[derive(Debug, Clone, Default)]
pub struct OpEntries {
    /// Byte range (tag and length prefix included) of every `op` entry, in order.
    pub ops: Vec<std::ops::Range<usize>>,
    /// Byte ranges (tags included) of the other top-level fields, in order.
    pub others: Vec<std::ops::Range<usize>>,
}

/// Splits a serialized `caffe2.NetDef` into its `op` entries and its other fields (each
/// checked for well-formed framing only), e.g. to decode only some of the ops.
///
/// ```
/// use ferrocaffe::graph::wire::op_entries;
/// use ferrocaffe::proto::{encode, NetDef, OperatorDef};
///
/// let mut net = NetDef { name: Some("n".into()), ..Default::default() };
/// net.op.push(OperatorDef::new("Relu", ["x"], ["y"]));
/// net.op.push(OperatorDef::new("Relu", ["y"], ["z"]));
/// let bytes = encode(&net);
/// let split = op_entries(&bytes).unwrap();
/// assert_eq!((split.ops.len(), split.others.len()), (2, 1));
/// ```
pub fn op_entries(buf: &[u8]) -> Result<OpEntries> {
    let mut out = OpEntries {
        // About 30 bytes per op in typical nets; over-reserving only costs address space.
        ops: Vec::with_capacity(buf.len() / 24 + 1),
        others: Vec::new(),
    };
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let (field, wire) = read_tag(buf, &mut pos)?;
        if field == NET_OP && wire == LEN {
            read_len(buf, &mut pos)?;
            out.ops.push(start..pos);
        } else {
            skip_value(buf, &mut pos, field, wire, 0)?;
            out.others.push(start..pos);
        }
    }
    Ok(out)
}

fn scan_op<V: NetVisitor>(
    buf: &[u8],
    range: std::ops::Range<usize>,
    index: usize,
    visitor: &mut V,
) -> Result<()> {
    let op = &buf[..range.end];
    let mut pos = range.start;
    while pos < range.end {
        let (field, wire) = read_tag(op, &mut pos)?;
        match field {
            OP_INPUT | OP_OUTPUT | OP_TYPE => {
                let what = || {
                    let f = match field {
                        OP_INPUT => "input",
                        OP_OUTPUT => "output",
                        _ => "type",
                    };
                    format!("op #{index} {f}")
                };
                expect_len(wire, &what)?;
                let r = read_len(op, &mut pos)?;
                let s = utf8(op, r, &what)?;
                match field {
                    OP_INPUT => visitor.op_input(s),
                    OP_OUTPUT => visitor.op_output(s),
                    _ => visitor.op_type(s),
                }
            }
            _ => skip_value(op, &mut pos, field, wire, 0)
                .map_err(|e| malformed(format!("in op #{index}: {e}")))?,
        }
    }
    Ok(())
}

/// `Option`-returning readers for fast paths that hand anything unusual (malformed bytes,
/// groups) back to the checked readers above, which report it.
pub(crate) mod quick {
    /// A varint (at most 10 bytes).
    #[inline(always)]
    pub(crate) fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
        let b = *buf.get(*pos)?;
        *pos += 1;
        if b < 0x80 {
            return Some(u64::from(b));
        }
        let mut value = u64::from(b & 0x7f);
        for shift in (7..64).step_by(7) {
            let b = *buf.get(*pos)?;
            *pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// A length-delimited payload.
    #[inline(always)]
    pub(crate) fn len_delimited<'b>(buf: &'b [u8], pos: &mut usize) -> Option<&'b [u8]> {
        let len = usize::try_from(varint(buf, pos)?).ok()?;
        let end = pos.checked_add(len).filter(|&e| e <= buf.len())?;
        let s = &buf[*pos..end];
        *pos = end;
        Some(s)
    }

    /// A length-delimited UTF-8 string (ASCII checked quickly, anything else fully).
    #[inline(always)]
    pub(crate) fn string<'b>(buf: &'b [u8], pos: &mut usize) -> Option<&'b str> {
        let b = len_delimited(buf, pos)?;
        if b.is_ascii() {
            // SAFETY: ASCII bytes are valid UTF-8.
            Some(unsafe { std::str::from_utf8_unchecked(b) })
        } else {
            std::str::from_utf8(b).ok()
        }
    }

    /// Skips a value of wire type `wire` (groups are left to the checked readers).
    #[inline]
    pub(crate) fn skip(buf: &[u8], pos: &mut usize, wire: u64) -> Option<()> {
        match wire {
            0 => varint(buf, pos).map(drop),
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                *pos = pos.checked_add(n).filter(|&e| e <= buf.len())?;
                Some(())
            }
            2 => len_delimited(buf, pos).map(drop),
            _ => None,
        }
    }
}

/// Appends a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a length-delimited field.
pub(crate) fn put_len_field(out: &mut Vec<u8>, field: u32, payload: &[u8]) {
    put_varint(out, (u64::from(field) << 3) | u64::from(LEN));
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// Rewrites an op payload with new inputs and outputs, keeping every other field byte for byte.
pub(crate) fn rewrite_op<'s>(
    buf: &[u8],
    range: std::ops::Range<usize>,
    inputs: impl IntoIterator<Item = &'s str>,
    outputs: impl IntoIterator<Item = &'s str>,
    out: &mut Vec<u8>,
) -> Result<()> {
    for s in inputs {
        put_len_field(out, OP_INPUT, s.as_bytes());
    }
    for s in outputs {
        put_len_field(out, OP_OUTPUT, s.as_bytes());
    }
    let op = &buf[..range.end];
    let mut pos = range.start;
    while pos < range.end {
        let start = pos;
        let (field, wire) = read_tag(op, &mut pos)?;
        skip_value(op, &mut pos, field, wire, 0)?;
        if field != OP_INPUT && field != OP_OUTPUT {
            out.extend_from_slice(&op[start..pos]);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::{encode, Argument, NetDef, OperatorDef};

    #[derive(Default, Debug, PartialEq)]
    struct Record {
        ops: Vec<(String, Vec<String>, Vec<String>)>,
        ext_in: Vec<String>,
        ext_out: Vec<String>,
    }

    impl NetVisitor for Record {
        fn begin_op(&mut self, index: usize) {
            assert_eq!(index, self.ops.len());
            self.ops.push(Default::default());
        }
        fn op_input(&mut self, name: &str) {
            self.ops.last_mut().unwrap().1.push(name.into());
        }
        fn op_output(&mut self, name: &str) {
            self.ops.last_mut().unwrap().2.push(name.into());
        }
        fn op_type(&mut self, name: &str) {
            self.ops.last_mut().unwrap().0 = name.into();
        }
        fn end_op(&mut self) {}
        fn external_input(&mut self, name: &str) {
            self.ext_in.push(name.into());
        }
        fn external_output(&mut self, name: &str) {
            self.ext_out.push(name.into());
        }
    }

    fn sample() -> NetDef {
        let mut net = NetDef {
            name: Some("n".into()),
            r#type: Some("dag".into()),
            num_workers: Some(4),
            external_input: vec!["x".into(), "w".into()],
            external_output: vec!["y".into()],
            ..Default::default()
        };
        let mut op = OperatorDef::new("FC", ["x", "w"], ["h"]);
        op.arg.push(Argument {
            name: Some("axis".into()),
            i: Some(1),
            ..Default::default()
        });
        op.engine = Some("CUDNN".into());
        net.op.push(op);
        net.op.push(OperatorDef::new("Relu", ["h"], ["y"]));
        net
    }

    #[test]
    fn scan_reports_everything_in_order() {
        let bytes = encode(&sample());
        let mut rec = Record::default();
        let layout = scan_net(&bytes, &mut rec).unwrap();
        assert_eq!(rec.ext_in, ["x", "w"]);
        assert_eq!(rec.ext_out, ["y"]);
        assert_eq!(rec.ops[0].0, "FC");
        assert_eq!(rec.ops[0].1, ["x", "w"]);
        assert_eq!(rec.ops[1].2, ["y"]);
        assert_eq!(layout.ops.len(), 2);
        // Fields cover the buffer exactly.
        let total: usize = layout.fields.iter().map(|(_, r)| r.len()).sum();
        assert_eq!(total, bytes.len());
        // The two ops form one run.
        assert_eq!(
            layout.fields.iter().filter(|(f, _)| *f == NET_OP).count(),
            1
        );
        let op0: OperatorDef = crate::proto::decode(&bytes[layout.op(0)]).unwrap();
        assert_eq!(op0, sample().op[0]);
    }

    #[test]
    fn rewrite_op_keeps_other_fields() {
        let net = sample();
        let bytes = encode(&net);
        let layout = scan_net(&bytes, &mut Record::default()).unwrap();
        let mut out = Vec::new();
        rewrite_op(&bytes, layout.op(0), ["a", "b", "c"], ["z"], &mut out).unwrap();
        let op: OperatorDef = crate::proto::decode(&out).unwrap();
        let mut expected = net.op[0].clone();
        expected.input = vec!["a".into(), "b".into(), "c".into()];
        expected.output = vec!["z".into()];
        assert_eq!(op, expected);
    }

    #[test]
    fn truncated_and_bad_inputs_are_errors() {
        let bytes = encode(&sample());
        for cut in 1..bytes.len() {
            // Every strict prefix either parses (cut at a field boundary) or fails cleanly.
            let _ = scan_net(&bytes[..cut], &mut Record::default());
        }
        let err = scan_net(&bytes[..bytes.len() - 1], &mut Record::default()).unwrap_err();
        assert!(err.to_string().contains("caffe2.NetDef"), "{err}");
        // Field 2 (op) as a varint.
        let err = scan_net(&[0x10, 0x01], &mut Record::default()).unwrap_err();
        assert!(err.to_string().contains("op #0"), "{err}");
        // Field number 0.
        assert!(scan_net(&[0x00, 0x01], &mut Record::default()).is_err());
        // Invalid UTF-8 in an external input.
        let err = scan_net(&[0x3a, 0x01, 0xff], &mut Record::default()).unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
        // Wire type 7 does not exist.
        assert!(scan_net(&[0x0f], &mut Record::default()).is_err());
    }

    #[test]
    fn unknown_fields_and_groups_are_skipped() {
        let mut bytes = encode(&sample());
        // Unknown field 100 as varint, fixed64, fixed32 and a group holding a varint.
        bytes.extend_from_slice(&[0xa0, 0x06, 0x05]);
        bytes.extend_from_slice(&[0xa1, 0x06, 1, 2, 3, 4, 5, 6, 7, 8]);
        bytes.extend_from_slice(&[0xa5, 0x06, 1, 2, 3, 4]);
        bytes.extend_from_slice(&[0xa3, 0x06, 0x08, 0x01, 0xa4, 0x06]);
        let mut rec = Record::default();
        let layout = scan_net(&bytes, &mut rec).unwrap();
        assert_eq!(rec.ops.len(), 2);
        assert_eq!(layout.fields.iter().filter(|(f, _)| *f == 100).count(), 4);
        // A group closed by the wrong field number is an error.
        assert!(scan_net(&[0xa3, 0x06, 0xac, 0x06], &mut Record::default()).is_err());
    }

    #[test]
    fn varints_roundtrip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut pos = 0;
            assert_eq!(read_varint(&out, &mut pos).unwrap(), v);
            assert_eq!(pos, out.len());
        }
        let mut pos = 0;
        assert!(read_varint(&[0xff; 11], &mut pos).is_err());
    }
}
