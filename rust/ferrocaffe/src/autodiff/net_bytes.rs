//! Serialized nets in and out of a backward pass: the forward ops of a serialized `NetDef`
//! (decoding only the ops that are differentiated), and gradient ops written as a serialized
//! `NetDef` holding only them.

use prost::Message;

use crate::error::Result;
use crate::graph::wire;
use crate::proto::{self, NetDef, OperatorDef};

/// The ops of the serialized `caffe2.NetDef` `bytes` from index `skip` on (all of them when
/// `skip` is 0; none when `skip` is past the end).
///
/// The result and the errors are those of decoding the whole net (`proto::decode`, lenient
/// fallback included) and dropping its first `skip` ops; well-formed nets take a fast path that
/// decodes the other ops and fields only to check them, into nothing, and the wanted ops
/// straight into a vector of the right size.
pub fn decode_ops_from(bytes: &[u8], skip: usize) -> Result<Vec<OperatorDef>> {
    if let Some(ops) = decode_ops_fast(bytes, skip) {
        return Ok(ops);
    }
    let mut net = proto::decode::<NetDef>(bytes)?;
    let skip = skip.min(net.op.len());
    net.op.drain(..skip);
    Ok(net.op)
}

/// The strict decode of the wanted ops, if the whole net decodes strictly (the parts of a
/// message decode independently, so checking each part is checking the whole).
fn decode_ops_fast(bytes: &[u8], skip: usize) -> Option<Vec<OperatorDef>> {
    let split = wire::op_entries(bytes).ok()?;
    let skip = skip.min(split.ops.len());
    let wanted = &split.ops[skip..];
    let mut net = NetDef {
        op: Vec::with_capacity(wanted.len()),
        ..Default::default()
    };
    for run in runs(wanted) {
        net.merge(&bytes[run]).ok()?;
    }
    if skip > 0 || !split.others.is_empty() {
        let mut rest: Vec<u8> = Vec::new();
        for r in runs(&split.ops[..skip]).chain(runs(&split.others)) {
            rest.extend_from_slice(&bytes[r]);
        }
        NetDef::decode(rest.as_slice()).ok()?;
    }
    Some(net.op)
}

/// Contiguous ranges merged into runs.
fn runs(ranges: &[std::ops::Range<usize>]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut k = 0;
    std::iter::from_fn(move || {
        let first = ranges.get(k)?;
        let mut run = first.clone();
        k += 1;
        while let Some(next) = ranges.get(k).filter(|r| r.start == run.end) {
            run.end = next.end;
            k += 1;
        }
        Some(run)
    })
}

/// The serialized `caffe2.NetDef` whose only field is `op` = `ops` (what encoding
/// `NetDef { op: ops, ..Default::default() }` gives, byte for byte).
pub fn encode_ops_as_net(ops: &[OperatorDef]) -> Vec<u8> {
    let lens: Vec<usize> = ops.iter().map(Message::encoded_len).collect();
    let total: usize = lens
        .iter()
        .map(|&l| 1 + prost::encoding::encoded_len_varint(l as u64) + l)
        .sum();
    let mut out = Vec::with_capacity(total);
    for (op, &len) in ops.iter().zip(&lens) {
        // Field 2 (`op`), wire type 2 (length-delimited).
        out.push(0x12);
        prost::encoding::encode_varint(len as u64, &mut out);
        op.encode_raw(&mut out);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::{encode, Argument};

    fn net(n: usize) -> NetDef {
        let mut net = NetDef {
            name: Some("n".into()),
            external_input: vec!["x".into()],
            ..Default::default()
        };
        for k in 0..n {
            let mut op = OperatorDef::new("Relu", [format!("b{k}")], [format!("b{}", k + 1)]);
            if k % 2 == 0 {
                op.arg.push(Argument {
                    name: Some("a".into()),
                    i: Some(k as i64),
                    ..Default::default()
                });
            }
            net.op.push(op);
        }
        net
    }

    #[test]
    fn decodes_the_ops_from_skip() {
        let n = net(5);
        let bytes = encode(&n);
        for skip in 0..7 {
            let ops = decode_ops_from(&bytes, skip).unwrap();
            assert_eq!(ops, n.op[skip.min(5)..].to_vec(), "skip {skip}");
        }
    }

    #[test]
    fn ops_interleaved_with_other_fields() {
        let n = net(3);
        let mut bytes = Vec::new();
        for (k, op) in n.op.iter().enumerate() {
            let one = NetDef {
                op: vec![op.clone()],
                external_output: vec![format!("o{k}")],
                ..Default::default()
            };
            bytes.extend(encode(&one));
        }
        assert_eq!(decode_ops_from(&bytes, 1).unwrap(), n.op[1..].to_vec());
    }

    #[test]
    fn errors_and_lenient_cases_match_the_full_decode() {
        let bytes = encode(&net(3));
        // Truncated: the same error as the full decode.
        let cut = &bytes[..bytes.len() - 2];
        let full = proto::decode::<NetDef>(cut).unwrap_err().to_string();
        assert_eq!(decode_ops_from(cut, 0).unwrap_err().to_string(), full);
        // Invalid UTF-8 in the net name (a field that is not an op) is an error, as before,
        // even though every op decodes.
        let mut bad = bytes.clone();
        bad.extend_from_slice(&[0x0a, 0x01, 0xff]);
        assert!(proto::decode::<NetDef>(&bad).is_err());
        assert!(decode_ops_from(&bad, 0).is_err());
        // A skipped op that fails is an error too.
        let mut bad_op = vec![0x12, 0x03, 0x0a, 0x01, 0xff];
        bad_op.extend_from_slice(&bytes);
        assert!(decode_ops_from(&bad_op, 1).is_err());
        // Field 2 with the wrong wire type: skipped by the lenient decode, as before.
        let mut mistyped = vec![0x10, 0x01];
        mistyped.extend_from_slice(&bytes);
        assert_eq!(
            decode_ops_from(&mistyped, 0).unwrap(),
            proto::decode::<NetDef>(&mistyped).unwrap().op
        );
    }

    #[test]
    fn encoding_matches_prost() {
        let n = net(4);
        let expected = encode(&NetDef {
            op: n.op.clone(),
            ..Default::default()
        });
        assert_eq!(encode_ops_as_net(&n.op), expected);
        assert!(encode_ops_as_net(&[]).is_empty());
        // Ops longer than 127 bytes have a two-byte length.
        let big = OperatorDef::new("Sum", (0..40).map(|k| format!("in{k}")), ["out"]);
        let expected = encode(&NetDef {
            op: vec![big.clone()],
            ..Default::default()
        });
        assert_eq!(encode_ops_as_net(&[big]), expected);
    }
}
