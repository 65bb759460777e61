//! Winograd convolution of 3x3 filters, stride 1, no dilation, one group (the 3x3 layers of
//! VGG, ResNet and the style nets), forward only, in both orders: F(2x2, 3x3) and F(4x4, 3x3)
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks").
//!
//! Each output tile of `m x m` pixels (m = 2 or 4) is computed from an input tile of
//! `a x a = (m + 2) x (m + 2)` pixels: with `U = G g G^T` (a filter `g` taken to `a x a`),
//! `V = B^T d B` (an input tile `d`), the tile is `A^T (U .* V) A`. Summed over the input
//! channels, the `a^2` element-wise products become `a^2` independent matrix products
//! `M[xi] = V[xi] U[xi]` (tiles x C by C x K), so the multiply-adds are those of the products:
//! `a^2 / m^2` per output pixel and tap pair instead of 9, a 2.25x (F2) or 4x (F4) cut, for the
//! price of the transforms (linear in C + K per tile, not C * K).
//!
//! How it runs:
//! - the filters are transformed once per run into `U [a^2][C][K]` (parts of the input
//!   channels shared out to the team of compute threads);
//! - the tiles of all images, in raster order, are cut in blocks of at most [`MAX_BLOCK`]
//!   tiles; each thread of the team takes blocks from a counter and, with its own scratch,
//!   transforms the block's input tiles into `V [a^2][tiles][C]`, runs the `a^2` products
//!   through the project's GEMM (`tiles <= 64` rows times `U[xi]`: the small-dimension
//!   kernels, which read `U` in place), and transforms the products back into the output
//!   tiles, with the bias and a fused Relu applied as they are written;
//! - the transforms work on 8 channels at once (arrays of 8 lanes the compiler vectorizes).
//!
//! Precision: F2's transforms only add and halve; F4's multiply by up to 8 (and 1/24), which
//! costs a few bits: against a float64 reference its error is about 10x that of im2col
//! (still ~1e-5 relative on unit-scale data with a few hundred channels; the tests bound it).
//!
//! `FERROCAFFE_WINOGRAD` (read when the op is created): `0` turns it off (im2col + GEMM
//! everywhere), `2` or `4` force F2 or F4 on every shape that qualifies (tests, A/B
//! measurements), anything else (or unset) takes the measured rules of [`Mode::choose`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::conv::Dims;
use super::conv_args::{Geometry, Order};
use super::par::SharedOut;
use crate::blas::{for_each_part, GemmContext};
use crate::error::{try_vec, Error, Result};
use crate::tensor::{Snapshot, Tensor};

/// The environment variable that turns the Winograd path off (`0`) or forces a tile size.
pub const WINOGRAD_VAR: &str = "FERROCAFFE_WINOGRAD";

/// Lanes of the transforms: 8 channels at once (one AVX2 vector, two SSE ones).
const L: usize = 8;
type Lanes = [f32; L];

/// The most tiles in a block: the products then have at most 64 rows, the small-dimension
/// kernels' range.
const MAX_BLOCK: usize = 64;

/// Output tile size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tile {
    /// F(2x2, 3x3): 4x4 input tiles.
    F2,
    /// F(4x4, 3x3): 6x6 input tiles.
    F4,
}

/// Whether and how the Winograd path is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Never (im2col + GEMM).
    Off,
    /// Where measured to pay ([`Mode::choose`]).
    Auto,
    /// This tile size on every shape that qualifies.
    Force(Tile),
}

impl Mode {
    /// The mode `FERROCAFFE_WINOGRAD` asks for.
    pub(crate) fn from_env() -> Mode {
        match std::env::var(WINOGRAD_VAR) {
            Ok(v) => match v.trim() {
                "0" => Mode::Off,
                "2" => Mode::Force(Tile::F2),
                "4" => Mode::Force(Tile::F4),
                _ => Mode::Auto,
            },
            Err(_) => Mode::Auto,
        }
    }

    /// The tile size a convolution runs with, or `None` for im2col + GEMM.
    pub(crate) fn choose(self, g: &Geometry, d: &Dims) -> Option<Tile> {
        let fits = d.kh == 3
            && d.kw == 3
            && g.stride == [1, 1]
            && g.dilation == [1, 1]
            && d.group == 1
            && d.oh > 0
            && d.ow > 0;
        if !fits {
            return None;
        }
        match self {
            Mode::Off => None,
            Mode::Force(t) => Some(t),
            Mode::Auto => auto(g.order, d),
        }
    }
}

/// The measured rules (`benchmarks/bench_conv3x3.py`, 2-core AMD EPYC with AVX2, shared with
/// other builds, so single ratios vary by +-20%; ratios im2col time / Winograd time):
///
/// - F4 beat F2 on nearly every shape (geomean 1.56 against 1.17 over C = K = 16..256, 8x8 to
///   56x56, N = 1 and 8, both orders): the rules only pick F4 (F2 stays for
///   `FERROCAFFE_WINOGRAD=2`, its error is ~20x smaller);
/// - 3 or 8 input channels lost 1.2x to 4x (0.24..0.88: a first layer on RGB images, where
///   im2col's product is already thin), and so did 16 inputs to 64 outputs (0.70..1.05);
///   16 to 16 won (1.05..2.5) but for NHWC 14x14, as did 64 to 16 (1.1..3.4);
/// - from 32 channels on both ways F4 won 1.2x to 2.9x, except that in NHWC, where im2col
///   copies whole runs of channels, images whose size is not a multiple of 4 (14x14: the
///   tiles cover 16x16, 31% more) lost with 16 or 32 channels (0.81..0.97), and that with
///   more than 128 x 128 channels fewer than 32 tiles lost (below).
fn auto(order: Order, d: &Dims) -> Option<Tile> {
    if d.c < 16 || d.m < 16 || (d.c < 32 && d.m > d.c) {
        return None;
    }
    // The 4x4 tiles cover more than 1.15x the output (saturating: the output exists, so its
    // size is far from overflowing, and a saturated product only compares).
    let covered = (d.oh.div_ceil(4) * 4).saturating_mul(d.ow.div_ceil(4) * 4);
    let wasteful = covered.saturating_mul(20) > d.oh.saturating_mul(d.ow).saturating_mul(23);
    if order == Order::Nhwc && d.c < 64 && wasteful {
        return None;
    }
    // Few tiles for large filters: each element of U (4x the filters) is read for a handful
    // of tiles, so the products wait for memory where im2col's reuse each filter value for
    // every output pixel; 256 channels on one 8x8 or 14x14 image ran 0.5x..1.2x.
    let tiles = d.n.saturating_mul(covered / 16);
    if d.c.saturating_mul(d.m) > 128 * 128 && tiles < 32 {
        return None;
    }
    Some(Tile::F4)
}

/// One convolution's operands and sizes.
pub(crate) struct Problem<'a> {
    pub(crate) order: Order,
    /// Padding (top, left); bottom and right are implied by the output size.
    pub(crate) pad: [usize; 2],
    pub(crate) d: Dims,
    pub(crate) gemm: GemmContext,
    pub(crate) x: &'a [f32],
    pub(crate) w: &'a [f32],
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) relu: bool,
    /// The filter tensor (`w` is its data) and the op's cache of its transform, if the
    /// transform may be kept between runs.
    pub(crate) keep: Option<(&'a Tensor, &'a FilterCache)>,
}

/// The transformed filters of an op's last run, kept while the filter tensor is unchanged
/// (an inference net's weights): the transform costs as much as the products on small images
/// (256 channels at 8x8: 65536 filters, 36 values each).
///
/// The filters are known by their address and length, which is sound for the reason
/// `blas::constant` gives: the entry holds a [`Snapshot`] of the tensor, so its buffer is
/// neither written in place (a write copies it away first) nor freed while the entry lives,
/// and data at that address and length is the data transformed.
#[derive(Default)]
pub(crate) struct FilterCache(parking_lot::Mutex<Option<Cached>>);

struct Cached {
    _held: Snapshot,
    addr: usize,
    len: usize,
    tile: Tile,
    order: Order,
    ck: (usize, usize),
    u: Arc<Vec<f32>>,
}

/// Y of the whole batch (`y` is `[N, K, oh, ow]` or `[N, oh, ow, K]`).
pub(crate) fn forward(tile: Tile, p: &Problem<'_>, y: &mut [f32]) -> Result<()> {
    match tile {
        Tile::F2 => run::<F2>(p, y),
        Tile::F4 => run::<F4>(p, y),
    }
}

fn too_large(d: &Dims) -> Error {
    Error::OutOfMemory(format!(
        "the Winograd buffers of a convolution of {} channels to {} on {}x{} images are too large \
         to allocate",
        d.c, d.m, d.h, d.w
    ))
}

fn mul(a: usize, b: usize, d: &Dims) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| too_large(d))
}

fn run<T: Transform>(p: &Problem<'_>, y: &mut [f32]) -> Result<()> {
    let d = &p.d;
    let (m, a) = (T::M, T::A);
    let aa = a * a;
    let (th, tw) = (d.oh.div_ceil(m), d.ow.div_ceil(m));
    let tiles = mul(mul(d.n, th, d)?, tw, d)?;
    let (c, k) = (d.c, d.m);
    let tile = if T::M == 2 { Tile::F2 } else { Tile::F4 };
    let key = (p.w.as_ptr() as usize, p.w.len(), tile, p.order, (c, k));
    let cached = p.keep.and_then(|(_, cache)| {
        let held = cache.0.lock();
        held.as_ref()
            .filter(|e| (e.addr, e.len, e.tile, e.order, e.ck) == key)
            .map(|e| e.u.clone())
    });
    let u = match cached {
        Some(u) => u,
        None => {
            let u = Arc::new(filters::<T>(p)?);
            if let Some((wt, cache)) = p.keep {
                *cache.0.lock() = Some(Cached {
                    _held: wt.snapshot(),
                    addr: key.0,
                    len: key.1,
                    tile,
                    order: p.order,
                    ck: (c, k),
                    u: u.clone(),
                });
            }
            u
        }
    };

    let threads = crate::threads::num_threads();
    // Blocks of at most 64 tiles, and two per thread when that leaves at least 16 tiles in
    // each (the threads take blocks as they go, so one that gets less of its core does fewer).
    // Fewer tiles stay in one block, whose products the team then splits: a block reads all
    // of U, and with 256 channels (9 MB of U) one block per thread on 4 or 16 tiles ran
    // 1.5x to 2x slower than one block (2 threads contending for memory).
    let blocks = tiles
        .div_ceil(MAX_BLOCK)
        .max(tiles.div_ceil(16).min(threads.saturating_mul(2)))
        .max(1);
    let per_block = tiles.div_ceil(blocks);
    let blocks = tiles.div_ceil(per_block);
    let parts = blocks.min(threads).max(1);
    let v_len = mul(mul(aa, per_block, d)?, c, d)?;
    let m_len = mul(mul(aa, per_block, d)?, k, d)?;
    let mut scratch = Vec::with_capacity(parts);
    for _ in 0..parts {
        scratch.push((
            try_vec(v_len, 0f32, "the Winograd input tiles")?,
            try_vec(m_len, 0f32, "the Winograd products")?,
        ));
    }
    // SAFETY: every output element belongs to exactly one tile, and every tile to one block,
    // which one thread processes: the threads write disjoint elements.
    let out = unsafe { SharedOut::new(y) };
    let next = AtomicUsize::new(0);
    let geo = TileGeo {
        th,
        tw,
        avx2: has_avx2(),
    };
    for_each_part(scratch, &|(mut v, mut mm)| loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= blocks {
            break;
        }
        let t0 = b * per_block;
        let cnt = per_block.min(tiles - t0);
        block::<T>(p, &geo, &u, t0, cnt, &mut v, &mut mm, &out);
    });
    Ok(())
}

/// Tiles per column and per row of an image, and whether the transforms may use AVX2.
struct TileGeo {
    th: usize,
    tw: usize,
    avx2: bool,
}

/// Whether this CPU has AVX2 and FMA (the transforms then run on 8-lane vectors).
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `U [a^2][C][K]`: the transformed filters.
fn filters<T: Transform>(p: &Problem<'_>) -> Result<Vec<f32>> {
    let d = &p.d;
    let (c, k) = (d.c, d.m);
    let aa = T::A * T::A;
    let len = mul(mul(aa, c, d)?, k, d)?;
    // [C][a^2][K] first (contiguous per input channel, so parts of the channels are disjoint
    // slices), then transposed into [a^2][C][K].
    let mut tmp = try_vec(len, 0f32, "the Winograd filters")?;
    let per = crate::blas::part_len(c, len);
    let parts: Vec<(usize, &mut [f32])> = tmp
        .chunks_mut(per * aa * k)
        .enumerate()
        .map(|(i, s)| (i * per, s))
        .collect();
    for_each_part(parts, &|(c0, s)| {
        for (ci, dst) in s.chunks_mut(aa * k).enumerate() {
            let ch = c0 + ci;
            let mut k0 = 0;
            while k0 < k {
                let nl = L.min(k - k0);
                let mut g = [[0f32; L]; 9];
                for (l, kk) in (k0..k0 + nl).enumerate() {
                    for (r, gr) in g.iter_mut().enumerate() {
                        gr[l] = match p.order {
                            Order::Nchw => p.w[(kk * c + ch) * 9 + r],
                            Order::Nhwc => p.w[(kk * 9 + r) * c + ch],
                        };
                    }
                }
                let mut uu = [[0f32; L]; 36];
                T::filter(&g, &mut uu);
                for (xi, ux) in uu[..aa].iter().enumerate() {
                    dst[xi * k + k0..xi * k + k0 + nl].copy_from_slice(&ux[..nl]);
                }
                k0 += nl;
            }
        }
    });
    let mut u = try_vec(len, 0f32, "the Winograd filters")?;
    for ch in 0..c {
        for xi in 0..aa {
            let src = (ch * aa + xi) * k;
            let dst = (xi * c + ch) * k;
            u[dst..dst + k].copy_from_slice(&tmp[src..src + k]);
        }
    }
    Ok(u)
}

/// Tiles `t0 .. t0 + cnt`: input transform, products, output transform; compiled for AVX2
/// where the CPU has it (the baseline build has SSE2 only: the transforms' 8 lanes then take
/// two instructions each).
#[allow(clippy::too_many_arguments)]
fn block<T: Transform>(
    p: &Problem<'_>,
    geo: &TileGeo,
    u: &[f32],
    t0: usize,
    cnt: usize,
    v: &mut [f32],
    mm: &mut [f32],
    out: &SharedOut<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    if geo.avx2 {
        // SAFETY: the CPU has AVX2 and FMA (`has_avx2`).
        unsafe { block_avx2::<T>(p, geo, u, t0, cnt, v, mm, out) };
        return;
    }
    block_body::<T>(p, geo, u, t0, cnt, v, mm, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx2<T: Transform>(
    p: &Problem<'_>,
    geo: &TileGeo,
    u: &[f32],
    t0: usize,
    cnt: usize,
    v: &mut [f32],
    mm: &mut [f32],
    out: &SharedOut<'_>,
) {
    block_body::<T>(p, geo, u, t0, cnt, v, mm, out);
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn block_body<T: Transform>(
    p: &Problem<'_>,
    geo: &TileGeo,
    u: &[f32],
    t0: usize,
    cnt: usize,
    v: &mut [f32],
    mm: &mut [f32],
    out: &SharedOut<'_>,
) {
    let d = &p.d;
    let (m, a) = (T::M, T::A);
    let aa = a * a;
    let (c, k) = (d.c, d.m);
    let per_img = geo.th * geo.tw;
    let origin = |t: usize| {
        let (img, r) = (t / per_img, t % per_img);
        (img, (r / geo.tw) * m, (r % geo.tw) * m)
    };
    // The tiles' arrays, made once per block: each tile writes the lanes it reads back (the
    // lanes past a last partial group of channels carry stale values through the transforms
    // and are never stored). Made per tile, their zeroing and the copies of a run-time number
    // of lanes went to `memset` and `memmove` calls, a third of a 32-channel layer's time.
    let (mut dt, mut vt) = ([[0f32; L]; 36], [[0f32; L]; 36]);
    let (mut mt, mut o) = ([[0f32; L]; 36], [[0f32; L]; 16]);
    // Input tiles -> V [a^2][cnt][C].
    for q in 0..cnt {
        let (img, oy, ox) = origin(t0 + q);
        let y0 = oy as isize - p.pad[0] as isize;
        let x0 = ox as isize - p.pad[1] as isize;
        let inside = y0 >= 0 && x0 >= 0 && y0 as usize + a <= d.h && x0 as usize + a <= d.w;
        let mut c0 = 0;
        while c0 < c {
            let nl = L.min(c - c0);
            if !inside {
                // The padding's zeros (gather writes only the pixels inside the image).
                dt = [[0f32; L]; 36];
            }
            gather(p, img, c0, nl, y0, x0, a, inside, &mut dt);
            T::input(&dt, &mut vt);
            for (xi, vx) in vt[..aa].iter().enumerate() {
                let at = (xi * cnt + q) * c + c0;
                copy_lanes(&mut v[at..at + nl], vx);
            }
            c0 += nl;
        }
    }
    // The products M[xi] = V[xi] U[xi]: [cnt, C] x [C, K].
    for xi in 0..aa {
        p.gemm.sgemm(
            false,
            false,
            cnt,
            k,
            c,
            1.0,
            &v[xi * cnt * c..(xi + 1) * cnt * c],
            &u[xi * c * k..(xi + 1) * c * k],
            0.0,
            &mut mm[xi * cnt * k..(xi + 1) * cnt * k],
        );
    }
    // M -> output tiles, bias, Relu.
    for q in 0..cnt {
        let (img, oy, ox) = origin(t0 + q);
        let (rows, cols) = (m.min(d.oh - oy), m.min(d.ow - ox));
        let mut k0 = 0;
        while k0 < k {
            let nl = L.min(k - k0);
            for (xi, mx) in mt[..aa].iter_mut().enumerate() {
                let at = (xi * cnt + q) * k + k0;
                copy_lanes(mx, &mm[at..at + nl]);
            }
            T::output(&mt, &mut o);
            if let Some(b) = p.bias {
                for ov in o[..m * m].iter_mut() {
                    for (x, bv) in ov[..nl].iter_mut().zip(&b[k0..k0 + nl]) {
                        *x += bv;
                    }
                }
            }
            if p.relu {
                for ov in o[..m * m].iter_mut() {
                    for x in ov.iter_mut() {
                        *x = if *x > 0.0 { *x } else { 0.0 };
                    }
                }
            }
            for i in 0..rows {
                for j in 0..cols {
                    let ov = &o[i * m + j];
                    match p.order {
                        Order::Nchw => {
                            for (l, &val) in ov[..nl].iter().enumerate() {
                                let at = ((img * k + k0 + l) * d.oh + oy + i) * d.ow + ox + j;
                                out.set(at, val);
                            }
                        }
                        Order::Nhwc => {
                            let at = ((img * d.oh + oy + i) * d.ow + ox + j) * k + k0;
                            for (l, &val) in ov[..nl].iter().enumerate() {
                                out.set(at + l, val);
                            }
                        }
                    }
                }
            }
            k0 += nl;
        }
    }
}

/// `dst[..n] = src[..n]` for the `n <= 8` values the shorter holds: a fixed-size copy (inlined)
/// for a whole group of 8 lanes.
#[inline(always)]
fn copy_lanes(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    if n == L {
        dst[..L].copy_from_slice(&src[..L]);
    } else {
        for (d, s) in dst[..n].iter_mut().zip(src) {
            *d = *s;
        }
    }
}

/// The `a x a` input tile at `(y0, x0)` (may reach into the padding: zeros) of channels
/// `c0 .. c0 + nl` of image `img`, into `dt[i * a + j][lane]`.
// `l` picks a lane of every value of the tile, not an element of one array.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
fn gather(
    p: &Problem<'_>,
    img: usize,
    c0: usize,
    nl: usize,
    y0: isize,
    x0: isize,
    a: usize,
    inside: bool,
    dt: &mut [Lanes; 36],
) {
    let d = &p.d;
    let (h, w, c) = (d.h, d.w, d.c);
    match p.order {
        Order::Nchw => {
            for l in 0..nl {
                let plane = &p.x[(img * c + c0 + l) * h * w..(img * c + c0 + l + 1) * h * w];
                if inside {
                    let (y0, x0) = (y0 as usize, x0 as usize);
                    for i in 0..a {
                        let row = &plane[(y0 + i) * w + x0..(y0 + i) * w + x0 + a];
                        for (j, &xv) in row.iter().enumerate() {
                            dt[i * a + j][l] = xv;
                        }
                    }
                } else {
                    for i in 0..a {
                        let iy = y0 + i as isize;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        for j in 0..a {
                            let ix = x0 + j as isize;
                            if ix >= 0 && ix < w as isize {
                                dt[i * a + j][l] = plane[iy as usize * w + ix as usize];
                            }
                        }
                    }
                }
            }
        }
        Order::Nhwc => {
            for i in 0..a {
                let iy = y0 + i as isize;
                if !inside && (iy < 0 || iy >= h as isize) {
                    continue;
                }
                for j in 0..a {
                    let ix = x0 + j as isize;
                    if !inside && (ix < 0 || ix >= w as isize) {
                        continue;
                    }
                    let at = ((img * h + iy as usize) * w + ix as usize) * c + c0;
                    copy_lanes(&mut dt[i * a + j], &p.x[at..at + nl]);
                }
            }
        }
    }
}

/// The three transforms of one tile size, on 8 lanes at once. Arrays hold `a x a` (or
/// `m x m`) row-major tiles at their front.
trait Transform {
    const M: usize;
    const A: usize;
    /// `G g G^T`: 3x3 -> a x a.
    fn filter(g: &[Lanes; 9], u: &mut [Lanes; 36]);
    /// `B^T d B`: a x a -> a x a.
    fn input(d: &[Lanes; 36], v: &mut [Lanes; 36]);
    /// `A^T m A`: a x a -> m x m.
    fn output(mt: &[Lanes; 36], o: &mut [Lanes; 16]);
}

/// Applies a 1-d transform `f` (`I` values to `O`) to the columns of the `I x I` tile `src`,
/// then to the rows of the result: `dst` is `O x O`.
#[inline(always)]
fn two_d<const I: usize, const O: usize>(
    src: &[Lanes],
    f: impl Fn(&[Lanes; I]) -> [Lanes; O],
    dst: &mut [Lanes],
) {
    // Built in place rather than zeroed and then filled (the zeroing was a `memset` call).
    let cols: [[Lanes; O]; I] =
        std::array::from_fn(|col| f(&std::array::from_fn(|r| src[r * I + col])));
    for o in 0..O {
        let row: [Lanes; I] = std::array::from_fn(|col| cols[col][o]);
        dst[o * O..(o + 1) * O].copy_from_slice(&f(&row));
    }
}

/// A lane-wise linear map: `out[lane] = f(in[0][lane], in[1][lane], ...)`.
macro_rules! lanes {
    ($n_out:literal, $x:ident, |$v:ident| [$($e:expr),* $(,)?]) => {{
        let mut out = [[0f32; L]; $n_out];
        for l in 0..L {
            let $v = |i: usize| $x[i][l];
            let vals = [$($e),*];
            for (o, v) in out.iter_mut().zip(vals) {
                o[l] = v;
            }
        }
        out
    }};
}

struct F2;

impl Transform for F2 {
    const M: usize = 2;
    const A: usize = 4;

    #[inline(always)]
    fn filter(g: &[Lanes; 9], u: &mut [Lanes; 36]) {
        two_d::<3, 4>(
            g,
            |x| {
                lanes!(4, x, |v| [
                    v(0),
                    0.5 * (v(0) + v(1) + v(2)),
                    0.5 * (v(0) - v(1) + v(2)),
                    v(2),
                ])
            },
            u,
        );
    }

    #[inline(always)]
    fn input(d: &[Lanes; 36], v: &mut [Lanes; 36]) {
        two_d::<4, 4>(
            d,
            |x| {
                lanes!(4, x, |v| [
                    v(0) - v(2),
                    v(1) + v(2),
                    v(2) - v(1),
                    v(1) - v(3)
                ])
            },
            v,
        );
    }

    #[inline(always)]
    fn output(mt: &[Lanes; 36], o: &mut [Lanes; 16]) {
        two_d::<4, 2>(
            mt,
            |x| lanes!(2, x, |v| [v(0) + v(1) + v(2), v(1) - v(2) - v(3)]),
            o,
        );
    }
}

struct F4;

impl Transform for F4 {
    const M: usize = 4;
    const A: usize = 6;

    #[inline(always)]
    fn filter(g: &[Lanes; 9], u: &mut [Lanes; 36]) {
        const S: f32 = 1.0 / 6.0;
        const T: f32 = 1.0 / 12.0;
        const Q: f32 = 1.0 / 24.0;
        two_d::<3, 6>(
            g,
            |x| {
                lanes!(6, x, |v| [
                    0.25 * v(0),
                    -S * (v(0) + v(1) + v(2)),
                    -S * (v(0) - v(1) + v(2)),
                    Q * v(0) + T * v(1) + S * v(2),
                    Q * v(0) - T * v(1) + S * v(2),
                    v(2),
                ])
            },
            u,
        );
    }

    #[inline(always)]
    fn input(d: &[Lanes; 36], v: &mut [Lanes; 36]) {
        two_d::<6, 6>(
            d,
            |x| {
                lanes!(6, x, |v| [
                    4.0 * v(0) - 5.0 * v(2) + v(4),
                    v(3) + v(4) - 4.0 * (v(1) + v(2)),
                    v(4) - v(3) + 4.0 * (v(1) - v(2)),
                    v(4) - v(2) + 2.0 * (v(3) - v(1)),
                    v(4) - v(2) + 2.0 * (v(1) - v(3)),
                    4.0 * v(1) - 5.0 * v(3) + v(5),
                ])
            },
            v,
        );
    }

    #[inline(always)]
    fn output(mt: &[Lanes; 36], o: &mut [Lanes; 16]) {
        two_d::<6, 4>(
            mt,
            |x| {
                lanes!(4, x, |v| [
                    v(0) + v(1) + v(2) + v(3) + v(4),
                    v(1) - v(2) + 2.0 * (v(3) - v(4)),
                    v(1) + v(2) + 4.0 * (v(3) + v(4)),
                    v(1) - v(2) + 8.0 * (v(3) - v(4)) + v(5),
                ])
            },
            o,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct 3x3 convolution in f64, NCHW, stride 1.
    #[allow(clippy::too_many_arguments)]
    fn direct(
        x: &[f32],
        w: &[f32],
        n: usize,
        c: usize,
        h: usize,
        wd: usize,
        k: usize,
        pad: [usize; 4],
    ) -> (Vec<f64>, usize, usize) {
        let oh = h + pad[0] + pad[2] - 2;
        let ow = wd + pad[1] + pad[3] - 2;
        let mut y = vec![0f64; n * k * oh * ow];
        for img in 0..n {
            for kk in 0..k {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = 0f64;
                        for ch in 0..c {
                            for i in 0..3 {
                                for j in 0..3 {
                                    let iy = (oy + i) as isize - pad[0] as isize;
                                    let ix = (ox + j) as isize - pad[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv = x
                                        [((img * c + ch) * h + iy as usize) * wd + ix as usize]
                                        as f64;
                                    s += xv * w[((kk * c + ch) * 3 + i) * 3 + j] as f64;
                                }
                            }
                        }
                        y[((img * k + kk) * oh + oy) * ow + ox] = s;
                    }
                }
            }
        }
        (y, oh, ow)
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn both_tiles_match_a_direct_convolution() {
        let (n, c, h, wd, k) = (2, 11, 9, 7, 10);
        for pad in [[0, 0, 0, 0], [1, 1, 1, 1], [2, 0, 1, 2]] {
            let x = data(n * c * h * wd, 1);
            let w = data(k * c * 9, 2);
            let (want, oh, ow) = direct(&x, &w, n, c, h, wd, k, pad);
            for tile in [Tile::F2, Tile::F4] {
                let d = Dims {
                    n,
                    c,
                    h,
                    w: wd,
                    m: k,
                    kh: 3,
                    kw: 3,
                    oh,
                    ow,
                    group: 1,
                };
                let p = Problem {
                    order: Order::Nchw,
                    pad: [pad[0], pad[1]],
                    d,
                    gemm: GemmContext::default(),
                    x: &x,
                    w: &w,
                    bias: None,
                    relu: false,
                    keep: None,
                };
                let mut y = vec![f32::NAN; want.len()];
                forward(tile, &p, &mut y).unwrap();
                for (i, (&got, &exp)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - exp).abs() < 1e-4,
                        "{tile:?} pad {pad:?} at {i}: {got} vs {exp}"
                    );
                }
            }
        }
    }

    fn dims(c: usize, m: usize, side: usize, k: usize, group: usize) -> Dims {
        Dims {
            n: 1,
            c,
            h: side,
            w: side,
            m,
            kh: k,
            kw: k,
            oh: side,
            ow: side,
            group,
        }
    }

    fn geometry(order: Order, stride: usize, dilation: usize) -> Geometry {
        Geometry {
            kernel: [3, 3],
            stride: [stride, stride],
            pad: [1, 1, 1, 1],
            dilation: [dilation, dilation],
            order,
            global: false,
        }
    }

    #[test]
    fn only_3x3_stride_1_undilated_single_group_convolutions_qualify() {
        let force = Mode::Force(Tile::F2);
        let g = geometry(Order::Nchw, 1, 1);
        assert_eq!(force.choose(&g, &dims(4, 4, 8, 3, 1)), Some(Tile::F2));
        assert_eq!(Mode::Off.choose(&g, &dims(64, 64, 8, 3, 1)), None);
        assert_eq!(force.choose(&g, &dims(4, 4, 8, 5, 1)), None);
        assert_eq!(force.choose(&g, &dims(4, 4, 8, 3, 2)), None);
        assert_eq!(
            force.choose(&geometry(Order::Nchw, 2, 1), &dims(4, 4, 8, 3, 1)),
            None
        );
        assert_eq!(
            force.choose(&geometry(Order::Nchw, 1, 2), &dims(4, 4, 8, 3, 1)),
            None
        );
    }

    #[test]
    fn the_rules_leave_few_input_channels_to_im2col() {
        let (nchw, nhwc) = (geometry(Order::Nchw, 1, 1), geometry(Order::Nhwc, 1, 1));
        assert_eq!(Mode::Auto.choose(&nchw, &dims(3, 64, 56, 3, 1)), None);
        assert_eq!(Mode::Auto.choose(&nchw, &dims(16, 64, 56, 3, 1)), None);
        assert_eq!(
            Mode::Auto.choose(&nchw, &dims(16, 16, 56, 3, 1)),
            Some(Tile::F4)
        );
        assert_eq!(
            Mode::Auto.choose(&nchw, &dims(64, 64, 14, 3, 1)),
            Some(Tile::F4)
        );
        // NHWC, few channels, 14x14 (tiles cover 16x16): im2col; 28x28: Winograd.
        assert_eq!(Mode::Auto.choose(&nhwc, &dims(32, 32, 14, 3, 1)), None);
        assert_eq!(
            Mode::Auto.choose(&nhwc, &dims(32, 32, 28, 3, 1)),
            Some(Tile::F4)
        );
        assert_eq!(
            Mode::Auto.choose(&nhwc, &dims(64, 64, 14, 3, 1)),
            Some(Tile::F4)
        );
        // 256 channels: one 14x14 image is 16 tiles (im2col), 28x28 is 49.
        assert_eq!(Mode::Auto.choose(&nchw, &dims(256, 256, 14, 3, 1)), None);
        assert_eq!(
            Mode::Auto.choose(&nchw, &dims(256, 256, 28, 3, 1)),
            Some(Tile::F4)
        );
    }
}
