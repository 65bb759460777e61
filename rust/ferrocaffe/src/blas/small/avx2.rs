//! The tiles on AVX2 with FMA: 8-lane vectors in 16 registers, so tiles of at most 12 x 1 or
//! 6 x 2 vectors; masked loads and stores only for the column tails; transposed stores
//! copied element by element from a buffer on the stack.

use std::arch::x86_64::*;

use super::super::transpose::transpose8;
use super::{tile_scalar, Tile};

/// Runs the kernel instantiated for `rows` rows and `v` vectors.
///
/// # Safety
/// AVX2 and FMA are available and the tile is in bounds.
pub(super) unsafe fn dispatch(rows: usize, v: usize, t: &Tile) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match v {
            1 => by_rows!(rows, 1, t, [1 2 3 4 5 6 7 8 9 10 11 12]),
            2 => by_rows!(rows, 2, t, [1 2 3 4 5 6]),
            _ => tile_scalar(rows, t),
        }
    }
}

/// A mask with lanes `0..n` (at most 8) set, for `maskload`/`maskstore`.
#[target_feature(enable = "avx2")]
fn lanes(n: usize) -> __m256i {
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// The `R x (8 V)` kernel.
///
/// # Safety
/// AVX2 and FMA are available; `R` rows of `P`, `t.cols` columns of `Q` and the matching
/// part of `C` are in bounds for the inner dimension `t.k`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const R: usize, const V: usize>(t: &Tile) {
    // SAFETY: forwarded from the caller.
    let acc = unsafe {
        if t.cols >= 8 * V {
            products::<R, V, false>(t)
        } else {
            products::<R, V, true>(t)
        }
    };
    // SAFETY: as above.
    unsafe {
        if V == 1 && R <= 8 && t.transposed {
            store_transposed::<R>(t, std::array::from_fn(|r| acc[r][0]));
        } else {
            store::<R, V>(t, &acc)
        }
    };
}

/// The transposed store of an `R x 8` tile (`R <= 8`): column `j` of the tile is `R`
/// contiguous values of `C`'s row `j`, so the tile is transposed in registers and each of its
/// `t.cols` columns stored as one (masked) vector, with the same arithmetic per value as
/// [`store`]: `alpha * acc (+ beta * C) (+ bias)`.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx2,fma")]
unsafe fn store_transposed<const R: usize>(t: &Tile, acc: [__m256; R]) {
    let (alpha, beta) = t.scalars;
    let (alpha_v, beta_v) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
    let mut rows = [_mm256_setzero_ps(); 8];
    for (o, a) in rows.iter_mut().zip(acc) {
        *o = _mm256_mul_ps(alpha_v, a);
    }
    let cols = transpose8(rows);
    let mask = lanes(R);
    let out = t.c.ptr.cast_mut();
    debug_assert_eq!(t.c.rs, 1);
    // SAFETY: the tile's rows of P (its bias values) and C's rows `0..t.cols`, `R` values
    // each, are in bounds; masked-off lanes are not touched.
    unsafe {
        let bias = if t.bias.is_null() {
            None
        } else {
            Some(_mm256_maskload_ps(t.bias, mask))
        };
        for (j, &col) in cols.iter().enumerate().take(t.cols) {
            let dst = out.add(j * t.c.cs);
            let mut val = col;
            if beta != 0.0 {
                val = _mm256_fmadd_ps(beta_v, _mm256_maskload_ps(dst, mask), val);
            }
            if let Some(b) = bias {
                val = _mm256_add_ps(val, b);
            }
            if R == 8 {
                _mm256_storeu_ps(dst, val);
            } else {
                _mm256_maskstore_ps(dst, mask, val);
            }
        }
    }
}

/// The `R x V` accumulators of the tile (alpha not applied). `MASKED`: the last vector of a
/// row of `Q` is partly past `t.cols` (masked-off lanes are not read).
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // R x V register tiles read clearer indexed
unsafe fn products<const R: usize, const V: usize, const MASKED: bool>(
    t: &Tile,
) -> [[__m256; V]; R] {
    let masks: [__m256i; V] = std::array::from_fn(|v| lanes(t.cols.saturating_sub(8 * v)));
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    // SAFETY: in bounds by the caller's contract.
    unsafe {
        for kk in 0..t.k {
            let qrow = t.q.add(kk * t.qld);
            let mut b = [_mm256_setzero_ps(); V];
            for v in 0..V {
                b[v] = if MASKED {
                    _mm256_maskload_ps(qrow.add(8 * v), masks[v])
                } else {
                    _mm256_loadu_ps(qrow.add(8 * v))
                };
            }
            let prow = t.p.ptr.add(kk * t.p.cs);
            for r in 0..R {
                let a = _mm256_broadcast_ss(&*prow.add(r * t.p.rs));
                for v in 0..V {
                    acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
                }
            }
        }
    }
    acc
}

/// `C = alpha * acc + beta * C (+ bias)` for the tile, straight or transposed.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn store<const R: usize, const V: usize>(t: &Tile, acc: &[[__m256; V]; R]) {
    let (alpha, beta) = t.scalars;
    let (alpha_v, beta_v) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
    let out = t.c.ptr.cast_mut();
    // SAFETY: the tile's part of C is in bounds; masked-off lanes are not touched.
    unsafe {
        if !t.transposed {
            for v in 0..V {
                let width = t.cols.saturating_sub(8 * v).min(8);
                let mask = lanes(width);
                let bias = if t.bias.is_null() {
                    None
                } else {
                    Some(_mm256_maskload_ps(t.bias.add(8 * v), mask))
                };
                for r in 0..R {
                    let dst = out.add(r * t.c.rs + 8 * v);
                    let mut val = _mm256_mul_ps(alpha_v, acc[r][v]);
                    if width == 8 {
                        if beta != 0.0 {
                            val = _mm256_fmadd_ps(beta_v, _mm256_loadu_ps(dst), val);
                        }
                        if let Some(b) = bias {
                            val = _mm256_add_ps(val, b);
                        }
                        _mm256_storeu_ps(dst, val);
                    } else {
                        if beta != 0.0 {
                            val = _mm256_fmadd_ps(beta_v, _mm256_maskload_ps(dst, mask), val);
                        }
                        if let Some(b) = bias {
                            val = _mm256_add_ps(val, b);
                        }
                        _mm256_maskstore_ps(dst, mask, val);
                    }
                }
            }
        } else {
            // Transposed: tile column j is C's row j, R contiguous floats.
            debug_assert_eq!(t.c.rs, 1);
            let mut buf = [[0.0f32; 16]; R];
            for r in 0..R {
                for v in 0..V {
                    let val = _mm256_mul_ps(alpha_v, acc[r][v]);
                    _mm256_storeu_ps(buf[r].as_mut_ptr().add(8 * v), val);
                }
            }
            for j in 0..t.cols {
                let dst = out.add(j * t.c.cs);
                for r in 0..R {
                    let d = dst.add(r);
                    let v = if beta != 0.0 {
                        beta.mul_add(*d, buf[r][j])
                    } else {
                        buf[r][j]
                    };
                    *d = if t.bias.is_null() {
                        v
                    } else {
                        v + *t.bias.add(r)
                    };
                }
            }
        }
    }
}
