//! Times the three products of an LSTM step (`N = 32`, `H = 256`, gates `4H = 1024`), and
//! `dG W` again with the weight held constant as the RNN gradient op holds it, on
//! this crate's GEMM, on one thread and shared with the helper thread, as GFLOP/s.
//!
//! `cargo run --release -p ferrocaffe --example step_gemms -- [runs]`
use std::time::Instant;

use ferrocaffe::blas::{hold_constant, sgemm, single_threaded};
use ferrocaffe::tensor::Tensor;

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
    // The backward step with the weight held constant (as RecurrentNetworkGradient holds its
    // parameters over the steps): its column strips are cut once, not at every call.
    let held = Tensor::from_vec(&[g, h], w.clone()).expect("g x h values");
    let _held = hold_constant([held.snapshot()]);
    let wh = held.as_slice::<f32>().expect("a float tensor");
    let mut dx2 = vec![0.0f32; n * h];
    let mut cases = cases;
    cases.push((
        "dG W held",
        Box::new(|| sgemm(false, false, n, h, g, 1.0, &dg, wh, 0.0, &mut dx2)),
    ));
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
