//! Sums of f32 values in f64 over eight lanes, for the normalization statistics (SpatialBN,
//! InstanceNorm, LayerNorm and their gradients) and SumElements.
//!
//! Lane `i` adds values `i, i + 8, i + 16, ...` in order; the lanes are then added 0 to 7, and
//! the last `len % 8` values after them, one by one. That order is the definition: the generic
//! version spells it out, and the x86-64 versions compute it with vectors (AVX: two 4-lane
//! halves; AVX-512F: one 8-lane vector), with separate multiplies and adds as the generic one
//! has, so every version gives the same bits. The compiler left the generic loop scalar
//! (`perf`: one `vcvtss2sd` and one `vmulsd` per value, 1.7 cycles a value on a Xeon), which
//! made the statistics most of a training SpatialBN's time.

use super::par::for_each_chunk;
use crate::error::{try_vec, Result};

/// Adds up `(sum of a(v), sum of b(v))` the way the module says, the lanes written out.
#[inline(always)]
fn generic(a: &[f32], b: &[f32], square: bool) -> (f64, f64) {
    let mut s1 = [0f64; 8];
    let mut s2 = [0f64; 8];
    let n = a.len().min(b.len());
    let (ca, cb) = (a[..n].chunks_exact(8), b[..n].chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            let (p, q) = terms(x[i], y[i], square);
            s1[i] += p;
            s2[i] += q;
        }
    }
    finish(s1, s2, ra, rb, square)
}

/// One value's two terms: `(x, x * x)` for plain sums of `x`, `(x * y, y)` for a dot product
/// of `x` with `y` beside the sum of `y`.
#[inline(always)]
fn terms(x: f32, y: f32, square: bool) -> (f64, f64) {
    let (x, y) = (f64::from(x), f64::from(y));
    if square {
        (x, x * x)
    } else {
        (x * y, y)
    }
}

/// The lanes added 0 to 7, then the values past the last whole 8.
#[inline(always)]
fn finish(s1: [f64; 8], s2: [f64; 8], ra: &[f32], rb: &[f32], square: bool) -> (f64, f64) {
    let (mut p, mut q) = (s1.iter().sum::<f64>(), s2.iter().sum::<f64>());
    for (&x, &y) in ra.iter().zip(rb) {
        let (u, v) = terms(x, y, square);
        p += u;
        q += v;
    }
    (p, q)
}

/// `(sum, sum of squares)` of `v` in f64.
pub(crate) fn sums_f64(v: &[f32]) -> (f64, f64) {
    run(v, v, true)
}

/// `(sum of a * b, sum of b)` in f64, over the values both slices have.
pub(crate) fn dot_sum_f64(a: &[f32], b: &[f32]) -> (f64, f64) {
    run(a, b, false)
}

fn run(a: &[f32], b: &[f32], square: bool) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { x86::sums_avx512(a, b, square) };
        }
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            return unsafe { x86::sums_avx(a, b, square) };
        }
    }
    generic(a, b, square)
}

/// Values per block of [`total_f64`].
const BLOCK: usize = 1 << 13;

/// The sum of `v` in f64: blocks of 8192 values each added as [`sums_f64`] does (the blocks
/// shared out to the team), then the blocks' sums in order. The same bits on any number of
/// threads.
pub(crate) fn total_f64(v: &[f32]) -> Result<f64> {
    if v.len() <= BLOCK {
        return Ok(sums_f64(v).0);
    }
    let mut blocks = try_vec(v.len().div_ceil(BLOCK), 0f64, "block sums")?;
    for_each_chunk(&mut blocks, 1, BLOCK, &|b0, part| {
        for (k, s) in part.iter_mut().enumerate() {
            let at = (b0 + k) * BLOCK;
            *s = sums_f64(&v[at..v.len().min(at + BLOCK)]).0;
        }
    });
    Ok(blocks.iter().sum())
}

/// Per-channel `(sum of a-terms, sum of b-terms)` of an `(n, c, inner)` tensor in NCHW (`c`
/// planes of `inner` values per image) or NHWC (`inner` pixels of `c` channels): with
/// `square`, `(x, x * x)` of `a`; else `(a * b, b)` (`b` as long as `a`). In parallel parts,
/// with the bits of one thread: NCHW sums each plane as [`sums_f64`] / [`dot_sum_f64`] (the
/// planes shared out), then adds a channel's planes in image order; NHWC adds each channel's
/// pixels in order within blocks of about 8192 values (the blocks shared out), then the
/// blocks' sums in order.
pub(crate) fn channel_sums(
    a: &[f32],
    b: &[f32],
    (n, c, inner): (usize, usize, usize),
    nhwc: bool,
    square: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut s1 = try_vec(c, 0f64, "per-channel sums")?;
    let mut s2 = try_vec(c, 0f64, "per-channel sums")?;
    let len = n.saturating_mul(c).saturating_mul(inner);
    if len == 0 || a.len() < len || b.len() < len {
        return Ok((s1, s2));
    }
    let (a, b) = (&a[..len], &b[..len]);
    if nhwc {
        // Blocks of whole pixels, about BLOCK values each, summed on their own (in parallel),
        // then added per channel in block order: the bits depend on the shape alone.
        let rows = (BLOCK / c).max(1);
        let pixels = n * inner;
        let blocks = pixels.div_ceil(rows);
        let mut part_sums = try_vec(
            blocks.saturating_mul(c),
            (0f64, 0f64),
            "per-block channel sums",
        )?;
        for_each_chunk(&mut part_sums, c, 2 * rows * c, &|b0, part| {
            for (k, sums) in part.chunks_mut(c).enumerate() {
                let at = (b0 + k) * rows * c..pixels.min((b0 + k + 1) * rows) * c;
                let (ba, bb) = (&a[at.clone()], &b[at]);
                for (j, block) in sums.chunks_mut(16).enumerate() {
                    pixel_sums(ba, bb, c, 16 * j, square, block);
                }
            }
        });
        for sums in part_sums.chunks_exact(c) {
            for ((d1, d2), &(p, q)) in s1.iter_mut().zip(s2.iter_mut()).zip(sums) {
                *d1 += p;
                *d2 += q;
            }
        }
    } else {
        let mut planes = try_vec(n * c, (0f64, 0f64), "per-plane sums")?;
        for_each_chunk(&mut planes, 1, 2 * inner, &|p0, part| {
            let at = p0 * inner..(p0 + part.len()) * inner;
            let (pa, pb) = (a[at.clone()].chunks_exact(inner), b[at].chunks_exact(inner));
            for ((s, xa), xb) in part.iter_mut().zip(pa).zip(pb) {
                *s = run(xa, xb, square);
            }
        });
        for (plane, (p, q)) in planes.into_iter().enumerate() {
            s1[plane % c] += p;
            s2[plane % c] += q;
        }
    }
    Ok((s1, s2))
}

/// Channels `c0..c0 + out.len()` (16 at most) of NHWC pixels of `c` channels: each channel's
/// terms added pixel by pixel, in order (on x86-64, 8 channels to a vector).
fn pixel_sums(a: &[f32], b: &[f32], c: usize, c0: usize, square: bool, out: &mut [(f64, f64)]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            done = unsafe { x86::pixel_sums_avx512(a, b, c, c0, square, out) };
        } else if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            done = unsafe { x86::pixel_sums_avx(a, b, c, c0, square, out) };
        }
    }
    // The channels left (all of them without the vector versions).
    for (k, o) in out.iter_mut().enumerate().skip(done) {
        let ch = c0 + k;
        let mut acc = (0f64, 0f64);
        for (pa, pb) in a.chunks_exact(c).zip(b.chunks_exact(c)) {
            let (p, q) = terms(pa[ch], pb[ch], square);
            acc.0 += p;
            acc.1 += q;
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::finish;
    use std::arch::x86_64::*;

    /// The x86-64 versions of [`super::generic`] (`$sums`) and of [`super::pixel_sums`]'s
    /// vector part (`$pixel_sums`) on f64 vectors of `$l` lanes (`$v`): a group of 8 values is
    /// `8 / $l` vectors, 16 channels `16 / $l`. One template for the two widths, so both give
    /// the generic definition's bits the same way.
    macro_rules! versions {
        ($feature:literal, $sums:ident, $pixel_sums:ident, $v:ty, $l:literal,
         $zero:ident, $load:ident, $add:ident, $mul:ident, $store:ident) => {
            /// [`super::generic`] on `8 / lanes` vectors a sum.
            #[target_feature(enable = $feature)]
            pub(super) fn $sums(a: &[f32], b: &[f32], square: bool) -> (f64, f64) {
                const H: usize = 8 / $l;
                let n = a.len().min(b.len());
                let whole = n - n % 8;
                let (mut s1, mut s2): ([$v; H], [$v; H]) = ([$zero(); H], [$zero(); H]);
                let mut i = 0;
                while i < whole {
                    for h in 0..H {
                        let at = i + $l * h;
                        // SAFETY: at + lanes <= i + 8 <= whole <= both lengths.
                        let x = unsafe { $load(a.as_ptr().add(at)) };
                        if square {
                            s1[h] = $add(s1[h], x);
                            s2[h] = $add(s2[h], $mul(x, x));
                        } else {
                            // SAFETY: as above.
                            let y = unsafe { $load(b.as_ptr().add(at)) };
                            s1[h] = $add(s1[h], $mul(x, y));
                            s2[h] = $add(s2[h], y);
                        }
                    }
                    i += 8;
                }
                let (mut l1, mut l2) = ([0f64; 8], [0f64; 8]);
                for h in 0..H {
                    // SAFETY: lanes * (h + 1) <= 8 values of each array (unaligned stores).
                    unsafe {
                        $store(l1.as_mut_ptr().add($l * h), s1[h]);
                        $store(l2.as_mut_ptr().add($l * h), s2[h]);
                    }
                }
                finish(l1, l2, &a[whole..n], &b[whole..n], square)
            }

            /// [`super::pixel_sums`] for the first whole vectors of `out`'s channels (16 at
            /// most); returns how many channels it did.
            #[target_feature(enable = $feature)]
            pub(super) fn $pixel_sums(
                a: &[f32],
                b: &[f32],
                c: usize,
                c0: usize,
                square: bool,
                out: &mut [(f64, f64)],
            ) -> usize {
                const H: usize = 16 / $l;
                let v = (out.len() / $l).min(H);
                if c0 + $l * v > c {
                    return 0;
                }
                let pixels = a.len().min(b.len()) / c.max(1);
                let (mut s1, mut s2): ([$v; H], [$v; H]) = ([$zero(); H], [$zero(); H]);
                for p in 0..pixels {
                    for j in 0..v {
                        let at = p * c + c0 + $l * j;
                        // SAFETY: at + lanes <= p * c + c <= pixels * c <= both lengths.
                        let x = unsafe { $load(a.as_ptr().add(at)) };
                        if square {
                            s1[j] = $add(s1[j], x);
                            s2[j] = $add(s2[j], $mul(x, x));
                        } else {
                            // SAFETY: as above.
                            let y = unsafe { $load(b.as_ptr().add(at)) };
                            s1[j] = $add(s1[j], $mul(x, y));
                            s2[j] = $add(s2[j], y);
                        }
                    }
                }
                let (mut l1, mut l2) = ([0f64; 16], [0f64; 16]);
                for j in 0..v {
                    // SAFETY: lanes * (j + 1) <= 16 values of each array (unaligned stores).
                    unsafe {
                        $store(l1.as_mut_ptr().add($l * j), s1[j]);
                        $store(l2.as_mut_ptr().add($l * j), s2[j]);
                    }
                }
                for (o, (p, q)) in out.iter_mut().zip(l1.into_iter().zip(l2)).take($l * v) {
                    *o = (p, q);
                }
                $l * v
            }
        };
    }

    /// 8 floats from `p` as f64.
    #[target_feature(enable = "avx512f")]
    unsafe fn load8(p: *const f32) -> __m512d {
        // SAFETY: the caller's `p` holds 8 floats.
        unsafe { _mm512_cvtps_pd(_mm256_loadu_ps(p)) }
    }

    /// 4 floats from `p` as f64.
    #[target_feature(enable = "avx")]
    unsafe fn load4(p: *const f32) -> __m256d {
        // SAFETY: the caller's `p` holds 4 floats.
        unsafe { _mm256_cvtps_pd(_mm_loadu_ps(p)) }
    }

    versions!(
        "avx512f",
        sums_avx512,
        pixel_sums_avx512,
        __m512d,
        8,
        _mm512_setzero_pd,
        load8,
        _mm512_add_pd,
        _mm512_mul_pd,
        _mm512_storeu_pd
    );
    versions!(
        "avx",
        sums_avx,
        pixel_sums_avx,
        __m256d,
        4,
        _mm256_setzero_pd,
        load4,
        _mm256_add_pd,
        _mm256_mul_pd,
        _mm256_storeu_pd
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values whose f64 sums round differently in another order: wide magnitudes and signs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let m = ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
                let e = ((s >> 20) % 40) as i32 - 20;
                m * 2f32.powi(e)
            })
            .collect()
    }

    /// [`channel_sums`] as its docs define it, one value at a time.
    fn channel_sums_by_definition(
        a: &[f32],
        b: &[f32],
        (n, c, inner): (usize, usize, usize),
        nhwc: bool,
        square: bool,
    ) -> Vec<(u64, u64)> {
        let mut s = vec![(0f64, 0f64); c];
        if nhwc {
            let rows = (BLOCK / c).max(1);
            let pixels: Vec<usize> = (0..n * inner).collect();
            for block in pixels.chunks(rows) {
                for (ch, acc) in s.iter_mut().enumerate() {
                    let mut part = (0f64, 0f64);
                    for &p in block {
                        let (u, v) = terms(a[p * c + ch], b[p * c + ch], square);
                        part.0 += u;
                        part.1 += v;
                    }
                    acc.0 += part.0;
                    acc.1 += part.1;
                }
            }
        } else {
            for plane in 0..n * c {
                let at = plane * inner..(plane + 1) * inner;
                let (u, v) = generic(&a[at.clone()], &b[at], square);
                s[plane % c].0 += u;
                s[plane % c].1 += v;
            }
        }
        s.into_iter()
            .map(|(u, v)| (u.to_bits(), v.to_bits()))
            .collect()
    }

    #[test]
    fn channel_sums_give_the_bits_of_their_definition_on_any_thread_count() {
        let shapes = [
            (2, 3, 5),
            (1, 1, 40000),
            (8, 8, 64),
            (3, 20, 49),
            (8, 24, 300),
            (8, 64, 256),
            (2, 100, 9),
            (1, 9000, 2),
        ];
        for (i, &(n, c, inner)) in shapes.iter().enumerate() {
            let len = n * c * inner;
            let (a, b) = (values(len, 10 + i as u64), values(len, 50 + i as u64));
            for nhwc in [false, true] {
                for square in [true, false] {
                    let want = channel_sums_by_definition(&a, &b, (n, c, inner), nhwc, square);
                    let bits = |(u, v): (Vec<f64>, Vec<f64>)| -> Vec<(u64, u64)> {
                        u.iter()
                            .zip(&v)
                            .map(|(p, q)| (p.to_bits(), q.to_bits()))
                            .collect()
                    };
                    let many = channel_sums(&a, &b, (n, c, inner), nhwc, square).unwrap();
                    let one = crate::threads::single_threaded(|| {
                        channel_sums(&a, &b, (n, c, inner), nhwc, square).unwrap()
                    });
                    let what = format!("{n}x{c}x{inner}, nhwc {nhwc}, square {square}");
                    assert_eq!(bits(many), want, "{what}");
                    assert_eq!(bits(one), want, "one thread, {what}");
                }
            }
        }
    }

    #[test]
    fn a_total_is_its_blocks_added_in_order() {
        for n in [0, 5, BLOCK, BLOCK + 1, 5 * BLOCK + 17] {
            let v = values(n, 7);
            let want = v.chunks(BLOCK).map(|b| generic(b, b, true).0).sum::<f64>();
            let want = if n == 0 { 0.0 } else { want };
            assert_eq!(total_f64(&v).unwrap().to_bits(), want.to_bits(), "n = {n}");
            let one = crate::threads::single_threaded(|| total_f64(&v).unwrap());
            assert_eq!(one.to_bits(), want.to_bits(), "one thread, n = {n}");
        }
    }

    #[test]
    fn every_version_gives_the_bits_of_the_definition() {
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 64, 255, 256, 1000, 4099] {
            let (a, b) = (values(n, 1), values(n + 3, 2));
            let want = [generic(&a, &a, true), generic(&a, &b, false)];
            let got = [sums_f64(&a), dot_sum_f64(&a, &b)];
            assert_eq!(
                got.map(|(p, q)| (p.to_bits(), q.to_bits())),
                want.map(|(p, q)| (p.to_bits(), q.to_bits())),
                "n = {n}"
            );
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx") {
                    // SAFETY: the CPU has AVX.
                    let v = unsafe { [x86::sums_avx(&a, &a, true), x86::sums_avx(&a, &b, false)] };
                    assert_eq!(v, want, "AVX, n = {n}");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    let v = unsafe {
                        [
                            x86::sums_avx512(&a, &a, true),
                            x86::sums_avx512(&a, &b, false),
                        ]
                    };
                    assert_eq!(v, want, "AVX-512F, n = {n}");
                }
            }
            // The values are such that the order matters: a plain left-to-right sum differs.
            if n == 4099 {
                let seq = a.iter().fold(0f64, |s, &v| s + f64::from(v));
                assert_ne!(seq.to_bits(), want[0].0.to_bits());
            }
        }
    }
}
