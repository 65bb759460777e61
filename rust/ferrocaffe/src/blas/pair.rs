//! A second thread for splitting one product: [`run_parts`] runs `parts` independent pieces
//! of work on the calling thread and a helper thread, and returns when all are done.
//!
//! Small GEMMs (an RNN step's `32 x 256 x 1024`) take tens of microseconds, so the hand-off
//! has to cost about a microsecond: the helper spins on an atomic for a while after each job
//! (every step of a recurrent net comes well within that window) and only then parks. A thread
//! pool with sleeping workers (rayon's `join` from outside the pool) costs more than the
//! product saves.
//!
//! Both threads take pieces from one counter, so the work balances itself: when the helper
//! starts late or gets less of its core (another library's worker spinning on it), the caller
//! simply does more of the pieces, and a job the helper never picked up is taken back. One
//! caller at a time gets the helper; a concurrent caller (the RNN executor or the DAG
//! executor with several workers) runs all pieces itself, so nobody waits for a busy helper
//! and no nesting can deadlock.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long the helper spins for the next job before parking.
const SPIN: Duration = Duration::from_micros(300);

/// A job as the helper sees it: a thin pointer to this, on the caller's stack.
struct Job<'a> {
    piece: &'a (dyn Fn(usize) + Sync),
    /// The pieces not yet taken, `lo..hi`, packed as `lo << 32 | hi`: the caller takes them
    /// from the front, the helper from the back, so that in a balanced run each thread gets
    /// the same half every time (and finds its half of the operands still in its own cache).
    left: AtomicU64,
}

impl Job<'_> {
    fn new(piece: &(dyn Fn(usize) + Sync), parts: usize) -> Job<'_> {
        let parts = parts.min(u32::MAX as usize) as u64;
        Job {
            piece,
            left: AtomicU64::new(parts),
        }
    }

    /// The next piece from the front (the caller) or the back (the helper), if any is left.
    fn take(&self, front: bool) -> Option<usize> {
        let mut cur = self.left.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = (cur >> 32, cur & 0xFFFF_FFFF);
            if lo >= hi {
                return None;
            }
            let (next, piece) = if front {
                ((lo + 1) << 32 | hi, lo)
            } else {
                (lo << 32 | (hi - 1), hi - 1)
            };
            match self
                .left
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(piece as usize),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Runs pieces until none is left.
    fn work(&self, front: bool) {
        while let Some(i) = self.take(front) {
            (self.piece)(i);
        }
    }
}

struct Helper {
    /// The posted job (`*const Job` as an address), 0 when none.
    job: AtomicUsize,
    /// Set by the helper when it has finished the job it took.
    done: AtomicBool,
    /// Held by the caller that owns the helper for the current job.
    busy: AtomicBool,
    /// Set while the helper is parked (or about to park).
    parked: AtomicBool,
    /// Set when a piece run by the helper panicked (the caller re-raises it).
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

/// Whether products are split between two threads here (a machine with two or more cores).
pub(crate) fn available() -> bool {
    helper().is_some()
}

fn serve(h: &'static Helper) {
    loop {
        let job = wait_for_job(h);
        // SAFETY: the caller posted a pointer to a live `Job`; once this thread has taken it
        // (the swap in `wait_for_job`), the caller does not return before it sees `done`.
        let job = unsafe { &*(job as *const Job<'_>) };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.work(false))).is_ok();
        h.panicked.store(!ok, Ordering::Relaxed);
        h.done.store(true, Ordering::Release);
    }
}

fn wait_for_job(h: &Helper) -> usize {
    let mut since = Instant::now();
    let mut spins = 0u32;
    loop {
        let job = h.job.swap(0, Ordering::AcqRel);
        if job != 0 {
            return job;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
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

thread_local! {
    /// Set inside [`single_threaded`]: this thread runs its pieces all by itself.
    static SOLO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every product (and every [`for_each_part`]) it starts kept on this thread,
/// the helper left alone. For callers that already run products on several threads at once
/// (the RNN executor's workers): the helper spinning beside them would only take their cores.
pub fn single_threaded<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SOLO.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SOLO.with(|s| s.replace(true)));
    f()
}

/// Runs `piece(0) .. piece(parts - 1)`, each exactly once, on this thread and the helper
/// thread (or all here when there is no helper or another caller has it). Returns after all.
pub(crate) fn run_parts(parts: usize, piece: &(dyn Fn(usize) + Sync)) {
    let job = Job::new(piece, parts);
    let solo = SOLO.with(|s| s.get());
    let Some(h) = helper().filter(|_| parts > 1 && !solo) else {
        job.work(true);
        return;
    };
    if h.busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        job.work(true);
        return;
    }
    let address = &job as *const Job<'_> as usize;
    h.done.store(false, Ordering::Relaxed);
    h.job.store(address, Ordering::SeqCst);
    if h.parked.load(Ordering::SeqCst) {
        h.thread.unpark();
    }
    let finish = Finish { h, address };
    job.work(true);
    drop(finish);
}

/// Runs `f` once on each item (disjoint pieces of work: row ranges of the outputs, say),
/// shared out like [`run_parts`]'s pieces. For element-wise work beside the products (an
/// LSTM unit's rows, a bias broadcast), which would otherwise leave the second core idle.
pub(crate) fn for_each_part<T: Send>(items: Vec<T>, f: &(dyn Fn(T) + Sync)) {
    let slots: Vec<std::sync::Mutex<Option<T>>> = items
        .into_iter()
        .map(|t| std::sync::Mutex::new(Some(t)))
        .collect();
    run_parts(slots.len(), &|i| {
        // Each index runs once, so the lock is never contended (nor poisoned by a
        // panic elsewhere: run_parts propagates that panic instead).
        let item = slots[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(t) = item {
            f(t);
        }
    });
}

/// Takes the job back if the helper never picked it up, else waits for the helper to finish
/// it; then releases the helper. Runs also when the caller's own piece unwinds (the job lives
/// on the caller's stack).
struct Finish {
    h: &'static Helper,
    address: usize,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let h = self.h;
        let taken_back = h
            .job
            .compare_exchange(self.address, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let mut panicked = false;
        if !taken_back {
            let mut spins = 0u32;
            while !h.done.load(Ordering::Acquire) {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            panicked = h.panicked.swap(false, Ordering::Relaxed);
        }
        h.busy.store(false, Ordering::Release);
        if panicked && !std::thread::panicking() {
            panic!("a piece of a product run on the GEMM helper thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_piece_runs_once_per_call_even_from_many_threads() {
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for i in 0..300usize {
                        let parts = 1 + (i + t) % 9;
                        let seen: Vec<AtomicU64> = (0..parts).map(|_| AtomicU64::new(0)).collect();
                        run_parts(parts, &|p| {
                            seen[p].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    #[test]
    fn a_parked_helper_is_woken_and_a_slow_piece_is_waited_for() {
        let hits = AtomicU64::new(0);
        run_parts(2, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN * 4);
        run_parts(2, &|p| {
            if p == 1 {
                std::thread::sleep(Duration::from_millis(5));
            }
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn single_threaded_keeps_every_piece_and_part_on_the_caller_until_it_returns() {
        let me = std::thread::current().id();
        let ran_here = |parts: usize| {
            let here = AtomicU64::new(0);
            run_parts(parts, &|_| {
                if std::thread::current().id() == me {
                    here.fetch_add(1, Ordering::Relaxed);
                }
                // Long enough pieces that a helper would take some.
                std::thread::sleep(Duration::from_micros(300));
            });
            here.load(Ordering::Relaxed)
        };
        let (inside, parts_inside) = single_threaded(|| {
            let seen = std::sync::Mutex::new(Vec::new());
            for_each_part((0..6).collect(), &|i: usize| {
                seen.lock().unwrap().push((i, std::thread::current().id()));
            });
            (ran_here(8), seen.into_inner().unwrap())
        });
        assert_eq!(inside, 8);
        assert_eq!(parts_inside.len(), 6);
        assert!(parts_inside.iter().all(|&(_, t)| t == me));
        // Restored afterwards (and after a panic inside): the helper takes pieces again.
        let caught = std::panic::catch_unwind(|| single_threaded(|| panic!("inside")));
        assert!(caught.is_err());
        if available() {
            assert!((0..200).any(|_| ran_here(8) < 8));
        }
    }
}
