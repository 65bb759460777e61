//! Serialized nets in and out of a backward pass: the forward ops of a serialized `NetDef`
//! (decoding only the ops that are differentiated), and gradient ops written as a serialized
//! `NetDef` holding only them.

use prost::Message;

use super::forward::WireOps;
use super::ir::{GradMap, Ir, IrState};
use super::maker::{GradRef, GradientContext};
use crate::error::Result;
use crate::graph::wire;
use crate::proto::{self, NetDef, OperatorDef};

/// What a backward pass over serialized ops gives.
#[derive(Debug, Clone, Default)]
pub struct SerializedBackward {
    /// The gradient ops as a serialized `caffe2.NetDef` with only its `op` field set.
    pub net: Vec<u8>,
    /// The gradient of every blob that has one.
    pub grads: GradMap,
    /// The IR state, when it was asked for.
    pub state: Option<IrState>,
    /// The output names of the gradient ops when they were asked for (every write, in no
    /// particular order): the names concatenated, and where each one ends.
    pub output_names: Option<(String, Vec<usize>)>,
}

/// What to compute besides the gradient ops and map.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras {
    /// The IR state ([`Ir::state`]).
    pub state: bool,
    /// The output names of the gradient ops.
    pub output_names: bool,
}

/// The backward pass of the ops of the serialized `caffe2.NetDef` `bytes` from index `skip`
/// on (Caffe2's `Net.AddGradientOperators(ys, skip)`).
///
/// The result and the errors are those of decoding the ops ([`decode_ops_from`]) and running
/// [`super::backward_pass_in`] on them. A well-formed net whose op types have no gradient
/// function (nothing that could call back into user code) is read in place instead: names are
/// borrowed from the bytes and each op is decoded only while its gradient is made. Should
/// anything fail that way, the pass is run again the plain way, which reports the error.
pub fn backward_pass_net_bytes(
    bytes: &[u8],
    skip: usize,
    ys: &[(String, GradRef)],
    cx: &mut GradientContext<'_>,
    extras: Extras,
) -> Result<SerializedBackward> {
    if let Some(split) = well_formed_entries(bytes, skip) {
        let items = split.into_iter().map(|r| &bytes[r]).collect();
        if let Some(out) = wire_backward(WireOps::net_entries(items), ys, cx, extras) {
            return Ok(out);
        }
    }
    let ops = decode_ops_from(bytes, skip)?;
    decoded_backward(&ops, ys, cx, extras)
}

/// The backward pass of serialized `caffe2.OperatorDef`s (Caffe2's
/// `GradientRegistry.GetBackwardPass`), read in place as in [`backward_pass_net_bytes`]. The
/// result and the errors are those of decoding every op (`proto::decode`; an error names the
/// op's position) and playing the decoded ops.
pub fn backward_pass_op_bytes<B: AsRef<[u8]>>(
    ops: &[B],
    ys: &[(String, GradRef)],
    cx: &mut GradientContext<'_>,
    extras: Extras,
) -> Result<SerializedBackward> {
    let items = ops.iter().map(AsRef::as_ref).collect();
    if let Some(out) = wire_backward(WireOps::operators(items), ys, cx, extras) {
        return Ok(out);
    }
    let mut decoded = Vec::with_capacity(ops.len());
    for (k, b) in ops.iter().enumerate() {
        decoded.push(
            proto::decode::<OperatorDef>(b.as_ref()).map_err(|e| match e {
                crate::Error::Decode { message, reason } => crate::Error::Decode {
                    message,
                    reason: format!("operator {k} of the list: {reason}"),
                },
                other => other,
            })?,
        );
    }
    decoded_backward(&decoded, ys, cx, extras)
}

fn run<'a>(
    mut ir: Ir<'a>,
    ys: &'a [(String, GradRef)],
    cx: &mut GradientContext<'_>,
    extras: Extras,
) -> Result<(Ir<'a>, SerializedBackward)> {
    if !extras.state {
        ir.skip_unused_generators();
    }
    let (net, grads, output_names) = ir.backward_serialized(ys, cx, extras.output_names)?;
    let out = SerializedBackward {
        net,
        grads,
        state: None,
        output_names,
    };
    Ok((ir, out))
}

fn decoded_backward(
    ops: &[OperatorDef],
    ys: &[(String, GradRef)],
    cx: &mut GradientContext<'_>,
    extras: Extras,
) -> Result<SerializedBackward> {
    let (ir, mut out) = run(Ir::new(ops)?, ys, cx, extras)?;
    out.state = extras.state.then(|| ir.state());
    Ok(out)
}

/// The backward pass over ops read in place; `None` if it cannot be used or anything fails.
fn wire_backward(
    wire: WireOps<'_>,
    ys: &[(String, GradRef)],
    cx: &mut GradientContext<'_>,
    extras: Extras,
) -> Option<SerializedBackward> {
    let mut ir = Ir::from_wire(wire, ys.len())?;
    // Gradient functions (Python ones, control ops) may have effects that a second run
    // would repeat: those nets take the plain path only.
    if ir.any_gradient_function(cx.registry) {
        return None;
    }
    let (ir, mut out) = run(ir, ys, cx, extras).ok()?;
    ir.check_undecoded().ok()?;
    out.state = extras.state.then(|| ir.state());
    Some(out)
}

/// The byte ranges of the `op` entries from `skip` on, if the whole net decodes strictly:
/// its other fields and the ops before `skip` are checked here (they are small, or skipped
/// ops), the wanted ops while the backward pass decodes them.
fn well_formed_entries(bytes: &[u8], skip: usize) -> Option<Vec<std::ops::Range<usize>>> {
    let mut split = wire::op_entries(bytes).ok()?;
    let skip = skip.min(split.ops.len());
    if skip > 0 || !split.others.is_empty() {
        let mut rest: Vec<u8> = Vec::new();
        for r in runs(&split.ops[..skip]).chain(runs(&split.others)) {
            rest.extend_from_slice(&bytes[r]);
        }
        NetDef::decode(rest.as_slice()).ok()?;
    }
    split.ops.drain(..skip);
    Some(split.ops)
}

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
