//! The lenient decoder: reads a message's bytes field by field with the rules of protobuf's
//! C++ runtime (see [`super::wire`] for why by hand), and writes out the bytes prost can
//! decode: the fields whose wire type fits the schema, nested messages rewritten the same way.
//! A known field with the wrong wire type (a string sent as a varint, say) is set aside with
//! the unknown fields, as the C++ and Python runtimes do, where prost would reject the whole
//! message.
//!
//! One scan serves two callers, each with its [`Policy`]:
//!
//! * [`strip_mistyped`] ([`Policy::PROST`]), `proto::decode`'s fallback when prost fails:
//!   the mistyped fields are dropped and everything else is left for prost to judge.
//! * [`crate::wire`] ([`Policy::RECORDS`]), Caffe2's DB records (a minidb read as a
//!   protodb, BlobProto bytes parsed as a TensorProto): the unknown fields are kept, strings
//!   are made valid UTF-8, packed lists and `required` fields are checked, and a failed parse
//!   keeps what it parsed (ProtoDB writes it back).
//!
//! The schema tables come from the descriptor compiled into the crate
//! ([`super::FILE_DESCRIPTOR_SET`]), so they cannot disagree with the prost types.

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use std::collections::HashMap;
use std::sync::OnceLock;

use super::wire::{self, put_varint, Rules, EGROUP, I32, I64, LEN, SGROUP, VARINT};

/// Same depth limit as prost's decoder (messages and groups together).
const MAX_DEPTH: usize = 100;

/// What a field holds, and so which wire types it may arrive with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A varint scalar (packed when `repeated` and length-delimited).
    Varint { repeated: bool },
    /// A 32-bit fixed scalar (or packed).
    Fixed32 { repeated: bool },
    /// A 64-bit fixed scalar (or packed).
    Fixed64 { repeated: bool },
    /// `bytes`, or `string` when `utf8`.
    Bytes { utf8: bool },
    /// A nested message: its index in [`Schema::messages`].
    Message(usize),
    /// A group.
    Group,
}

impl Kind {
    fn accepts(self, wire: u8) -> bool {
        match self {
            Kind::Varint { repeated } => wire == VARINT || (repeated && wire == LEN),
            Kind::Fixed32 { repeated } => wire == I32 || (repeated && wire == LEN),
            Kind::Fixed64 { repeated } => wire == I64 || (repeated && wire == LEN),
            Kind::Bytes { .. } | Kind::Message(_) => wire == LEN,
            Kind::Group => wire == SGROUP,
        }
    }
}

/// The fields of one message type.
#[derive(Debug, Default)]
struct MessageSchema {
    /// By field number, sorted.
    fields: Vec<(u32, Kind)>,
    /// The `required` field numbers.
    required: Vec<u32>,
}

impl MessageSchema {
    #[inline]
    fn kind(&self, field: u32) -> Option<Kind> {
        self.fields
            .binary_search_by_key(&field, |&(f, _)| f)
            .ok()
            .and_then(|i| self.fields.get(i))
            .map(|&(_, k)| k)
    }
}

/// The message types of `caffe2.proto`, as the lenient scan reads them.
#[derive(Debug)]
pub(crate) struct Schema {
    messages: Vec<MessageSchema>,
    by_name: HashMap<String, usize>,
}

/// A message type of a [`Schema`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessageId(usize);

impl Schema {
    /// Every message of `caffe2.proto`.
    pub(crate) fn caffe2() -> Option<&'static Schema> {
        static SCHEMA: OnceLock<Option<Schema>> = OnceLock::new();
        SCHEMA.get_or_init(|| Schema::from_descriptor(&[])).as_ref()
    }

    /// The messages as ferrocaffe's DB records read them: like [`Schema::caffe2`], except that
    /// `BlobProto.qtensor` is not read (kept as an unknown field): quantized tensors are not
    /// supported.
    pub(crate) fn records() -> Option<&'static Schema> {
        static SCHEMA: OnceLock<Option<Schema>> = OnceLock::new();
        SCHEMA
            .get_or_init(|| Schema::from_descriptor(&[("caffe2.BlobProto", 5)]))
            .as_ref()
    }

    /// The message type with full name `name` (`caffe2.TensorProto`).
    pub(crate) fn message(&self, name: &str) -> Option<MessageId> {
        self.by_name.get(name).copied().map(MessageId)
    }

    /// The tables of the compiled descriptor, without the fields in `exclude` (message full
    /// name, field number).
    fn from_descriptor(exclude: &[(&str, u32)]) -> Option<Schema> {
        let fds = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).ok()?;
        let mut all = Vec::new();
        fn walk<'d>(
            prefix: &str,
            msgs: &'d [prost_types::DescriptorProto],
            out: &mut Vec<(String, &'d prost_types::DescriptorProto)>,
        ) {
            for m in msgs {
                let name = format!("{prefix}.{}", m.name());
                walk(&name, &m.nested_type, out);
                out.push((name, m));
            }
        }
        for f in &fds.file {
            walk(f.package(), &f.message_type, &mut all);
        }
        let by_name: HashMap<String, usize> = all
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let mut messages = Vec::with_capacity(all.len());
        for (name, m) in &all {
            let mut schema = MessageSchema::default();
            for f in &m.field {
                let number = u32::try_from(f.number()).ok()?;
                if exclude.contains(&(name.as_str(), number)) {
                    continue;
                }
                let repeated = f.label() == Label::Repeated;
                let kind = match f.r#type() {
                    Type::Message => {
                        Kind::Message(*by_name.get(f.type_name().trim_start_matches('.'))?)
                    }
                    Type::String => Kind::Bytes { utf8: true },
                    Type::Bytes => Kind::Bytes { utf8: false },
                    Type::Group => Kind::Group,
                    Type::Double | Type::Fixed64 | Type::Sfixed64 => Kind::Fixed64 { repeated },
                    Type::Float | Type::Fixed32 | Type::Sfixed32 => Kind::Fixed32 { repeated },
                    _ => Kind::Varint { repeated },
                };
                schema.fields.push((number, kind));
                if f.label() == Label::Required {
                    schema.required.push(number);
                }
            }
            schema.fields.sort_by_key(|&(n, _)| n);
            messages.push(schema);
        }
        Some(Schema { messages, by_name })
    }
}

/// How the scan treats what prost and the C++ runtime disagree on (see the presets).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Varints as prost reads them (see [`Rules::strict_varints`]).
    pub(crate) strict_varints: bool,
    /// Keys wider than 32 bits: their field number truncated to 32 bits (the DB records'
    /// reader has always done that), instead of failing as prost does.
    pub(crate) wide_keys: bool,
    /// Groups skipped (within the depth limit) instead of failing.
    pub(crate) groups: bool,
    /// Strings that are not UTF-8 made valid with U+FFFD instead of left for prost to reject.
    pub(crate) lossy_strings: bool,
    /// A missing `required` field fails the parse (after the rest has been read).
    pub(crate) required: bool,
    /// Unknown and mistyped fields kept in [`Scan::unknown`], and after the known fields of
    /// nested messages, instead of dropped.
    pub(crate) keep_unknown: bool,
}

impl Policy {
    /// `proto::decode`'s fallback: nothing but the mistyped-field rule; whatever prost would
    /// reject (varints, keys, UTF-8) is left for it to reject, groups are skipped as prost
    /// skips them, and missing `required` fields are accepted as prost accepts them.
    pub(crate) const PROST: Policy = Policy {
        strict_varints: true,
        wide_keys: false,
        groups: true,
        lossy_strings: false,
        required: false,
        keep_unknown: false,
    };

    /// Caffe2's DB records, read as `ParseFromString` reads them (C++ varints, unknown
    /// fields kept, `required` checked, invalid UTF-8 replaced as the Python side sees it).
    /// Groups fail here, and keys wider than 32 bits are truncated: the behaviour the record
    /// reader has always had.
    pub(crate) const RECORDS: Policy = Policy {
        strict_varints: false,
        wide_keys: true,
        groups: false,
        lossy_strings: true,
        required: true,
        keep_unknown: true,
    };
}

/// Result of a scan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scan {
    /// The fields with the wire type their schema expects, nested messages rewritten, in
    /// input order: bytes prost decodes. On a failure, the fields before it.
    pub(crate) known: Vec<u8>,
    /// Unknown and mistyped fields, in input order (with [`Policy::keep_unknown`]).
    pub(crate) unknown: Vec<u8>,
    /// Whether the whole input parsed (and, with [`Policy::required`], no required field is
    /// missing).
    pub(crate) ok: bool,
    /// How many mistyped fields were set aside, nested messages included.
    pub(crate) mistyped: usize,
}

/// Scans `bytes` as message `message` of `schema` with `policy`. With `stream`, the input is
/// read as `ParseFromCodedStream` reads a whole file: an end-group key (or a zero key) ends
/// the message successfully, even before the end of the bytes.
pub(crate) fn scan(
    schema: &Schema,
    message: MessageId,
    bytes: &[u8],
    policy: Policy,
    stream: bool,
) -> Scan {
    let mut scanner = Scanner {
        schema,
        policy,
        mistyped: 0,
    };
    let mut known = Vec::with_capacity(bytes.len());
    let mut unknown = Vec::new();
    let ok = scanner.message(bytes, message.0, 0, stream, &mut known, &mut unknown);
    Scan {
        known,
        unknown,
        ok,
        mistyped: scanner.mistyped,
    }
}

struct Scanner<'s> {
    schema: &'s Schema,
    policy: Policy,
    mistyped: usize,
}

impl Scanner<'_> {
    /// Scans `b` as message number `msg` at nesting `depth`, appending its known fields to
    /// `out` and its unknown ones to `unknown`; false when the parse fails (what was appended
    /// before the failure stays).
    fn message(
        &mut self,
        b: &[u8],
        msg: usize,
        depth: usize,
        stream: bool,
        out: &mut Vec<u8>,
        unknown: &mut Vec<u8>,
    ) -> bool {
        if depth >= MAX_DEPTH {
            return false;
        }
        let Some(m) = self.schema.messages.get(msg) else {
            return false;
        };
        let rules = Rules {
            strict_varints: self.policy.strict_varints,
            groups: if self.policy.groups {
                u32::try_from(MAX_DEPTH.saturating_sub(depth)).unwrap_or(0)
            } else {
                0
            },
        };
        let mut seen = vec![false; m.required.len()];
        let mut pos = 0;
        while pos < b.len() {
            let Ok(key) = wire::read_varint(b, &mut pos, rules) else {
                return false;
            };
            let wt = (key & 7) as u8;
            if stream && (key == 0 || wt == EGROUP) {
                break;
            }
            let field = if self.policy.wide_keys {
                (key >> 3) as u32
            } else {
                match u32::try_from(key) {
                    Ok(k) => k >> 3,
                    Err(_) => return false,
                }
            };
            if field == 0 {
                return false;
            }
            let Some(payload) = wire::read_value(b, &mut pos, field, wt, rules)
                .ok()
                .and_then(|r| b.get(r))
            else {
                return false;
            };
            // The field as read, with its key and length written the shortest way.
            let raw = |dst: &mut Vec<u8>| {
                put_varint(dst, key);
                if wt == LEN {
                    put_varint(dst, payload.len() as u64);
                }
                dst.extend_from_slice(payload);
            };
            let kind = match m.kind(field) {
                Some(kind) if kind.accepts(wt) => kind,
                other => {
                    if other.is_some() {
                        self.mistyped = self.mistyped.saturating_add(1);
                    }
                    if self.policy.keep_unknown {
                        raw(unknown);
                    }
                    continue;
                }
            };
            if let Some(i) = m.required.iter().position(|&r| r == field) {
                if let Some(s) = seen.get_mut(i) {
                    *s = true;
                }
            }
            match kind {
                Kind::Message(inner) => {
                    // The nested message is rewritten in place, its known fields and then its
                    // unknown ones, and its length put in front; on a failure it is dropped
                    // whole (the C++ runtime's partial message is not kept).
                    let field_start = out.len();
                    put_varint(out, key);
                    let body_start = out.len();
                    let mut inner_unknown = Vec::new();
                    let depth = depth.saturating_add(1);
                    if !self.message(payload, inner, depth, false, out, &mut inner_unknown) {
                        out.truncate(field_start);
                        return false;
                    }
                    out.extend_from_slice(&inner_unknown);
                    let body_len = out.len().saturating_sub(body_start);
                    wire::insert_varint(out, body_start, body_len as u64);
                }
                Kind::Bytes { utf8: true } if self.policy.lossy_strings => {
                    let text = String::from_utf8_lossy(payload);
                    put_varint(out, key);
                    put_varint(out, text.len() as u64);
                    out.extend_from_slice(text.as_bytes());
                }
                Kind::Varint { .. } | Kind::Fixed32 { .. } | Kind::Fixed64 { .. } if wt == LEN => {
                    // A packed list must split into whole elements. Like the C++ runtime, a
                    // parse that fails inside the list keeps the whole elements before the
                    // failure (ProtoDB writes them back when it closes).
                    let whole = whole_elements(payload, kind, rules);
                    if whole < payload.len() {
                        if let Some(head) = payload.get(..whole).filter(|h| !h.is_empty()) {
                            put_varint(out, key);
                            put_varint(out, head.len() as u64);
                            out.extend_from_slice(head);
                        }
                        return false;
                    }
                    raw(out);
                }
                _ => raw(out),
            }
        }
        !self.policy.required || seen.iter().all(|&s| s)
    }
}

/// How many leading bytes of the packed list `body` form whole elements of `kind`.
fn whole_elements(body: &[u8], kind: Kind, rules: Rules) -> usize {
    match kind {
        Kind::Fixed32 { .. } => body.len() - body.len() % 4,
        Kind::Fixed64 { .. } => body.len() - body.len() % 8,
        _ => {
            let (mut pos, mut whole) = (0, 0);
            while pos < body.len() && wire::read_varint(body, &mut pos, rules).is_ok() {
                whole = pos;
            }
            whole
        }
    }
}

/// `bytes` (a `message`, by full name) without the fields whose wire type does not fit the
/// schema, the unknown ones dropped too, for prost to decode; `None` when there were no such
/// fields or the bytes are malformed in some other way (then prost's own error is the one to
/// report).
pub(crate) fn strip_mistyped(message: &str, bytes: &[u8]) -> Option<Vec<u8>> {
    let schema = Schema::caffe2()?;
    let id = schema.message(message)?;
    let scan = scan(schema, id, bytes, Policy::PROST, false);
    (scan.ok && scan.mistyped > 0).then_some(scan.known)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_message_of_the_schema_is_known() {
        for schema in [Schema::caffe2().unwrap(), Schema::records().unwrap()] {
            for name in crate::proto::MESSAGE_NAMES {
                assert!(schema.message(name).is_some(), "{name}");
            }
        }
    }

    #[test]
    fn the_tables_follow_the_descriptor() {
        let schema = Schema::caffe2().unwrap();
        let kind = |msg: &str, field| {
            let m = &schema.messages[schema.message(msg).unwrap().0];
            m.kind(field)
        };
        let tensor = schema.message("caffe2.TensorProto").unwrap().0;
        let segment = schema.message("caffe2.TensorProto.Segment").unwrap().0;
        assert_eq!(
            kind("caffe2.TensorProto", 1),
            Some(Kind::Varint { repeated: true })
        );
        assert_eq!(
            kind("caffe2.TensorProto", 3),
            Some(Kind::Fixed32 { repeated: true })
        );
        assert_eq!(
            kind("caffe2.TensorProto", 9),
            Some(Kind::Fixed64 { repeated: true })
        );
        assert_eq!(
            kind("caffe2.TensorProto", 7),
            Some(Kind::Bytes { utf8: true })
        );
        assert_eq!(
            kind("caffe2.TensorProto", 13),
            Some(Kind::Bytes { utf8: false })
        );
        assert_eq!(kind("caffe2.TensorProto", 11), Some(Kind::Message(segment)));
        assert_eq!(kind("caffe2.TensorProto", 12), None);
        assert_eq!(kind("caffe2.BlobProto", 3), Some(Kind::Message(tensor)));
        assert_eq!(schema.messages[segment].required, [1, 2]);
        // The records' BlobProto does not read qtensor.
        let records = Schema::records().unwrap();
        let blob = records.message("caffe2.BlobProto").unwrap().0;
        assert_eq!(records.messages[blob].kind(5), None);
        assert!(kind("caffe2.BlobProto", 5).is_some());
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

    #[test]
    fn groups_are_skipped_for_prost_and_fail_for_records() {
        // An unknown group (field 100 holding a varint) before a mistyped NetDef.name.
        let bytes = [0xa3, 0x06, 0x08, 0x01, 0xa4, 0x06, 0x08, 0x01];
        assert_eq!(strip_mistyped("caffe2.NetDef", &bytes), Some(vec![]));
        let schema = Schema::records().unwrap();
        let net = schema.message("caffe2.NetDef").unwrap();
        assert!(!scan(schema, net, &bytes, Policy::RECORDS, false).ok);
    }

    #[test]
    fn records_keep_unknown_fields_and_check_required_ones() {
        let schema = Schema::records().unwrap();
        let tensor = schema.message("caffe2.TensorProto").unwrap();
        // name "x", an unknown varint field 100, a mistyped data_type (bytes), a segment.
        let bytes = [
            0x3a, 0x01, b'x', 0xa0, 0x06, 0x07, 0x12, 0x01, b'y', 0x5a, 0x04, 0x08, 0x00, 0x10,
            0x02,
        ];
        let s = scan(schema, tensor, &bytes, Policy::RECORDS, false);
        assert!(s.ok);
        assert_eq!(
            s.known,
            [0x3a, 0x01, b'x', 0x5a, 0x04, 0x08, 0x00, 0x10, 0x02]
        );
        assert_eq!(s.unknown, [0xa0, 0x06, 0x07, 0x12, 0x01, b'y']);
        assert_eq!(s.mistyped, 1);
        // Without Segment.end the parse fails, and keeps the name before the segment.
        let no_end = [0x3a, 0x01, b'x', 0xa0, 0x06, 0x07, 0x5a, 0x02, 0x08, 0x00];
        let s = scan(schema, tensor, &no_end, Policy::RECORDS, false);
        assert!(!s.ok);
        assert_eq!(s.known, [0x3a, 0x01, b'x']);
        // The same bytes for prost: nothing required, unknown fields dropped.
        let s = scan(schema, tensor, &no_end, Policy::PROST, false);
        assert!(s.ok && s.unknown.is_empty());
        assert_eq!(s.known, [0x3a, 0x01, b'x', 0x5a, 0x02, 0x08, 0x00]);
    }

    #[test]
    fn records_make_strings_valid_utf8() {
        let schema = Schema::records().unwrap();
        let tensor = schema.message("caffe2.TensorProto").unwrap();
        let s = scan(schema, tensor, &[0x3a, 0x01, 0xff], Policy::RECORDS, false);
        assert!(s.ok);
        assert_eq!(s.known, [0x3a, 0x03, 0xef, 0xbf, 0xbd]);
        let s = scan(schema, tensor, &[0x3a, 0x01, 0xff], Policy::PROST, false);
        assert_eq!(s.known, [0x3a, 0x01, 0xff]);
    }

    #[test]
    fn a_broken_packed_list_keeps_its_whole_elements() {
        let schema = Schema::records().unwrap();
        let tensor = schema.message("caffe2.TensorProto").unwrap();
        // float_data packed with 6 bytes: one whole float.
        let s = scan(
            schema,
            tensor,
            &[0x1a, 0x06, 0, 0, 0x80, 0x3f, 1, 2],
            Policy::RECORDS,
            false,
        );
        assert!(!s.ok);
        assert_eq!(s.known, [0x1a, 0x04, 0, 0, 0x80, 0x3f]);
        // dims packed, ending inside a varint: the whole varints before it.
        let s = scan(
            schema,
            tensor,
            &[0x0a, 0x03, 0x02, 0x03, 0x80],
            Policy::RECORDS,
            false,
        );
        assert!(!s.ok);
        assert_eq!(s.known, [0x0a, 0x02, 0x02, 0x03]);
    }

    #[test]
    fn a_stream_ends_at_an_end_group_or_zero_key() {
        let schema = Schema::records().unwrap();
        let tensors = schema.message("caffe2.TensorProtos").unwrap();
        for end in [0x0c, 0x00] {
            let bytes = [0x0a, 0x00, end, 0xff, 0xff];
            assert!(scan(schema, tensors, &bytes, Policy::RECORDS, true).ok);
            assert!(!scan(schema, tensors, &bytes, Policy::RECORDS, false).ok);
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_fails() {
        // ExecutionStep.substep (2) nested 150 deep.
        let schema = Schema::caffe2().unwrap();
        let step = schema.message("caffe2.ExecutionStep").unwrap();
        let nested = |n: usize| {
            let mut b: Vec<u8> = vec![0x08, 0x01]; // a mistyped name, innermost
            for _ in 0..n {
                let mut outer = Vec::new();
                wire::put_len_field(&mut outer, 2, &b);
                b = outer;
            }
            b
        };
        let s = scan(schema, step, &nested(50), Policy::PROST, false);
        assert!(s.ok && s.mistyped == 1);
        assert!(!scan(schema, step, &nested(150), Policy::PROST, false).ok);
    }
}
