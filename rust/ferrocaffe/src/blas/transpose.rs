//! Transposing blocks of a row-major matrix (x86-64), the step that puts an operand in the
//! layout a kernel reads: 8 x 8 blocks turned around in AVX2 registers ([`transpose8`]), the
//! elements that do not fill a block one at a time. A plain element-by-element copy ran at
//! about 4 cycles per element on the small kernels' transposed input: a quarter of a
//! `64 x 64` FC's time.

use std::arch::x86_64::*;

/// `dst[..m * k]` (`k x m`, row-major) `= src[..m * k]` (`m x k`, row-major) transposed.
///
/// With 8 or more rows and columns, every element is in some 8 x 8 block: when a side is not
/// a multiple of 8, its last block starts 8 before its end and overlaps the one before (the
/// values it writes again are the same). Only a matrix thinner than 8 goes element by element.
///
/// # Panics
/// When `src` or `dst` holds fewer than `m * k` values.
pub(super) fn transpose(src: &[f32], m: usize, k: usize, dst: &mut [f32]) {
    let len = m.saturating_mul(k);
    let (src, dst) = (&src[..len], &mut dst[..len]);
    if m >= 8 && k >= 8 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available; m, k >= 8 and both slices hold m * k values.
        unsafe { blocks(src, m, k, dst) };
        return;
    }
    for (i, row) in src.chunks_exact(k.max(1)).enumerate() {
        for (p, &v) in row.iter().enumerate() {
            dst[p * m + i] = v;
        }
    }
}

/// Block starts along a side of `n >= 8`: `0, 8, ..`, and `n - 8` when `n` is not a multiple.
fn starts(n: usize) -> impl Iterator<Item = usize> {
    (0..n - n % 8)
        .step_by(8)
        .chain((!n.is_multiple_of(8)).then_some(n - 8))
}

/// The 8 x 8 blocks of [`transpose`].
///
/// # Safety
/// AVX2 is available; `m, k >= 8`, and both slices hold `m * k` values.
#[target_feature(enable = "avx2")]
unsafe fn blocks(src: &[f32], m: usize, k: usize, dst: &mut [f32]) {
    for i0 in starts(m) {
        for p0 in starts(k) {
            // SAFETY: rows `i0..i0 + 8 <= m` and columns `p0..p0 + 8 <= k` lie in `src`, and
            // the transposed block in `dst`.
            unsafe {
                let t = transpose8(rows8(src.as_ptr().add(i0 * k + p0), k as isize, 8));
                for (c, v) in t.iter().enumerate() {
                    _mm256_storeu_ps(dst.as_mut_ptr().add((p0 + c) * m + i0), *v);
                }
            }
        }
    }
}

/// Transposes the 8 x 8 block held in `r` (row `i` in `r[i]`).
#[target_feature(enable = "avx2")]
pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Reads `count <= 8` rows of 8 consecutive values, row `i` at `src + i * stride`; rows past
/// `count` are zeros.
///
/// # Safety
/// The `count` rows of 8 values are readable.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rows8(src: *const f32, stride: isize, count: usize) -> [__m256; 8] {
    let mut r = [_mm256_setzero_ps(); 8];
    for (i, v) in r.iter_mut().enumerate().take(count) {
        // SAFETY: as the caller says.
        *v = unsafe { _mm256_loadu_ps(src.offset(i as isize * stride)) };
    }
    r
}

#[cfg(test)]
mod tests {
    use super::transpose;

    #[test]
    fn transposes_every_shape() {
        for &(m, k) in &[
            (0, 5),
            (1, 1),
            (3, 7),
            (8, 8),
            (9, 17),
            (16, 8),
            (64, 64),
            (20, 33),
            (7, 40),
            (40, 7),
            (144, 20),
            (12, 12),
        ] {
            let src: Vec<f32> = (0..m * k).map(|v| v as f32).collect();
            let mut dst = vec![f32::NAN; m * k];
            transpose(&src, m, k, &mut dst);
            for i in 0..m {
                for p in 0..k {
                    assert_eq!(dst[p * m + i], src[i * k + p], "{m}x{k} at ({i}, {p})");
                }
            }
        }
    }
}
