//! Dependency analysis of a recurrent step net unrolled over T timesteps.
//!
//! Every (timestep, op) pair is a task; tasks are numbered in the order the plain runner would
//! run them (all ops of the first step in net order, then the next step...). Each task reads
//! and writes *resources*:
//!
//! * a blob, by identity (its handle): blobs local to a step workspace are distinct per step
//!   (or shared by the steps that reuse a workspace), blobs of the op's or the shared
//!   workspace are one resource for all steps;
//! * a row of a linked buffer: reading or writing a linked blob touches rows
//!   `t + offset .. t + offset + window` of its buffer, found from the `rnn_internal_apply_link`
//!   op of the same step; `rnn_internal_accumulate_gradient_input` touches row `t + offset` of
//!   its destination.
//!
//! Replaying the accesses in sequential order gives the edges: read after write, write after
//! write, and write after read (which is what makes reused workspaces safe). Running tasks in
//! any order that respects them gives the same results as the sequential run, bit for bit.
//! An op that reads or writes a whole linked buffer by name makes the plan sequential.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::net::OpInstance;
use crate::ops::args::Args;
use crate::workspace::BlobHandle;

/// Type of the link op.
pub const APPLY_LINK: &str = "rnn_internal_apply_link";
/// Type of the gradient accumulation op.
pub const ACCUMULATE: &str = "rnn_internal_accumulate_gradient_input";
/// Type of the parameter gradient accumulation op.
pub const ACCUMULATE_PARAM: &str = "rnn_internal_accumulate_param_gradient";

/// The task graph of one run.
#[derive(Debug)]
pub struct Graph {
    /// Ops per step.
    pub ops_per_step: usize,
    /// Number of steps.
    pub steps: usize,
    /// Successors of each task (compressed rows: `succ[start[k]..start[k + 1]]`).
    pub succ: Vec<u32>,
    /// Row starts into `succ`.
    pub start: Vec<u32>,
    /// Number of predecessors of each task.
    pub preds: Vec<u32>,
    /// Whether the tasks must run one after another.
    pub sequential: bool,
    /// Link tasks that depend on nothing (their step has a workspace of its own): the threaded
    /// run does them first, in order, on the calling thread.
    pub prologue: Vec<u32>,
}

impl Graph {
    /// Number of tasks.
    pub fn num_tasks(&self) -> usize {
        self.preds.len()
    }

    /// The successors of task `k`.
    pub fn successors(&self, k: usize) -> &[u32] {
        &self.succ[self.start[k] as usize..self.start[k + 1] as usize]
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Res {
    Blob(usize),
    Row(usize, i64),
}

fn key(h: &BlobHandle) -> usize {
    Arc::as_ptr(h) as usize
}

#[derive(Default)]
struct Track {
    writer: Option<u32>,
    readers: Vec<u32>,
}

fn int_arg(op: &OpInstance, name: &str) -> i64 {
    Args::new(op.def()).int(name, 0).unwrap_or(0)
}

/// The graph of `steps[order[0]], steps[order[1]], ...`, each step being the op instances of
/// one timestep (same net, so the same number of ops) with that timestep's value.
pub fn build(steps: &[(usize, &[Mutex<OpInstance>])]) -> Graph {
    let per = steps.first().map_or(0, |s| s.1.len());
    let n = per * steps.len();
    let mut sequential = false;
    // Every linked buffer, over all steps.
    let mut externals: HashSet<usize> = HashSet::new();
    for (_, ops) in steps {
        for op in ops.iter() {
            let op = op.lock();
            if op.def().r#type() == APPLY_LINK && op.inputs().len() == 2 {
                externals.insert(key(&op.inputs()[1]));
            }
        }
    }
    let mut tracks: HashMap<Res, Track> = HashMap::new();
    let mut edges: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut preds = vec![0u32; n];
    let mut is_link = vec![false; n];
    let mut acc: Vec<(Res, bool)> = Vec::new();
    let mut deps: Vec<u32> = Vec::new();
    for (s, (t, ops)) in steps.iter().enumerate() {
        let t = *t as i64;
        let mut links: HashMap<usize, (usize, i64, i64)> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let op = op.lock();
            let k = (s * per + i) as u32;
            acc.clear();
            let ty = op.def().r#type();
            let (ins, outs) = (op.inputs(), op.outputs());
            if ty == APPLY_LINK && ins.len() == 2 && outs.len() == 2 {
                is_link[k as usize] = true;
                let (off, win) = (int_arg(&op, "offset"), int_arg(&op, "window"));
                links.insert(key(&outs[0]), (key(&ins[1]), t + off, win));
                acc.push((Res::Blob(key(&ins[0])), false));
                acc.push((Res::Blob(key(&outs[0])), true));
            } else if ty == ACCUMULATE && ins.len() == 3 && outs.len() == 1 {
                acc.push((Res::Blob(key(&ins[0])), false));
                acc.push((Res::Blob(key(&ins[1])), false));
                acc.push((Res::Row(key(&outs[0]), t + int_arg(&op, "offset")), true));
                if externals.contains(&key(&ins[1])) {
                    sequential = true;
                }
            } else {
                for (list, write) in [(ins, false), (outs, true)] {
                    for h in list {
                        let b = key(h);
                        acc.push((Res::Blob(b), write));
                        if externals.contains(&b) {
                            sequential = true;
                        }
                        if let Some(&(ext, first, win)) = links.get(&b) {
                            for r in first..first + win {
                                acc.push((Res::Row(ext, r), write));
                            }
                        }
                    }
                }
            }
            // One access per resource; a write covers a read.
            acc.sort_by_key(|&(r, w)| (hash_of(r), !w));
            acc.dedup_by(|later, first| later.0 == first.0);
            deps.clear();
            for &(r, w) in &acc {
                let tr = tracks.entry(r).or_default();
                deps.extend(tr.writer);
                if w {
                    deps.extend(tr.readers.iter().copied());
                }
            }
            deps.sort_unstable();
            deps.dedup();
            for &d in &deps {
                if d != k {
                    edges[d as usize].push(k);
                    preds[k as usize] += 1;
                }
            }
            for &(r, w) in &acc {
                let tr = tracks.entry(r).or_default();
                if w {
                    tr.writer = Some(k);
                    tr.readers.clear();
                } else {
                    tr.readers.push(k);
                }
            }
        }
    }
    let prologue = (0..n)
        .filter(|&k| preds[k] == 0 && is_link[k])
        .map(|k| k as u32)
        .collect();
    let mut start = Vec::with_capacity(n + 1);
    let mut succ = Vec::new();
    start.push(0);
    for e in edges {
        succ.extend(e);
        start.push(succ.len() as u32);
    }
    Graph {
        ops_per_step: per,
        steps: steps.len(),
        succ,
        start,
        preds,
        sequential,
        prologue,
    }
}

fn hash_of(r: Res) -> (u8, usize, i64) {
    match r {
        Res::Blob(b) => (0, b, 0),
        Res::Row(b, row) => (1, b, row),
    }
}
