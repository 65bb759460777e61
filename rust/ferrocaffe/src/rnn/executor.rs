//! The threaded step executor (`enable_rnn_executor`).
//!
//! Each timestep gets its own instances of the step net's ops, in the step's workspace, with
//! the timestep input renamed to a blob of its own (`<timestep>_rnnexec_t<t>`, holding `t`),
//! so that steps sharing a workspace (forward-only nets cycle over a few) still read their
//! own timestep. [`analysis::build`] turns the unrolled net into a task graph once per
//! sequence length (again only when a step is re-instantiated); then each run executes the
//! tasks on `num_threads` threads (the calling one included) as their predecessors finish.
//! At most `max_parallel_timesteps` consecutive steps are in flight: a task of step `s` starts
//! only once every task of step `s - max_parallel_timesteps` is done. Ready tasks are taken
//! earliest (in sequential order) first; a worker that finishes a task goes on with the next
//! ready one and wakes the others only when more are ready, so chains of dependent tasks do not
//! bounce between threads. Link ops that depend on nothing (every step has a workspace of its
//! own) only make views: they run first, in order, on the calling thread. A task that starts
//! while another is running keeps its products on its own thread
//! ([`crate::blas::single_threaded`]); a task running alone shares them with the GEMM helper.
//!
//! The first failing task stops the run: no new task starts, running ones finish, and the
//! error names the op and the timestep. Instances and the graph are kept, so the op can run
//! again.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::analysis::{self, Graph, APPLY_LINK};
use super::steps::set_timestep;
use crate::bail;
use crate::error::{Error, Result};
use crate::net::{instantiate_ops, OpInstance};
use crate::proto::NetDef;
use crate::workspace::{Blob, Workspace};

/// The op instances of one timestep.
struct Step {
    ws: Arc<Workspace>,
    ops: Vec<Mutex<OpInstance>>,
}

/// Runs a step net over many timesteps on worker threads.
pub struct RnnExecutor {
    net: NetDef,
    timestep: String,
    steps: Vec<Option<Step>>,
    /// (number of steps, direction) the cached graph was built for.
    graph: Option<((usize, bool), Graph)>,
    num_threads: usize,
    max_parallel: usize,
    peak_span: usize,
}

/// The default number of worker threads: the machine's parallelism, at most 4 — or 1 when
/// GEMMs are threaded themselves ([`crate::blas::gemm_is_threaded`]: a CBLAS library's pool,
/// or ferrocaffe's own GEMM sharing each product out to the team of compute threads): the products
/// already use every core (measured on 2 cores: a 2-layer LSTM ran 1.3x slower on 2 executor
/// threads than on 1 with OpenBLAS, 1.06x slower with ferrocaffe's GEMM).
pub fn default_threads() -> usize {
    if crate::blas::gemm_is_threaded() {
        return 1;
    }
    crate::threads::num_threads().min(4)
}

impl RnnExecutor {
    /// An executor for `net` whose timestep blob is `timestep`. `num_threads` 0 picks
    /// [`default_threads`]; `max_parallel` 0 means no bound.
    pub fn new(net: NetDef, timestep: &str, num_threads: usize, max_parallel: usize) -> Self {
        RnnExecutor {
            net,
            timestep: timestep.to_string(),
            steps: Vec::new(),
            graph: None,
            num_threads: if num_threads == 0 {
                default_threads()
            } else {
                num_threads
            },
            max_parallel,
            peak_span: 0,
        }
    }

    /// In the last run: the largest `s - f + 1` over tasks started, `s` being the task's step
    /// and `f` the first unfinished step (at most the `max_parallel_timesteps` bound; 1 when
    /// the steps ran one after another).
    pub fn last_peak_span(&self) -> usize {
        self.peak_span
    }

    /// The step net (with its link ops).
    pub fn net(&self) -> &NetDef {
        &self.net
    }

    /// Sets the number of worker threads (at least 1).
    pub fn set_num_threads(&mut self, n: usize) {
        self.num_threads = n.max(1);
    }

    /// Bounds the number of timesteps in flight (0: no bound).
    pub fn set_max_parallel_timesteps(&mut self, n: usize) {
        self.max_parallel = n;
    }

    /// Name of the timestep blob of step `t`.
    pub fn timestep_blob(&self, t: usize) -> String {
        format!("{}_rnnexec_t{t}", self.timestep)
    }

    /// Makes sure timestep `t` has op instances in `ws` (creating them, and the timestep
    /// blob, when `t` is new or its workspace changed).
    pub fn ensure_timestep(&mut self, t: usize, ws: &Arc<Workspace>) -> Result<()> {
        if self.steps.len() <= t {
            self.steps.resize_with(t + 1, || None);
        }
        let name = self.timestep_blob(t);
        if let Some(s) = &self.steps[t] {
            if Arc::ptr_eq(&s.ws, ws) {
                set_timestep(ws, &name, t)?;
                return Ok(());
            }
        }
        self.steps[t] = None;
        self.graph = None;
        set_timestep(ws, &name, t)?;
        let mut def = self.net.clone();
        for op in &mut def.op {
            for input in &mut op.input {
                if *input == self.timestep {
                    input.clone_from(&name);
                }
            }
        }
        let ops = instantiate_ops(&def, ws)
            .map_err(|e| e.map_message(|m| format!("{m} [RNN executor, timestep {t}]")))?;
        self.steps[t] = Some(Step {
            ws: ws.clone(),
            ops: ops.into_iter().map(Mutex::new).collect(),
        });
        Ok(())
    }

    /// Runs timesteps `0..seq_len` (backward: `seq_len - 1` down to 0), all initialized with
    /// [`ensure_timestep`](Self::ensure_timestep).
    pub fn run(&mut self, seq_len: usize, backward: bool) -> Result<()> {
        let order: Vec<usize> = if backward {
            (0..seq_len).rev().collect()
        } else {
            (0..seq_len).collect()
        };
        let mut steps: Vec<&Step> = Vec::with_capacity(seq_len);
        for &t in &order {
            match self.steps.get(t).and_then(Option::as_ref) {
                Some(s) => steps.push(s),
                None => {
                    bail!(Runtime: "RNN executor: timestep {t} was not initialized")
                }
            }
        }
        let cached = matches!(&self.graph, Some((k, _)) if *k == (seq_len, backward));
        if !cached {
            let views: Vec<(usize, &[Mutex<OpInstance>])> = order
                .iter()
                .zip(&steps)
                .map(|(&t, s)| (t, s.ops.as_slice()))
                .collect();
            self.graph = Some(((seq_len, backward), analysis::build(&views)));
        }
        let Some((_, graph)) = &self.graph else {
            bail!(Runtime: "RNN executor: no task graph");
        };
        make_links_writable(&steps);
        let run = Run {
            graph,
            steps: &steps,
            order: &order,
            net: self.net.name(),
        };
        if self.num_threads <= 1 || graph.sequential || graph.num_tasks() <= 1 {
            self.peak_span = usize::from(graph.num_tasks() > 0);
            (0..graph.num_tasks()).try_for_each(|k| run.task(k))
        } else {
            let (r, peak) = run.parallel(self.num_threads, self.max_parallel);
            self.peak_span = peak;
            r
        }
    }
}

/// Gives every linked buffer a buffer of its own before tasks write views of it from several
/// threads (a buffer shared copy-on-write would otherwise be copied by the first write while
/// other views read it).
fn make_links_writable(steps: &[&Step]) {
    let mut seen: Vec<usize> = Vec::new();
    for s in steps.iter().take(1) {
        for op in &s.ops {
            let op = op.lock();
            if op.def().r#type() != APPLY_LINK || op.inputs().len() != 2 {
                continue;
            }
            let h = &op.inputs()[1];
            let k = Arc::as_ptr(h) as usize;
            if seen.contains(&k) {
                continue;
            }
            seen.push(k);
            let mut b = h.write();
            if let Blob::Tensor(t) = &mut *b {
                if t.dtype() != crate::tensor::DataType::String {
                    t.bytes_mut();
                }
            }
        }
    }
}

struct Run<'a> {
    graph: &'a Graph,
    steps: &'a [&'a Step],
    order: &'a [usize],
    net: &'a str,
}

struct Sched {
    ready: BinaryHeap<Reverse<u32>>,
    preds: Vec<u32>,
    /// Unfinished tasks per step.
    left: Vec<u32>,
    /// Tasks whose predecessors are done but whose step is too far ahead, per step.
    parked: Vec<Vec<u32>>,
    /// First step with unfinished tasks.
    frontier: usize,
    done: usize,
    /// Tasks running now.
    running: usize,
    peak_span: usize,
    failed: Option<Error>,
}

impl Run<'_> {
    fn task(&self, k: usize) -> Result<()> {
        let per = self.graph.ops_per_step;
        let (s, i) = (k / per, k % per);
        let step = self.steps[s];
        let mut op = step.ops[i].lock();
        op.run(&step.ws).map_err(|e| {
            e.map_message(|m| {
                format!(
                    "{m} [recurrent step net '{}', timestep {}, op #{i} ({})]",
                    self.net,
                    self.order[s],
                    op.def().r#type()
                )
            })
        })
    }

    fn parallel(&self, threads: usize, max_parallel: usize) -> (Result<()>, usize) {
        let g = self.graph;
        let n = g.num_tasks();
        let per = g.ops_per_step.max(1);
        let window = if max_parallel == 0 {
            usize::MAX
        } else {
            max_parallel
        };
        let mut sched = Sched {
            ready: BinaryHeap::new(),
            preds: g.preds.clone(),
            left: vec![per as u32; g.steps],
            parked: vec![Vec::new(); g.steps],
            frontier: 0,
            done: 0,
            running: 0,
            peak_span: 0,
            failed: None,
        };
        let mut in_prologue = vec![false; n];
        for &k in &g.prologue {
            in_prologue[k as usize] = true;
        }
        for (k, &pro) in in_prologue.iter().enumerate() {
            if sched.preds[k] == 0 && !pro {
                release(&mut sched, k as u32, per, window);
            }
        }
        for &k in &g.prologue {
            if let Err(e) = self.task(k as usize) {
                return (Err(e), 1);
            }
            finish(&mut sched, g, k as usize, per, window);
        }
        if sched.done == n {
            return (Ok(()), 1);
        }
        let state = Mutex::new(sched);
        let wake = Condvar::new();
        let work = || {
            let mut st = state.lock();
            loop {
                if st.failed.is_some() || st.done == n {
                    break;
                }
                let Some(Reverse(k)) = st.ready.pop() else {
                    wake.wait(&mut st);
                    continue;
                };
                st.peak_span = st.peak_span.max(k as usize / per - st.frontier + 1);
                st.running += 1;
                // A task that starts while another runs keeps its products on its own
                // thread: the GEMM helper spinning beside two busy workers would take a core
                // from one of them (a 2-layer LSTM on 2 workers ran 1.3x slower). Alone, it
                // splits them with the helper as usual (one layer's chain of steps).
                let others = st.running > 1;
                drop(st);
                let r = if others {
                    crate::blas::single_threaded(|| self.task(k as usize))
                } else {
                    self.task(k as usize)
                };
                st = state.lock();
                st.running -= 1;
                if let Err(e) = r {
                    if st.failed.is_none() {
                        st.failed = Some(e);
                    }
                    wake.notify_all();
                    break;
                }
                finish(&mut st, g, k as usize, per, window);
                // This worker takes the next ready task itself; others are woken only for
                // the rest (a chain of dependent tasks then stays on one thread).
                if st.done == n || st.ready.len() > 1 {
                    wake.notify_all();
                }
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..threads.min(n) {
                scope.spawn(work);
            }
            work();
        });
        let mut st = state.into_inner();
        let r = match st.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        (r, st.peak_span)
    }
}

/// Task `k` has no unfinished predecessor: ready, or parked until its step is in the window.
fn release(st: &mut Sched, k: u32, per: usize, window: usize) {
    let s = k as usize / per;
    if s - st.frontier < window {
        st.ready.push(Reverse(k));
    } else {
        st.parked[s].push(k);
    }
}

fn finish(st: &mut Sched, g: &Graph, k: usize, per: usize, window: usize) {
    st.done += 1;
    for &q in g.successors(k) {
        st.preds[q as usize] -= 1;
        if st.preds[q as usize] == 0 {
            release(st, q, per, window);
        }
    }
    let s = k / per;
    st.left[s] -= 1;
    while st.frontier < st.left.len() && st.left[st.frontier] == 0 {
        st.frontier += 1;
        if let Some(newly) = st.frontier.checked_add(window - 1) {
            if newly < st.parked.len() {
                let parked = std::mem::take(&mut st.parked[newly]);
                for q in parked {
                    st.ready.push(Reverse(q));
                }
            }
        }
    }
}
