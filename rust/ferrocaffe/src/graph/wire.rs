//! Reading a serialized `caffe2.NetDef` without decoding it into owned messages.
//!
//! The graph algorithms only need, per op, its type, inputs and outputs, plus the net's external
//! inputs and outputs. [`scan_net`] walks the protobuf encoding once, hands those strings
//! (borrowed from the buffer) to a [`NetVisitor`], and records where every top-level field
//! and every op lies, so an edited net can be written back by copying the untouched bytes
//! ([`NetLayout`]). Decoding a 100k-op net this way costs a few milliseconds; a full decode
//! into `NetDef` costs ten times that.
//!
//! The wire format itself (varints, keys, values, and why it is read by hand) is the crate's
//! one wire layer, `proto::wire`; this module adds what a NetDef means, and its error texts.

use crate::error::{Error, Result};
use crate::proto::wire::{fields_in, read_len, read_tag, read_value, utf8 as str_of, Rules};
use crate::proto::wire::{WireError, LEN};

/// Appends a length-delimited field.
pub(crate) use crate::proto::wire::put_len_field;

/// `Option`-returning readers for fast paths that hand anything unusual (malformed bytes,
/// groups) back to the checked readers here, which report it.
pub(crate) use crate::proto::wire::quick;

/// C++ varints, groups skipped up to 65 deep.
const RULES: Rules = Rules::NET;

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
fn wire_error(e: WireError) -> Error {
    malformed(e.to_string())
}

#[inline(always)]
fn utf8<'a>(
    buf: &'a [u8],
    range: std::ops::Range<usize>,
    what: &dyn Fn() -> String,
) -> Result<&'a str> {
    buf.get(range)
        .and_then(str_of)
        .ok_or_else(|| malformed(format!("{} is not valid UTF-8", what())))
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
        let (field, wire) = read_tag(buf, &mut pos, RULES).map_err(wire_error)?;
        match field {
            NET_OP => {
                expect_len(wire, &|| format!("op #{num_ops}"))?;
                let payload = read_len(buf, &mut pos, RULES).map_err(wire_error)?;
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
                let r = read_len(buf, &mut pos, RULES).map_err(wire_error)?;
                let name = utf8(buf, r, &|| format!("an {what} entry"))?;
                if field == NET_EXTERNAL_INPUT {
                    visitor.external_input(name);
                } else {
                    visitor.external_output(name);
                }
            }
            _ => {
                read_value(buf, &mut pos, field, wire, RULES).map_err(wire_error)?;
            }
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
    for f in fields_in(buf, 0..buf.len(), RULES) {
        let f = f.map_err(wire_error)?;
        let entry = f.start..f.value.end;
        if f.number == NET_OP && f.wire == LEN {
            out.ops.push(entry);
        } else {
            out.others.push(entry);
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
    // Offsets (in errors) stay those of `buf`.
    let op = buf.get(..range.end).unwrap_or_default();
    let mut pos = range.start;
    while pos < op.len() {
        let (field, wire) = read_tag(op, &mut pos, RULES).map_err(wire_error)?;
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
                let r = read_len(op, &mut pos, RULES).map_err(wire_error)?;
                let s = utf8(op, r, &what)?;
                match field {
                    OP_INPUT => visitor.op_input(s),
                    OP_OUTPUT => visitor.op_output(s),
                    _ => visitor.op_type(s),
                }
            }
            _ => {
                read_value(op, &mut pos, field, wire, RULES)
                    .map_err(|e| malformed(format!("in op #{index}: {}", wire_error(e))))?;
            }
        }
    }
    Ok(())
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
    for f in fields_in(buf, range, RULES) {
        let f = f.map_err(wire_error)?;
        if f.number != OP_INPUT && f.number != OP_OUTPUT {
            out.extend_from_slice(buf.get(f.start..f.value.end).unwrap_or_default());
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
}
