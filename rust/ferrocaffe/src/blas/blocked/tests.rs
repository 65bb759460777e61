use super::*;
use crate::blas::tests::naive;

fn data(len: usize, seed: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32 + seed) * 0.618).sin())
        .collect()
}

/// Runs the blocked kernel (which must apply) and checks it against float64.
#[allow(clippy::too_many_arguments)]
fn check(ta: bool, tb: bool, m: usize, n: usize, k: usize, alpha: f32, beta: f32, bias: bool) {
    let a = data(m * k, 1.0);
    let b = data(k * n, 2.0);
    let c0 = data(m * n, 3.0);
    let bv = data(n, 4.0);
    for isa in available() {
        check_on(isa, ta, tb, m, n, k, alpha, beta, bias, &a, &b, &c0, &bv);
    }
}

#[allow(clippy::too_many_arguments)]
fn check_on(
    isa: Isa,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    bias: bool,
    a: &[f32],
    b: &[f32],
    c0: &[f32],
    bv: &[f32],
) {
    let mut c = c0.to_vec();
    // SAFETY: `isa` is available, with matrices of these sizes.
    let ran = unsafe {
        sgemm(
            isa,
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            a,
            b,
            beta,
            &mut c,
            bias.then_some(bv),
        )
    };
    assert!(
        ran,
        "{m}x{n}x{k} did not run on the blocked kernel ({isa:?})"
    );
    let ab = naive(ta, tb, m, n, k, a, b);
    for i in 0..m {
        for j in 0..n {
            let mut want = alpha as f64 * ab[i * n + j] + beta as f64 * c0[i * n + j] as f64;
            if bias {
                want += bv[j] as f64;
            }
            let got = c[i * n + j] as f64;
            let tol = 1e-5 * (k as f64).sqrt() * (1.0 + want.abs());
            assert!(
                (got - want).abs() <= tol,
                "{isa:?} {ta} {tb} {m}x{n}x{k} alpha {alpha} beta {beta} bias {bias}: \
                 C[{i}][{j}] = {got}, want {want}"
            );
        }
    }
}

#[test]
fn matches_float64_for_every_transpose_and_edge() {
    if available().is_empty() {
        return;
    }
    // Edges of every kind: rows and columns not multiples of the micro-tile, inner sizes
    // below, at and above one chunk (KC), tiles cut for the team.
    for &(m, n, k) in &[
        (1, 1, 4096),
        (7, 17, 300),
        (6, 16, 256),
        (13, 33, 257),
        (150, 70, 513),
        (97, 301, 64),
        (256, 256, 256),
        // Two-panel micro-tiles (AVX-512) with a short second panel, and with none.
        (9, 24, 100),
        (12, 48, 600),
        (30, 200, 40),
        // A row-major A with rows 4 KiB apart is packed, not read in place.
        (20, 40, 1024),
    ] {
        for ta in [false, true] {
            for tb in [false, true] {
                check(ta, tb, m, n, k, 1.0, 0.0, false);
            }
        }
    }
}

#[test]
fn alpha_beta_and_bias() {
    if available().is_empty() {
        return;
    }
    for &(alpha, beta, bias) in &[
        (1.0, 1.0, false),
        (0.5, -2.0, false),
        (1.0, 0.0, true),
        (2.0, 0.5, true),
    ] {
        check(false, true, 37, 45, 600, alpha, beta, bias);
        check(true, false, 130, 20, 70, alpha, beta, bias);
    }
}

#[test]
fn beta_zero_overwrites_nan() {
    if available().is_empty() {
        return;
    }
    let (m, n, k) = (20, 40, 30);
    let a = data(m * k, 1.0);
    let b = data(k * n, 2.0);
    for isa in available() {
        let mut c = vec![f32::NAN; m * n];
        // SAFETY: as in `check_on`.
        assert!(unsafe { sgemm(isa, false, false, m, n, k, 1.0, &a, &b, 0.0, &mut c, None) });
        assert!(c.iter().all(|v| v.is_finite()), "{isa:?}");
    }
}

#[test]
fn results_do_not_depend_on_the_threads() {
    if available().is_empty() {
        return;
    }
    let (m, n, k) = (300, 200, 700);
    let a = data(m * k, 1.0);
    let b = data(k * n, 2.0);
    for isa in available() {
        let mut team = vec![0.0; m * n];
        let mut solo = vec![0.0; m * n];
        // SAFETY: as in `check_on`.
        unsafe {
            assert!(sgemm(
                isa, false, true, m, n, k, 1.0, &a, &b, 0.0, &mut team, None
            ));
            crate::threads::single_threaded(|| {
                assert!(sgemm(
                    isa, false, true, m, n, k, 1.0, &a, &b, 0.0, &mut solo, None
                ))
            });
        }
        assert_eq!(team, solo, "{isa:?}");
    }
}

#[test]
fn kernels_agree_bit_for_bit() {
    // Each element is the same FMA chain on every kernel, so the widths give the same bits.
    let isas = available();
    let (m, n, k) = (100, 150, 300);
    let a = data(m * k, 1.0);
    let b = data(k * n, 2.0);
    let bv = data(n, 4.0);
    let mut first: Option<Vec<f32>> = None;
    for isa in isas {
        let mut c = data(m * n, 3.0);
        // SAFETY: as in `check_on`.
        assert!(unsafe {
            sgemm(
                isa,
                false,
                false,
                m,
                n,
                k,
                1.5,
                &a,
                &b,
                0.5,
                &mut c,
                Some(&bv),
            )
        });
        match &first {
            None => first = Some(c),
            Some(f) => assert_eq!(f, &c, "{isa:?}"),
        }
    }
}

#[test]
fn plans_cover_the_product_and_cut_it_for_the_team() {
    for &(m, n, k, threads) in &[
        (1024, 1024, 1024, 2),
        (256, 256, 256, 2),
        (64, 4096, 512, 16),
        (5000, 3, 10, 4),
        (1, 1, 1, 8),
    ] {
        let p = Plan::new(m, n, k, threads);
        assert!(p.mb * p.mc >= m && (p.mb - 1) * p.mc < m, "{p:?}");
        assert!(p.nb * p.nc >= n && (p.nb - 1) * p.nc < n, "{p:?}");
        assert!(p.kb * p.kc >= k && p.kc <= KC, "{p:?}");
        assert!(p.mc.is_multiple_of(MR) && p.nc.is_multiple_of(NR));
        if m * n * k >= PARALLEL_MNK && m > 4 * MR {
            assert!(
                p.mb * p.nb >= threads,
                "{p:?} has too few tiles for {threads} threads"
            );
        }
    }
}

#[test]
fn aliasing_a_too_large_to_pack_is_read_in_place() {
    // Rows 1024 floats apart would be packed, but A alone exceeds MAX_PACKED: the product
    // still runs here (A read in place) instead of falling back to the gemm crate.
    let (m, n, k) = (MAX_PACKED / ALIASING_STRIDE + 7, 16, ALIASING_STRIDE);
    let a = data(m * k, 1.0);
    let b = data(k * n, 2.0);
    for isa in available() {
        let mut c = vec![0.0; m * n];
        // SAFETY: as in `check_on`.
        assert!(unsafe { sgemm(isa, false, false, m, n, k, 1.0, &a, &b, 0.0, &mut c, None) });
        for i in (0..m).step_by(997).chain([m - 1]) {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                    "{isa:?} C[{i}][{j}] = {got}, want {want}"
                );
            }
        }
    }
}
