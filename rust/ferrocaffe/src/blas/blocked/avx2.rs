//! The `6 x 16` micro-kernel on AVX2 with FMA: twelve 8-lane accumulators (of the sixteen
//! registers), two vectors of a packed `B` row and one broadcast element of packed `A` per
//! step, so each step issues 12 FMAs against 2 loads and 6 broadcasts and the two FMA units
//! stay busy. Each element of the tile is one FMA chain over the `kc` steps in order.

use std::arch::x86_64::*;

use super::{Epilogue, MR, NR};

/// `C[0..rows, 0..cols] (row stride ldc) <- epilogue(A_panel B_panel)` for one `kc`-long
/// panel pair: `b` holds `kc` rows of [`NR`] values; `a` holds `kc` groups of [`MR`] values
/// (one per row) when `PACKED`, else it is [`MR`] rows of `A` itself, `lda` apart, `kc`
/// contiguous values each.
///
/// # Safety
/// AVX2 and FMA are available; `a` and `b` hold those values; `c` points at
/// a block of `rows <= MR` rows and `cols <= NR` columns inside C (and `e.bias`, when set, at
/// `cols` values) that no other thread touches meanwhile.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const PACKED: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    e: &Epilogue,
) {
    // The tile of C is read or written at the end: start fetching it now (its rows are far
    // apart, and a hardware prefetcher does not follow them).
    for r in 0..rows {
        // SAFETY: prefetching computes an address inside the block and reads nothing.
        unsafe {
            let row = c.add(r * ldc) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.add(4 * (cols - 1)));
        }
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // Where the A value of row `r` and the next step are.
    let (rs, ps) = if PACKED { (1, MR) } else { (lda, 1) };
    // One step: a row of the B panel against the MR values of the A panel.
    let step = |acc: &mut [[__m256; 2]; MR], pa: *const f32, pb: *const f32| {
        // SAFETY: the caller's `pa` and `pb` point at a step inside the panels.
        unsafe {
            let b0 = _mm256_loadu_ps(pb);
            let b1 = _mm256_loadu_ps(pb.add(8));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*pa.add(r * rs));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
        }
    };
    // SAFETY (the loops): steps `0..kc`, inside both panels; a packed A panel (read from L2)
    // is prefetched 16 steps ahead, which only computes addresses.
    unsafe {
        let (mut pa, mut pb) = (a, b);
        for _ in 0..kc / 4 {
            if PACKED {
                _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(16 * MR) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(16 * MR + 16) as *const i8);
            }
            step(&mut acc, pa, pb);
            step(&mut acc, pa.add(ps), pb.add(NR));
            step(&mut acc, pa.add(2 * ps), pb.add(2 * NR));
            step(&mut acc, pa.add(3 * ps), pb.add(3 * NR));
            pa = pa.add(4 * ps);
            pb = pb.add(4 * NR);
        }
        for _ in 0..kc % 4 {
            step(&mut acc, pa, pb);
            pa = pa.add(ps);
            pb = pb.add(NR);
        }
    }
    let alpha = _mm256_set1_ps(e.alpha);
    let beta = _mm256_set1_ps(e.beta);
    let all = _mm256_set1_epi32(-1);
    // Each row of the tile inside C, a vector (or the lanes of it inside C) at a time: the
    // same arithmetic for full and edge tiles; masked lanes are neither read nor written.
    for (r, row) in acc.iter().enumerate().take(rows) {
        for (h, v) in row.iter().enumerate() {
            let lanes = cols.saturating_sub(8 * h).min(8);
            if lanes == 0 {
                break;
            }
            // Plain loads and stores for whole vectors (masked stores are slow on AMD cores).
            let full = lanes == 8;
            let mask = if full { all } else { lanes_mask(lanes) };
            // SAFETY: the lanes of `mask` lie inside the block (and the bias), as the caller
            // says; masked loads and stores touch no other lane.
            unsafe {
                let load = |p: *const f32| {
                    if full {
                        _mm256_loadu_ps(p)
                    } else {
                        _mm256_maskload_ps(p, mask)
                    }
                };
                let dst = c.add(r * ldc + h * 8);
                let mut out = _mm256_mul_ps(alpha, *v);
                if e.accumulate {
                    out = _mm256_add_ps(out, load(dst));
                } else {
                    if e.beta != 0.0 {
                        out = _mm256_fmadd_ps(beta, load(dst), out);
                    }
                    if !e.bias.is_null() {
                        out = _mm256_add_ps(out, load(e.bias.add(h * 8)));
                    }
                }
                if full {
                    _mm256_storeu_ps(dst, out);
                } else {
                    _mm256_maskstore_ps(dst, mask, out);
                }
            }
        }
    }
}

/// A mask with lanes `0..n` (`n <= 8`) set.
#[target_feature(enable = "avx2")]
fn lanes_mask(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}
