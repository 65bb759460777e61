//! The process's compute threads: one team of helper threads that every kernel shares, for
//! products ([`crate::blas`]), element-wise work beside them and convolutions.
//!
//! The team has [`num_threads`]` - 1` helpers: the machine's cores, or fewer when
//! `FERROCAFFE_NUM_THREADS` says so (read once, when the team starts). [`run_parts`] runs
//! `parts` independent pieces of work on the calling thread and on the helpers, and returns
//! when all are done.
//!
//! Small products (an RNN step's `32 x 256 x 1024`) take tens of microseconds, so the hand-off
//! has to cost about a microsecond: the helpers spin on an atomic for a while after each job
//! (every step of a recurrent net comes well within that window) and only then park. A pool
//! with sleeping workers (rayon's `join` from outside its pool) costs more than the product
//! saves. This is why the team is written here rather than taken from rayon.
//!
//! All threads take pieces from one counter, so the work balances itself: when a helper
//! starts late or gets less of its core, the others simply do more of the pieces, and pieces
//! no helper picked up are done by the caller. One caller at a time gets the team; a
//! concurrent caller (the RNN executor or the DAG executor with several workers) runs all of
//! its pieces itself, so nobody waits for a busy team and no nesting can deadlock.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before parking.
const SPIN: Duration = Duration::from_micros(300);

/// The environment variable that caps the team (the calling thread included).
pub const NUM_THREADS_VAR: &str = "FERROCAFFE_NUM_THREADS";

/// Threads that compute one piece of work at once, the caller included: the machine's
/// parallelism, capped by `FERROCAFFE_NUM_THREADS` (a positive integer; anything else is
/// ignored). Read once.
pub fn num_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cap = std::env::var(NUM_THREADS_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0);
        cap.map_or(cores, |c| c.min(cores)).max(1)
    })
}

/// A job as the helpers see it: a thin pointer to this, on the caller's stack.
struct Job<'a> {
    piece: &'a (dyn Fn(usize) + Sync),
    /// The pieces not yet taken, `lo..hi`, packed as `lo << 32 | hi`: the caller takes them
    /// from the front, the helpers from the back, so that in a balanced run each thread tends
    /// to get the same pieces every time (and finds their operands still in its own cache).
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

    /// The next piece from the front (the caller) or the back (a helper), if any is left.
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

/// One helper's parking slot.
struct Slot {
    /// Set while the helper is parked (or about to park).
    parked: AtomicBool,
    thread: Thread,
}

struct Team {
    /// The posted job (`*const Job` as an address), 0 when none.
    job: AtomicUsize,
    /// Counts posted jobs: a helper works when it sees a new value.
    epoch: AtomicU64,
    /// Helpers `0..width` join the posted job (one fewer than its pieces, the caller takes
    /// one): the others leave it alone, so a job of a few pieces on a many-core machine does
    /// not have every spinning helper touch its counters.
    width: AtomicUsize,
    /// Helpers that may be reading the posted job; the caller waits for 0 after clearing it.
    joined: AtomicUsize,
    /// Held by the caller that owns the team for the current job.
    busy: AtomicBool,
    /// Set when a piece run by a helper panicked (the caller re-raises it).
    panicked: AtomicBool,
    slots: Vec<Slot>,
}

static TEAM: OnceLock<Option<&'static Team>> = OnceLock::new();

fn team() -> Option<&'static Team> {
    *TEAM.get_or_init(|| {
        let helpers = num_threads() - 1;
        if helpers == 0 {
            return None;
        }
        // The helpers start before the team exists (its slots hold their handles): each
        // waits for it in this cell.
        let cell: std::sync::Arc<OnceLock<&'static Team>> = Default::default();
        let mut slots = Vec::with_capacity(helpers);
        for i in 0..helpers {
            let cell = cell.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ferrocaffe-compute-{i}"))
                .spawn(move || loop {
                    if let Some(t) = cell.get() {
                        serve(t, i);
                    }
                    std::thread::park_timeout(Duration::from_millis(1));
                });
            match spawned {
                Ok(h) => slots.push(Slot {
                    parked: AtomicBool::new(false),
                    thread: h.thread().clone(),
                }),
                // Fewer helpers than asked for (a thread limit): the team is what started.
                Err(_) => break,
            }
        }
        if slots.is_empty() {
            return None;
        }
        let t: &'static Team = Box::leak(Box::new(Team {
            job: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            width: AtomicUsize::new(0),
            joined: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            slots,
        }));
        let _ = cell.set(t);
        for s in &t.slots {
            s.thread.unpark();
        }
        Some(t)
    })
}

/// Whether pieces are shared out to helper threads here (more than one thread allowed).
pub fn available() -> bool {
    team().is_some()
}

fn serve(t: &'static Team, i: usize) -> ! {
    let mut seen = 0u64;
    loop {
        seen = wait_for_job(t, i, seen);
        // A width read from a later job only makes this helper join or skip that one:
        // skipping is always safe (the caller runs every piece nobody took).
        if i >= t.width.load(Ordering::SeqCst) {
            continue;
        }
        t.joined.fetch_add(1, Ordering::SeqCst);
        let job = t.job.load(Ordering::SeqCst);
        if job != 0 {
            // SAFETY: the caller posted a pointer to a live `Job`, and it does not return
            // (nor free the job) before `joined` is back to 0 after clearing `job`; this
            // thread counted itself in before reading `job`.
            let job = unsafe { &*(job as *const Job<'_>) };
            let ok =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.work(false))).is_ok();
            if !ok {
                t.panicked.store(true, Ordering::Relaxed);
            }
        }
        t.joined.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits until a job newer than `seen` is posted; returns its epoch.
fn wait_for_job(t: &Team, i: usize, seen: u64) -> u64 {
    let slot = &t.slots[i];
    let mut since = Instant::now();
    let mut spins = 0u32;
    loop {
        let now = t.epoch.load(Ordering::Acquire);
        if now != seen {
            return now;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        if since.elapsed() < SPIN {
            continue;
        }
        // Announce the park, then look once more: a caller bumps the epoch before reading
        // `parked`, this thread stores `parked` before reading the epoch (both SeqCst), so one
        // of the two sees the other and no wake-up is lost.
        slot.parked.store(true, Ordering::SeqCst);
        if t.epoch.load(Ordering::SeqCst) == seen {
            std::thread::park_timeout(Duration::from_millis(50));
        }
        slot.parked.store(false, Ordering::SeqCst);
        since = Instant::now();
    }
}

thread_local! {
    /// Set inside [`single_threaded`]: this thread runs its pieces all by itself.
    static SOLO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every piece of work it starts kept on this thread, the team left alone. For
/// callers that already run work on several threads at once (the RNN executor's workers):
/// helpers spinning beside them would only take their cores.
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

/// Runs `piece(0) .. piece(parts - 1)`, each exactly once, on this thread and the team (or
/// all here when there is no team or another caller has it). Returns after all.
pub fn run_parts(parts: usize, piece: &(dyn Fn(usize) + Sync)) {
    let job = Job::new(piece, parts);
    let solo = SOLO.with(|s| s.get());
    let Some(t) = team().filter(|_| parts > 1 && !solo) else {
        job.work(true);
        return;
    };
    if t.busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        job.work(true);
        return;
    }
    let finish = Finish { t };
    t.job
        .store(&job as *const Job<'_> as usize, Ordering::SeqCst);
    let width = (parts - 1).min(t.slots.len());
    t.width.store(width, Ordering::SeqCst);
    t.epoch.fetch_add(1, Ordering::SeqCst);
    // Wake those of the joining helpers that are parked.
    for s in &t.slots[..width] {
        if s.parked.load(Ordering::SeqCst) {
            s.thread.unpark();
        }
    }
    job.work(true);
    drop(finish);
}

/// Runs `f` once on each item (disjoint pieces of work: row ranges of the outputs, say),
/// shared out like [`run_parts`]'s pieces.
pub fn for_each_part<T: Send>(items: Vec<T>, f: &(dyn Fn(T) + Sync)) {
    if items.len() <= 1 {
        for t in items {
            f(t);
        }
        return;
    }
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

/// Withdraws the job and waits for every helper that may be reading it; then releases the
/// team. Runs also when the caller's own piece unwinds (the job lives on the caller's stack).
struct Finish {
    t: &'static Team,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let t = self.t;
        t.job.store(0, Ordering::SeqCst);
        let mut spins = 0u32;
        while t.joined.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let panicked = t.panicked.swap(false, Ordering::Relaxed);
        t.busy.store(false, Ordering::Release);
        if panicked && !std::thread::panicking() {
            panic!("a piece of work run on a ferrocaffe compute thread panicked");
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
    fn a_parked_team_is_woken_and_a_slow_piece_is_waited_for() {
        let hits = AtomicU64::new(0);
        run_parts(2, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN * 4);
        run_parts(4, &|p| {
            if p == 3 {
                std::thread::sleep(Duration::from_millis(5));
            }
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn a_job_of_two_pieces_runs_on_the_caller_and_the_first_helper_only() {
        let names = std::sync::Mutex::new(Vec::new());
        for _ in 0..50 {
            run_parts(2, &|_| {
                let name = std::thread::current().name().map(str::to_string);
                names.lock().unwrap().push(name);
                std::thread::sleep(Duration::from_micros(100));
            });
        }
        let me = std::thread::current().name().map(str::to_string);
        let helper = Some("ferrocaffe-compute-0".to_string());
        for n in names.into_inner().unwrap() {
            assert!(n == me || n == helper, "a piece ran on {n:?}");
        }
    }

    #[test]
    fn the_team_is_sized_to_the_machine() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = num_threads();
        assert!(n >= 1 && n <= cores);
        if std::env::var(NUM_THREADS_VAR).is_err() {
            assert_eq!(n, cores);
        }
        assert_eq!(available(), n > 1);
        if let Some(t) = team() {
            assert_eq!(t.slots.len(), n - 1);
        }
    }

    #[test]
    fn a_panicking_piece_on_a_helper_reaches_the_caller() {
        if !available() {
            return;
        }
        let me = std::thread::current().id();
        // Some run puts a piece on a helper; its panic must come back to the caller.
        let reached = (0..200).any(|_| {
            std::panic::catch_unwind(|| {
                run_parts(8, &|_| {
                    if std::thread::current().id() != me {
                        panic!("on a helper");
                    }
                    std::thread::sleep(Duration::from_micros(200));
                })
            })
            .is_err()
        });
        assert!(reached);
        // The team still works afterwards.
        let hits = AtomicU64::new(0);
        run_parts(8, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 8);
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
        // Restored afterwards (and after a panic inside): the helpers take pieces again.
        let caught = std::panic::catch_unwind(|| single_threaded(|| panic!("inside")));
        assert!(caught.is_err());
        if available() {
            assert!((0..200).any(|_| ran_here(8) < 8));
        }
    }
}
