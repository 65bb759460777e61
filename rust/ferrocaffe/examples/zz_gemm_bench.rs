use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let small = args.get(1).map(|s| s == "small").unwrap_or(true);
    ferrocaffe::blas::set_small_kernels_enabled(small);
    for &(ta, tb, m, n, k) in &[(false, true, 32usize, 1024usize, 256usize), (false, false, 32, 256, 1024), (true, false, 1024, 256, 32),
        (false, true, 2048, 1024, 128), (true, false, 1024, 128, 2048), (false, false, 2048, 128, 1024), (false, true, 1024,1024,1024)] {
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.1).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.2).cos()).collect();
        let mut c = vec![0.0f32; m * n];
        for _ in 0..10 { ferrocaffe::blas::sgemm(ta, tb, m, n, k, 1.0, &a, &b, 1.0, &mut c); }
        let reps = (2_000_000_000 / (2 * m * n * k)).max(3);
        let t = Instant::now();
        for _ in 0..reps { ferrocaffe::blas::sgemm(ta, tb, m, n, k, 1.0, &a, &b, 1.0, &mut c); }
        let dt = t.elapsed().as_secs_f64() / reps as f64;
        println!("{ta} {tb} {m}x{n}x{k}: {:.1} us {:.0} GFLOP/s", dt * 1e6, 2.0 * (m * n * k) as f64 / dt / 1e9);
    }
}
