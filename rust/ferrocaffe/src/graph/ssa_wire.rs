//! [`Ssa::from_bytes`]'s fast path: the SSA of a serialized net computed in one pass over its
//! ops, names borrowed from the bytes and interned a batch at a time, without the per-op
//! tables of [`super::NetIo`] (op types are only checked, not interned).
//!
//! It accepts exactly the nets the checked reader accepts, minus the unusual ones (groups,
//! malformed bytes, versions that could overflow), which it hands back (`None`) so that the
//! checked reader reports them; and it gives the same result, blob ids included (names are
//! interned in the order the checked reader interns them).

use super::intern::{BlobId, Names};
use super::ssa::{Slot, Ssa, ValueId, Version};
use super::wire::quick::{len_delimited, skip, split_key, string, tag, varint};
use super::wire::{NET_EXTERNAL_INPUT, NET_EXTERNAL_OUTPUT, NET_OP, OP_INPUT, OP_OUTPUT};
use crate::graph::FxHashMap;
use crate::proto::wire::LEN;

const OP_TYPE: u32 = 4;
/// The keys of an op's inputs, outputs and type (length-delimited): one byte each.
const KEY_INPUT: u64 = (OP_INPUT as u64) << 3 | LEN as u64;
const KEY_OUTPUT: u64 = (OP_OUTPUT as u64) << 3 | LEN as u64;
const KEY_TYPE: u64 = (OP_TYPE as u64) << 3 | LEN as u64;
const NONE: u32 = u32::MAX;

/// Ops interned per batch: their names are hashed and their table slots touched together,
/// so that the cache misses of a batch overlap.
const BATCH_OPS: usize = 32;

/// Names per batch outside the ops.
const BATCH_NAMES: usize = 64;

/// The top-level fields the SSA needs.
struct Outline<'b> {
    ops: Vec<&'b [u8]>,
    external_inputs: Vec<&'b str>,
    external_outputs: Vec<&'b str>,
}

/// The ops and external inputs and outputs, if the net is plainly well-formed, its external
/// inputs and outputs follow its ops and its external inputs precede its external outputs (as
/// protobuf writes them).
fn outline(bytes: &[u8]) -> Option<Outline<'_>> {
    u32::try_from(bytes.len()).ok()?;
    let mut out = Outline {
        ops: Vec::with_capacity(bytes.len() / 32 + 1),
        external_inputs: Vec::new(),
        external_outputs: Vec::new(),
    };
    let mut pos = 0;
    while pos < bytes.len() {
        // Field numbers checked as the checked reader checks them.
        let (field, wire) = tag(bytes, &mut pos)?;
        match field {
            NET_OP | NET_EXTERNAL_INPUT | NET_EXTERNAL_OUTPUT if wire != LEN => return None,
            NET_OP => {
                if !out.external_inputs.is_empty() || !out.external_outputs.is_empty() {
                    return None;
                }
                out.ops.push(len_delimited(bytes, &mut pos)?);
            }
            NET_EXTERNAL_INPUT => {
                // The checked reader interns names in wire order; this pass interns the
                // external inputs before the external outputs.
                if !out.external_outputs.is_empty() {
                    return None;
                }
                out.external_inputs.push(string(bytes, &mut pos)?);
            }
            NET_EXTERNAL_OUTPUT => out.external_outputs.push(string(bytes, &mut pos)?),
            _ => skip(bytes, &mut pos, u64::from(wire))?,
        }
    }
    Some(out)
}

/// Appends the inputs and then the outputs of a serialized op to `names`; returns how many
/// inputs it has. The type must be a string, as the checked reader requires; `None` for an op
/// whose inputs do not all precede its outputs (as protobuf writes them).
fn scan_op<'b>(op: &'b [u8], names: &mut Vec<&'b str>, outs: &mut Vec<&'b str>) -> Option<usize> {
    let start = names.len();
    outs.clear();
    let mut pos = 0;
    while pos < op.len() {
        // Dispatched on the whole key: the common fields need no more decoding.
        match varint(op, &mut pos)? {
            KEY_INPUT => {
                let s = string(op, &mut pos)?;
                if !outs.is_empty() {
                    return None;
                }
                names.push(s);
            }
            KEY_OUTPUT => outs.push(string(op, &mut pos)?),
            KEY_TYPE => {
                string(op, &mut pos)?;
            }
            key => {
                // Field numbers checked as the checked reader checks them; an input, output
                // or type with another wire type is its error to report.
                let (field, wire) = split_key(key)?;
                if matches!(field, OP_INPUT | OP_OUTPUT | OP_TYPE) {
                    return None;
                }
                skip(op, &mut pos, u64::from(wire))?;
            }
        }
    }
    let n_in = names.len() - start;
    names.extend_from_slice(outs);
    Some(n_in)
}

/// What the pass knows of one blob, in one place (the pass reads and writes all of it for
/// each use of the blob).
#[derive(Clone, Copy)]
struct BlobState {
    /// Its current version (meaningful when `known`).
    version: Version,
    /// The value id of `(blob, version)`, or `NONE` before any op reads or writes that pair.
    current: u32,
    /// Whether it is in `blob_versions` (so far).
    known: bool,
    /// Whether some op-phase event would add it to `blob_versions` (see [`Pass::finish`]).
    added: bool,
}

/// The state of the versioning pass.
struct Pass {
    blobs: Vec<BlobState>,
    /// The blobs in the order of their first op-phase events.
    events: Vec<BlobId>,
    values: Vec<(BlobId, Version)>,
    inputs: Vec<Slot>,
    outputs: Vec<Slot>,
    in_off: Vec<u32>,
    out_off: Vec<u32>,
}

impl Pass {
    fn grow(&mut self, n: usize, start: &FxHashMap<&str, Version>, names: &Names) {
        while self.blobs.len() < n {
            let id = BlobId(self.blobs.len() as u32);
            let v = if start.is_empty() {
                None
            } else {
                start.get(names.name(id)).copied()
            };
            self.blobs.push(BlobState {
                version: v.unwrap_or(0),
                current: NONE,
                known: v.is_some(),
                added: false,
            });
        }
    }

    fn op(&mut self, ins: &[BlobId], outs: &[BlobId], declared: bool) {
        for &b in ins {
            let e = &mut self.blobs[b.index()];
            if !e.known && !declared {
                e.known = true;
                e.version = 0;
                if !e.added {
                    e.added = true;
                    self.events.push(b);
                }
            }
            // Unknown blobs are read at version 0 (`version` stays 0 until they are known).
            let v = e.version;
            if e.current == NONE {
                e.current = self.values.len() as u32;
                self.values.push((b, v));
            }
            self.inputs.push(Slot {
                blob: b,
                version: v,
                value: ValueId(e.current),
            });
        }
        for &b in outs {
            let e = &mut self.blobs[b.index()];
            let v = if e.known {
                e.version + 1
            } else {
                if !e.added {
                    e.added = true;
                    self.events.push(b);
                }
                1
            };
            e.known = true;
            e.version = v;
            e.current = self.values.len() as u32;
            self.values.push((b, v));
        }
        for &b in outs {
            let e = &self.blobs[b.index()];
            self.outputs.push(Slot {
                blob: b,
                version: e.version,
                value: ValueId(e.current),
            });
        }
        self.in_off.push(self.inputs.len() as u32);
        self.out_off.push(self.outputs.len() as u32);
    }
}

/// The SSA of a serialized net with starting versions `start`, or `None` to let the checked
/// reader handle it.
pub(crate) fn ssa_from_bytes(bytes: &[u8], start: &[(&str, Version)]) -> Option<Ssa> {
    let net = outline(bytes)?;
    let n_ops = net.ops.len();
    let mut names = Names::with_capacity(bytes.len() / 24, bytes.len() / 2);
    // Starting versions by name (later duplicates win, as dict assignment would).
    let mut start_map: FxHashMap<&str, Version> = FxHashMap::default();
    for &(n, v) in start {
        start_map.insert(n, v);
    }
    // No version can overflow: each output (at least 2 bytes) bumps one version by one. (The
    // checked reader reports the nets where one could.)
    let max_start = start.iter().map(|s| s.1).max().unwrap_or(0);
    max_start.checked_add(bytes.len() as i64)?;
    let declared = !net.external_inputs.is_empty();
    // Room for about as many blobs as the names table (grown one batch at a time).
    let blobs = bytes.len() / 24;
    let mut pass = Pass {
        blobs: Vec::with_capacity(blobs),
        events: Vec::with_capacity(n_ops),
        values: Vec::with_capacity(n_ops * 2 + 8),
        inputs: Vec::with_capacity(n_ops * 3),
        outputs: Vec::with_capacity(n_ops + n_ops / 2),
        in_off: Vec::with_capacity(n_ops + 1),
        out_off: Vec::with_capacity(n_ops + 1),
    };
    pass.in_off.push(0);
    pass.out_off.push(0);
    let mut batch: Vec<&str> = Vec::new();
    let mut counts: Vec<(usize, usize)> = Vec::with_capacity(BATCH_OPS);
    let mut ids: Vec<BlobId> = Vec::new();
    let mut outs: Vec<&str> = Vec::new();
    for chunk in net.ops.chunks(BATCH_OPS) {
        batch.clear();
        counts.clear();
        for op in chunk {
            let before = batch.len();
            let n_in = scan_op(op, &mut batch, &mut outs)?;
            counts.push((n_in, batch.len() - before - n_in));
        }
        ids.clear();
        names.intern_batch(&batch, &mut ids);
        pass.grow(names.len(), &start_map, &names);
        let mut at = 0;
        for &(n_in, n_out) in &counts {
            let ins = &ids[at..at + n_in];
            let outs = &ids[at + n_in..at + n_in + n_out];
            pass.op(ins, outs, declared);
            at += n_in + n_out;
        }
    }
    // Names the checked reader interns after the ops' ones (in batches, as the ops' names).
    let mut ext_in: Vec<BlobId> = Vec::with_capacity(net.external_inputs.len());
    for chunk in net.external_inputs.chunks(BATCH_NAMES) {
        names.intern_batch(chunk, &mut ext_in);
    }
    for chunk in net.external_outputs.chunks(BATCH_NAMES) {
        ids.clear();
        names.intern_batch(chunk, &mut ids);
    }
    let start_ids: Vec<(BlobId, Version)> =
        start.iter().map(|&(n, v)| (names.intern(n), v)).collect();
    pass.grow(names.len(), &start_map, &names);
    Some(pass.finish(names, &ext_in, &start_ids))
}

impl Pass {
    /// `blob_versions` in Caffe2's order: the starting items, the external inputs, then each
    /// blob at its first op-phase event (its first write, or with no declared external input
    /// its first read) unless it was already there.
    fn finish(mut self, names: Names, ext_in: &[BlobId], start: &[(BlobId, Version)]) -> Ssa {
        let mut in_order = vec![false; names.len()];
        let mut order = Vec::with_capacity(self.events.len() + start.len() + ext_in.len());
        for &(b, _) in start {
            if !in_order[b.index()] {
                in_order[b.index()] = true;
                order.push(b);
            }
        }
        for &b in ext_in {
            if !in_order[b.index()] {
                in_order[b.index()] = true;
                order.push(b);
                // Declared and never written: version 0.
                let e = &mut self.blobs[b.index()];
                if !e.known {
                    e.known = true;
                    e.version = 0;
                }
            }
        }
        for &b in &self.events {
            if !in_order[b.index()] {
                in_order[b.index()] = true;
                order.push(b);
            }
        }
        Ssa::from_parts(
            names,
            self.in_off,
            self.inputs,
            self.out_off,
            self.outputs,
            self.values,
            self.blobs
                .iter()
                .map(|e| e.known.then_some(e.version))
                .collect(),
            order,
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::graph::NetIo;
    use crate::proto::{encode, Argument, NetDef, OperatorDef};

    fn checked(bytes: &[u8], start: &[(&str, Version)]) -> Ssa {
        Ssa::from_net_io(NetIo::from_bytes(bytes).unwrap(), start.iter().copied()).unwrap()
    }

    fn same(a: &Ssa, b: &Ssa) {
        let names = |s: &Ssa| {
            s.names()
                .iter()
                .map(|(_, n)| n.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(a), names(b));
        assert_eq!(a.len(), b.len());
        for op in 0..a.len() {
            assert_eq!(a.inputs(op), b.inputs(op), "inputs of op {op}");
            assert_eq!(a.outputs(op), b.outputs(op), "outputs of op {op}");
        }
        assert_eq!(a.num_values(), b.num_values());
        let bv = |s: &Ssa| s.blob_version_ids().collect::<Vec<_>>();
        assert_eq!(bv(a), bv(b));
        for (id, _) in a.names().iter() {
            assert_eq!(a.version_of(id), b.version_of(id));
        }
    }

    /// A deterministic pseudo-random net: ops reading and writing a small pool of blobs
    /// (in-place ops, repeated inputs and outputs), some with arguments.
    fn net(seed: u64, n_ops: usize, declared: bool) -> NetDef {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut net = NetDef::default();
        if declared {
            net.external_input = (0..3).map(|k| format!("b{k}")).collect();
        }
        for _ in 0..n_ops {
            let ins: Vec<String> = (0..next(4)).map(|_| format!("b{}", next(12))).collect();
            let outs: Vec<String> = (0..1 + next(2)).map(|_| format!("b{}", next(12))).collect();
            let mut op = OperatorDef::new("Op", ins, outs);
            if next(3) == 0 {
                op.arg.push(Argument {
                    name: Some("a".into()),
                    i: Some(1),
                    ..Default::default()
                });
            }
            net.op.push(op);
        }
        net.external_output.push("b1".into());
        net
    }

    #[test]
    fn same_as_the_checked_reader() {
        for seed in 0..40 {
            for declared in [false, true] {
                let bytes = encode(&net(seed, 50 + seed as usize, declared));
                for start in [&[][..], &[("b3", 7), ("zz", 2), ("b3", 9)][..]] {
                    let fast = ssa_from_bytes(&bytes, start).unwrap();
                    same(&fast, &checked(&bytes, start));
                }
            }
        }
    }

    #[test]
    fn unusual_nets_go_to_the_checked_reader() {
        let n = net(1, 5, true);
        // External inputs before the ops.
        let mut head = encode(&NetDef {
            external_input: vec!["q".into()],
            ..Default::default()
        });
        head.extend(encode(&NetDef {
            op: n.op.clone(),
            ..Default::default()
        }));
        assert!(ssa_from_bytes(&head, &[]).is_none());
        same(
            &Ssa::from_bytes(&head, None::<(&str, Version)>).unwrap(),
            &checked(&head, &[]),
        );
        // An output before an input inside an op.
        let odd = NetDef {
            op: vec![OperatorDef {
                output: vec!["o".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut bytes = encode(&odd);
        // Append an input to the op: rewrite the op with output then input.
        bytes.clear();
        let op_bytes = [0x12u8, 0x01, b'o', 0x0a, 0x01, b'i'];
        bytes.push(0x12);
        bytes.push(op_bytes.len() as u8);
        bytes.extend_from_slice(&op_bytes);
        assert!(ssa_from_bytes(&bytes, &[]).is_none());
        same(
            &Ssa::from_bytes(&bytes, None::<(&str, Version)>).unwrap(),
            &checked(&bytes, &[]),
        );
        // Malformed: the checked reader's error.
        assert!(ssa_from_bytes(&[0x12, 0x05], &[]).is_none());
        assert!(Ssa::from_bytes(&[0x12, 0x05], None::<(&str, Version)>).is_err());
        // A starting version that could overflow.
        let bytes = encode(&n);
        assert!(ssa_from_bytes(&bytes, &[("b1", i64::MAX)]).is_none());
        assert!(Ssa::from_bytes(&bytes, [("b1", i64::MAX)]).is_err());
        // A mistyped op type.
        let bad_type = [0x12u8, 0x02, 0x20, 0x01];
        assert!(ssa_from_bytes(&bad_type, &[]).is_none());
        assert!(Ssa::from_bytes(&bad_type, None::<(&str, Version)>).is_err());
    }

    #[test]
    fn external_outputs_before_external_inputs_go_to_the_checked_reader() {
        // external_output "y", then external_input "x": the checked reader interns y first.
        let bytes = [0x42u8, 0x01, b'y', 0x3a, 0x01, b'x'];
        assert!(ssa_from_bytes(&bytes, &[]).is_none());
        let ssa = Ssa::from_bytes(&bytes, None::<(&str, Version)>).unwrap();
        same(&ssa, &checked(&bytes, &[]));
        assert_eq!(ssa.names().iter().next().map(|(_, n)| n), Some("y"));
    }

    #[test]
    fn field_numbers_beyond_29_bits_are_errors_as_in_the_checked_reader() {
        // A varint field numbered 2^29 (a 33-bit key), in the net and inside an op.
        let wide = [0x80u8, 0x80, 0x80, 0x80, 0x10, 0x01];
        let mut top = encode(&net(1, 5, true));
        top.extend_from_slice(&wide);
        let mut in_op = vec![0x12u8, wide.len() as u8];
        in_op.extend_from_slice(&wide);
        for bytes in [top, in_op] {
            assert!(NetIo::from_bytes(&bytes).is_err());
            assert!(ssa_from_bytes(&bytes, &[]).is_none());
            assert!(Ssa::from_bytes(&bytes, None::<(&str, Version)>).is_err());
        }
    }
}
