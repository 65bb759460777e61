//! Convolution and pooling over any number of spatial axes (Caffe2's `ConvPoolOpBase` with
//! `kernels`/`strides`/`pads`/`dilations` lists): `Conv`, `Conv1D`, `Conv3D`, `MaxPool`,
//! `AveragePool` (and their `1D`/`3D` names), `LpPool`, and their gradients, on NCHW
//! (`[N, C, d1, .., dk]`) or NHWC (`[N, d1, .., dk, C]`) tensors.
//!
//! Four-dimensional inputs with a 2-d geometry keep running on the 2-d kernels (`conv.rs`,
//! `pool.rs`); `Dispatch` picks by the input's rank at run time. Here, one index table per
//! run says, for every kernel tap and output position, which input position it reads (or that it
//! falls in the padding); convolutions use it as a generic im2col before the products, pooling
//! as the list of each output's window.

use super::conv_args::{self, out_extent, Order};
use super::pool::{axis_windows, Win};
use crate::blas::GemmContext;
use crate::error::{try_vec, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::{bail, err};

/// A tap that reads padding.
const PAD: usize = usize::MAX;

/// The geometry arguments as given, for any number of spatial axes. Empty lists were not given
/// (their defaults depend on the input's rank, known when the op runs).
#[derive(Clone, Debug)]
pub(crate) struct NdGeometry {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    /// Heads of all axes, then tails (`[t, l, b, r]` in 2-d).
    pads: Vec<usize>,
    dilation: Vec<usize>,
    pub(crate) order: Order,
    pub(crate) global: bool,
}

/// The geometry of one run, one value per spatial axis.
#[derive(Clone, Debug)]
struct Axes {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    head: Vec<usize>,
    tail: Vec<usize>,
    dilation: Vec<usize>,
}

/// A list argument, or its single-value (`one`, repeated twice) or `h`/`w` forms.
fn read_list(init: &OpInit<'_>, list: &str, one: &str, h: &str, w: &str) -> Result<Vec<i64>> {
    let a = &init.args;
    let l = a.ints(list);
    if !l.is_empty() {
        return Ok(l);
    }
    if a.has(one) {
        let v = a.int(one, 0)?;
        return Ok(vec![v, v]);
    }
    if a.has(h) || a.has(w) {
        let d = if list == "kernels" { 0 } else { 1 };
        return Ok(vec![a.int(h, d)?, a.int(w, d)?]);
    }
    Ok(Vec::new())
}

/// Non-negative and an `int` (as Caffe2 read these arguments).
fn checked(init: &OpInit<'_>, what: &str, v: &[i64]) -> Result<Vec<usize>> {
    v.iter()
        .map(|&x| {
            if x < 0 {
                bail!(op = init, BadArgument: "{what} must not be negative, got {x}");
            }
            if i32::try_from(x).is_err() {
                bail!(
                    op = init,
                    BadArgument: "Value {x} of argument {what} cannot be represented correctly \
                     in a target type (int)"
                );
            }
            usize::try_from(x).map_err(|_| err!(op = init, BadArgument: "{what} out of range: {x}"))
        })
        .collect()
}

impl NdGeometry {
    /// Reads the arguments of `init` (any number of spatial axes).
    pub(crate) fn new(init: &OpInit<'_>) -> Result<Self> {
        let a = &init.args;
        let order = match a.string("order", "NCHW")?.as_str() {
            "NCHW" => Order::Nchw,
            "NHWC" => Order::Nhwc,
            other => bail!(op = init, BadArgument: "Unknown storage order: {other}"),
        };
        let global = a.bool("global_pooling", false)?;
        let kernel = checked(
            init,
            "kernel",
            &read_list(init, "kernels", "kernel", "kernel_h", "kernel_w")?,
        )?;
        let stride = checked(
            init,
            "stride",
            &read_list(init, "strides", "stride", "stride_h", "stride_w")?,
        )?;
        let dilation = checked(
            init,
            "dilation",
            &read_list(init, "dilations", "dilation", "dilation_h", "dilation_w")?,
        )?;
        let mut pads = a.ints("pads");
        if pads.is_empty() {
            if a.has("pad") {
                pads = vec![a.int("pad", 0)?; 4];
            } else if ["pad_t", "pad_l", "pad_b", "pad_r"]
                .iter()
                .any(|n| a.has(n))
            {
                pads = vec![
                    a.int("pad_t", 0)?,
                    a.int("pad_l", 0)?,
                    a.int("pad_b", 0)?,
                    a.int("pad_r", 0)?,
                ];
            }
        }
        let pads = checked(init, "pad", &pads)?;
        if stride.contains(&0) || dilation.contains(&0) {
            bail!(op = init, BadArgument: "stride and dilation must be positive");
        }
        let g = NdGeometry {
            kernel,
            stride,
            pads,
            dilation,
            order,
            global,
        };
        if let Some(rank) = g.rank() {
            for (name, len) in [("strides", g.stride.len()), ("dilations", g.dilation.len())] {
                if len != 0 && len != rank {
                    bail!(
                        op = init,
                        BadArgument: "{name} has {len} values, expected {rank} (one per kernel \
                         axis)"
                    );
                }
            }
            if !g.pads.is_empty() && g.pads.len() != 2 * rank {
                bail!(
                    op = init,
                    BadArgument: "pads has {} values, expected {} (a head and a tail per axis)",
                    g.pads.len(),
                    2 * rank
                );
            }
        }
        if global
            && (g.pads.iter().any(|&p| p != 0)
                || g.stride.iter().any(|&s| s != 1)
                || g.dilation.iter().any(|&d| d != 1))
        {
            bail!(
                op = init,
                BadArgument: "If global_pooling is set pad, dilation and stride shouldn't be set."
            );
        }
        Ok(g)
    }

    /// The number of spatial axes the arguments give, if they give one.
    pub(crate) fn rank(&self) -> Option<usize> {
        [
            self.kernel.len(),
            self.stride.len(),
            self.dilation.len(),
            self.pads.len() / 2,
        ]
        .into_iter()
        .find(|&l| l != 0)
    }

    /// Whether the arguments are those of a 2-d op (or give no rank).
    pub(crate) fn fits_2d(&self) -> bool {
        self.rank().is_none_or(|r| r == 2)
    }

    /// Whether any dilation is not 1.
    pub(crate) fn dilated(&self) -> bool {
        self.dilation.iter().any(|&d| d != 1)
    }

    /// `(N, C, spatial dims)` of a tensor in this layout.
    fn split_dims(&self, dims: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
        if dims.len() < 3 {
            bail!(
                ShapeMismatch: "expected an input of at least 3 dims (N, C and a spatial axis), \
                 got shape {dims:?}"
            );
        }
        let k = dims.len() - 2;
        Ok(match self.order {
            Order::Nchw => (dims[0], dims[1], dims[2..].to_vec()),
            Order::Nhwc => (dims[0], dims[k + 1], dims[1..=k].to_vec()),
        })
    }

    /// Dims of a tensor in this layout.
    fn join_dims(&self, n: usize, c: usize, spatial: &[usize]) -> Vec<usize> {
        let mut d = Vec::with_capacity(spatial.len() + 2);
        d.push(n);
        if self.order == Order::Nchw {
            d.push(c);
        }
        d.extend_from_slice(spatial);
        if self.order == Order::Nhwc {
            d.push(c);
        }
        d
    }

    /// The geometry of a run over `inp` spatial dims; `kernel` replaces the kernel argument
    /// (the filter's dims, or the input's for global pooling).
    fn axes(&self, inp: &[usize], kernel: Option<&[usize]>) -> Result<Axes> {
        let k = inp.len();
        if let Some(r) = self.rank() {
            if r != k {
                bail!(
                    ShapeMismatch: "the op's geometry has {r} spatial axes but the input has {k} \
                     (shape of its spatial axes {inp:?})"
                );
            }
        }
        let pick = |v: &[usize], default: usize| -> Vec<usize> {
            if v.len() == k {
                v.to_vec()
            } else {
                vec![default; k]
            }
        };
        let kern = match kernel {
            Some(kd) => {
                if self.kernel.len() == k {
                    for (i, (&a, &b)) in self.kernel.iter().zip(kd).enumerate() {
                        if a != 0 && a != b {
                            bail!(
                                ShapeMismatch: "kernel argument {a} disagrees with filter dim \
                                 {i}: {b}"
                            );
                        }
                    }
                }
                kd.to_vec()
            }
            None => {
                let kv = pick(&self.kernel, 0);
                if kv.contains(&0) {
                    bail!(
                        BadArgument: "If you are doing convolution or pooling, you will need to \
                         set explicitly the kernel size."
                    );
                }
                kv
            }
        };
        let (head, tail) = if self.pads.len() == 2 * k {
            (self.pads[..k].to_vec(), self.pads[k..].to_vec())
        } else {
            (vec![0; k], vec![0; k])
        };
        Ok(Axes {
            kernel: kern,
            stride: pick(&self.stride, 1),
            head,
            tail,
            dilation: pick(&self.dilation, 1),
        })
    }
}

fn product(v: &[usize], what: &str) -> Result<usize> {
    v.iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| err!(OutOfMemory: "{what} of size {v:?} is too large"))
}

impl Axes {
    fn out_dims(&self, inp: &[usize]) -> Result<Vec<usize>> {
        (0..inp.len())
            .map(|i| {
                out_extent(
                    inp[i],
                    self.kernel[i],
                    self.dilation[i],
                    self.head[i],
                    self.tail[i],
                    self.stride[i],
                )
            })
            .collect()
    }

    /// For each kernel tap (rows) and output position (columns), the flat spatial input index
    /// it reads, or [`PAD`].
    fn tap_table(&self, inp: &[usize], out: &[usize]) -> Result<Vec<usize>> {
        let (kn, on) = (
            product(&self.kernel, "the kernel")?,
            product(out, "the output")?,
        );
        let len = kn
            .checked_mul(on)
            .ok_or_else(|| err!(OutOfMemory: "the index table of {kn} x {on} is too large"))?;
        let mut table = try_vec(len, PAD, "the index table")?;
        if len == 0 {
            return Ok(table);
        }
        let nd = inp.len();
        let mut kidx = vec![0usize; nd];
        let mut oidx = vec![0usize; nd];
        for trow in table.chunks_mut(on) {
            oidx.fill(0);
            for t in trow.iter_mut() {
                let mut flat = 0usize;
                let mut inside = true;
                for d in 0..nd {
                    // All values fit an int (checked when read), so this stays in i64 range.
                    let pos = (oidx[d] as i64) * (self.stride[d] as i64) - (self.head[d] as i64)
                        + (kidx[d] as i64) * (self.dilation[d] as i64);
                    if pos < 0 || pos >= inp[d] as i64 {
                        inside = false;
                        break;
                    }
                    flat = flat * inp[d] + pos as usize;
                }
                if inside {
                    *t = flat;
                }
                step(&mut oidx, out);
            }
            step(&mut kidx, &self.kernel);
        }
        Ok(table)
    }
}

/// Advances a row-major multi-index over `dims`.
fn step(idx: &mut [usize], dims: &[usize]) {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return;
        }
        idx[d] = 0;
    }
}

/// Runs the 2-d kernel for 4-d inputs when the op has one, the N-d one otherwise.
pub(crate) struct Dispatch {
    pub(crate) two_d: Option<Box<dyn Operator>>,
    pub(crate) nd: Box<dyn Operator>,
}

impl Operator for Dispatch {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let rank = ctx.input(0)?.dims().len();
        match &mut self.two_d {
            Some(op) if rank == 4 => op.run(ctx),
            _ => self.nd.run(ctx),
        }
    }

    fn fuse_relu(&mut self) -> bool {
        let nd = self.nd.fuse_relu();
        match &mut self.two_d {
            Some(op) => op.fuse_relu() && nd,
            None => nd,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Convolution

/// N-d convolution or its gradient.
pub(crate) struct ConvNd {
    pub(crate) g: NdGeometry,
    pub(crate) group: usize,
    pub(crate) gradient: bool,
    pub(crate) no_bias: bool,
    pub(crate) relu: bool,
}

/// Sizes of one N-d convolution.
struct ConvRun {
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    /// Spatial input positions per image.
    s: usize,
    /// Spatial output positions per image.
    o: usize,
    /// Kernel taps.
    k: usize,
    out: Vec<usize>,
    table: Vec<usize>,
    nhwc: bool,
}

impl ConvRun {
    fn cg(&self) -> usize {
        self.c / self.group
    }
    fn mg(&self) -> usize {
        self.m / self.group
    }
    fn kd(&self) -> usize {
        self.cg() * self.k
    }

    /// The column matrix of group `gi` of image `img`: `[cg * k, o]` (NCHW) or `[o, k * cg]`
    /// (NHWC).
    fn im2col(&self, x: &[f32], img: usize, gi: usize, col: &mut [f32]) {
        let (cg, o, k) = (self.cg(), self.o, self.k);
        if self.nhwc {
            let xi = &x[img * self.s * self.c..(img + 1) * self.s * self.c];
            for (p, row) in col.chunks_mut(k * cg).enumerate() {
                for (t, dst) in row.chunks_mut(cg).enumerate() {
                    match self.table[t * o + p] {
                        PAD => dst.fill(0.0),
                        i => dst
                            .copy_from_slice(&xi[i * self.c + gi * cg..i * self.c + gi * cg + cg]),
                    }
                }
            }
        } else {
            for (ci, rows) in col.chunks_mut(k * o).enumerate() {
                let plane = (img * self.c + gi * cg + ci) * self.s;
                let xp = &x[plane..plane + self.s];
                for (dst, &i) in rows.iter_mut().zip(&self.table) {
                    *dst = if i == PAD { 0.0 } else { xp[i] };
                }
            }
        }
    }

    /// Adds a column matrix of group `gi` into the image `dxi`.
    fn col2im(&self, col: &[f32], gi: usize, dxi: &mut [f32]) {
        let (cg, o, k) = (self.cg(), self.o, self.k);
        if self.nhwc {
            for (p, row) in col.chunks(k * cg).enumerate() {
                for (t, src) in row.chunks(cg).enumerate() {
                    let i = self.table[t * o + p];
                    if i != PAD {
                        let at = i * self.c + gi * cg;
                        for (d, v) in dxi[at..at + cg].iter_mut().zip(src) {
                            *d += v;
                        }
                    }
                }
            }
        } else {
            for (ci, rows) in col.chunks(k * o).enumerate() {
                let plane = (gi * cg + ci) * self.s;
                let dp = &mut dxi[plane..plane + self.s];
                for (v, &i) in rows.iter().zip(&self.table) {
                    if i != PAD {
                        dp[i] += v;
                    }
                }
            }
        }
    }
}

impl ConvNd {
    fn plan(&self, xd: &[usize], wd: &[usize]) -> Result<ConvRun> {
        let (n, c, inp) = self.g.split_dims(xd)?;
        if wd.len() != xd.len() {
            bail!(
                ShapeMismatch: "filter has {} dims but the input has {}: shapes {wd:?} and {xd:?}",
                wd.len(),
                xd.len()
            );
        }
        let (m, wc, kern) = self.g.split_dims(wd)?;
        if c != wc * self.group {
            bail!(
                ShapeMismatch: "Convolution op: input channels does not match: # of input \
                 channels {c} is not equal to kernel channels * group: {wc}*{}",
                self.group
            );
        }
        if m % self.group != 0 {
            bail!(
                ShapeMismatch: "The number of output channels {m} is not divisible by group {}",
                self.group
            );
        }
        let ax = self.g.axes(&inp, Some(&kern))?;
        for (d, &size) in inp.iter().enumerate() {
            // Every value fits an int (checked when read): no overflow in usize.
            let dk = ax.dilation[d] * (ax.kernel[d].max(1) - 1) + 1;
            if size + ax.head[d] + ax.tail[d] < dk {
                bail!(
                    ShapeMismatch: "the dilated kernel ({dk}) of axis {d} does not fit the padded \
                     input ({} + {} + {})",
                    size,
                    ax.head[d],
                    ax.tail[d]
                );
            }
        }
        let out = ax.out_dims(&inp)?;
        let table = ax.tap_table(&inp, &out)?;
        Ok(ConvRun {
            n,
            c,
            m,
            group: self.group,
            s: product(&inp, "the input")?,
            o: product(&out, "the output")?,
            k: product(&kern, "the kernel")?,
            out,
            table,
            nhwc: self.g.order == Order::Nhwc,
        })
    }

    fn forward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm = ctx.gemm;
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let r = self.plan(x.dims(), w.dims())?;
        let bias = conv_args::bias(&ins, r.m)?;
        let (xs, ws) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let y_dims = self.g.join_dims(r.n, r.m, &r.out);
        let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
        if y.is_empty() {
            return Ok(());
        }
        let (kd, o, mg) = (r.kd(), r.o, r.mg());
        let mut col = try_vec(kd * o, 0f32, "the column buffer")?;
        let mut tmp = try_vec(
            if r.nhwc && r.group > 1 { o * mg } else { 0 },
            0f32,
            "the group buffer",
        )?;
        for (img, yi) in y.chunks_mut(r.m * o).enumerate() {
            for gi in 0..r.group {
                let wg = &ws[gi * mg * kd..(gi + 1) * mg * kd];
                r.im2col(xs, img, gi, &mut col);
                if !r.nhwc {
                    let dst = &mut yi[gi * mg * o..(gi + 1) * mg * o];
                    gemm.sgemm(false, false, mg, o, kd, 1.0, wg, &col, 0.0, dst);
                } else if r.group == 1 {
                    gemm.sgemm(false, true, o, mg, kd, 1.0, &col, wg, 0.0, yi);
                } else {
                    gemm.sgemm(false, true, o, mg, kd, 1.0, &col, wg, 0.0, &mut tmp);
                    for p in 0..o {
                        yi[p * r.m + gi * mg..p * r.m + (gi + 1) * mg]
                            .copy_from_slice(&tmp[p * mg..(p + 1) * mg]);
                    }
                }
            }
            if let Some(b) = bias {
                if r.nhwc {
                    for row in yi.chunks_mut(r.m) {
                        for (v, bv) in row.iter_mut().zip(b) {
                            *v += bv;
                        }
                    }
                } else {
                    for (row, bv) in yi.chunks_mut(o).zip(b) {
                        for v in row {
                            *v += bv;
                        }
                    }
                }
            }
            if self.relu {
                super::math::relu_in_place(yi);
            }
        }
        Ok(())
    }

    /// Inputs (X, W, dY); outputs (dW, db, dX) or, with no_bias, (dW, dX); dX optional.
    fn backward(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let gemm: GemmContext = ctx.gemm;
        let n_out = ctx.num_outputs();
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let w = ins.tensor(1)?;
        let r = self.plan(x.dims(), w.dims())?;
        let dy = ins.tensor(2)?;
        let y_dims = self.g.join_dims(r.n, r.m, &r.out);
        if dy.dims() != y_dims.as_slice() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let (xs, ws, g) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            dy.as_slice::<f32>()?,
        );
        let want_dx = n_out > if self.no_bias { 1 } else { 2 };
        let mut dx = try_vec(if want_dx { xs.len() } else { 0 }, 0f32, "dX")?;
        let mut dw = try_vec(ws.len(), 0f32, "dW")?;
        let mut db = try_vec(r.m, 0f32, "db")?;
        let (kd, o, mg) = (r.kd(), r.o, r.mg());
        let n_imgs = if g.is_empty() { 0 } else { r.n };
        let col_len = if n_imgs == 0 { 0 } else { kd * o };
        let mut col = try_vec(col_len, 0f32, "the column buffer")?;
        let mut gg = try_vec(if n_imgs == 0 { 0 } else { o * mg }, 0f32, "dY of a group")?;
        let img_in = r.s * r.c;
        for img in 0..n_imgs {
            let gi_all = &g[img * r.m * o..(img + 1) * r.m * o];
            for gi in 0..r.group {
                if r.nhwc {
                    for p in 0..o {
                        gg[p * mg..(p + 1) * mg]
                            .copy_from_slice(&gi_all[p * r.m + gi * mg..p * r.m + (gi + 1) * mg]);
                    }
                } else {
                    gg.copy_from_slice(&gi_all[gi * mg * o..(gi + 1) * mg * o]);
                }
                r.im2col(xs, img, gi, &mut col);
                let dwg = &mut dw[gi * mg * kd..(gi + 1) * mg * kd];
                let wg = &ws[gi * mg * kd..(gi + 1) * mg * kd];
                if r.nhwc {
                    gemm.sgemm(true, false, mg, kd, o, 1.0, &gg, &col, 1.0, dwg);
                    if want_dx {
                        gemm.sgemm(false, false, o, kd, mg, 1.0, &gg, wg, 0.0, &mut col);
                    }
                } else {
                    gemm.sgemm(false, true, mg, kd, o, 1.0, &gg, &col, 1.0, dwg);
                    if want_dx {
                        gemm.sgemm(true, false, kd, o, mg, 1.0, wg, &gg, 0.0, &mut col);
                    }
                }
                if want_dx {
                    r.col2im(&col, gi, &mut dx[img * img_in..(img + 1) * img_in]);
                }
            }
            if r.nhwc {
                for row in gi_all.chunks(r.m.max(1)) {
                    for (acc, v) in db.iter_mut().zip(row) {
                        *acc += v;
                    }
                }
            } else {
                for (acc, row) in db.iter_mut().zip(gi_all.chunks(o.max(1))) {
                    *acc += row.iter().sum::<f32>();
                }
            }
        }
        let (w_dims, x_dims) = (w.dims().to_vec(), x.dims().to_vec());
        let dx = want_dx.then_some((x_dims.as_slice(), dx.as_slice()));
        let db = (!self.no_bias).then_some(db.as_slice());
        super::conv::write_grads(&mut outs, (&w_dims, &dw), db, dx)
    }
}

impl Operator for ConvNd {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if self.gradient {
            self.backward(ctx)
        } else {
            self.forward(ctx)
        }
    }

    fn fuse_relu(&mut self) -> bool {
        self.relu = !self.gradient;
        self.relu
    }
}

// ---------------------------------------------------------------------------------------------
// Pooling

/// What a pooling window computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PoolKind {
    Max,
    Average,
    /// `(sum |x|^p)^(1/p)`.
    Lp(f32),
}

/// N-d pooling or its gradient (inputs X, Y, dY).
pub(crate) struct PoolNd {
    pub(crate) g: NdGeometry,
    pub(crate) kind: PoolKind,
    pub(crate) gradient: bool,
    pub(crate) include_pad: bool,
}

/// The windows of one pooling run: output `o` reads the spatial input positions
/// `index[start[o]..start[o + 1]]` and divides an average by `divisor[o]`.
struct Windows {
    start: Vec<usize>,
    index: Vec<usize>,
    divisor: Vec<f32>,
}

impl PoolNd {
    fn windows(&self, inp: &[usize]) -> Result<(Vec<usize>, Windows)> {
        let ax = if self.g.global {
            Axes {
                kernel: inp.to_vec(),
                stride: vec![1; inp.len()],
                head: vec![0; inp.len()],
                tail: vec![0; inp.len()],
                dilation: vec![1; inp.len()],
            }
        } else {
            self.g.axes(inp, None)?
        };
        let out = if self.g.global {
            vec![1; inp.len()]
        } else {
            for (d, &size) in inp.iter().enumerate() {
                if size + ax.head[d] + ax.tail[d] < ax.kernel[d] {
                    bail!(
                        ShapeMismatch: "the kernel ({}) of axis {d} does not fit the padded \
                         input ({} + {} + {})",
                        ax.kernel[d],
                        size,
                        ax.head[d],
                        ax.tail[d]
                    );
                }
            }
            ax.out_dims(inp)?
        };
        let per_axis: Vec<Vec<Win>> = (0..inp.len())
            .map(|d| {
                if self.g.global {
                    vec![Win {
                        start: 0,
                        end: inp[d],
                        span: i64::try_from(inp[d]).unwrap_or(i64::MAX),
                    }]
                } else {
                    axis_windows(
                        out[d],
                        inp[d],
                        ax.kernel[d],
                        ax.stride[d],
                        ax.head[d],
                        ax.tail[d],
                    )
                }
            })
            .collect();
        let on = product(&out, "the output")?;
        let mut w = Windows {
            start: try_vec(1, 0usize, "the windows")?,
            index: Vec::new(),
            divisor: Vec::new(),
        };
        w.start
            .try_reserve_exact(on)
            .map_err(|_| err!(OutOfMemory: "the pooling windows are too large"))?;
        w.divisor
            .try_reserve_exact(on)
            .map_err(|_| err!(OutOfMemory: "the pooling windows are too large"))?;
        let nd = inp.len();
        let mut oidx = vec![0usize; nd];
        let mut cur = vec![0usize; nd];
        for _ in 0..on {
            let wins: Vec<Win> = (0..nd).map(|d| per_axis[d][oidx[d]]).collect();
            let count = wins.iter().map(|w| w.end - w.start).product::<usize>();
            let span = wins.iter().map(|w| w.span).product::<i64>();
            w.divisor.push(if self.include_pad {
                span.max(1) as f32
            } else {
                count.max(1) as f32
            });
            if count > 0 {
                w.index
                    .try_reserve(count)
                    .map_err(|_| err!(OutOfMemory: "the pooling windows are too large"))?;
                for (c, wd) in cur.iter_mut().zip(&wins) {
                    *c = wd.start;
                }
                for _ in 0..count {
                    w.index
                        .push(cur.iter().zip(inp).fold(0, |f, (&c, &dim)| f * dim + c));
                    // The next position of the window, row-major.
                    for d in (0..nd).rev() {
                        cur[d] += 1;
                        if cur[d] < wins[d].end {
                            break;
                        }
                        cur[d] = wins[d].start;
                    }
                }
            }
            w.start.push(w.index.len());
            step(&mut oidx, &out);
        }
        Ok((out, w))
    }
}

impl Operator for PoolNd {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let (n, c, inp) = self.g.split_dims(x.dims())?;
        let (out, win) = self.windows(&inp)?;
        let xs = x.as_slice::<f32>()?;
        let (s, o) = (product(&inp, "the input")?, product(&out, "the output")?);
        let nhwc = self.g.order == Order::Nhwc;
        // Element (image, channel, position) of a tensor with `sz` positions per image.
        let at = |img: usize, ch: usize, pos: usize, sz: usize| {
            if nhwc {
                (img * sz + pos) * c + ch
            } else {
                (img * c + ch) * sz + pos
            }
        };
        let y_dims = self.g.join_dims(n, c, &out);
        if !self.gradient {
            let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
            for img in 0..n {
                for ch in 0..c {
                    for q in 0..o {
                        let idx = &win.index[win.start[q]..win.start[q + 1]];
                        let vals = idx.iter().map(|&i| xs[at(img, ch, i, s)]);
                        y[at(img, ch, q, o)] = match self.kind {
                            PoolKind::Max => vals.fold(f32::MIN, f32::max),
                            PoolKind::Average => vals.sum::<f32>() / win.divisor[q],
                            PoolKind::Lp(p) => {
                                vals.map(|v| v.abs().powf(p)).sum::<f32>().powf(1.0 / p)
                            }
                        };
                    }
                }
            }
            return Ok(());
        }
        let y = ins.tensor(1)?.as_slice::<f32>()?;
        let dy = ins.tensor(2)?;
        if dy.dims() != y_dims.as_slice() || y.len() != dy.numel() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let g = dy.as_slice::<f32>()?;
        let dims = x.dims().to_vec();
        let dx = outs.tensor(0)?.try_ensure::<f32>(&dims)?;
        dx.fill(0.0);
        for img in 0..n {
            for ch in 0..c {
                for q in 0..o {
                    let idx = &win.index[win.start[q]..win.start[q + 1]];
                    let (yv, gv) = (y[at(img, ch, q, o)], g[at(img, ch, q, o)]);
                    match self.kind {
                        PoolKind::Max => {
                            if let Some(&i) = idx.iter().find(|&&i| xs[at(img, ch, i, s)] == yv) {
                                dx[at(img, ch, i, s)] += gv;
                            }
                        }
                        PoolKind::Average => {
                            let v = gv / win.divisor[q];
                            for &i in idx {
                                dx[at(img, ch, i, s)] += v;
                            }
                        }
                        PoolKind::Lp(p) => {
                            let den = yv.powf(p - 1.0);
                            for &i in idx {
                                let xv = xs[at(img, ch, i, s)];
                                dx[at(img, ch, i, s)] += gv * xv * xv.abs().powf(p - 2.0) / den;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
