//! Memory optimization of nets by blob recycling: the two graph algorithms of Caffe2's
//! `memonger` (`caffe2/core/memonger.cc`, reached from Python as `memonger_*`).
//!
//! * [`optimize_inference_net`]: a linear pass over a simple net's ops. Each blob lives from
//!   the op that first writes it to the op that last reads it; a blob whose last reader has run
//!   goes on a free list (last in, first out), and an op's output that is written for the first
//!   time takes a blob from that list. Blobs that share storage are renamed `__m<k>_shared`.
//! * [`compute_blob_recycling_for_dag`]: a depth-first walk of the op graph from the given head
//!   blobs, for nets whose ops may run in parallel. A blob can be reused only by an op that
//!   carries every "token" of the ops that used the blob before (a token is created at each
//!   branch of the graph), so that two ops that may run at the same time never share a blob.
//!   The free list is a heap ordered by how often a blob was shared already; with blob shapes
//!   given, the free blob whose size fits best is taken instead. Shared blobs are renamed
//!   `<namescope>__m<k>_shared`; step nets of `RecurrentNetwork` ops are renamed too and the op
//!   records each renaming as a `<blob>.rename` argument, and so are the branches of `AsyncIf`
//!   ops.
//!
//! Both return a new net; the op order is unchanged. Names and choices follow Caffe2's exactly,
//! including the orders in which its C++ standard library containers were iterated
//! (`std_order`).

mod std_order;

use std::collections::{HashMap, HashSet};

use crate::error::{Error, Result};
use crate::proto::{Argument, NetDef, OperatorDef};
use crate::{bail, err};

use std_order::{pop_heap_min, push_heap_min, StdKeyOrder};

/// Checks every op whose type has a schema against it (Caffe2's `run_schema_check`, which the
/// memonger runs before changing a graph): counts of inputs and outputs, in-place rules.
pub fn run_schema_check(net: &NetDef) -> Result<()> {
    for (i, op) in net.op.iter().enumerate() {
        if let Some(schema) = crate::schema::lookup(op.r#type()) {
            schema.verify(op).map_err(
                |e| err!(Schema: "memonger: operator {i} did not pass schema checking: {e}"),
            )?;
        }
    }
    Ok(())
}

/// `memonger.optimize_inference_fast`: recycles the blobs of a simple (sequential) net, keeping
/// `static_blobs` as they are. Nets of another type, nets with a `RecurrentNetwork` op and nets
/// that were optimized already (a `__m<k>_shared` name is taken) come back unchanged.
pub fn optimize_inference_net(net: &NetDef, static_blobs: &[String]) -> Result<NetDef> {
    if !matches!(net.r#type(), "" | "simple") {
        return Ok(net.clone());
    }
    run_schema_check(net)?;
    if net.op.iter().any(|op| op.r#type() == "RecurrentNetwork") {
        return Ok(net.clone());
    }
    let static_blobs: HashSet<&str> = static_blobs.iter().map(String::as_str).collect();

    // First writer and last reader of each non-static blob that some op writes.
    let mut all_blobs: HashSet<&str> = HashSet::new();
    let mut ranges: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, op) in net.op.iter().enumerate() {
        for inp in &op.input {
            if let Some(r) = ranges.get_mut(inp.as_str()) {
                r.1 = i;
            }
            all_blobs.insert(inp);
        }
        for out in &op.output {
            all_blobs.insert(out);
            if !static_blobs.contains(out.as_str()) {
                ranges.entry(out).or_insert((i, i));
            }
        }
    }

    // Blob -> the blob whose storage it uses; a storage blob -> its shared name.
    let mut mapping: HashMap<&str, &str> = HashMap::new();
    let mut renaming: HashMap<&str, String> = HashMap::new();
    let mut free_blobs: Vec<&str> = Vec::new();
    for (i, op) in net.op.iter().enumerate() {
        let mut released = StdKeyOrder::new();
        for inp in &op.input {
            let inp = inp.as_str();
            if ranges.get(inp).is_some_and(|r| r.1 == i) {
                if let Some(&storage) = mapping.get(inp) {
                    released.insert(storage);
                } else {
                    released.insert(inp);
                    mapping.insert(inp, inp);
                    let shared = format!("__m{}_shared", renaming.len());
                    if all_blobs.contains(shared.as_str()) {
                        // The net was optimized already.
                        return Ok(net.clone());
                    }
                    renaming.insert(inp, shared);
                }
            }
        }
        for out in &op.output {
            if free_blobs.is_empty() {
                continue;
            }
            if ranges.get(out.as_str()).is_some_and(|r| r.0 == i) {
                if let Some(recycled) = free_blobs.pop() {
                    mapping.insert(out, recycled);
                }
            }
        }
        for b in released.iter() {
            // `released` holds names borrowed from the net; find the borrowed one.
            if let Some((&name, _)) = mapping.get_key_value(b) {
                free_blobs.push(name);
            }
        }
    }

    let rename = |b: &mut String| -> Result<()> {
        if let Some(&storage) = mapping.get(b.as_str()) {
            let shared = renaming.get(storage).ok_or_else(|| {
                err!(Runtime: "memonger: blob '{b}' was mapped to '{storage}', which has no shared name")
            })?;
            *b = shared.clone();
        }
        Ok(())
    };
    let mut out = net.clone();
    for op in &mut out.op {
        for b in op.input.iter_mut().chain(op.output.iter_mut()) {
            rename(b)?;
        }
    }
    Ok(out)
}

/// What [`compute_blob_recycling_for_dag`] works on besides the net: Caffe2's
/// `memonger_compute_blob_recycling_for_dag` arguments.
#[derive(Debug, Clone, Default)]
pub struct DagRecycling {
    /// The blobs the walk starts from (the net's inputs, or its losses for a backward pass).
    pub heads: Vec<String>,
    /// The ops whose outputs may be recycled, in net order.
    pub op_indices: Vec<usize>,
    /// The blobs that may share storage.
    pub shareable: HashSet<String>,
    /// Prefix of the shared blobs' names.
    pub namescope: String,
    /// Blobs that must keep their own storage once freed.
    pub dont_share: HashSet<String>,
    /// Shapes of blobs; when given, a free blob of fitting size is preferred.
    pub blob_shapes: HashMap<String, Vec<i64>>,
}

/// `memonger.share_grad_blobs` / `optimize_inference_for_dag`: recycles the shareable blobs
/// of a net that may run its ops in parallel (see the module documentation).
///
/// Errors (as Caffe2's enforcements, `RuntimeError` in Python): an op that fails its schema; an
/// op index out of range; a shareable input of an optimized op that no earlier optimized op
/// writes; an op reached twice by the walk.
pub fn compute_blob_recycling_for_dag(net: &NetDef, opts: &DagRecycling) -> Result<NetDef> {
    run_schema_check(net)?;
    for &i in &opts.op_indices {
        if i >= net.op.len() {
            bail!(
                InvalidArgument: "memonger: op index {i} is out of range for a net of {} ops",
                net.op.len()
            );
        }
    }
    let mut dag = Dag::new(net, opts)?;
    dag.walk()?;
    dag.name_shared_blobs();
    dag.apply(net)
}

/// A free blob: (minus the number of blobs already sharing it, name), in a min-heap.
type FreeBlob = (i64, String);

/// One op being processed by the walk, and where it is in visiting its consumers.
struct Frame {
    op: usize,
    tokens: HashSet<u64>,
    branches: usize,
    output: usize,
    consumer: usize,
}

struct Dag<'a> {
    net: &'a NetDef,
    opts: &'a DagRecycling,
    heads: HashSet<&'a str>,
    next_token: u64,
    /// Blob -> the optimized ops reading it (once per input slot).
    blob_to_ops: HashMap<String, Vec<usize>>,
    blob_input_count: HashMap<String, usize>,
    /// How many writes of its shareable inputs an op waits for.
    op_inputs: Vec<usize>,
    op_visited_count: Vec<usize>,
    op_visited: Vec<bool>,
    op_token_deposit: Vec<HashSet<u64>>,
    share_counts: HashMap<String, i64>,
    blob_sizes: HashMap<String, i64>,
    req_tokens: HashMap<String, HashSet<u64>>,
    optim_op_outputs: HashSet<String>,
    mapping: HashMap<String, String>,
    mapping_order: StdKeyOrder,
    blob_device: HashMap<String, (i32, i32)>,
    processed_outputs: HashSet<String>,
}

fn device_of(op: &OperatorDef) -> (i32, i32) {
    if op.r#type() == "CopyGPUToCPU" {
        // Runs on the GPU but its output lives on the CPU.
        return (0, 0);
    }
    op.device_option
        .as_ref()
        .map_or((0, 0), |d| (d.device_type(), d.device_id()))
}

fn op_label(net: &NetDef, i: usize) -> String {
    net.op.get(i).map_or_else(
        || format!("op {i}"),
        |op| format!("op {i} ({})", op.r#type()),
    )
}

impl<'a> Dag<'a> {
    fn new(net: &'a NetDef, opts: &'a DagRecycling) -> Result<Self> {
        let n = net.op.len();
        let mut dag = Dag {
            net,
            opts,
            heads: opts.heads.iter().map(String::as_str).collect(),
            next_token: 1,
            blob_to_ops: HashMap::new(),
            blob_input_count: HashMap::new(),
            op_inputs: vec![0; n],
            op_visited_count: vec![0; n],
            op_visited: vec![false; n],
            op_token_deposit: vec![HashSet::new(); n],
            share_counts: HashMap::new(),
            blob_sizes: HashMap::new(),
            req_tokens: HashMap::new(),
            optim_op_outputs: HashSet::new(),
            mapping: HashMap::new(),
            mapping_order: StdKeyOrder::new(),
            blob_device: HashMap::new(),
            processed_outputs: HashSet::new(),
        };
        // The outputs that may be renamed: shareable ones, unless they must keep their own
        // storage.
        for &i in &opts.op_indices {
            for out in &net.op[i].output {
                if opts.shareable.contains(out) && !opts.dont_share.contains(out) {
                    dag.optim_op_outputs.insert(out.clone());
                }
            }
        }
        // In-degrees: an op waits for every write (so far) of each shareable input that
        // optimized ops produce; other shareable inputs start with one user.
        let mut blob_seen: HashMap<&str, usize> = HashMap::new();
        for &i in &opts.op_indices {
            let op = &net.op[i];
            for inp in &op.input {
                if !(opts.shareable.contains(inp) || dag.heads.contains(inp.as_str())) {
                    continue;
                }
                if dag.optim_op_outputs.contains(inp) {
                    let Some(&seen) = blob_seen.get(inp.as_str()) else {
                        bail!(
                            Runtime: "memonger: input '{inp}' of {} was not output by an op \
                             before",
                            op_label(net, i)
                        );
                    };
                    dag.op_inputs[i] = dag.op_inputs[i].saturating_add(seen);
                } else {
                    dag.share_counts.insert(inp.clone(), 1);
                }
                dag.blob_to_ops.entry(inp.clone()).or_default().push(i);
            }
            for out in &op.output {
                *blob_seen.entry(out).or_insert(0) += 1;
                dag.blob_device.insert(out.clone(), device_of(op));
            }
        }
        Ok(dag)
    }

    fn mapped<'s>(&'s self, blob: &'s str) -> &'s str {
        self.mapping.get(blob).map_or(blob, String::as_str)
    }

    fn take_token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token = self.next_token.saturating_add(1);
        t
    }

    /// Walks depth first from the ops reading a head blob that wait for no other op (a head
    /// read by an op in the middle of the graph is reached through that op's parents).
    fn walk(&mut self) -> Result<()> {
        let opts = self.opts;
        for head in &opts.heads {
            let starts = self.blob_to_ops.get(head).cloned().unwrap_or_default();
            for op in starts {
                if self.op_visited[op] || self.op_inputs[op] != 0 {
                    continue;
                }
                let mut free_blobs: Vec<FreeBlob> = Vec::new();
                let tokens = HashSet::from([self.take_token()]);
                self.walk_from(op, tokens, &mut free_blobs)?;
            }
        }
        Ok(())
    }

    fn walk_from(
        &mut self,
        op: usize,
        mut tokens: HashSet<u64>,
        free_blobs: &mut Vec<FreeBlob>,
    ) -> Result<()> {
        let branches = self.enter(op, &mut tokens, free_blobs)?;
        let mut stack = vec![Frame {
            op,
            tokens,
            branches,
            output: 0,
            consumer: 0,
        }];
        while let Some(top) = stack.last_mut() {
            let op = &self.net.op[top.op];
            let Some(output) = op.output.get(top.output) else {
                stack.pop();
                continue;
            };
            let consumer = self
                .blob_to_ops
                .get(output)
                .and_then(|c| c.get(top.consumer))
                .copied();
            let Some(consumer) = consumer else {
                top.output += 1;
                top.consumer = 0;
                continue;
            };
            top.consumer += 1;
            self.op_visited_count[consumer] = self.op_visited_count[consumer].saturating_add(1);
            if self.op_visited_count[consumer] == self.op_inputs[consumer] {
                let mut child_tokens = top.tokens.clone();
                let branches = top.branches;
                if branches > 1 {
                    child_tokens.insert(self.take_token());
                }
                let child_branches = self.enter(consumer, &mut child_tokens, free_blobs)?;
                stack.push(Frame {
                    op: consumer,
                    tokens: child_tokens,
                    branches: child_branches,
                    output: 0,
                    consumer: 0,
                });
            } else if !self.op_visited[consumer] {
                let tokens = top.tokens.clone();
                self.op_token_deposit[consumer].extend(tokens);
            }
        }
        Ok(())
    }

    fn require_tokens(&mut self, blob: &str, tokens: &HashSet<u64>) {
        self.req_tokens
            .entry(blob.to_string())
            .or_default()
            .extend(tokens.iter().copied());
    }

    /// Processes one op: frees the shareable inputs it reads last and gives its outputs free
    /// blobs. Returns how many (output, reader) edges leave it.
    fn enter(
        &mut self,
        index: usize,
        tokens: &mut HashSet<u64>,
        free_blobs: &mut Vec<FreeBlob>,
    ) -> Result<usize> {
        let net = self.net;
        let opts = self.opts;
        tokens.extend(std::mem::take(&mut self.op_token_deposit[index]));
        if self.op_visited[index] {
            bail!(
                Runtime: "memonger: {} was reached a second time by the walk over the graph",
                op_label(net, index)
            );
        }
        self.op_visited[index] = true;
        let op = &net.op[index];

        for blob in op.input.iter().chain(op.output.iter()) {
            let actual = self.mapped(blob).to_string();
            self.require_tokens(&actual, tokens);
            if actual != *blob {
                self.require_tokens(blob, tokens);
            }
        }

        let mut new_free: Vec<FreeBlob> = Vec::new();
        let mut new_free_set: HashSet<String> = HashSet::new();
        for inp in &op.input {
            if !opts.shareable.contains(inp) {
                continue;
            }
            let count = self.blob_input_count.entry(inp.clone()).or_insert(0);
            *count += 1;
            let readers = self.blob_to_ops.get(inp).map_or(0, Vec::len);
            if *count == readers {
                let actual = self.mapped(inp).to_string();
                if !opts.dont_share.contains(&actual) {
                    let shares = self.share_counts.get(&actual).copied().unwrap_or(0);
                    new_free.push((-shares, actual.clone()));
                    new_free_set.insert(actual);
                }
            }
        }

        for out in &op.output {
            if !opts.shareable.contains(out)
                || self.processed_outputs.contains(out)
                || new_free_set.contains(out)
            {
                continue;
            }
            let device = self.blob_device.get(out).copied().unwrap_or((0, 0));
            if let Some(freed) = self.take_free_blob(out, tokens, free_blobs, device) {
                self.require_tokens(&freed, tokens);
                *self.share_counts.entry(freed.clone()).or_insert(0) += 1;
                self.mapping_order.insert(out);
                self.mapping.insert(out.clone(), freed);
            }
            self.processed_outputs.insert(out.clone());
        }

        let already_free: HashSet<String> = free_blobs.iter().map(|f| f.1.clone()).collect();
        for blob in new_free {
            if already_free.contains(&blob.1) {
                continue;
            }
            if !opts.blob_shapes.is_empty() && !self.blob_sizes.contains_key(&blob.1) {
                let size = self.blob_size(&blob.1);
                self.blob_sizes.insert(blob.1.clone(), size);
            }
            free_blobs.push(blob);
            push_heap_min(free_blobs);
        }

        Ok(op
            .output
            .iter()
            .map(|o| self.blob_to_ops.get(o).map_or(0, Vec::len))
            .sum())
    }

    fn blob_size(&self, blob: &str) -> i64 {
        self.opts.blob_shapes.get(blob).map_or(0, |dims| {
            dims.iter().fold(1i64, |a, &d| a.saturating_mul(d))
        })
    }

    /// Whether an op holding `tokens` on `device` may write into `blob`: the blob lives on the
    /// same device and every op that used it holds tokens the writer holds.
    fn can_use(&self, blob: &str, tokens: &HashSet<u64>, device: (i32, i32)) -> bool {
        if self.blob_device.get(blob).copied().unwrap_or((0, 0)) != device {
            return false;
        }
        self.req_tokens
            .get(blob)
            .is_none_or(|req| req.iter().all(|t| tokens.contains(t)))
    }

    fn take_free_blob(
        &mut self,
        blob: &str,
        tokens: &HashSet<u64>,
        free_blobs: &mut Vec<FreeBlob>,
        device: (i32, i32),
    ) -> Option<String> {
        if self.opts.blob_shapes.is_empty() {
            // The least shared free blob that can be used (heap order).
            let mut unusable = Vec::new();
            let mut found = None;
            while !free_blobs.is_empty() {
                pop_heap_min(free_blobs);
                let Some(cand) = free_blobs.pop() else {
                    break;
                };
                if self.can_use(&cand.1, tokens, device) {
                    found = Some(cand.1);
                    break;
                }
                unusable.push(cand);
            }
            for cand in unusable {
                free_blobs.push(cand);
                push_heap_min(free_blobs);
            }
            return found;
        }
        // The largest usable blob up to the wanted size, else the smallest one above it.
        let wanted = self.blob_size(blob);
        let mut best_size = -1i64;
        let mut best = None;
        for (i, cand) in free_blobs.iter().enumerate() {
            if !self.can_use(&cand.1, tokens, device) {
                continue;
            }
            let size = self.blob_sizes.get(&cand.1).copied().unwrap_or(0);
            if size >= best_size && (best_size < wanted || best_size >= size) {
                best_size = size;
                best = Some(i);
            }
        }
        best.map(|i| free_blobs.remove(i).1)
    }

    /// Gives the blobs that others were mapped to their shared names, in the order Caffe2
    /// visited its mapping, and points every mapped blob at its final name.
    fn name_shared_blobs(&mut self) {
        let ns = &self.opts.namescope;
        let mut renamed: HashMap<String, String> = HashMap::new();
        let mut renamed_order = StdKeyOrder::new();
        let mut index = 0usize;
        for key in self.mapping_order.iter() {
            let Some(target) = self.mapping.get(key) else {
                continue;
            };
            if !renamed_order.insert(target) {
                continue;
            }
            let name = if self.optim_op_outputs.contains(target) {
                let name = format!("{ns}__m{index}_shared");
                index += 1;
                name
            } else {
                target.clone()
            };
            renamed.insert(target.clone(), name);
        }

        // The storage blobs themselves map to their shared names too (a range insert, which
        // keeps the entries already there).
        for key in renamed_order.iter() {
            if let Some(name) = renamed.get(key) {
                self.mapping
                    .entry(key.to_string())
                    .or_insert_with(|| name.clone());
            }
        }
        self.mapping_order.insert_range(renamed_order.iter());

        // One pass over the mapping, in its order, following renamed targets.
        let keys: Vec<String> = self.mapping_order.iter().map(str::to_string).collect();
        for key in keys {
            let Some(target) = self.mapping.get(&key) else {
                continue;
            };
            if let Some(name) = renamed.get(target) {
                if name != target {
                    let name = name.clone();
                    renamed.insert(key.clone(), name.clone());
                    self.mapping.insert(key, name);
                }
            }
        }
    }

    fn apply(&self, net: &NetDef) -> Result<NetDef> {
        let mut out = net.clone();
        for op in &mut out.op {
            if op.r#type().starts_with("RecurrentNetwork") {
                self.apply_recurrent(op)?;
            }
            if op.r#type() == "AsyncIf" {
                self.apply_async_if(op)?;
            }
            for b in op.input.iter_mut().chain(op.output.iter_mut()) {
                if let Some(m) = self.mapping.get(b.as_str()) {
                    *b = m.clone();
                }
            }
        }
        Ok(out)
    }

    /// The branches of an `AsyncIf` op, their external inputs and outputs included.
    fn apply_async_if(&self, op: &mut OperatorDef) -> Result<()> {
        for arg in &mut op.arg {
            if arg.name() != "then_net" && arg.name() != "else_net" {
                continue;
            }
            let mut branch = self.apply(arg.n.as_ref().unwrap_or(&NetDef::default()))?;
            for b in branch
                .external_input
                .iter_mut()
                .chain(branch.external_output.iter_mut())
            {
                if let Some(m) = self.mapping.get(b.as_str()) {
                    *b = m.clone();
                }
            }
            arg.n = Some(branch);
        }
        Ok(())
    }

    fn apply_recurrent(&self, op: &mut OperatorDef) -> Result<()> {
        for arg in &mut op.arg {
            let name = arg.name();
            if name != "step_net" && name != "backward_step_net" {
                continue;
            }
            if let Some(step) = arg.n.as_ref() {
                if arg.s.is_some() {
                    bail!(
                        Runtime: "Invalid definition for {name} of {} op: only one of NetDef \
                         and string should be present",
                        op.r#type.as_deref().unwrap_or_default()
                    );
                }
                arg.n = Some(self.apply(step)?);
            } else if arg.s.as_ref().is_some_and(|s| !s.is_empty()) {
                return Err(Error::NotImplemented(format!(
                    "memonger: the {name} of a {} op is given in text format; renaming blobs \
                     inside it needs the step net as a NetDef argument",
                    op.r#type.as_deref().unwrap_or_default()
                )));
            }
        }
        let blobs: Vec<String> = op.input.iter().chain(op.output.iter()).cloned().collect();
        for b in blobs {
            if let Some(m) = self.mapping.get(&b) {
                if *m != b {
                    op.arg.push(Argument {
                        name: Some(format!("{b}.rename")),
                        s: Some(m.clone().into_bytes()),
                        ..Default::default()
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
