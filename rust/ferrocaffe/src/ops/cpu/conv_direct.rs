//! Direct 2-d convolution, for layers with few channels (a first layer on RGB or grey images, a
//! last layer back to RGB, the narrow layers of small models; [`applies`] says which), where
//! im2col + GEMM spends much of its time copying short rows into the column matrix and then
//! runs a product with a short side.
//!
//! Each image is first split into its stride phases: for strides `(sh, sw)`, the padded input
//! plane of each channel becomes `sh * sw` planes of `rq x wq`, phase `(pr, pc)` holding the
//! padded pixels `(R * sh + pr, Q * sw + pc)`, zero outside the image. A filter tap `(i, j)` of
//! output pixel `(r, q)` then reads pixel `(r + i*dh / sh, q + j*dw / sw)` of phase
//! `(i*dh % sh, j*dw % sw)`: with the output pixels numbered row-major over rows `wq` wide (the
//! `wq - ow` last ones of each row are computed and thrown away), one tap reads one contiguous
//! run of its phase plane for a run of consecutive outputs, whatever the stride, dilation or
//! padding. A run of output pixels of a block of output channels is then accumulated in
//! registers over all `C * kh * kw` taps: per tap, a few vector loads of the input, a broadcast
//! of each channel's weight, and a fused multiply-add per (channel, vector). Bias and a fused
//! Relu are applied as the run is stored, into NCHW rows or NHWC pixels. Each output is
//! `bias + sum over taps in (c, kh, kw) order`, one fused multiply-add after another.
//!
//! The phase copies of all images are made first (a part per group of images), then runs of
//! pixels of all images are shared out to the team.

use super::conv::Dims;
use super::conv_args::{Geometry, Order};
use super::depthwise;
use super::math::relu;
use super::par::{macs_part_len, SharedOut};
use crate::blas::{for_each_part, part_len};
use crate::error::{try_vec, Error, Result};

/// Output pixels per unit of work shared out: a multiple of every block's run (of
/// [`WIDE_SEG`] with the AVX-512 blocks).
const SEG: usize = 96;
/// [`SEG`] where the AVX-512 blocks run, whose runs are twice as long.
const WIDE_SEG: usize = 192;
/// Floats in a vector of the accumulators (one AVX2 register; two blocks make one AVX-512).
const LANES: usize = 8;

/// Whether the direct kernel runs this convolution: a kernel larger than 1x1, and few channels
/// per group: at most 4 in, or at most 8 out, or at most 16 each way. Single-threaded on the
/// corpus's shapes and their neighbours (2-core AMD EPYC, AVX2), it ran 1.1-5x faster than
/// im2col + GEMM there (or Winograd, for 16 to 16; groups of 8 to 8 and 12 to 16 1.1-2x), and
/// 0.8-0.9x with 16 in and 24 or 32 out or 20 in and 32 out. Not an NCHW convolution at stride
/// 1 with fewer than 32 taps per output (`C * kh * kw`) and 16 or more outputs (a 3x3 or 5x5
/// first layer) either: there im2col copies whole rows and the product runs along the long
/// rows of pixels, which measured 1.05-1.2x faster (`x 8x3x32x32, W 16x3x3x3` and
/// `x 8x1x28x28, W 20x1x5x5`) than the direct kernel, whose rows carry `kw - 1` computed and
/// discarded columns.
///
/// Depthwise convolutions (one channel per group) only in NCHW at stride 1 with rows of 16 or
/// more: 1.2-3x faster than the depthwise kernel's plane-at-a-time loop there, but 2-6x slower
/// than its NHWC kernels on short rows, at stride 2 or in NHWC.
pub(crate) fn applies(mode: Mode, g: &Geometry, d: &Dims) -> bool {
    if d.kh * d.kw < 2 || mode == Mode::Off {
        return false;
    }
    if mode == Mode::Force {
        return true;
    }
    if d.group == d.c && d.m == d.c && d.group > 1 {
        return g.order == Order::Nchw && g.stride == [1, 1] && d.ow >= depthwise::WIDE;
    }
    if wide_nchw(g, d) {
        return true;
    }
    let (cg, mg) = (d.c / d.group, d.m / d.group);
    let few = cg <= 4 || mg <= 8 || (cg <= 16 && mg <= 16);
    let rows_win = g.order == Order::Nchw
        && g.stride == [1, 1]
        && d.group == 1
        && d.c * d.kh * d.kw < 32
        && d.m >= 16;
    few && !rows_win
}

/// Where the AVX-512 blocks run ([`wide_blocks`]), also every NCHW convolution of one group
/// with at most 20 input and 32 output channels and output rows of 7 or more, including those
/// [`applies`] otherwise leaves to im2col (a first layer at stride 1) and those `conv.rs`
/// runs through NHWC. One op at a time on a Xeon against those paths, 1 and 2 threads: the
/// corpus's layers of that kind 1.0-1.45x and 1.0-1.9x (googlenet's `8x16x15x15` to 32:
/// 248 -> 178 us and 168 -> 102 us; lenet's `8x20x12x12` 5x5 to 32: 295 -> 243 us and
/// 179 -> 128 us), but for a strided `8x16x16x16` to 32 (0.77x on one thread, 1.0x on two). With
/// more channels, Winograd or the GEMM paths stay ahead (32 to 32: 0.66-1.0x); on shorter rows
/// most of each run is padding (`8x16x3x3`: 0.5x).
pub(crate) fn wide_nchw(g: &Geometry, d: &Dims) -> bool {
    g.order == Order::Nchw
        && d.group == 1
        && d.kh * d.kw > 1
        && d.c <= 20
        && d.m <= 32
        && d.ow >= 7
        && wide_blocks()
}

/// Which convolutions the kernel takes, from `FERROCAFFE_DIRECT_CONV` when an op is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `0`: none (im2col + GEMM or Winograd instead, to compare).
    Off,
    /// Unset (or any other value): those [`applies`] picks.
    Auto,
    /// `2`: every convolution with a kernel larger than 1x1 (to measure it against the others).
    Force,
}

impl Mode {
    pub(crate) fn from_env() -> Mode {
        match std::env::var("FERROCAFFE_DIRECT_CONV").as_deref() {
            Ok("0") => Mode::Off,
            Ok("2") => Mode::Force,
            _ => Mode::Auto,
        }
    }
}

/// Where the phase planes of one image lie, and which run each tap reads.
struct Layout {
    sh: usize,
    sw: usize,
    wq: usize,
    /// `rq * wq`, where `rq = oh + (kh - 1) * dh / sh` rows hold every row a tap reads
    plane: usize,
    /// Floats of one image's phase planes: `C * sh * sw * plane`.
    image: usize,
    /// Offset of each tap's run in an image's planes, in W's `(c, i, j)` order.
    taps: Vec<usize>,
    /// Output pixels computed per image: `oh * wq`.
    len: usize,
}

fn too_large(d: &Dims) -> Error {
    Error::OutOfMemory(format!(
        "the phase planes of a convolution of {}x{}x{}x{} input with a {}x{} kernel are too \
         large to allocate",
        d.n, d.c, d.h, d.w, d.kh, d.kw
    ))
}

impl Layout {
    fn new(g: &Geometry, d: &Dims) -> Result<Layout> {
        let (sh, sw) = (g.stride[0].max(1), g.stride[1].max(1));
        let (dh, dw) = (g.dilation[0], g.dilation[1]);
        // The output exists (not empty), so these spans are bounded by the padded input.
        let rq = d.oh + (d.kh - 1) * dh / sh;
        let wq = d.ow + (d.kw - 1) * dw / sw;
        let plane = rq.checked_mul(wq).ok_or_else(|| too_large(d))?;
        let image = [d.c, sh, sw]
            .iter()
            .try_fold(plane, |a, &b| a.checked_mul(b))
            .ok_or_else(|| too_large(d))?;
        let mut taps = try_vec(d.c * d.kh * d.kw, 0usize, "the tap table")?;
        for c in 0..d.c {
            for i in 0..d.kh {
                for j in 0..d.kw {
                    let (pr, orow) = ((i * dh) % sh, (i * dh) / sh);
                    let (pc, ocol) = ((j * dw) % sw, (j * dw) / sw);
                    taps[(c * d.kh + i) * d.kw + j] =
                        ((c * sh + pr) * sw + pc) * plane + orow * wq + ocol;
                }
            }
        }
        Ok(Layout {
            sh,
            sw,
            wq,
            plane,
            image,
            taps,
            len: d.oh * wq,
        })
    }

    /// Floats of the phase buffer of all images, with room after the last for the runs that
    /// go past an image's last output pixel.
    fn buffer_len(&self, d: &Dims) -> Result<usize> {
        self.image
            .checked_mul(d.n)
            .and_then(|v| v.checked_add(self.wq + WIDE_SEG))
            .ok_or_else(|| too_large(d))
    }
}

/// Image `img`'s phase planes into `out` (`lay.image` floats): every float written. Each
/// input row is laid out once as a padded row in `row` (zeros, then its values from column
/// `pl`), whose columns `pc, pc + sw, ...` are then row `R` of phase plane `(pr, pc)`; at
/// column stride 1 the padded row is written straight into its plane. Compiled per SIMD level
/// (the split of stride 2 vectorizes).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn fill_phases(
    lay: &Layout,
    g: &Geometry,
    d: &Dims,
    x: &[f32],
    img: usize,
    out: &mut [f32],
    row: &mut Vec<f32>,
) {
    let (pt, pl) = (g.pad[0], g.pad[1]);
    let (h, w, c) = (d.h, d.w, d.c);
    let (sh, sw, wq) = (lay.sh, lay.sw, lay.wq);
    let image = &x[img * c * h * w..(img + 1) * c * h * w];
    row.clear();
    row.resize(wq * sw, 0.0);
    // Input columns that land in the padded row (those past `wq * sw` are never read).
    let cols = w.min((wq * sw).saturating_sub(pl));
    let rows = lay.plane / wq;
    for (ch, planes) in out.chunks_exact_mut(lay.plane * sh * sw).enumerate() {
        for r in 0..rows {
            for pr in 0..sh {
                let dst = |pc: usize| (pr * sw + pc) * lay.plane + r * wq;
                // Padded row r * sh + pr is input row ih = that - pt, when inside.
                let Some(ih) = (r * sh + pr).checked_sub(pt).filter(|&ih| ih < h) else {
                    for pc in 0..sw {
                        planes[dst(pc)..dst(pc) + wq].fill(0.0);
                    }
                    continue;
                };
                // Input row `ih` of channel `ch` into `inside` (`cols` values).
                let fetch = |inside: &mut [f32]| match g.order {
                    Order::Nchw => inside.copy_from_slice(&image[(ch * h + ih) * w..][..cols]),
                    Order::Nhwc => {
                        let src = &image[ih * w * c + ch..];
                        for (v, px) in inside.iter_mut().zip(src.chunks(c)) {
                            *v = px[0];
                        }
                    }
                };
                let at = pl.min(wq * sw);
                if sw == 1 {
                    // The padded row is the phase row: written in place.
                    let out = &mut planes[dst(0)..dst(0) + wq];
                    out[..at].fill(0.0);
                    fetch(&mut out[at..at + cols]);
                    out[at + cols..].fill(0.0);
                    continue;
                }
                fetch(&mut row[at..at + cols]);
                match sw {
                    2 => {
                        let (p0, p1) = planes[dst(0)..dst(1) + wq].split_at_mut(lay.plane);
                        for ((a, b), pair) in p0[..wq]
                            .iter_mut()
                            .zip(&mut p1[..wq])
                            .zip(row.chunks_exact(2))
                        {
                            *a = pair[0];
                            *b = pair[1];
                        }
                    }
                    _ => {
                        for pc in 0..sw {
                            let o = dst(pc);
                            for (v, grp) in planes[o..o + wq].iter_mut().zip(row.chunks_exact(sw)) {
                                *v = grp[pc];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// How the output channels are cut into register blocks, group by group (a block's channels
/// read the same input channels): in each group, blocks of 6 while more than 6 are left, then
/// 5 as 3 + 2, else the rest as one block.
fn channel_blocks(m: usize, group: usize) -> Vec<(usize, usize)> {
    let mg = m / group;
    let mut out = Vec::with_capacity(group * (mg.div_ceil(6) + 1));
    for gi in 0..group {
        let (mut m0, end) = (gi * mg, (gi + 1) * mg);
        while end - m0 > 6 {
            out.push((m0, 6));
            m0 += 6;
        }
        match end - m0 {
            0 => {}
            5 => out.extend([(m0, 3), (m0 + 3, 2)]),
            r => out.push((m0, r)),
        }
    }
    out
}

/// The filters of each block, one after another, each as `[C/G * kh * kw taps][mb]` (the
/// block's channels side by side).
fn blocked_filters(
    g: &Geometry,
    d: &Dims,
    w: &[f32],
    blocks: &[(usize, usize)],
) -> Result<Vec<f32>> {
    let (cg, kk) = (d.c / d.group, d.kh * d.kw);
    let taps = cg * kk;
    let mut out = try_vec(d.m * taps, 0f32, "the direct convolution's filters")?;
    for &(m0, mb) in blocks {
        let dst = &mut out[m0 * taps..(m0 + mb) * taps];
        for j in 0..mb {
            let m = m0 + j;
            for c in 0..cg {
                for t in 0..kk {
                    let src = match g.order {
                        Order::Nchw => (m * cg + c) * kk + t,
                        Order::Nhwc => (m * kk + t) * cg + c,
                    };
                    dst[(c * kk + t) * mb + j] = w[src];
                }
            }
        }
    }
    Ok(out)
}

/// `y = conv(x, w) + bias` (then Relu when `relu`) for all images, in `g.order`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    g: &Geometry,
    d: &Dims,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) -> Result<()> {
    let lay = Layout::new(g, d)?;
    let len = lay.buffer_len(d)?;
    PHASES.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let out = run_with(g, d, &lay, x, w, bias, relu, y, &mut buf, len);
            if buf.capacity() > KEEP {
                *buf = Vec::new();
            }
            out
        }
        // Not expected (a convolution does not start another on its thread), but a buffer of
        // its own is correct either way.
        Err(_) => run_with(g, d, &lay, x, w, bias, relu, y, &mut Vec::new(), len),
    })
}

thread_local! {
    /// The calling thread's phase buffer, kept between convolutions (up to [`KEEP`] floats):
    /// every image's planes are written in full each time, so it is never cleared.
    static PHASES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Floats of phase buffer kept between convolutions (16 MiB).
const KEEP: usize = 1 << 22;

/// [`forward`] with `buf` as the phase buffer (grown to `len` floats).
#[allow(clippy::too_many_arguments)]
fn run_with(
    g: &Geometry,
    d: &Dims,
    lay: &Layout,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    buf: &mut Vec<f32>,
    len: usize,
) -> Result<()> {
    if buf.len() < len {
        buf.try_reserve_exact(len - buf.len())
            .map_err(|_| too_large(d))?;
        // Zeros once, for the slack after the last image (read, then thrown away).
        buf.resize(len, 0.0);
    }
    let ph = &mut buf[..len];
    // The phase copies: an image's worth of values each.
    let per = part_len(d.n, d.n.saturating_mul(lay.image));
    let parts: Vec<(usize, &mut [f32])> = ph[..d.n * lay.image]
        .chunks_mut(per * lay.image)
        .enumerate()
        .map(|(i, p)| (i * per, p))
        .collect();
    for_each_part(parts, &|(first, planes)| {
        let mut row = Vec::new();
        for (k, img) in planes.chunks_exact_mut(lay.image).enumerate() {
            fill_phases(lay, g, d, x, first + k, img, &mut row);
        }
    });
    let blocks = channel_blocks(d.m, d.group);
    let wb = blocked_filters(g, d, w, &blocks)?;
    let k = Kernel {
        order: g.order,
        d,
        lay,
        ph,
        wb: &wb,
        blocks: &blocks,
        bias,
        relu,
    };
    // Units: runs of `seg` output pixels of one image.
    let seg = if wide_blocks() { WIDE_SEG } else { SEG };
    let segs = lay.len.div_ceil(seg);
    let units = d.n * segs;
    let macs = (d.m * (d.c / d.group) * d.kh * d.kw)
        .saturating_mul(lay.len)
        .saturating_mul(d.n);
    let per = macs_part_len(units, macs);
    // SAFETY: every output pixel belongs to one unit, and every unit to one part, which one
    // thread runs; a unit writes its own pixels (all their channels) only.
    let ys = &unsafe { SharedOut::new(y) };
    let ranges: Vec<(usize, usize)> = (0..units)
        .step_by(per)
        .map(|a| (a, (a + per).min(units)))
        .collect();
    for_each_part(ranges, &|(a, b)| {
        let mut u = a;
        while u < b {
            let img = u / segs;
            let last = b.min((img + 1) * segs);
            let (p0, p1) = ((u % segs) * seg, ((last - img * segs) * seg).min(lay.len));
            run(&k, img, p0, p1, ys);
            u = last;
        }
    });
    Ok(())
}

struct Kernel<'a> {
    order: Order,
    d: &'a Dims,
    lay: &'a Layout,
    ph: &'a [f32],
    /// The filters, block after block ([`blocked_filters`]).
    wb: &'a [f32],
    /// (first channel, channels) of each block.
    blocks: &'a [(usize, usize)],
    bias: Option<&'a [f32]>,
    relu: bool,
}

/// Output pixels `p0..p1` (row-major over rows `wq` wide) of image `img`, all channels.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
fn run<'a, 'y>(k: &Kernel<'a>, img: usize, p0: usize, p1: usize, y: &SharedOut<'y>) {
    // Fused multiply-adds where the target has them (aarch64 always does); plain multiply and
    // add in the baseline x86-64 version, where `mul_add` would be a library call.
    let target = multiversion::target::selected_target!();
    let fma = cfg!(target_arch = "aarch64") || target.supports_feature_str("fma");
    // The AVX-512 version: the blocks of `wide_blocks`, whose runs are twice as long.
    let wide = cfg!(target_arch = "x86_64") && target.supports_feature_str("avx512f");
    match (fma, wide) {
        (true, true) => blocks::<true, true>(k, img, p0, p1, y),
        (true, false) => blocks::<true, false>(k, img, p0, p1, y),
        _ => blocks::<false, false>(k, img, p0, p1, y),
    }
}

/// Whether [`run`] dispatches to its AVX-512 version here (the condition `multiversion` checks
/// for it), which takes the wide blocks: [`WIDE_SEG`] then cuts the work.
fn wide_blocks() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// All output channels over pixels `p0..p1`, block after block. Each block's run of pixels
/// keeps `MB * NV` accumulator vectors of 8 lanes, the run's `NV` input vectors and a broadcast
/// weight in registers (15 or fewer of AVX2's 16). With `WIDE` (AVX-512, where the compiler
/// joins two 8-lane vectors in one register), runs twice as long: 12 accumulator registers
/// (6 of 32 channels; ..., 2 of 96), where the AVX2 runs left 6 (6 channels of 16), two
/// fused multiply-adds a cycle waiting on each other's 4-cycle latency. Measured one op at a
/// time on one core of a Xeon: the resnet model's `8x16x32x32` 3x3 layers ~1.6x faster.
#[inline(always)]
fn blocks<const FMA: bool, const WIDE: bool>(
    k: &Kernel<'_>,
    img: usize,
    p0: usize,
    p1: usize,
    y: &SharedOut<'_>,
) {
    let d = k.d;
    // Each block reads the taps of its group's input channels.
    let taps = d.c / d.group * d.kh * d.kw;
    let mg = d.m / d.group;
    for &(m0, mb) in k.blocks {
        let w = &k.wb[m0 * taps..(m0 + mb) * taps];
        let gi = m0 / mg;
        let t = &k.lay.taps[gi * taps..(gi + 1) * taps];
        match (WIDE, mb) {
            (true, 6) => runs::<6, 4, FMA>(k, img, p0, p1, m0, t, w, y),
            (true, 4) => runs::<4, 6, FMA>(k, img, p0, p1, m0, t, w, y),
            (true, 3) => runs::<3, 8, FMA>(k, img, p0, p1, m0, t, w, y),
            (true, 2) => runs::<2, 8, FMA>(k, img, p0, p1, m0, t, w, y),
            (true, _) => runs::<1, 8, FMA>(k, img, p0, p1, m0, t, w, y),
            (false, 6) => runs::<6, 2, FMA>(k, img, p0, p1, m0, t, w, y),
            (false, 4) => runs::<4, 2, FMA>(k, img, p0, p1, m0, t, w, y),
            (false, 3) => runs::<3, 3, FMA>(k, img, p0, p1, m0, t, w, y),
            (false, 2) => runs::<2, 4, FMA>(k, img, p0, p1, m0, t, w, y),
            (false, _) => runs::<1, 6, FMA>(k, img, p0, p1, m0, t, w, y),
        }
    }
}

/// Output channels `m0..m0 + MB` over pixels `p0..p1`, in runs of `NV` vectors, over the taps
/// `taps` (offsets of their runs) with the filters `wb`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn runs<const MB: usize, const NV: usize, const FMA: bool>(
    k: &Kernel<'_>,
    img: usize,
    p0: usize,
    p1: usize,
    m0: usize,
    taps: &[usize],
    wb: &[f32],
    y: &SharedOut<'_>,
) {
    let base = img * k.lay.image;
    // Every read below is checked here, once per call rather than per tap (the per-tap
    // checks and the reloads they cost took a third of the inner loop): the runs start at
    // `p0, p0 + NV * LANES, ..` below `p1`, each reads `NV * LANES` values from `base + off`
    // for every tap, and a run ends at most `wq + WIDE_SEG` past an image's last plane, which the
    // buffer holds.
    let runs = (p1.saturating_sub(p0)).div_ceil(NV * LANES);
    let last_end = base + taps.iter().copied().max().unwrap_or(0) + p0 + runs * NV * LANES;
    assert!(last_end <= k.ph.len() && wb.len() >= taps.len() * MB);
    let (ph, wp) = (k.ph.as_ptr(), wb.as_ptr());
    let mut p = p0;
    while p < p1 {
        let mut acc = [[[0f32; LANES]; NV]; MB];
        for (t, &off) in taps.iter().enumerate() {
            // SAFETY: `base + off + p + NV * LANES <= last_end <= ph.len()` and
            // `(t + 1) * MB <= wb.len()`, both asserted above.
            let (xs, wt) = unsafe {
                (
                    std::ptr::read_unaligned(ph.add(base + off + p).cast::<[[f32; LANES]; NV]>()),
                    std::ptr::read_unaligned(wp.add(t * MB).cast::<[f32; MB]>()),
                )
            };
            for (a, &wv) in acc.iter_mut().zip(&wt) {
                for (av, xv) in a.iter_mut().zip(&xs) {
                    for (o, &xe) in av.iter_mut().zip(xv) {
                        *o = if FMA {
                            wv.mul_add(xe, *o)
                        } else {
                            *o + wv * xe
                        };
                    }
                }
            }
        }
        // A copy of the accumulators for the stores to index freely (the accumulators
        // themselves are only ever read at constant places, so they stay in registers).
        let buf: [[[f32; LANES]; NV]; MB] = acc;
        let vals: [&[f32]; MB] = std::array::from_fn(|mb| buf[mb].as_flattened());
        store(k, img, p, (NV * LANES).min(p1 - p), m0, &vals, y);
        p += NV * LANES;
    }
}

/// Stores the valid outputs among the `n` pixels from `p` (those whose column is below `ow`),
/// `vals[mb]` holding channel `m0 + mb`, with bias and Relu: a row's stretch at a time.
#[inline(always)]
fn store<const MB: usize>(
    k: &Kernel<'_>,
    img: usize,
    p: usize,
    n: usize,
    m0: usize,
    vals: &[&[f32]; MB],
    y: &SharedOut<'_>,
) {
    let d = k.d;
    let (wq, so) = (k.lay.wq, d.oh * d.ow);
    let (mut r, mut q) = (p / wq, p % wq);
    let mut i = 0;
    while i < n {
        // Pixels i..i + len of the run are columns q.. of output row r.
        let len = (wq - q).min(n - i);
        let valid = len.min(d.ow.saturating_sub(q));
        let pix = r * d.ow + q;
        match k.order {
            // A stretch wholly past the row's last output column (computed and thrown away)
            // stores nothing: its `pix` may lie past the last image's plane.
            _ if valid == 0 => {}
            Order::Nchw => {
                for (mb, v) in vals.iter().enumerate() {
                    let m = m0 + mb;
                    let at = (img * d.m + m) * so + pix;
                    let v = &v[i..i + valid];
                    let bias = k.bias.map_or(0.0, |b| b[m]);
                    match (k.bias.is_some(), k.relu) {
                        (false, false) => y.write_with(at, v, |x| x),
                        (true, false) => y.write_with(at, v, |x| x + bias),
                        (false, true) => y.write_with(at, v, relu),
                        (true, true) => y.write_with(at, v, |x| relu(x + bias)),
                    }
                }
            }
            Order::Nhwc => {
                let bias = k.bias.map(|b| &b[m0..m0 + MB]);
                for e in 0..valid {
                    let mut px = [0f32; MB];
                    for ((o, v), mb) in px.iter_mut().zip(vals).zip(0..MB) {
                        let mut v = v[i + e];
                        if let Some(b) = bias {
                            v += b[mb];
                        }
                        *o = if k.relu { relu(v) } else { v };
                    }
                    y.write_with((img * so + pix + e) * d.m + m0, &px, |x| x);
                }
            }
        }
        i += len;
        r += 1;
        q = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The convolution by its definition, in f64, NCHW (x `[N, C, H, W]`, w `[M, C/G, kh, kw]`).
    fn reference(g: &Geometry, d: &Dims, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
        let (cg, mg) = (d.c / d.group, d.m / d.group);
        let mut y = vec![0f64; d.n * d.m * d.oh * d.ow];
        for n in 0..d.n {
            for m in 0..d.m {
                let gi = m / mg;
                for oy in 0..d.oh {
                    for ox in 0..d.ow {
                        let mut s = b.map_or(0.0, |b| f64::from(b[m]));
                        for c in 0..cg {
                            for i in 0..d.kh {
                                for j in 0..d.kw {
                                    let iy = (oy * g.stride[0] + i * g.dilation[0]) as isize
                                        - g.pad[0] as isize;
                                    let ix = (ox * g.stride[1] + j * g.dilation[1]) as isize
                                        - g.pad[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= d.h as isize || ix >= d.w as isize
                                    {
                                        continue;
                                    }
                                    let xc = gi * cg + c;
                                    let xv =
                                        x[((n * d.c + xc) * d.h + iy as usize) * d.w + ix as usize];
                                    let wv = w[((m * cg + c) * d.kh + i) * d.kw + j];
                                    s += f64::from(xv) * f64::from(wv);
                                }
                            }
                        }
                        y[((n * d.m + m) * d.oh + oy) * d.ow + ox] = s;
                    }
                }
            }
        }
        y
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (v % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// NCHW `[n, c, h, w]` as NHWC.
    fn to_nhwc(v: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        for i in 0..n {
            for ch in 0..c {
                for p in 0..hw {
                    out[(i * hw + p) * c + ch] = v[(i * c + ch) * hw + p];
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_in_both_orders() {
        // (n, c, h, w, m, group, (kh, kw), stride, pad (t, l, b, r), dilation)
        let cases = [
            (2, 3, 11, 13, 8, 1, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1]),
            (2, 8, 9, 9, 3, 1, (5, 5), [1, 1], [2, 2, 2, 2], [1, 1]),
            (3, 2, 13, 17, 13, 1, (3, 5), [2, 3], [1, 2, 0, 1], [1, 1]),
            (1, 3, 20, 19, 7, 1, (3, 3), [1, 2], [2, 2, 2, 2], [2, 2]),
            (2, 12, 7, 7, 16, 2, (5, 5), [1, 1], [2, 2, 2, 2], [1, 1]),
            (2, 6, 18, 18, 6, 6, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1]),
            (1, 1, 4, 40, 1, 1, (2, 2), [1, 1], [0, 0, 0, 0], [1, 1]),
            // Images of several units of output pixels (SEG, WIDE_SEG), every block size:
            // 16 = 6 + 6 + 4, 11 = 6 + 3 + 2, 13 = 6 + 6 + 1.
            (2, 5, 20, 30, 16, 1, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1]),
            (1, 3, 17, 40, 11, 1, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1]),
            (2, 4, 23, 29, 13, 1, (3, 3), [2, 2], [1, 1, 1, 1], [1, 1]),
        ];
        for (n, c, h, w, m, group, (kh, kw), stride, pad, dilation) in cases {
            let mut g = Geometry {
                kernel: [kh, kw],
                stride,
                pad,
                dilation,
                order: Order::Nchw,
                global: false,
            };
            let (oh, ow) = g.out_size(h, w, kh, kw).unwrap();
            let d = Dims {
                n,
                c,
                h,
                w,
                m,
                kh,
                kw,
                oh,
                ow,
                group,
            };
            let x = values(n * c * h * w, 1);
            let wt = values(m * (c / group) * kh * kw, 2);
            let b = values(m, 3);
            for relu in [false, true] {
                g.order = Order::Nchw;
                let want = reference(&g, &d, &x, &wt, Some(&b));
                let want: Vec<f64> = want
                    .into_iter()
                    .map(|v| if relu { v.max(0.0) } else { v })
                    .collect();
                let mut y = vec![f32::NAN; want.len()];
                forward(&g, &d, &x, &wt, Some(&b), relu, &mut y).unwrap();
                for (i, (a, e)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*a) - e).abs() < 1e-4,
                        "NCHW case c{c} m{m} at {i}"
                    );
                }
                g.order = Order::Nhwc;
                let xh = to_nhwc(&x, n, c, h * w);
                let wh = to_nhwc(&wt, m, c / group, kh * kw);
                let mut yh = vec![f32::NAN; want.len()];
                forward(&g, &d, &xh, &wh, Some(&b), relu, &mut yh).unwrap();
                let wanth = to_nhwc(
                    &want.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                    n,
                    m,
                    oh * ow,
                );
                for (i, (a, e)) in yh.iter().zip(&wanth).enumerate() {
                    assert!((a - e).abs() < 1e-4, "NHWC case c{c} m{m} at {i}");
                }
            }
        }
    }

    #[test]
    fn channel_blocks_stay_inside_groups() {
        assert_eq!(channel_blocks(16, 1), vec![(0, 6), (6, 6), (12, 4)]);
        assert_eq!(channel_blocks(11, 1), vec![(0, 6), (6, 3), (9, 2)]);
        assert_eq!(channel_blocks(16, 2), vec![(0, 6), (6, 2), (8, 6), (14, 2)]);
        assert_eq!(channel_blocks(4, 4), vec![(0, 1), (1, 1), (2, 1), (3, 1)]);
    }
}
