//! Seeded random mutations of the golden NetDefs, OperatorDefs and PlanDefs: bit flips,
//! truncations, insertions, deletions, duplicated slices, splices and corrupted length
//! fields. Every mutant decodes to `Ok` or to `Err(Error::Decode)` naming the message, never
//! a panic; what decodes re-encodes to bytes that decode to the same message.

mod proto_support;

use ferrocaffe::proto::{self, Named, NetDef, OperatorDef, PlanDef};
use ferrocaffe::Error;
use proto_support::Sample;
use std::fmt::Debug;

/// splitmix64: tiny, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

/// Positions just after a byte that looks like a length-delimited tag.
fn length_positions(data: &[u8]) -> Vec<usize> {
    (0..data.len().saturating_sub(1))
        .filter(|&i| data[i] & 7 == 2 && data[i] >> 3 != 0)
        .map(|i| i + 1)
        .collect()
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let len = data.len();
    match rng.below(8) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.byte();
        }
        2 => data.truncate(rng.below(len + 1)),
        3 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
            data.splice(at..at, bytes);
        }
        4 if len > 0 => {
            let a = rng.below(len);
            let b = a + rng.below(len - a + 1);
            data.drain(a..b);
        }
        5 if len > 0 => {
            let a = rng.below(len);
            let b = a + rng.below((len - a).min(64) + 1);
            let slice = data[a..b].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, slice);
        }
        6 => {
            let cut = rng.below(len + 1);
            let from = rng.below(other.len() + 1);
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        _ => {
            // Corrupt a length: replace the varint after a length-delimited tag.
            let spots = length_positions(data);
            if spots.is_empty() {
                return;
            }
            let at = spots[rng.below(spots.len())];
            let old_end = (at..data.len())
                .find(|&i| data[i] & 0x80 == 0)
                .map_or(data.len(), |i| i + 1);
            let new = match rng.below(6) {
                0 => vec![0],
                1 => varint(u64::from(data[at] & 0x7f) + 1 + rng.below(4) as u64),
                2 => varint(u64::from(data[at] & 0x7f).saturating_sub(1 + rng.below(4) as u64)),
                3 => varint(u32::MAX as u64),
                4 => varint(u64::MAX),
                _ => vec![0xff; 11],
            };
            data.splice(at..old_end, new);
        }
    }
}

#[derive(Default, Debug)]
struct Tally {
    ok: usize,
    err: usize,
}

/// `from` names the seed for failure messages.
fn decode_mutant<M: Named + PartialEq + Debug>(data: &[u8], from: &str, tally: &mut Tally) {
    match proto::decode::<M>(data) {
        Ok(msg) => {
            tally.ok += 1;
            let bytes = proto::encode(&msg);
            let again: M = proto::decode(&bytes).unwrap_or_else(|e| {
                panic!(
                    "re-encoded {} does not decode: {e}; input {data:?}",
                    M::FULL_NAME
                )
            });
            assert_eq!(
                proto::encode(&again),
                bytes,
                "unstable; mutant of {from}: {data:?}"
            );
        }
        Err(Error::Decode { message, reason }) => {
            tally.err += 1;
            assert_eq!(message, M::FULL_NAME);
            assert!(!reason.is_empty());
        }
        Err(other) => panic!("{}: not a decode error: {other:?} ({from})", M::FULL_NAME),
    }
}

fn seeds() -> Vec<Sample> {
    let mut all: Vec<Sample> = proto_support::samples()
        .into_iter()
        .filter(|s| {
            matches!(
                s.kind,
                "caffe2.NetDef" | "caffe2.OperatorDef" | "caffe2.PlanDef"
            )
        })
        .filter(|s| !s.bytes.is_empty() && s.bytes.len() <= 4096)
        .collect();
    all.sort_by(|a, b| a.bytes.cmp(&b.bytes));
    all.dedup_by(|a, b| a.bytes == b.bytes);
    all
}

#[test]
fn mutated_golden_messages_decode_or_fail_cleanly() {
    let seeds = seeds();
    assert!(seeds.len() > 500, "only {} seed messages", seeds.len());
    let mut rng = Rng(0x5eed_ca1f_fe02);
    let (mut net, mut op, mut plan) = (Tally::default(), Tally::default(), Tally::default());
    const MUTANTS: usize = 30_000;
    for _ in 0..MUTANTS {
        let seed = &seeds[rng.below(seeds.len())];
        let mut data = seed.bytes.clone();
        let other = &seeds[rng.below(seeds.len())].bytes;
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut data, other);
        }
        decode_mutant::<NetDef>(&data, &seed.origin, &mut net);
        decode_mutant::<OperatorDef>(&data, &seed.origin, &mut op);
        decode_mutant::<PlanDef>(&data, &seed.origin, &mut plan);
    }
    eprintln!("NetDef {net:?}, OperatorDef {op:?}, PlanDef {plan:?}");
    // Both outcomes are common: the mutations reach past the first byte.
    for (name, t) in [("NetDef", &net), ("OperatorDef", &op), ("PlanDef", &plan)] {
        assert_eq!(t.ok + t.err, MUTANTS);
        assert!(t.ok > MUTANTS / 50, "{name}: {t:?}");
        assert!(t.err > MUTANTS / 50, "{name}: {t:?}");
    }
}

#[test]
fn random_bytes_decode_or_fail_cleanly() {
    let mut rng = Rng(42);
    let mut tally = Tally::default();
    for _ in 0..5_000 {
        let n = rng.below(64);
        let data: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
        decode_mutant::<NetDef>(&data, "random", &mut tally);
        decode_mutant::<OperatorDef>(&data, "random", &mut tally);
        decode_mutant::<PlanDef>(&data, "random", &mut tally);
    }
    assert!(tally.err > 1000, "{tally:?}");
}
