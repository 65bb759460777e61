//! The protobuf wire format, read and written by hand: varints, field keys, values (skipped or
//! located), and the fields of a message's bytes. Every hand-written reader of protobuf bytes
//! in the crate is built on this module: the lenient decoder ([`super::lenient`]: `proto::decode`'s
//! fallback and the DB records of [`crate::wire`]) and the NetDef readers of
//! [`crate::graph::wire`] (the graph and SSA fast paths, the autodiff's serialized ops).
//!
//! # Why by hand
//!
//! prost decodes a message strictly and all at once into its struct: a known field with an
//! unexpected wire type fails the whole message, unknown fields are dropped, and a failure
//! leaves nothing behind. Caffe2 read its messages with protobuf's C++ runtime, which behaves
//! otherwise, and ferrocaffe must read what Caffe2 read:
//!
//! * a known field with the wrong wire type is kept as an unknown field, not an error;
//! * unknown fields are kept and written back after the known ones (ProtoDB, `Save`);
//! * a parse fails at specific points and keeps what it merged before them: a packed list
//!   that ends inside an element keeps its whole elements, a missing `required` field fails
//!   only after the rest has been merged, a file read as a stream ends at an end-group (or
//!   zero) key;
//! * varints are read as C++ reads them (ten bytes at most, bits beyond 64 dropped), where
//!   prost also rejects a tenth byte above 1.
//!
//! No crate reproduces these rules (prost's `encoding` helpers decode into prost's own field
//! types and error type, and stop at the first problem), and the graph readers need something
//! prost does not offer at all: walking a 100k-op `NetDef` in place, borrowing names from the
//! bytes and recording byte ranges, without building any message. So the wire format lives
//! here, once, with each caller's rules spelled out in [`Rules`] (and in
//! [`super::lenient::Policy`] for the lenient decoder).
//!
//! Everything here reads bytes a user supplies: lengths are checked against the end of the
//! buffer with checked additions, and no function panics on any input.

use std::fmt;
use std::ops::Range;

/// Wire type: varint.
pub(crate) const VARINT: u8 = 0;
/// Wire type: 64-bit fixed.
pub(crate) const I64: u8 = 1;
/// Wire type: length-delimited.
pub(crate) const LEN: u8 = 2;
/// Wire type: start of a group.
pub(crate) const SGROUP: u8 = 3;
/// Wire type: end of a group.
pub(crate) const EGROUP: u8 = 4;
/// Wire type: 32-bit fixed.
pub(crate) const I32: u8 = 5;

/// How varints and groups are read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// prost's varints: a ten-byte varint whose last byte is above 1 overflows 64 bits and is
    /// rejected. Without it, the C++ rule: the bits beyond 64 are dropped.
    pub(crate) strict_varints: bool,
    /// How many groups may nest inside one another; a start-group key beyond that (with 0:
    /// any start-group key) is an error.
    pub(crate) groups: u32,
}

impl Rules {
    /// C++ varints, groups skipped up to 65 deep: what the NetDef readers accept.
    pub(crate) const NET: Rules = Rules {
        strict_varints: false,
        groups: 65,
    };
    /// C++ varints, no groups.
    pub(crate) const NO_GROUPS: Rules = Rules {
        strict_varints: false,
        groups: 0,
    };
}

/// Why bytes are not a well-formed protobuf encoding (the texts are the NetDef readers').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireError {
    /// A varint runs past the end, past ten bytes, or (strict) past 64 bits.
    Varint { at: usize },
    /// A length prefix runs past the end of the buffer.
    Length { len: u64, at: usize, total: usize },
    /// A key whose field number is 0 or does not fit in 29 bits.
    FieldNumber { field: u64, at: usize },
    /// A fixed-width value runs past the end.
    Fixed { field: u32 },
    /// Groups nest deeper than [`Rules::groups`].
    GroupDepth,
    /// A group closed by the end-group key of another field.
    GroupEnd { open: u32, close: u32 },
    /// Wire type 6 or 7, or an end-group outside a group.
    WireType { wire: u8, field: u32, at: usize },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Varint { at } => write!(f, "truncated or over-long varint at byte {at}"),
            WireError::Length { len, at, total } => write!(
                f,
                "length {len} at byte {at} runs past the end ({total} bytes)"
            ),
            WireError::FieldNumber { field, at } => {
                write!(f, "invalid field number {field} at byte {at}")
            }
            WireError::Fixed { field } => write!(f, "truncated fixed-width field {field}"),
            WireError::GroupDepth => write!(f, "groups nested too deeply"),
            WireError::GroupEnd { open, close } => {
                write!(f, "group {open} closed by end-group {close}")
            }
            WireError::WireType { wire, field, at } => write!(
                f,
                "invalid wire type {wire} for field {field} before byte {at}"
            ),
        }
    }
}

/// Reads a varint at `pos` (C++ rule: ten bytes at most, bits beyond 64 dropped), moving `pos`
/// past it; `None` if it is truncated or longer than ten bytes (`pos` is then unspecified).
#[inline(always)]
pub(crate) fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    read_varint_as(buf, pos, false)
}

#[inline(always)]
fn read_varint_as(buf: &[u8], pos: &mut usize, strict: bool) -> Option<u64> {
    // One-byte varints (keys, short lengths) are by far the most common.
    let at = *pos;
    if let Some(&b) = buf.get(at) {
        if b < 0x80 {
            // `at` indexes `buf`: no overflow.
            *pos = at + 1;
            return Some(u64::from(b));
        }
    }
    varint_slow(buf, pos, strict)
}

#[inline]
fn varint_slow(buf: &[u8], pos: &mut usize, strict: bool) -> Option<u64> {
    let start = *pos;
    let mut value = 0u64;
    for (i, &b) in buf.get(start..)?.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if strict && i == 9 && b > 1 {
                return None;
            }
            // `start + i` indexes `buf`: no overflow.
            *pos = start + i + 1;
            return Some(value);
        }
    }
    None
}

/// Reads a varint with `rules`.
#[inline(always)]
pub(crate) fn read_varint(buf: &[u8], pos: &mut usize, rules: Rules) -> Result<u64, WireError> {
    let at = *pos;
    read_varint_as(buf, pos, rules.strict_varints).ok_or(WireError::Varint { at })
}

/// Reads a length prefix and returns the range of the payload that follows, which must lie
/// within `buf`; `pos` moves past the payload.
#[inline(always)]
pub(crate) fn read_len(
    buf: &[u8],
    pos: &mut usize,
    rules: Rules,
) -> Result<Range<usize>, WireError> {
    let len = read_varint(buf, pos, rules)?;
    let start = *pos;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| start.checked_add(l))
        .filter(|&e| e <= buf.len())
        .ok_or(WireError::Length {
            len,
            at: start,
            total: buf.len(),
        })?;
    *pos = end;
    Ok(start..end)
}

/// Reads a field key as protobuf does: a field number from 1 to 2^29 - 1 (the key fits in 32
/// bits) and a wire type (checked when the value is read).
#[inline(always)]
pub(crate) fn read_tag(buf: &[u8], pos: &mut usize, rules: Rules) -> Result<(u32, u8), WireError> {
    let at = *pos;
    let key = read_varint(buf, pos, rules)?;
    split_key(key).ok_or(WireError::FieldNumber {
        field: key >> 3,
        at,
    })
}

/// A key's field number and wire type, if the number is valid (see [`read_tag`]).
#[inline(always)]
pub(crate) fn split_key(key: u64) -> Option<(u32, u8)> {
    // Field number 1 or more and a key that fits in 32 bits, in one comparison.
    if (8..=u64::from(u32::MAX)).contains(&key) {
        Some(((key >> 3) as u32, (key & 7) as u8))
    } else {
        None
    }
}

/// Reads the value of field `field` with wire type `wire` (its key just read) and returns
/// where it lies: the payload of a length-delimited value, the content of a group up to and
/// including its end-group key, or else the value's own bytes.
#[inline(always)]
pub(crate) fn read_value(
    buf: &[u8],
    pos: &mut usize,
    field: u32,
    wire: u8,
    rules: Rules,
) -> Result<Range<usize>, WireError> {
    let start = *pos;
    match wire {
        VARINT => {
            read_varint(buf, pos, rules)?;
        }
        I64 | I32 => {
            let n = if wire == I64 { 8 } else { 4 };
            *pos = start
                .checked_add(n)
                .filter(|&e| e <= buf.len())
                .ok_or(WireError::Fixed { field })?;
        }
        LEN => return read_len(buf, pos, rules),
        SGROUP => skip_group(buf, pos, field, rules)?,
        _ => {
            return Err(WireError::WireType {
                wire,
                field,
                at: start,
            })
        }
    }
    Ok(start..*pos)
}

/// Skips the content of group `field` and its end-group key.
fn skip_group(buf: &[u8], pos: &mut usize, field: u32, rules: Rules) -> Result<(), WireError> {
    let inner = Rules {
        groups: rules.groups.checked_sub(1).ok_or(WireError::GroupDepth)?,
        ..rules
    };
    loop {
        let (f, w) = read_tag(buf, pos, rules)?;
        if w == EGROUP {
            return if f == field {
                Ok(())
            } else {
                Err(WireError::GroupEnd {
                    open: field,
                    close: f,
                })
            };
        }
        read_value(buf, pos, f, w, inner)?;
    }
}

/// One field of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    /// Field number.
    pub(crate) number: u32,
    /// Wire type.
    pub(crate) wire: u8,
    /// Where its key starts.
    pub(crate) start: usize,
    /// Where its value lies (see [`read_value`]); `value.end` is where the field ends.
    pub(crate) value: Range<usize>,
}

/// The fields of the message in `buf[range]`, in order, read with `rules` (positions are
/// offsets in `buf`); iteration stops after the first error.
pub(crate) fn fields_in(buf: &[u8], range: Range<usize>, rules: Rules) -> Fields<'_> {
    // A range past the end of `buf` reads as empty.
    let end = range.end.min(buf.len());
    Fields {
        buf: buf.get(..end).unwrap_or_default(),
        pos: range.start,
        rules,
    }
}

/// Iterator over the fields of a message: see [`fields_in`].
pub(crate) struct Fields<'b> {
    buf: &'b [u8],
    pos: usize,
    rules: Rules,
}

impl Iterator for Fields<'_> {
    type Item = Result<Field, WireError>;

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let start = self.pos;
        let error = match read_tag(self.buf, &mut self.pos, self.rules) {
            Ok((number, wire)) => {
                match read_value(self.buf, &mut self.pos, number, wire, self.rules) {
                    Ok(value) => {
                        return Some(Ok(Field {
                            number,
                            wire,
                            start,
                            value,
                        }))
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        // Nothing more after an error.
        self.pos = self.buf.len();
        Some(Err(error))
    }
}

/// Quick readers for fast paths: `None` for anything unusual (malformed bytes, groups), which
/// the fast path hands back to a checked reader to report.
pub(crate) mod quick {
    use super::{read_len, read_tag, read_value, Rules};

    pub(crate) use super::{split_key, varint};

    /// A field key: field number (1 to 2^29 - 1) and wire type.
    #[inline(always)]
    pub(crate) fn tag(buf: &[u8], pos: &mut usize) -> Option<(u32, u8)> {
        read_tag(buf, pos, Rules::NO_GROUPS).ok()
    }

    /// A length-delimited payload.
    #[inline(always)]
    pub(crate) fn len_delimited<'b>(buf: &'b [u8], pos: &mut usize) -> Option<&'b [u8]> {
        let r = read_len(buf, pos, Rules::NO_GROUPS).ok()?;
        buf.get(r)
    }

    /// A length-delimited UTF-8 string.
    #[inline(always)]
    pub(crate) fn string<'b>(buf: &'b [u8], pos: &mut usize) -> Option<&'b str> {
        super::utf8(len_delimited(buf, pos)?)
    }

    /// Skips a value of wire type `wire` (the low three bits of a key); groups give `None`.
    #[inline]
    pub(crate) fn skip(buf: &[u8], pos: &mut usize, wire: u64) -> Option<()> {
        read_value(buf, pos, 0, u8::try_from(wire).ok()?, Rules::NO_GROUPS)
            .ok()
            .map(drop)
    }
}

/// `bytes` as a string if they are valid UTF-8 (ASCII checked quickly, anything else fully).
#[inline(always)]
pub(crate) fn utf8(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: ASCII bytes are valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// Appends a varint (the shortest encoding).
#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Inserts a varint at `at` in `out` (the bytes after it move up).
pub(crate) fn insert_varint(out: &mut Vec<u8>, at: usize, mut v: u64) {
    let mut bytes = [0u8; 10];
    let mut n = 0;
    for b in bytes.iter_mut() {
        n += 1;
        if v < 0x80 {
            *b = v as u8;
            break;
        }
        *b = (v as u8) | 0x80;
        v >>= 7;
    }
    let at = at.min(out.len());
    out.splice(at..at, bytes.iter().take(n).copied());
}

/// Appends a length-delimited field: key, length, payload.
#[inline]
pub(crate) fn put_len_field(out: &mut Vec<u8>, field: u32, payload: &[u8]) {
    put_varint(out, (u64::from(field) << 3) | u64::from(LEN));
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn varints_roundtrip_and_follow_each_rule() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            for strict in [false, true] {
                let mut pos = 0;
                assert_eq!(read_varint_as(&out, &mut pos, strict), Some(v));
                assert_eq!(pos, out.len());
            }
        }
        // Eleven bytes: too long for both.
        assert_eq!(varint(&[0xff; 11], &mut 0), None);
        // Truncated.
        assert_eq!(varint(&[0x80, 0x80], &mut 0), None);
        assert_eq!(varint(&[], &mut 0), None);
        // A tenth byte above 1: C++ drops the extra bits, prost rejects it.
        let mut ten = vec![0x81];
        ten.extend([0x80; 8]);
        ten.push(0x7e);
        assert_eq!(varint(&ten, &mut 0), Some(1));
        assert_eq!(read_varint_as(&ten, &mut 0, true), None);
        assert_eq!(
            read_varint(
                &ten,
                &mut 0,
                Rules {
                    strict_varints: true,
                    groups: 0
                }
            ),
            Err(WireError::Varint { at: 0 })
        );
    }

    #[test]
    fn inserted_varints_are_put_varints() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut expected = vec![7];
            put_varint(&mut expected, v);
            expected.push(9);
            let mut out = vec![7, 9];
            insert_varint(&mut out, 1, v);
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn keys_lengths_and_values() {
        // Field number 0 and a key beyond 32 bits.
        assert_eq!(
            read_tag(&[0x00], &mut 0, Rules::NET),
            Err(WireError::FieldNumber { field: 0, at: 0 })
        );
        let mut wide = Vec::new();
        put_varint(&mut wide, 1 << 32);
        assert!(read_tag(&wide, &mut 0, Rules::NET).is_err());
        // A length past the end, even one that overflows.
        for len in [5u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, len);
            b.push(1);
            let e = read_len(&b, &mut 0, Rules::NET).unwrap_err();
            assert!(matches!(e, WireError::Length { .. }), "{e}");
        }
        // Fixed-width values, cut short.
        assert_eq!(
            read_value(&[1, 2, 3], &mut 0, 9, I32, Rules::NET),
            Err(WireError::Fixed { field: 9 })
        );
        assert_eq!(
            read_value(&[1, 2, 3, 4], &mut 0, 9, I32, Rules::NET),
            Ok(0..4)
        );
        // Wire types 6 and 7, and an end-group with no start.
        for w in [EGROUP, 6, 7] {
            assert!(read_value(&[0; 8], &mut 0, 1, w, Rules::NET).is_err());
        }
    }

    #[test]
    fn groups_nest_within_the_limit() {
        // Group 1 holding a varint field 2, closed.
        let g = [0x10, 0x05, 0x0c];
        assert_eq!(read_value(&g, &mut 0, 1, SGROUP, Rules::NET), Ok(0..3));
        assert_eq!(
            read_value(&g, &mut 0, 1, SGROUP, Rules::NO_GROUPS),
            Err(WireError::GroupDepth)
        );
        // Closed by another field's end-group.
        assert_eq!(
            read_value(&[0x14], &mut 0, 1, SGROUP, Rules::NET),
            Err(WireError::GroupEnd { open: 1, close: 2 })
        );
        // `groups` levels of nesting are fine, one more is not.
        let nested = |n: usize| {
            let mut b = vec![0x0b; n - 1];
            b.extend(vec![0x0c; n]);
            b
        };
        let rules = Rules {
            strict_varints: false,
            groups: 3,
        };
        assert!(read_value(&nested(3), &mut 0, 1, SGROUP, rules).is_ok());
        assert_eq!(
            read_value(&nested(4), &mut 0, 1, SGROUP, rules),
            Err(WireError::GroupDepth)
        );
    }

    #[test]
    fn fields_iterate_and_stop_at_the_first_error() {
        let mut b = Vec::new();
        put_len_field(&mut b, 1, b"ab");
        b.extend([0x10, 0x96, 0x01]);
        let all: Vec<_> = fields_in(&b, 0..b.len(), Rules::NET).collect();
        assert_eq!(
            all,
            [
                Ok(Field {
                    number: 1,
                    wire: LEN,
                    start: 0,
                    value: 2..4
                }),
                Ok(Field {
                    number: 2,
                    wire: VARINT,
                    start: 4,
                    value: 5..7
                }),
            ]
        );
        // Offsets stay those of the whole buffer.
        let tail: Vec<_> = fields_in(&b, 4..b.len(), Rules::NET).collect();
        assert_eq!(tail.len(), 1);
        b.push(0x0a);
        let all: Vec<_> = fields_in(&b, 0..b.len(), Rules::NET).collect();
        assert_eq!(all.len(), 3);
        assert!(all[2].is_err());
        // A range past the end reads as empty (no panic).
        assert_eq!(fields_in(&b, 100..200, Rules::NET).count(), 0);
    }

    #[test]
    fn quick_readers() {
        let mut b = Vec::new();
        put_len_field(&mut b, 1, "é".as_bytes());
        let mut pos = 1;
        assert_eq!(quick::string(&b, &mut pos), Some("é"));
        let mut pos = 1;
        assert_eq!(quick::string(&[0x0a, 0x01, 0xff], &mut pos), None);
        assert_eq!(quick::skip(&[0x0b, 0x0c], &mut 0, 3), None);
        let mut pos = 0;
        assert_eq!(
            quick::skip(&[1, 2, 3, 4, 5, 6, 7, 8], &mut pos, 1),
            Some(())
        );
        assert_eq!(pos, 8);
    }
}
