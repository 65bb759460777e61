//! A second thread for splitting one small product in two: [`run_split`] runs part 0 on the
//! calling thread and part 1 on a helper thread, and returns when both are done.
//!
//! Small GEMMs (an RNN step's `32 x 256 x 1024`) take tens of microseconds, so the hand-off
//! has to cost about a microsecond: the helper spins on an atomic for a while after each job
//! (every step of a recurrent net comes well within that window) and only then parks. A thread
//! pool with sleeping workers (rayon's `join` from outside the pool) costs more than the
//! product saves. One caller at a time gets the helper; a concurrent caller (the RNN executor
//! or the DAG executor with several workers) runs both parts itself, so nobody ever waits for
//! a busy helper and no nesting can deadlock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long the helper spins for the next job before parking.
const SPIN: Duration = Duration::from_micros(300);

/// A job as the helper sees it: a thin pointer to this, on the caller's stack.
struct Job<'a> {
    part: &'a (dyn Fn(usize) + Sync),
}

struct Helper {
    /// The posted job (`*const Job` as an address), 0 when none.
    job: AtomicUsize,
    /// Set by the helper when it has finished the posted job.
    done: AtomicBool,
    /// Held by the caller that owns the helper for the current job.
    busy: AtomicBool,
    /// Set while the helper is parked (or about to park).
    parked: AtomicBool,
    /// Set when the helper's part of the last job panicked (the caller re-raises it).
    panicked: AtomicBool,
    thread: Thread,
}

static HELPER: OnceLock<Option<&'static Helper>> = OnceLock::new();

fn helper() -> Option<&'static Helper> {
    *HELPER.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 2 {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::channel::<&'static Helper>();
        let spawned = std::thread::Builder::new()
            .name("ferrocaffe-gemm".into())
            .spawn(move || {
                let Ok(h) = rx.recv() else { return };
                serve(h);
            });
        let handle = spawned.ok()?;
        let h: &'static Helper = Box::leak(Box::new(Helper {
            job: AtomicUsize::new(0),
            done: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            thread: handle.thread().clone(),
        }));
        tx.send(h).ok()?;
        Some(h)
    })
}

fn serve(h: &'static Helper) {
    loop {
        let job = wait_for_job(h);
        // SAFETY: the caller posted a pointer to a live `Job` and does not return (so the
        // job stays alive) until it sees `done`.
        let job = unsafe { &*(job as *const Job<'_>) };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.part)(1))).is_ok();
        h.panicked.store(!ok, Ordering::Relaxed);
        h.done.store(true, Ordering::Release);
    }
}

fn wait_for_job(h: &Helper) -> usize {
    let mut since = Instant::now();
    let mut spins = 0u32;
    loop {
        let job = h.job.swap(0, Ordering::Acquire);
        if job != 0 {
            return job;
        }
        spins = spins.wrapping_add(1);
        if spins % 64 != 0 {
            std::hint::spin_loop();
            continue;
        }
        if since.elapsed() < SPIN {
            continue;
        }
        // Announce the park, then look once more: a caller stores its job before reading
        // `parked`, this thread stores `parked` before reading the job (both SeqCst), so one
        // of the two sees the other and no wake-up is lost.
        h.parked.store(true, Ordering::SeqCst);
        if h.job.load(Ordering::SeqCst) == 0 {
            std::thread::park_timeout(Duration::from_millis(50));
        }
        h.parked.store(false, Ordering::SeqCst);
        since = Instant::now();
    }
}

/// Runs `part(0)` here and `part(1)` on the helper thread (or both here, in order, when there
/// is no helper or another caller has it). Returns after both.
pub(crate) fn run_split(part: &(dyn Fn(usize) + Sync)) {
    let Some(h) = helper() else {
        part(0);
        part(1);
        return;
    };
    if h
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        part(0);
        part(1);
        return;
    }
    let job = Job { part };
    h.done.store(false, Ordering::Relaxed);
    h.job
        .store(&job as *const Job<'_> as usize, Ordering::SeqCst);
    if h.parked.load(Ordering::SeqCst) {
        h.thread.unpark();
    }
    let wait = AwaitHelper(h);
    part(0);
    drop(wait);
}

/// Waits for the helper to finish the posted job and releases it, also when the caller's own
/// part unwinds (the job lives on the caller's stack).
struct AwaitHelper(&'static Helper);

impl Drop for AwaitHelper {
    fn drop(&mut self) {
        let mut spins = 0u32;
        while !self.0.done.load(Ordering::Acquire) {
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let panicked = self.0.panicked.swap(false, Ordering::Relaxed);
        self.0.busy.store(false, Ordering::Release);
        if panicked && !std::thread::panicking() {
            panic!("the GEMM helper thread's part of a product panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn both_parts_run_once_per_call_even_from_many_threads() {
        let total = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let total = &total;
                s.spawn(move || {
                    for i in 0..500u64 {
                        let seen = [AtomicU64::new(0), AtomicU64::new(0)];
                        run_split(&|p| {
                            seen[p].fetch_add(1, Ordering::Relaxed);
                        });
                        assert_eq!(seen[0].load(Ordering::Relaxed), 1);
                        assert_eq!(seen[1].load(Ordering::Relaxed), 1);
                        total.fetch_add(t + i, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * (499 * 500 / 2) + 500 * 6);
    }

    #[test]
    fn a_parked_helper_is_woken() {
        let hits = AtomicU64::new(0);
        run_split(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN * 4);
        run_split(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
    }
}
