//! Products with one small dimension, on AVX-512 or AVX2 and without packing the large operand.
//!
//! An RNN step multiplies a batch of a few dozen rows by a large weight: `Y = X W^T`
//! (`32 x 256` by `1024 x 256`), `dX = dY W` and `dW += dY^T X` (summed over the batch).
//! General BLAS kernels copy ("pack") both operands into their own layout on every call,
//! which for these shapes means a pass over the whole 1 MB weight per product: a fifth of
//! OpenBLAS's time in an LSTM. Here the large operand is read where it lies:
//!
//! - every product is computed as `P * Q` tiles: `R` rows of `P` broadcast one element at a
//!   time (any strides) against `V` vectors (16 lanes on AVX-512, 8 on AVX2) of a row of `Q`
//!   (contiguous), `R x V` accumulators in registers over the whole inner dimension
//!   ([`avx512`], [`avx2`]: the same tiles at the two vector widths);
//! - `C = A B` and `C = A^T B` take `P = op(A)`, `Q = B` as they are;
//! - `C = A B^T` is computed as `C^T = B A^T`: `P = B` (the weight, rows read in place) and
//!   `Q = A^T`, the small operand, transposed into a scratch buffer; tiles are stored
//!   transposed (through a buffer on the stack, a row of `C` at a time);
//! - where `Q` is wide (rows 512 bytes or more apart: `dX = dY W` reads a `1024 x 256`
//!   weight as `Q`) and deep, the columns a tile covers are first copied into a tight strip
//!   that all the tiles of those columns then read: rows a kilobyte apart fall in a few cache
//!   sets and defeat the prefetchers (the copy made that product ~25% faster on Zen 3);
//!   an operand held constant ([`super::constant`]: an RNN's weight over its timesteps) is
//!   cut in those strips once and read from them by every product.
//!
//! Products above a megaflop are cut in about [`pieces`] pieces (disjoint parts of `C`, along
//! the dimension that splits the large operand) shared out to the team of compute threads
//! ([`crate::threads`]). Each element of `C` is one fused multiply-add chain over the
//! inner dimension in order, whatever tile, piece or vector width it falls in, so results do
//! not depend on the thread count, on which thread ran which piece, or on the CPU.

use std::cell::RefCell;
use std::sync::OnceLock;

use super::constant::{self, Strips};
use crate::threads::run_parts;

/// `tile::<rows, v>(t)` of the kernel module it is expanded in, for each instantiated
/// number of rows; other counts run on [`tile_scalar`].
macro_rules! by_rows {
    ($rows:expr, $v:literal, $t:expr, [$($r:literal)*]) => {
        match $rows {
            $($r => tile::<$r, $v>($t),)*
            _ => tile_scalar($rows, $t),
        }
    };
}

mod avx2;
mod avx512;

/// The largest "small" dimension: `m` of `A B` and `A B^T`, `k` of `A^T B`.
const SMALL: usize = 64;
/// Products of at least this many flops are shared out to the team of compute threads...
const SPLIT_FLOPS: usize = 1 << 20;
/// ... in about this many pieces, which the threads share out as they go: four per thread,
/// but none under [`PIECE_FLOPS`], so that a product's threads grow with its size (on 16
/// cores a megaflop product is cut in 8 pieces, not 64).
fn pieces(flops: usize) -> usize {
    let most = crate::threads::num_threads().saturating_mul(4).max(8);
    (flops / PIECE_FLOPS).clamp(2, most)
}

/// Flops a piece of an `A B^T` product must do per value of the transposed `A` it reads
/// ([`Problem::run`]).
const PACKED_SHARE: usize = 100;

/// The fewest flops worth a piece of their own (a few microseconds on one core).
const PIECE_FLOPS: usize = 1 << 17;

/// The vector instruction set the kernels run on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Isa {
    /// AVX-512F: 16 lanes, 32 registers.
    Avx512,
    /// AVX2 with FMA: 8 lanes, 16 registers.
    Avx2,
}

impl Isa {
    /// Every one this CPU has, best first.
    fn all() -> Vec<Isa> {
        let mut all = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512f") {
            all.push(Isa::Avx512);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            all.push(Isa::Avx2);
        }
        all
    }

    /// The best one this CPU has (`None`: the kernels do not run here).
    fn detect() -> Option<Isa> {
        static ISA: OnceLock<Option<Isa>> = OnceLock::new();
        *ISA.get_or_init(|| Isa::all().first().copied())
    }

    fn lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
        }
    }

    /// The columns one tile covers, given `left` columns still to do in the block.
    fn tile_width(self, left: usize) -> usize {
        match self {
            // 3 vectors; 4 at once when that is all there is.
            Isa::Avx512 if left == 64 => 64,
            Isa::Avx512 => left.min(48),
            // 2 vectors (6 x 2 accumulators + 2 loads + 1 broadcast fill the 16 registers).
            Isa::Avx2 => left.min(16),
        }
    }

    /// The width of the column strips of a held operand: the tile width of the strips'
    /// blocks (pieces start at multiples of 48, a multiple of both).
    fn strip_width(self) -> usize {
        match self {
            Isa::Avx512 => 48,
            Isa::Avx2 => 16,
        }
    }

    /// Whether the kernels of this ISA take the product.
    fn fits(self, trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize) -> bool {
        if m == 0 || n == 0 || k == 0 {
            return false;
        }
        let lanes = self.lanes();
        match (trans_a, trans_b) {
            (false, false) => m <= SMALL && n >= lanes,
            (false, true) => m <= SMALL && k >= lanes,
            // On AVX2 the gemm crate's packed kernels ran these 10% faster (measured on Zen 3:
            // `m = 1024, n = 256, k = 32`).
            (true, false) => self == Isa::Avx512 && k <= SMALL && n >= lanes,
            (true, true) => false,
        }
    }

    /// The most rows a tile of `v` vectors has (what fits in the registers).
    fn max_rows(self, v: usize) -> usize {
        match self {
            Isa::Avx512 => [12, 12, 8, 6][v - 1],
            Isa::Avx2 => [12, 6][v - 1],
        }
    }
}

/// The instruction set [`sgemm`] runs `op(A) (m x k) * op(B) (k x n)` on (row-major, tight),
/// or `None` where its kernels do not take the product (or the CPU has neither ISA).
pub(super) fn applies(trans_a: bool, trans_b: bool, m: usize, n: usize, k: usize) -> Option<Isa> {
    Isa::detect().filter(|isa| isa.fits(trans_a, trans_b, m, n, k))
}

/// `C = alpha * op(A) op(B) + beta * C (+ bias)` on `isa`, for the shapes [`applies`]
/// accepts (row-major, tight leading dimensions; `beta == 0` overwrites `C`; `bias`, `n`
/// values, is added to every row as the tiles are stored: a fully connected layer).
#[allow(clippy::too_many_arguments)]
pub(super) fn sgemm(
    isa: Isa,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
    bias: Option<&[f32]>,
) {
    debug_assert!(isa.fits(trans_a, trans_b, m, n, k));
    debug_assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    debug_assert!(bias.is_none_or(|b| b.len() >= n));
    let isa = narrowest(isa, trans_a, trans_b, m);
    let scalars = (alpha, beta);
    let bias = bias.map_or(std::ptr::null(), <[f32]>::as_ptr);
    let c = c.as_mut_ptr();
    if trans_b {
        // C^T = B A^T: P = B (n x k, in place), Q = A^T (k x m, packed), tiles transposed.
        PACK.with(|pack| {
            let mut pack = pack.borrow_mut();
            transpose_into(&a[..m * k], m, k, &mut pack);
            let p = Problem {
                isa,
                p: Strided::new(b.as_ptr(), k, 1),
                rows: n,
                q: pack.as_ptr(),
                cols: m,
                k,
                scalars,
                c: Strided::new(c.cast_const(), 1, n),
                transposed: true,
                bias,
                copy_strips: copies_strips(m, k),
                strips: None,
            };
            p.run();
        });
        return;
    }
    let p = if trans_a {
        Strided::new(a.as_ptr(), 1, m)
    } else {
        Strided::new(a.as_ptr(), k, 1)
    };
    let copy_strips = copies_strips(n, k);
    let held = copy_strips
        .then(|| constant::strips(&b[..k * n], k, n, isa.strip_width()))
        .flatten();
    Problem {
        isa,
        p,
        rows: m,
        q: b.as_ptr(),
        cols: n,
        k,
        scalars,
        c: Strided::new(c.cast_const(), n, 1),
        transposed: false,
        bias,
        copy_strips,
        strips: held.as_ref().and_then(|h| h.get()),
    }
    .run();
}

/// The ISA a product runs on: `isa`, except that `A B^T` with at most 8 rows of `A` runs on
/// AVX2 where the CPU has it. Those rows are the lanes of its transposed tiles: half of an
/// AVX-512 vector would be masked off, and AVX2 stores the tiles through a register
/// transpose ([`avx2`]). Each value is the same fused multiply-add chain either way.
fn narrowest(isa: Isa, trans_a: bool, trans_b: bool, m: usize) -> Isa {
    static AVX2: OnceLock<bool> = OnceLock::new();
    let avx2 = *AVX2.get_or_init(|| Isa::all().contains(&Isa::Avx2));
    if isa == Isa::Avx512 && !trans_a && trans_b && m <= 8 && avx2 {
        Isa::Avx2
    } else {
        isa
    }
}

/// Inner dimensions from which a column strip of `Q` that several tiles read is first copied
/// tight (see [`Problem::block`]).
const PACK_MIN_K: usize = 64;
/// ... and from which width of `Q` (rows 512 bytes apart).
const PACK_MIN_COLS: usize = 128;

/// Whether column strips of a `Q` of `cols` columns and `k` rows are copied tight.
fn copies_strips(cols: usize, k: usize) -> bool {
    cols >= PACK_MIN_COLS && k >= PACK_MIN_K
}

thread_local! {
    /// A column strip of `Q` copied tight: rows of a wide `Q` lie a kilobyte or more apart,
    /// which the caches hold badly (the same few sets) and the prefetchers do not follow.
    static STRIP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The transposed small operand of `A B^T` products (kept: no allocation per step).
    static PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `dst (k x m) = src (m x k)^T`, `dst` resized to hold it.
fn transpose_into(src: &[f32], m: usize, k: usize, dst: &mut Vec<f32>) {
    // Every value is written below: only a longer buffer's new part is zeroed here.
    dst.resize(m * k, 0.0);
    super::transpose::transpose(src, m, k, dst);
}

/// A matrix seen through element strides: element `(r, p)` at `ptr[r * rs + p * cs]`.
#[derive(Clone, Copy)]
struct Strided {
    ptr: *const f32,
    rs: usize,
    cs: usize,
}

impl Strided {
    fn new(ptr: *const f32, rs: usize, cs: usize) -> Self {
        Strided { ptr, rs, cs }
    }

    /// The view starting at element `(r, c)`.
    fn at(self, r: usize, c: usize) -> Self {
        // wrapping_add: the offset is in bounds for every element a tile touches; the
        // pointer itself is only dereferenced there.
        Strided {
            ptr: self.ptr.wrapping_add(r * self.rs + c * self.cs),
            ..self
        }
    }
}

/// `C (rows x cols) = alpha * P (rows x k) Q (k x cols, row-major, tight) + beta * C`.
struct Problem<'a> {
    isa: Isa,
    p: Strided,
    rows: usize,
    q: *const f32,
    cols: usize,
    k: usize,
    scalars: (f32, f32),
    /// Output element `(r, c)` (stored through `ptr` cast to mutable).
    c: Strided,
    /// Whether the tiles are stored transposed (`C^T = P Q`: `c` has unit row stride, and
    /// unit column stride too when `C` has one column).
    transposed: bool,
    /// The bias of each column of the output (`C`'s columns: `P`'s rows when the output is
    /// stored transposed), or null.
    bias: *const f32,
    /// Whether each column strip of `Q` is copied tight before its tiles run
    /// ([`copies_strips`]; the same products either way).
    copy_strips: bool,
    /// `Q` cut in column strips already (a held operand): tiles read those instead.
    strips: Option<&'a Strips>,
}

// SAFETY: the two threads that share a `Problem` write disjoint rows or columns of `C` and
// only read `P` and `Q`, which outlive the call.
unsafe impl Sync for Problem<'_> {}

impl Problem<'_> {
    fn run(&self) {
        let flops = 2 * self.rows * self.cols * self.k;
        if flops < SPLIT_FLOPS {
            self.block(0, self.rows, 0, self.cols);
            return;
        }
        // Pieces along the larger operand: Q's columns (in whole 48-column blocks, a multiple
        // of every tile width) or P's rows (in multiples of 12), about PIECES of them.
        if self.cols >= self.rows && self.cols >= 96 {
            let width = (self.cols.div_ceil(pieces(flops))).div_ceil(48) * 48;
            let parts = self.cols.div_ceil(width);
            run_parts(parts, &|i| {
                self.block(0, self.rows, i * width, ((i + 1) * width).min(self.cols))
            });
        } else {
            let mut pieces = pieces(flops);
            if self.transposed {
                // Every piece reads all of Q, which this thread has just written (the
                // transposed small operand): each thread that joins first moves it out of this
                // core's cache. Worth it only for products of PACKED_SHARE flops or more per
                // value of Q a piece: below that, two threads ran 1.5-2x slower than one
                // (`64x64x512` and `64x32x288` on 2 Xeon cores: 39 -> 60 us, 15 -> 30 us).
                let q = self.cols.saturating_mul(self.k).max(1);
                pieces = pieces.min(flops / q.saturating_mul(PACKED_SHARE));
                if pieces < 2 {
                    self.block(0, self.rows, 0, self.cols);
                    return;
                }
            }
            let height = (self.rows.div_ceil(pieces)).div_ceil(12) * 12;
            let parts = self.rows.div_ceil(height);
            run_parts(parts, &|i| {
                self.block(i * height, ((i + 1) * height).min(self.rows), 0, self.cols)
            });
        }
    }

    /// Rows `r0..r1` and columns `c0..c1` of `C`.
    fn block(&self, r0: usize, r1: usize, c0: usize, c1: usize) {
        let lanes = self.isa.lanes();
        let mut c = c0;
        while c < c1 {
            let width = match self.strips {
                Some(s) => s.width().min(c1 - c),
                None => self.isa.tile_width(c1 - c),
            };
            let v = width.div_ceil(lanes);
            // The rows in tiles of at most max_rows, as even as they come (32 rows in tiles
            // of 6: 5 5 5 5 6 6, not five 6s and a 2).
            let tiles = (r1 - r0).div_ceil(self.max_rows(v));
            // The tiles of these columns, reading Q's columns from `q`, rows `qld` apart.
            let run = |q: *const f32, qld: usize| {
                let mut r = r0;
                for i in 0..tiles {
                    let rows = (r1 - r) / (tiles - i);
                    let t = Tile {
                        p: self.p.at(r, 0),
                        q,
                        qld,
                        cols: width,
                        k: self.k,
                        scalars: self.scalars,
                        c: self.c.at(r, c),
                        transposed: self.transposed,
                        bias: self.bias_at(r, c),
                    };
                    // SAFETY: the ISA was detected on this CPU (`applies`); the tile's rows,
                    // columns and inner dimension lie within the matrices the caller checked
                    // (or within the strip copied from them).
                    unsafe {
                        match self.isa {
                            Isa::Avx512 => avx512::dispatch(rows, v, &t),
                            Isa::Avx2 => avx2::dispatch(rows, v, &t),
                        }
                    }
                    r += rows;
                }
            };
            if let Some(s) = self.strips {
                run(s.at(c), width);
            } else if self.copy_strips && tiles > 1 && self.cols > width {
                STRIP.with(|strip| {
                    let mut strip = strip.borrow_mut();
                    self.copy_strip(c, width, &mut strip);
                    run(strip.as_ptr(), width);
                });
            } else {
                run(self.q.wrapping_add(c), self.cols);
            }
            c += width;
        }
    }

    /// The most rows a tile of `v` vectors takes: what fits in the registers, but 8 for the
    /// AVX2 tiles of one vector stored transposed (an 8 x 8 register transpose).
    fn max_rows(&self, v: usize) -> usize {
        if self.isa == Isa::Avx2 && v == 1 && self.transposed {
            8
        } else {
            self.isa.max_rows(v)
        }
    }

    /// The bias of the tile at row `r`, column `c` (of `P` and `Q`), or null.
    fn bias_at(&self, r: usize, c: usize) -> *const f32 {
        if self.bias.is_null() {
            self.bias
        } else if !self.transposed {
            self.bias.wrapping_add(c)
        } else {
            self.bias.wrapping_add(r)
        }
    }

    /// Columns `c..c + width` of `Q`, every row of them, into `strip` (`k x width`, tight).
    fn copy_strip(&self, c: usize, width: usize, strip: &mut Vec<f32>) {
        strip.clear();
        // SAFETY: Q is `k x cols`, tight, within the caller's bounds.
        let q = unsafe { std::slice::from_raw_parts(self.q, self.k * self.cols) };
        constant::append_strip(q, self.k, self.cols, c, width, strip);
    }
}

/// One tile: `rows x cols` of `C` from `rows` rows of `P` and `cols` columns of `Q`.
struct Tile {
    p: Strided,
    q: *const f32,
    qld: usize,
    cols: usize,
    k: usize,
    scalars: (f32, f32),
    c: Strided,
    /// Stored transposed: tile column `j` is `C`'s row `j`.
    transposed: bool,
    /// Null, or the bias of the tile's output columns: indexed by the tile's column `j` when
    /// stored straight, by its row `r` when stored transposed.
    bias: *const f32,
}

/// Any tile, one element at a time (for tile shapes that have no instantiation).
///
/// # Safety
/// `rows` rows of `P`, `t.cols` columns of `Q` and the matching part of `C` are in bounds
/// for the inner dimension `t.k`.
unsafe fn tile_scalar(rows: usize, t: &Tile) {
    let (alpha, beta) = t.scalars;
    for r in 0..rows {
        for j in 0..t.cols {
            // SAFETY: in bounds by the caller's contract.
            unsafe {
                let mut s = 0.0f32;
                for kk in 0..t.k {
                    let pv = *t.p.ptr.add(r * t.p.rs + kk * t.p.cs);
                    s = pv.mul_add(*t.q.add(kk * t.qld + j), s);
                }
                let dst = t.c.ptr.cast_mut().add(r * t.c.rs + j * t.c.cs);
                let v = if beta != 0.0 {
                    beta.mul_add(*dst, alpha * s)
                } else {
                    alpha * s
                };
                *dst = if t.bias.is_null() {
                    v
                } else {
                    v + *t.bias.add(if t.transposed { r } else { j })
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::naive;
    use super::*;

    fn data(len: usize, seed: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32 + seed) * 0.618).sin())
            .collect()
    }

    /// Checks the product on every ISA of this CPU against float64 and returns the results
    /// (which must not depend on the ISA).
    fn check(ta: bool, tb: bool, m: usize, n: usize, k: usize) {
        let mut first: Option<Vec<f32>> = None;
        for isa in Isa::all() {
            if isa.fits(ta, tb, m, n, k) {
                let c = check_on(isa, ta, tb, m, n, k);
                match &first {
                    None => first = Some(c),
                    Some(f) => assert_eq!(f, &c, "{isa:?} {ta}{tb} {m}x{n}x{k}"),
                }
            }
        }
    }

    fn check_on(isa: Isa, ta: bool, tb: bool, m: usize, n: usize, k: usize) -> Vec<f32> {
        let a = data(m * k, 1.0);
        let b = data(k * n, 2.0);
        let want = naive(ta, tb, m, n, k, &a, &b);
        let tol = 1e-4 * (k as f64).sqrt();
        // beta = 0 overwrites (NaN included); beta = 1 and 0.5 accumulate; alpha scales.
        let mut c = vec![f32::NAN; m * n];
        sgemm(isa, ta, tb, m, n, k, 1.0, &a, &b, 0.0, &mut c, None);
        for (i, (x, y)) in c.iter().zip(&want).enumerate() {
            assert!(
                (*x as f64 - y).abs() < tol,
                "{ta}{tb} {m}x{n}x{k} [{i}]: {x} vs {y}"
            );
        }
        let once = c.clone();
        sgemm(isa, ta, tb, m, n, k, 2.0, &a, &b, 0.5, &mut c, None);
        for (x, y) in c.iter().zip(&want) {
            assert!(
                (*x as f64 - 2.5 * y).abs() < 3.0 * tol,
                "{isa:?} {x} vs {}",
                2.5 * y
            );
        }
        once
    }

    #[test]
    fn the_lstm_step_product_runs_on_the_best_isa_of_this_cpu() {
        assert_eq!(applies(false, true, 32, 1024, 256), Isa::detect());
    }

    #[test]
    fn every_layout_and_tail_matches_a_float64_reference() {
        for &(m, n, k) in &[
            (1, 16, 16),
            (3, 17, 19),
            (7, 47, 5),
            (12, 48, 64),
            (13, 50, 33),
            (32, 64, 40),
            (33, 130, 29),
            (64, 100, 64),
        ] {
            check(false, false, m, n, k);
            check(false, true, m, n, k);
            check(true, false, m, n, k);
            check(true, false, n, n + 3, m.min(64));
        }
    }

    #[test]
    fn a_bias_added_as_the_tiles_are_stored_matches_one_added_after() {
        // FC shapes (A B^T, a batch of up to 8 rows: transposed tiles of 1 to 8 rows, masked
        // below 8), wider batches, and A B; the fused bias must give the bits of C filled with
        // the bias and then accumulated into (one rounding of product plus bias).
        for &(ta, tb, m, n, k) in &[
            (false, true, 8, 64, 32),
            (false, true, 8, 5, 32),
            (false, true, 5, 13, 7),
            (false, true, 8, 1, 16),
            (false, true, 1, 9, 8),
            (false, true, 3, 17, 40),
            (false, true, 16, 20, 9),
            (false, true, 33, 70, 20),
            (false, false, 3, 17, 19),
            (false, false, 8, 64, 32),
            (true, false, 40, 33, 8),
        ] {
            for isa in Isa::all().into_iter().filter(|i| i.fits(ta, tb, m, n, k)) {
                let (a, b, bias) = (data(m * k, 5.0), data(k * n, 6.0), data(n, 7.0));
                let mut fused = vec![f32::NAN; m * n];
                sgemm(
                    isa,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    &a,
                    &b,
                    0.0,
                    &mut fused,
                    Some(&bias),
                );
                let mut after: Vec<f32> = (0..m * n).map(|i| bias[i % n]).collect();
                sgemm(isa, ta, tb, m, n, k, 1.0, &a, &b, 1.0, &mut after, None);
                let want = naive(ta, tb, m, n, k, &a, &b);
                assert_eq!(fused, after, "{isa:?} {ta}{tb} {m}x{n}x{k}");
                for (i, (x, y)) in fused.iter().zip(&want).enumerate() {
                    let y = y + bias[i % n] as f64;
                    assert!(
                        (*x as f64 - y).abs() < 1e-4 * (k as f64).sqrt(),
                        "[{i}] {x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_narrow_batch_times_a_transposed_weight_runs_on_avx2_where_the_cpu_has_it() {
        let avx2 = Isa::all().contains(&Isa::Avx2);
        for isa in Isa::all() {
            let narrowed = narrowest(isa, false, true, 8);
            assert_eq!(narrowed, if avx2 { Isa::Avx2 } else { isa });
            assert_eq!(narrowest(isa, false, true, 9), isa);
            assert_eq!(narrowest(isa, false, false, 8), isa);
        }
    }

    #[test]
    fn split_products_match_and_do_not_depend_on_the_split() {
        // Above SPLIT_FLOPS: the LSTM step shapes, run split and unsplit.
        for &(ta, tb, m, n, k) in &[
            (false, true, 32, 1024, 256),
            (false, false, 32, 256, 1024),
            (true, false, 1024, 256, 32),
            (false, true, 20, 1000, 130),
            (false, false, 20, 300, 70),
        ] {
            check(ta, tb, m, n, k);
            for isa in Isa::all().into_iter().filter(|i| i.fits(ta, tb, m, n, k)) {
                split_matches_whole(isa, ta, tb, m, n, k);
            }
        }
    }

    fn split_matches_whole(isa: Isa, ta: bool, tb: bool, m: usize, n: usize, k: usize) {
        {
            let a = data(m * k, 3.0);
            let b = data(k * n, 4.0);
            let mut split = vec![0.0; m * n];
            sgemm(isa, ta, tb, m, n, k, 1.0, &a, &b, 0.0, &mut split, None);
            // The same tiles in one block on this thread.
            let mut whole = vec![0.0; m * n];
            let (p, rows, q, cols, c) = if tb {
                let mut pack = Vec::new();
                transpose_into(&a, m, k, &mut pack);
                let c = Strided::new(whole.as_mut_ptr().cast_const(), 1, n);
                (Strided::new(b.as_ptr(), k, 1), n, pack, m, c)
            } else {
                let p = if ta {
                    Strided::new(a.as_ptr(), 1, m)
                } else {
                    Strided::new(a.as_ptr(), k, 1)
                };
                let c = Strided::new(whole.as_mut_ptr().cast_const(), n, 1);
                (p, m, b.clone(), n, c)
            };
            // With and without copying the strips of Q tight, and from Q cut in strips
            // beforehand (a held operand): the same bits.
            let packed = Strips::pack(&q, k, cols, isa.strip_width());
            for (copy_strips, strips) in [(false, None), (true, None), (false, Some(&packed))] {
                whole.fill(f32::NAN);
                let prob = Problem {
                    isa,
                    p,
                    rows,
                    q: q.as_ptr(),
                    cols,
                    k,
                    scalars: (1.0, 0.0),
                    c,
                    transposed: tb,
                    bias: std::ptr::null(),
                    copy_strips,
                    strips,
                };
                prob.block(0, rows, 0, cols);
                let held = strips.is_some();
                assert_eq!(
                    split, whole,
                    "{isa:?} {ta}{tb} {m}x{n}x{k} {copy_strips} {held}"
                );
            }
        }
    }

    #[test]
    fn shapes_outside_the_kernels_are_refused() {
        assert!(applies(true, true, 8, 8, 8).is_none());
        assert!(applies(false, false, 65, 100, 100).is_none());
        assert!(applies(true, false, 100, 100, 65).is_none());
        assert!(applies(false, false, 8, 0, 8).is_none());
        assert!(!Isa::Avx512.fits(false, false, 8, 15, 8));
        assert!(Isa::Avx2.fits(false, false, 8, 15, 8));
        assert!(!Isa::Avx2.fits(true, false, 100, 100, 32));
    }
}
