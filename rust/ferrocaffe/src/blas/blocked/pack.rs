//! Copying blocks of the operands into the micro-kernel's layout ("packing"): `A` in panels
//! of [`MR`] rows, each `kc` groups of `MR` values; `B` in panels of [`NR`] columns, each
//! `kc` rows of `NR` values. Rows or columns past the matrix are zeros, so edge tiles run the
//! same kernel.
//!
//! Where the source runs along the panel's long side (`A` by rows, a transposed `B` by
//! columns: FC's weight), eight steps of the inner dimension are read as one vector per row
//! and turned around in registers (an 8 x 8 transpose); a scalar copy of that layout went at
//! one element per cycle, an eighth of the product's time at 1024 x 1024 on one core.

use std::arch::x86_64::*;

use super::{View, MR, NR};
use crate::blas::transpose::{rows8, transpose8};

/// Panels `panels` of the `A` block at rows `i0..i0 + mc`, columns `p0..p0 + kc` of `op(A)`,
/// into `dst` (the block's start: panel `q` at `q * MR * kc`).
///
/// # Safety
/// AVX2 is available; the block's rows below `m` lie in the matrix; `dst` has room for the
/// block's panels and no other thread writes these panels meanwhile.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn a_panels(
    a: &View,
    m: usize,
    i0: usize,
    p0: usize,
    kc: usize,
    panels: std::ops::Range<usize>,
    dst: *mut f32,
) {
    // Six lanes of eight: one step of a panel.
    let six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for q in panels {
        let r0 = i0 + q * MR;
        let rows = m.saturating_sub(r0).min(MR);
        // SAFETY: panel `q` of the block, as the caller says.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(q * MR * kc), MR * kc) };
        if rows < MR {
            out.fill(0.0);
        }
        if a.cs == 1 {
            // Rows contiguous: eight steps of every row at once, transposed.
            let full = kc / 8 * 8;
            for p in (0..full).step_by(8) {
                // SAFETY: rows `r0..r0 + rows` of op(A), columns `p0 + p..+8` inside the block.
                let t = transpose8(unsafe { rows8(a.at(r0, p0 + p), a.rs, rows) });
                for (s, v) in t.iter().enumerate() {
                    // SAFETY: six floats of step `p + s`, inside the panel.
                    unsafe { _mm256_maskstore_ps(out.as_mut_ptr().add((p + s) * MR), six, *v) };
                }
            }
            for r in 0..rows {
                for p in full..kc {
                    // SAFETY: row `r0 + r < m`, column `p0 + p` of the block.
                    out[p * MR + r] = unsafe { *a.at(r0 + r, p0 + p) };
                }
            }
        } else {
            for p in 0..kc {
                // SAFETY: column `p0 + p` of op(A), rows `r0..r0 + rows` (stride `rs`).
                let src = unsafe { a.at(r0, p0 + p) };
                for (r, o) in out[p * MR..p * MR + rows].iter_mut().enumerate() {
                    // SAFETY: as above.
                    *o = unsafe { *src.offset(r as isize * a.rs) };
                }
            }
        }
    }
}

/// Panels `panels` of the `B` block at rows `p0..p0 + kc`, columns `j0..` of `op(B)` (of `n`
/// columns), into `dst` (the block's start: panel `q` at `q * NR * kc`).
///
/// # Safety
/// As [`a_panels`], for `op(B)`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn b_panels(
    b: &View,
    n: usize,
    j0: usize,
    p0: usize,
    kc: usize,
    panels: std::ops::Range<usize>,
    dst: *mut f32,
) {
    for q in panels {
        let c0 = j0 + q * NR;
        let cols = n.saturating_sub(c0).min(NR);
        // SAFETY: panel `q` of the block, as the caller says.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(q * NR * kc), NR * kc) };
        if cols < NR {
            out.fill(0.0);
        }
        if b.cs == 1 {
            for p in 0..kc {
                // SAFETY: row `p0 + p` of op(B), columns `c0..c0 + cols`, contiguous.
                let src = unsafe { std::slice::from_raw_parts(b.at(p0 + p, c0), cols) };
                out[p * NR..p * NR + cols].copy_from_slice(src);
            }
        } else if b.rs == 1 {
            // Columns contiguous (a transposed B): eight steps of eight columns at once,
            // transposed, for each half of the panel.
            let full = kc / 8 * 8;
            for half in 0..2 {
                let count = cols.saturating_sub(half * 8).min(8);
                if count == 0 {
                    break;
                }
                for p in (0..full).step_by(8) {
                    // SAFETY: columns `c0 + 8 half..+count` of op(B), rows `p0 + p..+8`.
                    let t = transpose8(unsafe { rows8(b.at(p0 + p, c0 + half * 8), b.cs, count) });
                    for (s, v) in t.iter().enumerate() {
                        // SAFETY: eight floats of step `p + s`, inside the panel.
                        unsafe {
                            _mm256_storeu_ps(out.as_mut_ptr().add((p + s) * NR + half * 8), *v)
                        };
                    }
                }
            }
            for j in 0..cols {
                for p in full..kc {
                    // SAFETY: column `c0 + j < n`, row `p0 + p` of the block.
                    out[p * NR + j] = unsafe { *b.at(p0 + p, c0 + j) };
                }
            }
        } else {
            for j in 0..cols {
                // SAFETY: column `c0 + j < n` of op(B), rows `p0..p0 + kc` (stride `rs`).
                let src = unsafe { b.at(p0, c0 + j) };
                for p in 0..kc {
                    // SAFETY: as above.
                    out[p * NR + j] = unsafe { *src.offset(p as isize * b.rs) };
                }
            }
        }
    }
}
