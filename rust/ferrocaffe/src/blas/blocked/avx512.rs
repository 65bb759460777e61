//! The `6 x 32` micro-kernel on AVX-512: twelve 16-lane accumulators, one vector from each of
//! two neighbouring packed `B` panels ([`NR`] columns each, `NR * kc` apart) and one broadcast
//! element of `A` per step: 12 FMAs against 2 loads and 6 broadcasts, as the [`super::avx2`]
//! kernel at twice the width. It reads the same packed layouts as that kernel (two of its
//! panels side by side), so the packing and the tiling are shared; a tile's last panel, when
//! it has no neighbour, runs on the AVX2 kernel. Each element of the tile is one FMA chain over
//! the `kc` steps in order, as there.

use std::arch::x86_64::*;

use super::{Epilogue, MR, NR};

/// Columns of this kernel's tile.
pub(super) const WIDE: usize = 2 * NR;

/// `C[0..rows, 0..cols] (row stride ldc) <- epilogue(A_panel [B_panel B_next])` for one
/// `kc`-long panel: `b` holds `kc` rows of [`NR`] values and the next panel follows it
/// (`NR * kc` values further); `a` is as for [`super::avx2::tile`].
///
/// # Safety
/// AVX-512F is available; `a` and both panels of `b` hold those values; `c` points at a block
/// of `rows <= MR` rows and `NR < cols <= WIDE` columns inside C (and `e.bias`, when set, at
/// `cols` values) that no other thread touches meanwhile.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
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
    for r in 0..rows {
        // SAFETY: prefetching computes an address inside the block and reads nothing.
        unsafe {
            let row = c.add(r * ldc) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.add(4 * (cols - 1)));
        }
    }
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (rs, ps) = if PACKED { (1, MR) } else { (lda, 1) };
    let next = NR * kc;
    let step = |acc: &mut [[__m512; 2]; MR], pa: *const f32, pb: *const f32| {
        // SAFETY: the caller's `pa` and `pb` point at a step inside the panels (and `pb +
        // next` at the same step of the neighbouring panel).
        unsafe {
            let b0 = _mm512_loadu_ps(pb);
            let b1 = _mm512_loadu_ps(pb.add(next));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*pa.add(r * rs));
                row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                row[1] = _mm512_fmadd_ps(av, b1, row[1]);
            }
        }
    };
    // SAFETY (the loops): steps `0..kc`, inside the panels; prefetches only compute addresses.
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
    let alpha = _mm512_set1_ps(e.alpha);
    let beta = _mm512_set1_ps(e.beta);
    for (r, row) in acc.iter().enumerate().take(rows) {
        for (h, v) in row.iter().enumerate() {
            let lanes = cols.saturating_sub(NR * h).min(NR);
            // Lanes `0..lanes` (`lanes <= 16`); masked lanes are neither read nor written.
            let mask = crate::blas::mask16(lanes);
            // SAFETY: the lanes of `mask` lie inside the block (and the bias), as the caller
            // says; masked loads and stores touch no other lane.
            unsafe {
                let dst = c.add(r * ldc + h * NR);
                let mut out = _mm512_mul_ps(alpha, *v);
                if e.accumulate {
                    out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, dst));
                } else {
                    if e.beta != 0.0 {
                        out = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, dst), out);
                    }
                    if !e.bias.is_null() {
                        out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, e.bias.add(h * NR)));
                    }
                }
                _mm512_mask_storeu_ps(dst, mask, out);
            }
        }
    }
}
