//! The tiles on AVX-512F: 16-lane vectors, masked loads and stores for the column tails, and
//! transposed stores gathered from a buffer on the stack.

use std::arch::x86_64::*;

use super::{tile_scalar, Tile};
use crate::blas::mask16;

/// Runs the kernel instantiated for `rows` rows and `v` vectors.
///
/// # Safety
/// AVX-512F is available and the tile is in bounds.
pub(super) unsafe fn dispatch(rows: usize, v: usize, t: &Tile) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match v {
            1 => by_rows!(rows, 1, t, [1 2 3 4 5 6 7 8 9 10 11 12]),
            2 => by_rows!(rows, 2, t, [1 2 3 4 5 6 7 8 9 10 11 12]),
            3 => by_rows!(rows, 3, t, [1 2 3 4 5 6 7 8]),
            4 => by_rows!(rows, 4, t, [1 2 3 4 5 6]),
            _ => tile_scalar(rows, t),
        }
    }
}

/// The `R x (16 V)` kernel (columns past `t.cols` masked off).
///
/// # Safety
/// AVX-512F is available; `R` rows of `P`, `t.cols` columns of `Q` and the matching part of
/// `C` are in bounds for the inner dimension `t.k`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // R x V register tiles read clearer indexed
unsafe fn tile<const R: usize, const V: usize>(t: &Tile) {
    let masks: [__mmask16; V] = std::array::from_fn(|v| mask16(t.cols.saturating_sub(16 * v)));
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    // SAFETY (loads): in bounds by the caller's contract; masked-off lanes are not read.
    unsafe {
        for kk in 0..t.k {
            let qrow = t.q.add(kk * t.qld);
            let mut b = [_mm512_setzero_ps(); V];
            for v in 0..V {
                b[v] = _mm512_maskz_loadu_ps(masks[v], qrow.add(16 * v));
            }
            let prow = t.p.ptr.add(kk * t.p.cs);
            for r in 0..R {
                let a = _mm512_set1_ps(*prow.add(r * t.p.rs));
                for v in 0..V {
                    acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
                }
            }
        }
    }
    let (alpha, beta) = t.scalars;
    let (alpha_v, beta_v) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
    let out = t.c.ptr.cast_mut();
    // SAFETY (stores): the tile's part of C is in bounds; masked-off lanes are not touched.
    unsafe {
        if !t.transposed {
            let mut bias = [None; V];
            if !t.bias.is_null() {
                for v in 0..V {
                    bias[v] = Some(_mm512_maskz_loadu_ps(masks[v], t.bias.add(16 * v)));
                }
            }
            for r in 0..R {
                for v in 0..V {
                    let dst = out.add(r * t.c.rs + 16 * v);
                    let mut val = _mm512_mul_ps(alpha_v, acc[r][v]);
                    if beta != 0.0 {
                        let old = _mm512_maskz_loadu_ps(masks[v], dst);
                        val = _mm512_fmadd_ps(beta_v, old, val);
                    }
                    if let Some(b) = bias[v] {
                        val = _mm512_add_ps(val, b);
                    }
                    _mm512_mask_storeu_ps(dst, masks[v], val);
                }
            }
        } else {
            // Transposed store: tile column j goes to C's row j, R contiguous floats. The
            // tile goes through a buffer on the stack (scattering it straight into C would
            // hit one cache line per element, 4 KB apart: several times slower).
            let mut buf = [[_mm512_setzero_ps(); V]; R];
            for r in 0..R {
                for v in 0..V {
                    buf[r][v] = _mm512_mul_ps(alpha_v, acc[r][v]);
                }
            }
            debug_assert_eq!(t.c.rs, 1);
            let base = buf.as_ptr().cast::<f32>();
            let row_mask = mask16(R);
            let bias = if t.bias.is_null() {
                None
            } else {
                Some(_mm512_maskz_loadu_ps(row_mask, t.bias))
            };
            // Lane r reads element (r, j) of the buffer: offset r * 16 V + j.
            let offsets = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(16 * V as i32),
            );
            for j in 0..t.cols {
                let mut val = _mm512_mask_i32gather_ps::<4>(
                    _mm512_setzero_ps(),
                    row_mask,
                    offsets,
                    base.add(j),
                );
                let dst = out.add(j * t.c.cs);
                if beta != 0.0 {
                    let old = _mm512_maskz_loadu_ps(row_mask, dst);
                    val = _mm512_fmadd_ps(beta_v, old, val);
                }
                if let Some(b) = bias {
                    val = _mm512_add_ps(val, b);
                }
                _mm512_mask_storeu_ps(dst, row_mask, val);
            }
        }
    }
}
