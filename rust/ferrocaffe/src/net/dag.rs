//! The `dag` / `async_scheduling` executor: an op runs as soon as every op it depends on has
//! finished, on a pool of `num_workers` threads.
//!
//! Dependencies come from the resolved blob handles (so aliases through parent workspaces are
//! seen): an op depends on the last writer of each blob it reads or writes (read-after-write,
//! write-after-write) and on every reader since that write of each blob it writes
//! (write-after-read). Blobs named in `control_input` count as reads for ordering. Executing in any order compatible with these edges gives the same results
//! as running the ops in net order. Pools are shared between nets of the same size; a
//! `num_workers` above [`super::max_threads`] gets that many threads, and only the
//! [`MAX_POOLS`] most recently used pool sizes are kept, so that nets of many sizes do not
//! keep threads for ever.
//!
//! Dependencies are per blob: two blobs whose tensors alias one storage (the `Alias` op, RNN
//! link views) are not seen as related, as in Caffe2; nets that write through such aliases
//! should use the `simple` executor or order the ops through a shared blob.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::OpInstance;
use crate::error::{Error, Result};
use crate::workspace::Workspace;

/// Ops with their dependency graph.
pub struct DagNet {
    ops: Vec<Mutex<OpInstance>>,
    /// Ops that depend on op i.
    children: Vec<Vec<usize>>,
    /// Number of ops op i depends on.
    indegree: Vec<usize>,
    roots: Vec<usize>,
    workers: usize,
}

/// At most this many thread pools are kept between runs (the least recently used one is let
/// go, its threads ending when no net runs on it any more).
pub const MAX_POOLS: usize = 4;

/// The kept pools by worker count, the most recently used last.
type Pools = Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>>;

fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(Default::default)
}

/// A pool of `workers` threads (at most [`super::max_threads`]), shared by the nets of that
/// size; only the [`MAX_POOLS`] most recently used sizes are kept.
fn pool(workers: usize) -> Result<Arc<rayon::ThreadPool>> {
    let workers = workers.clamp(1, super::max_threads());
    let mut pools = pools().lock();
    if let Some(k) = pools.iter().position(|(w, _)| *w == workers) {
        let entry = pools.remove(k);
        let p = entry.1.clone();
        pools.push(entry);
        return Ok(p);
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .thread_name(|i| format!("ferrocaffe-dag-{i}"))
        .build()
        .map_err(|e| Error::Runtime(format!("cannot start {workers} dag workers: {e}")))?;
    let p = Arc::new(p);
    if pools.len() >= MAX_POOLS {
        pools.remove(0);
    }
    pools.push((workers, p.clone()));
    Ok(p)
}

/// How many thread pools are kept now (at most [`MAX_POOLS`]).
pub fn pool_count() -> usize {
    pools().lock().len()
}

/// Dependency edges of `ops` (see the module docs): `children[i]` lists the ops after `i`.
pub fn dependencies(ops: &[OpInstance]) -> Vec<Vec<usize>> {
    #[derive(Default)]
    struct State {
        writer: Option<usize>,
        readers: Vec<usize>,
    }
    let mut state: HashMap<usize, State> = HashMap::new();
    let mut parents: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    for (i, op) in ops.iter().enumerate() {
        let mut deps = Vec::new();
        for h in op.inputs().iter().chain(op.control_inputs()) {
            let s = state.entry(Arc::as_ptr(h) as usize).or_default();
            deps.extend(s.writer);
        }
        for h in op.outputs() {
            let s = state.entry(Arc::as_ptr(h) as usize).or_default();
            deps.extend(s.writer);
            deps.extend(s.readers.iter().copied());
        }
        for h in op.inputs() {
            let s = state.entry(Arc::as_ptr(h) as usize).or_default();
            s.readers.push(i);
        }
        for h in op.outputs() {
            let s = state.entry(Arc::as_ptr(h) as usize).or_default();
            s.writer = Some(i);
            s.readers.clear();
        }
        deps.retain(|&d| d != i);
        deps.sort_unstable();
        deps.dedup();
        parents[i] = deps;
    }
    let mut children = vec![Vec::new(); ops.len()];
    for (i, ps) in parents.iter().enumerate() {
        for &p in ps {
            children[p].push(i);
        }
    }
    children
}

struct RunState<'a> {
    net: &'a DagNet,
    ws: &'a Arc<Workspace>,
    pending: Vec<AtomicUsize>,
    failed: AtomicBool,
    error: Mutex<Option<(usize, Error)>>,
}

impl RunState<'_> {
    fn run_from<'s>(&'s self, scope: &rayon::Scope<'s>, mut i: usize) {
        loop {
            if self.failed.load(Ordering::Acquire) {
                return;
            }
            if let Err(e) = self.net.ops[i].lock().run(self.ws) {
                self.failed.store(true, Ordering::Release);
                let mut slot = self.error.lock();
                // Keep the error of the earliest op in net order, for determinism.
                if slot.as_ref().is_none_or(|(k, _)| i < *k) {
                    *slot = Some((i, e));
                }
                return;
            }
            let mut next = None;
            for &c in &self.net.children[i] {
                if self.pending[c].fetch_sub(1, Ordering::AcqRel) == 1 {
                    match next {
                        None => next = Some(c),
                        Some(_) => scope.spawn(move |s| self.run_from(s, c)),
                    }
                }
            }
            match next {
                Some(c) => i = c,
                None => return,
            }
        }
    }
}

impl DagNet {
    /// Over instantiated ops, with `num_workers` threads (at least 1; 0 means 4; at most
    /// [`super::max_threads`]).
    pub fn new(ops: Vec<OpInstance>, num_workers: i32) -> Self {
        let children = dependencies(&ops);
        let mut indegree = vec![0; ops.len()];
        for cs in &children {
            for &c in cs {
                indegree[c] += 1;
            }
        }
        let roots = (0..ops.len()).filter(|&i| indegree[i] == 0).collect();
        let workers = if num_workers <= 0 {
            4
        } else {
            num_workers as usize
        };
        DagNet {
            ops: ops.into_iter().map(Mutex::new).collect(),
            children,
            indegree,
            roots,
            workers,
        }
    }

    /// Number of ops.
    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }

    /// Runs every op once, in dependency order, on the pool.
    pub fn run(&mut self, ws: &Arc<Workspace>) -> Result<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        if self.workers == 1 {
            for op in &self.ops {
                op.lock().run(ws)?;
            }
            return Ok(());
        }
        let pool = pool(self.workers)?;
        let state = RunState {
            net: self,
            ws,
            pending: self.indegree.iter().map(|&d| AtomicUsize::new(d)).collect(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        };
        pool.in_place_scope(|s| {
            for &r in &self.roots {
                let st = &state;
                s.spawn(move |s| st.run_from(s, r));
            }
        });
        match state.error.into_inner() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{NetDef, OperatorDef};
    use crate::tensor::Tensor;

    #[test]
    fn edges_cover_raw_war_waw_and_control_inputs() {
        let ws = Workspace::new();
        ws.feed("a", Tensor::from_vec(&[1], vec![1.0f32]).unwrap());
        ws.feed("c", Tensor::from_vec(&[1], vec![2.0f32]).unwrap());
        let mut last = OperatorDef::new("Relu", ["c"], ["z"]);
        last.control_input.push("b".into());
        let net = NetDef {
            op: vec![
                OperatorDef::new("Relu", ["a"], ["b"]), // 0
                OperatorDef::new("Relu", ["c"], ["a"]), // 1: WAR on a after 0
                OperatorDef::new("Relu", ["a"], ["a"]), // 2: RAW + WAW after 1
                OperatorDef::new("Relu", ["c"], ["y"]), // 3: independent
                last,                                   // 4: control input b after 0
            ],
            ..Default::default()
        };
        let ops = crate::net::instantiate_ops(&net, &ws).unwrap();
        let children = dependencies(&ops);
        assert_eq!(children[0], vec![1, 4]);
        assert_eq!(children[1], vec![2]);
        assert!(children[2].is_empty() && children[3].is_empty());
    }

    #[test]
    fn pools_stay_bounded_over_many_worker_counts() {
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_vec(&[2], vec![-1.0f32, 2.0]).unwrap());
        let net = NetDef {
            op: vec![
                OperatorDef::new("Relu", ["x"], ["a"]),
                OperatorDef::new("Relu", ["x"], ["b"]),
                OperatorDef::new("Add", ["a", "b"], ["y"]),
            ],
            ..Default::default()
        };
        for workers in 2..60 {
            let ops = crate::net::instantiate_ops(&net, &ws).unwrap();
            let mut dag = DagNet::new(ops, workers);
            dag.run(&ws).unwrap();
            let y = ws.blob("y").unwrap();
            let y = y.read();
            assert_eq!(y.tensor().unwrap().as_slice::<f32>().unwrap(), &[0.0, 4.0]);
            assert!(pool_count() <= MAX_POOLS, "{} pools", pool_count());
        }
        // A request far above the cap runs on a capped pool.
        let ops = crate::net::instantiate_ops(&net, &ws).unwrap();
        DagNet::new(ops, 100_000).run(&ws).unwrap();
        let kept: Vec<usize> = pools().lock().iter().map(|(w, _)| *w).collect();
        assert!(
            kept.iter().all(|&w| w <= crate::net::max_threads()),
            "{kept:?}"
        );
        assert!(kept.len() <= MAX_POOLS);
    }
}
