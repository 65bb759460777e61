//! Times the three products of an LSTM step (`N = 32`, `H = 256`, gates `4H = 1024`) on
//! this crate's GEMM, on one thread and shared with the helper thread, as GFLOP/s.
//!
//! `cargo run --release -p ferrocaffe --example step_gemms -- [runs]`
use std::time::Instant;

use ferrocaffe::blas::{sgemm, single_threaded};

fn time(runs: usize, f: &mut dyn FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        for _ in 0..64 {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / 64.0);
    }
    best
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let (n, h) = (32usize, 256usize);
    let g = 4 * h;
    let data = |len: usize, s: f32| -> Vec<f32> {
        (0..len).map(|i| ((i as f32 + s) * 0.618).sin()).collect()
    };
    let w = data(g * h, 1.0);
    let x = data(n * h, 2.0);
    let dg = data(n * g, 3.0);
    let mut y = vec![0.0f32; n * g];
    let mut dx = vec![0.0f32; n * h];
    let mut dw = vec![0.0f32; g * h];
    let flops = 2.0 * (n * g * h) as f64;
    type Case<'a> = (&'a str, Box<dyn FnMut() + 'a>);
    let cases: Vec<Case> = vec![
        (
            "h W^T   ",
            Box::new(|| sgemm(false, true, n, g, h, 1.0, &x, &w, 0.0, &mut y)),
        ),
        (
            "dG W    ",
            Box::new(|| sgemm(false, false, n, h, g, 1.0, &dg, &w, 0.0, &mut dx)),
        ),
        (
            "dG^T h  ",
            Box::new(|| sgemm(true, false, g, h, n, 1.0, &dg, &x, 1.0, &mut dw)),
        ),
    ];
    for (name, mut f) in cases {
        let solo = single_threaded(|| time(runs, &mut f));
        let pair = time(runs, &mut f);
        println!(
            "{name} one thread {:7.1} us {:6.1} GF/s | two threads {:7.1} us {:6.1} GF/s",
            solo * 1e6,
            flops / solo / 1e9,
            pair * 1e6,
            flops / pair / 1e9
        );
    }
}
