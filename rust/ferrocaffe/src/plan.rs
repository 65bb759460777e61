//! Plans: `PlanDef` / `ExecutionStep` runner, with Caffe2's plan-executor semantics.
//!
//! * Top-level steps run in order; each is compiled just before it runs (its nets are created
//!   then, from the plan's `network` list, replacing a workspace net of the same name once).
//!   A step with `create_workspace` is compiled anew, in a fresh child workspace, every time it
//!   runs; other steps are compiled once.
//! * A step has either `network`s or `substep`s. It iterates while its continuation test holds:
//!   `num_iter` times (default 1), or, with `should_stop_blob`, until that blob holds `true`
//!   (checked after every net and after every sequential substep, ending the step), or once
//!   with `only_once`.
//! * `concurrent_substeps` (more than one substep) or `num_concurrent_instances` > 1: each
//!   iteration runs `substeps × instances` tasks, task `k` running substep `k % substeps`, on
//!   at most [`crate::net::max_threads`] threads (the calling one included; more when there are
//!   more substeps, up to [`MAX_SUBSTEP_THREADS`], so that every substep of a step runs
//!   concurrently with the others, as producer and consumer substeps need), taking tasks in
//!   order; once a task fails no further task starts, and the first failure is reported after
//!   the running ones finish.
//! * Substeps with `run_every_ms`, and the `report_net` (every `report_interval` seconds), run on
//!   reporter threads while the step runs, and once more when it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::proto::{ExecutionStep, NetDef, PlanDef};
use crate::workspace::{Blob, BlobHandle, SharedNet, Workspace};

type ShouldContinue = Arc<dyn Fn(i64) -> bool + Send + Sync>;

struct NetDefInfo<'p> {
    def: &'p NetDef,
    needs_override: bool,
}

type NetDefs<'p> = Mutex<HashMap<String, NetDefInfo<'p>>>;

impl Workspace {
    /// Runs a plan (see the module docs).
    pub fn run_plan(self: &Arc<Self>, plan: &PlanDef) -> Result<()> {
        run_plan(self, plan)
    }
}

/// Runs `plan` in `ws`.
pub fn run_plan(ws: &Arc<Workspace>, plan: &PlanDef) -> Result<()> {
    let mut defs = HashMap::new();
    for net in &plan.network {
        let name = net.name().to_string();
        if defs.contains_key(&name) {
            return Err(Error::BadArgument(format!(
                "Your plan contains networks of the same name \"{name}\", which should not happen. Check your plan to see if you made a programming error in creating the plan."
            )));
        }
        let needs_override = ws.get_net(&name).is_some();
        defs.insert(
            name,
            NetDefInfo {
                def: net,
                needs_override,
            },
        );
    }
    let defs = Mutex::new(defs);
    let always: ShouldContinue = Arc::new(|_| true);
    for step in &plan.execution_step {
        let wrapper = StepWrapper::new(step, ws.clone(), always.clone(), &defs)?;
        execute(&wrapper)?;
    }
    Ok(())
}

struct StepWrapper<'p> {
    step: &'p ExecutionStep,
    ws: Arc<Workspace>,
    ext: ShouldContinue,
    defs: &'p NetDefs<'p>,
    compiled: Option<Arc<Compiled<'p>>>,
}

impl<'p> StepWrapper<'p> {
    fn new(
        step: &'p ExecutionStep,
        ws: Arc<Workspace>,
        ext: ShouldContinue,
        defs: &'p NetDefs<'p>,
    ) -> Result<Self> {
        let mut w = StepWrapper {
            step,
            ws,
            ext,
            defs,
            compiled: None,
        };
        if !step.create_workspace() {
            w.compiled = Some(Arc::new(w.compile()?));
        }
        Ok(w)
    }

    fn compiled(&self) -> Result<Arc<Compiled<'p>>> {
        match &self.compiled {
            Some(c) => Ok(c.clone()),
            None => Ok(Arc::new(self.compile()?)),
        }
    }

    fn compile(&self) -> Result<Compiled<'p>> {
        let step = self.step;
        let ws = if step.create_workspace() {
            Workspace::new_child(&self.ws)
        } else {
            self.ws.clone()
        };
        if !step.substep.is_empty() && !step.network.is_empty() {
            return Err(Error::Schema(
                "An ExecutionStep should either have substep or networks but not both.".into(),
            ));
        }
        let got_failure = Arc::new(AtomicBool::new(false));
        let mut recurring = Vec::new();
        let mut report_substeps = Vec::new();
        let mut networks = Vec::new();
        if !step.substep.is_empty() {
            let sub_continue: ShouldContinue =
                if !step.concurrent_substeps() || step.substep.len() <= 1 {
                    self.ext.clone()
                } else {
                    let ext = self.ext.clone();
                    let failed = got_failure.clone();
                    Arc::new(move |it| !failed.load(Ordering::Acquire) && ext(it))
                };
            for ss in &step.substep {
                let w = StepWrapper::new(ss, ws.clone(), sub_continue.clone(), self.defs)?;
                if ss.run_every_ms.is_some() {
                    report_substeps.push(w);
                } else {
                    recurring.push(w);
                }
            }
        } else {
            for name in &step.network {
                networks.push(self.net(&ws, name)?);
            }
        }
        let should_stop = match &step.should_stop_blob {
            Some(name) => Some(
                ws.get_blob(name)
                    .ok_or_else(|| Error::MissingBlob(format!("blob {name} does not exist")))?,
            ),
            None => None,
        };
        let report_net = match &step.report_net {
            Some(name) => {
                if step.report_interval.is_none() {
                    return Err(Error::BadArgument(
                        "A report_interval must be provided if report_net is set.".into(),
                    ));
                }
                Some(self.net(&ws, name)?)
            }
            None => None,
        };
        let own = continuation_test(step)?;
        let ext = self.ext.clone();
        Ok(Compiled {
            _ws: ws,
            recurring,
            report_substeps,
            networks,
            should_stop,
            report_net,
            should_continue: Arc::new(move |it| ext(it) && own(it)),
            got_failure,
        })
    }

    fn net(&self, ws: &Arc<Workspace>, name: &str) -> Result<SharedNet> {
        let mut defs = self.defs.lock();
        let info = defs.get_mut(name).ok_or_else(|| {
            Error::MissingBlob(format!(
                "ExecutionStep {} uses undefined net {name}",
                self.step.name()
            ))
        })?;
        if info.needs_override || ws.get_net(name).is_none() {
            ws.create_net(info.def, true)?;
            info.needs_override = false;
        }
        ws.get_net(name)
            .ok_or_else(|| Error::MissingBlob(format!("Network {name} not found.")))
    }
}

fn continuation_test(step: &ExecutionStep) -> Result<ShouldContinue> {
    if step.should_stop_blob.is_some() && step.num_iter.is_some() {
        return Err(Error::BadArgument(
            "Must not specify num_iter if should_stop_blob is set".into(),
        ));
    }
    if step.should_stop_blob.is_none() {
        if step.only_once.is_some() {
            return Err(Error::BadArgument(format!(
                "only_once is not supported without should_stop_blob (step {})",
                step.name()
            )));
        }
        let n = step.num_iter.unwrap_or(1);
        return Ok(Arc::new(move |i| i < n));
    }
    if step.only_once() {
        Ok(Arc::new(|i| i == 0))
    } else {
        Ok(Arc::new(|_| true))
    }
}

struct Compiled<'p> {
    /// Keeps a step-local workspace (and so its nets) alive while the step runs.
    _ws: Arc<Workspace>,
    recurring: Vec<StepWrapper<'p>>,
    report_substeps: Vec<StepWrapper<'p>>,
    networks: Vec<SharedNet>,
    should_stop: Option<BlobHandle>,
    report_net: Option<SharedNet>,
    should_continue: ShouldContinue,
    got_failure: Arc<AtomicBool>,
}

fn should_stop(blob: &Option<BlobHandle>) -> Result<bool> {
    let Some(h) = blob else { return Ok(false) };
    let b = h.read();
    match &*b {
        Blob::Tensor(t) => match t.as_slice::<bool>() {
            Ok([v]) => Ok(*v),
            _ => Err(Error::DtypeMismatch(format!(
                "should_stop_blob expects a scalar boolean, got {t:?}"
            ))),
        },
        _ => Ok(false),
    }
}

/// Runs `f` every `interval` on reporter threads, and once more when told to stop.
struct Reporters {
    done: std::sync::Mutex<bool>,
    cv: Condvar,
}

impl Reporters {
    fn new() -> Self {
        Reporters {
            done: std::sync::Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    fn run(&self, interval: Duration, f: &(dyn Fn() + Sync)) {
        loop {
            let done = {
                let guard = self.done.lock().unwrap_or_else(|e| e.into_inner());
                let (guard, _) = self
                    .cv
                    .wait_timeout_while(guard, interval, |d| !*d)
                    .unwrap_or_else(|e| e.into_inner());
                *guard
            };
            f();
            if done {
                return;
            }
        }
    }

    fn stop(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

fn execute(wrapper: &StepWrapper<'_>) -> Result<()> {
    let step = wrapper.step;
    let compiled = wrapper.compiled()?;
    let c = &*compiled;
    if step.report_net.is_none() && c.report_substeps.is_empty() {
        return run_body(step, c);
    }
    let reporters = Reporters::new();
    std::thread::scope(|s| {
        if let Some(net) = &c.report_net {
            let ms = step.report_interval().max(0) as u64 * 1000;
            let f = move || {
                let _ = net.lock().run();
            };
            let r = &reporters;
            s.spawn(move || r.run(Duration::from_millis(ms), &f));
        }
        for sub in &c.report_substeps {
            let ms = sub.step.run_every_ms().max(0) as u64;
            let f = move || {
                let _ = execute(sub);
            };
            let r = &reporters;
            s.spawn(move || r.run(Duration::from_millis(ms), &f));
        }
        let result = run_body(step, c);
        reporters.stop();
        result
    })
}

fn run_body(step: &ExecutionStep, c: &Compiled<'_>) -> Result<()> {
    if !step.substep.is_empty() || !c.recurring.is_empty() || !c.report_substeps.is_empty() {
        let sequential = (!step.concurrent_substeps() || step.substep.len() <= 1)
            && step.num_concurrent_instances.is_none_or(|n| n <= 1);
        let mut iter = 0i64;
        while (c.should_continue)(iter) {
            if sequential {
                for sub in &c.recurring {
                    execute(sub)?;
                    if should_stop(&c.should_stop)? {
                        return Ok(());
                    }
                }
            } else {
                run_concurrent(step, c)?;
                if should_stop(&c.should_stop)? {
                    return Ok(());
                }
            }
            iter += 1;
        }
        return Ok(());
    }
    let mut iter = 0i64;
    while (c.should_continue)(iter) {
        for net in &c.networks {
            net.lock().run()?;
            if should_stop(&c.should_stop)? {
                return Ok(());
            }
        }
        iter += 1;
    }
    Ok(())
}

/// The most threads one step's concurrent substeps run on when it has that many substeps
/// (with fewer, [`crate::net::max_threads`] bounds them).
pub const MAX_SUBSTEP_THREADS: usize = 256;

/// How many threads run `tasks` tasks of `substeps` distinct substeps.
fn concurrent_workers(substeps: usize, tasks: usize) -> usize {
    let cap = crate::net::max_threads().max(substeps.min(MAX_SUBSTEP_THREADS));
    tasks.min(cap).max(1)
}

fn run_concurrent(step: &ExecutionStep, c: &Compiled<'_>) -> Result<()> {
    let n = c.recurring.len();
    if n == 0 {
        return Ok(());
    }
    let instances = usize::try_from(step.num_concurrent_instances().max(1)).unwrap_or(1);
    let tasks = n.saturating_mul(instances);
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let work = || loop {
        let k = next.fetch_add(1, Ordering::AcqRel);
        if k >= tasks || c.got_failure.load(Ordering::Acquire) {
            return;
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            execute(&c.recurring[k % n])
        }))
        .unwrap_or_else(|_| Err(Error::Runtime("a plan worker panicked".into())));
        if let Err(e) = r {
            c.got_failure.store(true, Ordering::Release);
            first_error.lock().get_or_insert(e);
        }
    };
    std::thread::scope(|s| {
        // Helpers beside the calling thread; when the system refuses a thread, the ones
        // started (and the calling thread) take the remaining tasks.
        for i in 1..concurrent_workers(n, tasks) {
            let spawned = std::thread::Builder::new()
                .name(format!("ferrocaffe-plan-{i}"))
                .spawn_scoped(s, work);
            if spawned.is_err() {
                break;
            }
        }
        work();
    });
    match first_error.into_inner() {
        Some(e) => Err(Error::Runtime(format!(
            "One of the workers died with an unhandled exception {e}"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::OperatorDef;
    use crate::tensor::Tensor;

    fn counter(ws: &Arc<Workspace>, name: &str) -> i64 {
        let h = ws.blob(name).unwrap();
        let b = h.read();
        b.tensor().unwrap().as_slice::<i64>().unwrap()[0]
    }

    /// A plan of one step: `substeps` substeps, each running a net that adds 1 to its own
    /// counter, with `instances` concurrent instances.
    fn counting_plan(substeps: usize, instances: i32) -> PlanDef {
        let mut plan = PlanDef::default();
        let mut top = ExecutionStep {
            name: Some("top".into()),
            concurrent_substeps: Some(true),
            num_concurrent_instances: Some(instances),
            ..Default::default()
        };
        for k in 0..substeps {
            let net = format!("count{k}");
            plan.network.push(NetDef {
                name: Some(net.clone()),
                op: vec![OperatorDef::new(
                    "Add",
                    [format!("c{k}"), "one".to_string()],
                    [format!("c{k}")],
                )],
                ..Default::default()
            });
            top.substep.push(ExecutionStep {
                name: Some(format!("s{k}")),
                network: vec![net],
                ..Default::default()
            });
        }
        plan.execution_step.push(top);
        plan
    }

    #[test]
    fn ten_thousand_concurrent_instances_run_on_bounded_threads() {
        let ws = Workspace::new();
        ws.feed("one", Tensor::from_vec(&[1], vec![1i64]).unwrap());
        for k in 0..2 {
            ws.feed(
                &format!("c{k}"),
                Tensor::from_vec(&[1], vec![0i64]).unwrap(),
            );
        }
        ws.run_plan(&counting_plan(2, 10_000)).unwrap();
        assert_eq!(counter(&ws, "c0"), 10_000);
        assert_eq!(counter(&ws, "c1"), 10_000);
    }

    #[test]
    fn workers_are_bounded_but_cover_every_substep() {
        let cap = crate::net::max_threads();
        assert_eq!(concurrent_workers(2, 20_000), cap);
        assert_eq!(concurrent_workers(3, 3), 3);
        assert_eq!(concurrent_workers(cap + 5, cap + 5), cap + 5);
        assert_eq!(
            concurrent_workers(100_000, 100_000),
            cap.max(MAX_SUBSTEP_THREADS)
        );
    }

    #[test]
    fn a_failing_instance_is_reported() {
        let ws = Workspace::new();
        ws.feed("one", Tensor::from_vec(&[1], vec![1i64]).unwrap());
        // c0's type does not match `one`'s: every instance fails at run time, and the step
        // reports it.
        ws.feed("c0", Tensor::from_vec(&[1], vec![0f32]).unwrap());
        let e = ws.run_plan(&counting_plan(1, 50)).unwrap_err();
        assert!(e.to_string().contains("One of the workers died"), "{e}");
    }
}
