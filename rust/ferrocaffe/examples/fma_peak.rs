//! The machine's single-precision FMA peak, on one thread and on two at once, as GFLOP/s:
//! a loop of independent 8-lane AVX2 fused multiply-adds on registers only (no memory
//! traffic), the ceiling that no GEMM on this machine can pass. `bench_rnn.py` reports the
//! LSTM pass's arithmetic; divided by this peak it gives the pass's lower bound.
//!
//! `cargo run --release -p ferrocaffe --example fma_peak -- [runs]`
use std::time::Instant;

/// Iterations of the inner loop per timing; each runs `CHAINS` FMAs of 8 lanes.
const ITERS: usize = 20_000_000;
/// Independent accumulators: more than latency (4 cycles) x FMA units (2) so both units stay busy.
const CHAINS: usize = 12;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(seed); CHAINS];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut total = _mm256_setzero_ps();
    for x in acc {
        total = _mm256_add_ps(total, x);
    }
    // SAFETY: `lanes` holds the 8 floats that the unaligned store writes.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
    lanes.iter().sum()
}

/// GFLOP/s of `threads` threads each running the loop once, timed together.
#[cfg(target_arch = "x86_64")]
fn gflops(threads: usize) -> f64 {
    let start = Instant::now();
    let sums: Vec<f32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            // SAFETY: `main` checked that the CPU has AVX2 and FMA.
            .map(|t| s.spawn(move || unsafe { fma_loop(ITERS, t as f32) }))
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    // Keeps the loops from being optimised away.
    std::hint::black_box(sums);
    let flops = (threads * ITERS * CHAINS * 8 * 2) as f64;
    flops / seconds / 1e9
}

#[cfg(target_arch = "x86_64")]
fn main() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        println!("this CPU has no AVX2 + FMA: no peak to measure");
        return;
    }
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, 2.min(cpus), cpus] {
        let best = (0..runs).map(|_| gflops(threads)).fold(0.0, f64::max);
        println!("FMA peak, {threads} thread(s): {best:.1} GFLOP/s (best of {runs})");
        if threads == cpus {
            break;
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("fma_peak measures x86-64 AVX2 + FMA only");
}
