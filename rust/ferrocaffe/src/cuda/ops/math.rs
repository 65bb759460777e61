//! Element-wise math on CUDA (kernels/math.cu): unary math and its gradients, Add/Sub/Mul/Div,
//! Pow, comparisons and logic with Caffe2's broadcasting (numpy rules, or the legacy
//! `broadcast=1` with `axis`), the broadcast ops' gradients and SumReduceLike, Sum,
//! WeightedSum, Scale, Clip and Cast.
//!
//! Shapes, arguments, checks and error kinds follow the CPU kernels (ops/cpu/math.rs,
//! activations.rs, unary_grad.rs, math_grad.rs, compare.rs, optim.rs, cast.rs), whose shape
//! helpers are reused. On CUDA the types are float32 (int32 and int64 where the CPU takes
//! integers, bool for comparisons and logic); double and the other types fail with
//! `DtypeMismatch`.

use cudarc::driver::{CudaFunction, DeviceRepr};

use crate::cuda::op::{
    device, init_device, input_f32, input_of, n64, new_tensor, set_output, DevIn,
};
use crate::cuda::{grid, rows};
use crate::cuda_launch;
use crate::device::DeviceType;
use crate::error::{Error, Result};
use crate::ops::cpu::broadcast::legacy_sizes;
use crate::ops::cpu::math::BroadcastArgs;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::DataType;
use crate::{bail, err};

/// The kernel module of this family.
const MODULE: &str = "math";

/// Most dims a broadcast plan holds after coalescing (`FC_MAXD` in math.cu).
const MAXD: usize = 12;

/// Threads per block of the block-per-output reductions.
const RED_THREADS: u32 = 256;

/// Registers this family's CUDA kernels.
pub fn register(r: &mut Registry) {
    register_unary(r);
    register_pairs(r);
    register_binary(r);
    r.register("AddGradient", DeviceType::Cuda, "", |i| {
        create_arith_grad(i, Kind::Add)
    });
    r.register("SubGradient", DeviceType::Cuda, "", |i| {
        create_arith_grad(i, Kind::Sub)
    });
    r.register("MulGradient", DeviceType::Cuda, "", |i| {
        create_arith_grad(i, Kind::Mul)
    });
    r.register("DivGradient", DeviceType::Cuda, "", |i| {
        create_arith_grad(i, Kind::Div)
    });
    r.register(
        "SumReduceLike",
        DeviceType::Cuda,
        "",
        create_sum_reduce_like,
    );
    r.register("Sum", DeviceType::Cuda, "", create_sum);
    r.register("WeightedSum", DeviceType::Cuda, "", create_weighted_sum);
    r.register("Cast", DeviceType::Cuda, "", create_cast);
}

// ---- kernels by dtype ----------------------------------------------------------------------

const F32: &[DataType] = &[DataType::Float];
const NUMERIC: &[DataType] = &[DataType::Float, DataType::Int32, DataType::Int64];
const COMPARABLE: &[DataType] = &[
    DataType::Float,
    DataType::Int32,
    DataType::Int64,
    DataType::Bool,
];
const BOOL: &[DataType] = &[DataType::Bool];

/// The kernel-name suffix of a dtype.
fn suffix(dt: DataType) -> Option<&'static str> {
    match dt {
        DataType::Float => Some("f32"),
        DataType::Int32 => Some("i32"),
        DataType::Int64 => Some("i64"),
        DataType::Bool => Some("u8"),
        _ => None,
    }
}

/// One op's kernels for each dtype it takes on CUDA: `{base}_{suffix}{variant}` for each
/// variant (e.g. `add_f32_same`, `add_f32_bc`).
struct Kernels {
    op: String,
    by_type: Vec<(DataType, Vec<CudaFunction>)>,
}

impl Kernels {
    fn load(init: &OpInit<'_>, base: &str, types: &[DataType], variants: &[&str]) -> Result<Self> {
        let dev = init_device(init)?;
        let mut by_type = Vec::with_capacity(types.len());
        for &dt in types {
            let sfx = suffix(dt)
                .ok_or_else(|| err!(NotImplemented: "no CUDA kernel suffix for type {dt}"))?;
            let fs = variants
                .iter()
                .map(|v| dev.function(MODULE, &format!("{base}_{sfx}{v}")))
                .collect::<Result<Vec<_>>>()?;
            by_type.push((dt, fs));
        }
        Ok(Kernels {
            op: init.def.r#type().to_string(),
            by_type,
        })
    }

    /// The kernels for input `i`'s dtype `dt`.
    fn get(&self, ctx: &OpContext<'_>, i: usize, dt: DataType) -> Result<&[CudaFunction]> {
        match self.by_type.iter().find(|(t, _)| *t == dt) {
            Some((_, fs)) => Ok(fs),
            None => {
                let names: Vec<String> = self.by_type.iter().map(|(t, _)| t.to_string()).collect();
                Err(Error::DtypeMismatch(format!(
                    "input {i} ('{}') holds {dt}; {} on CUDA supports {}",
                    ctx.input_name(i),
                    self.op,
                    names.join(", ")
                )))
            }
        }
    }
}

/// The one kernel at `idx` of `fs` (the variants asked for at load).
fn pick(fs: &[CudaFunction], idx: usize) -> Result<&CudaFunction> {
    fs.get(idx)
        .ok_or_else(|| err!(Device: "internal: CUDA kernel variant {idx} missing"))
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Fails unless input `i` holds float32 (without copying it to the device).
fn check_f32(ctx: &OpContext<'_>, i: usize) -> Result<()> {
    let dt = ctx.input(i)?.dtype();
    if dt != DataType::Float {
        bail!(
            DtypeMismatch: "input {i} ('{}') holds {dt}, expected float32",
            ctx.input_name(i)
        );
    }
    Ok(())
}

// ---- unary ops -----------------------------------------------------------------------------

fn register_unary(r: &mut Registry) {
    macro_rules! unary {
        ($($name:literal => $base:literal, $types:expr),* $(,)?) => {$(
            r.register($name, DeviceType::Cuda, "", |i| {
                create_unary(i, $base, $types, 0.0, 0.0)
            });
        )*};
    }
    unary!(
        "Sigmoid" => "sigmoid", F32,
        "Tanh" => "tanh", F32,
        "Exp" => "exp", F32,
        "Log" => "log", F32,
        "Sqrt" => "sqrt", F32,
        "Rsqrt" => "rsqrt", F32,
        "RSqrt" => "rsqrt32", F32,
        "Reciprocal" => "reciprocal", F32,
        "Cos" => "cos", F32,
        "Sin" => "sin", F32,
        "Tan" => "tan", F32,
        "Acos" => "acos", F32,
        "Asin" => "asin", F32,
        "Atan" => "atan", F32,
        "Softsign" => "softsign", F32,
        "Log1p" => "log1p", F32,
        "Cbrt" => "cbrt", F32,
        "Negative" => "neg", NUMERIC,
        "Abs" => "abs", NUMERIC,
        "Sqr" => "sqr", NUMERIC,
        "Sign" => "sign", NUMERIC,
        "Cube" => "cube", NUMERIC,
        "Not" => "not", BOOL,
    );
    r.register("LeakyRelu", DeviceType::Cuda, "", |i| {
        let alpha = i.args.float("alpha", 0.01)?;
        create_unary(i, "leaky_relu", F32, alpha, 0.0)
    });
    r.register("Clip", DeviceType::Cuda, "", |i| {
        let lo = i.args.float("min", f32::MIN)?;
        let hi = i.args.float("max", f32::MAX)?;
        create_unary(i, "clip", F32, lo, hi)
    });
    r.register("Scale", DeviceType::Cuda, "", |i| {
        let s = i.args.float("scale", 1.0)?;
        create_unary(i, "scale", F32, s, 0.0)
    });
    r.register("Pow", DeviceType::Cuda, "", create_pow);
}

/// `Y = f(X)` element-wise, same shape and dtype; the kernel takes (x, y, n, p0, p1).
fn create_unary(
    init: &OpInit<'_>,
    base: &str,
    types: &[DataType],
    p0: f32,
    p1: f32,
) -> Result<Box<dyn Operator>> {
    let ks = Kernels::load(init, base, types, &[""])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dt = ctx.input(0)?.dtype();
        let f = pick(ks.get(ctx, 0, dt)?, 0)?;
        let x = input_of(ctx, &dev, 0, dt)?;
        let n = x.numel();
        let (y, yp) = new_tensor(&dev, dt, x.dims())?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n); x.ptr, yp, n64(n), p0, p1)?;
        }
        set_output(ctx, 0, y)
    })))
}

/// Pow: `X ^ exponent`, or `A ^ B` (same shapes, or legacy broadcasting), float32.
fn create_pow(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    if init.num_inputs() == 1 {
        if !init.args.has("exponent") {
            bail!(op = init, BadArgument: "Pow needs an exponent argument or a second input");
        }
        let e = init.args.float("exponent", 1.0)?;
        return create_unary(init, "powe", F32, e, 0.0);
    }
    if init.args.has("exponent") {
        bail!(
            op = init,
            BadArgument: "Only one of the exponent argument and a second input may be given"
        );
    }
    let bc = BroadcastArgs::new(init)?;
    let ks = Kernels::load(init, "pow", F32, &["_same", "_bc"])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let a = ctx.input(0)?.dims().to_vec();
        let b = ctx.input(1)?.dims().to_vec();
        if !bc.legacy && a != b {
            bail!(
                op = ctx,
                ShapeMismatch: "Dimension mismatch - did you forget to set broadcast=1? {a:?} vs \
                 {b:?}"
            );
        }
        run_binary(ctx, bc, &ks, None)
    })))
}

// ---- gradients of unary ops: two float inputs of one shape ---------------------------------

fn register_pairs(r: &mut Registry) {
    macro_rules! pair {
        ($($name:literal => $kernel:literal),* $(,)?) => {$(
            r.register($name, DeviceType::Cuda, "", |i| create_pair(i, $kernel, 0.0, 0.0));
        )*};
    }
    pair!(
        "SigmoidGradient" => "sigmoid_grad",
        "TanhGradient" => "tanh_grad",
        "SoftsignGradient" => "softsign_grad",
        "AbsGradient" => "abs_grad",
        "SinGradient" => "sin_grad",
        "CosGradient" => "cos_grad",
        "TanGradient" => "tan_grad",
        "AcosGradient" => "acos_grad",
        "AsinGradient" => "asin_grad",
        "AtanGradient" => "atan_grad",
        "CbrtGradient" => "cbrt_grad",
        "RSqrtGradient" => "rsqrt_grad",
        "RsqrtGradient" => "rsqrt_grad",
        "ReciprocalGradient" => "reciprocal_grad",
    );
    r.register("LeakyReluGradient", DeviceType::Cuda, "", |i| {
        let alpha = i.args.float("alpha", 0.01)?;
        create_pair(i, "leaky_relu_grad", alpha, 0.0)
    });
    r.register("ClipGradient", DeviceType::Cuda, "", |i| {
        let lo = i.args.float("min", f32::MIN)?;
        let hi = i.args.float("max", f32::MAX)?;
        create_pair(i, "clip_grad", lo, hi)
    });
}

/// `out = f(in0, in1)` over two float32 inputs of one shape; the kernel takes
/// (in0, in1, out, n, p0, p1).
fn create_pair(init: &OpInit<'_>, base: &str, p0: f32, p1: f32) -> Result<Box<dyn Operator>> {
    let ks = Kernels::load(init, base, F32, &[""])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let ad = ctx.input(0)?.dims().to_vec();
        let bd = ctx.input(1)?.dims().to_vec();
        if ad != bd {
            bail!(
                op = ctx,
                ShapeMismatch: "inputs '{}' {ad:?} and '{}' {bd:?} must have the same shape",
                ctx.input_name(0),
                ctx.input_name(1)
            );
        }
        let a = input_f32(ctx, &dev, 0)?;
        let b = input_f32(ctx, &dev, 1)?;
        let f = pick(ks.get(ctx, 0, DataType::Float)?, 0)?;
        let n = a.numel();
        let (y, yp) = new_tensor(&dev, DataType::Float, &ad)?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n); a.ptr, b.ptr, yp, n64(n), p0, p1)?;
        }
        set_output(ctx, 0, y)
    })))
}

// ---- binary ops with broadcasting ----------------------------------------------------------

/// A broadcast binary op's index plan (`FcBcPlan` in math.cu, same layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct BcPlan {
    nd: i64,
    d: [i64; MAXD],
    sa: [i64; MAXD],
    sb: [i64; MAXD],
}

// SAFETY: plain `#[repr(C)]` integers laid out as the kernel's `FcBcPlan`, passed by value.
unsafe impl DeviceRepr for BcPlan {}

/// A reduction plan of a broadcast operand's gradient (`FcRedPlan` in math.cu, same layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct RedPlan {
    nk: i64,
    nr: i64,
    kd: [i64; MAXD],
    kc: [i64; MAXD],
    ko: [i64; MAXD],
    rd: [i64; MAXD],
    rc: [i64; MAXD],
    ro: [i64; MAXD],
}

// SAFETY: plain `#[repr(C)]` integers laid out as the kernel's `FcRedPlan`, passed by value.
unsafe impl DeviceRepr for RedPlan {}

/// Element strides of `dims` aligned to the end of `out` (0 along dims of size 1 and the
/// missing leading ones), as the CPU's broadcast loops.
fn strides(dims: &[usize], out: &[usize]) -> Result<Vec<i64>> {
    let off = out.len().checked_sub(dims.len()).ok_or_else(
        || err!(ShapeMismatch: "shape {dims:?} has more dims than the broadcast shape {out:?}"),
    )?;
    let mut s = vec![0i64; out.len()];
    let mut acc: i64 = 1;
    for (k, &d) in dims.iter().enumerate().rev() {
        s[k + off] = if d == 1 { 0 } else { acc };
        acc = acc.saturating_mul(n64(d));
    }
    Ok(s)
}

/// The dims of `dims` not of size 1 (with `keep(k)`), as (size, strides of each operand),
/// adjacent dims merged where every operand is contiguous across them.
fn coalesce<const K: usize>(
    dims: &[usize],
    strides: [&[i64]; K],
    keep: impl Fn(usize) -> bool,
) -> Vec<(i64, [i64; K])> {
    let mut out: Vec<(i64, [i64; K])> = Vec::new();
    for (k, &d) in dims.iter().enumerate() {
        if d == 1 || !keep(k) {
            continue;
        }
        let d = n64(d);
        let s: [i64; K] = std::array::from_fn(|j| strides[j].get(k).copied().unwrap_or(0));
        if let Some(last) = out.last_mut() {
            if (0..K).all(|j| last.1[j] == s[j].saturating_mul(d)) {
                last.0 = last.0.saturating_mul(d);
                last.1 = s;
                continue;
            }
        }
        out.push((d, s));
    }
    out
}

fn too_many_dims(n: usize) -> Error {
    err!(
        NotImplemented: "a broadcast of {n} non-contiguous dims on CUDA (at most {MAXD} are \
         supported)"
    )
}

/// The plan of `c[i] = f(a[ia], b[ib])` over loop shape `lc` with operand shapes `la`, `lb`.
fn bc_plan(la: &[usize], lb: &[usize], lc: &[usize]) -> Result<BcPlan> {
    let sa = strides(la, lc)?;
    let sb = strides(lb, lc)?;
    let dims = coalesce(lc, [&sa, &sb], |_| true);
    if dims.len() > MAXD {
        return Err(too_many_dims(dims.len()));
    }
    let mut p = BcPlan {
        nd: n64(dims.len()),
        d: [1; MAXD],
        sa: [0; MAXD],
        sb: [0; MAXD],
    };
    for (k, (d, [a, b])) in dims.into_iter().enumerate() {
        p.d[k] = d;
        p.sa[k] = a;
        p.sb[k] = b;
    }
    Ok(p)
}

/// The plan reducing a full-size gradient over loop shape `lc` to the operand whose strides
/// in `lc` are `out_s`: its kept dims are where `out_s` is not 0, the rest are summed. `c_s`
/// are the full-size tensors' strides, `oth_s` the other operand's. Returns the plan and the
/// number of terms of each output element.
fn red_plan(lc: &[usize], out_s: &[i64], c_s: &[i64], oth_s: &[i64]) -> Result<(RedPlan, i64)> {
    let kept = coalesce(lc, [c_s, oth_s], |k| out_s.get(k).is_some_and(|&s| s != 0));
    let red = coalesce(lc, [c_s, oth_s], |k| out_s.get(k).is_none_or(|&s| s == 0));
    if kept.len() > MAXD || red.len() > MAXD {
        return Err(too_many_dims(kept.len().max(red.len())));
    }
    let mut p = RedPlan {
        nk: n64(kept.len()),
        nr: n64(red.len()),
        kd: [1; MAXD],
        kc: [0; MAXD],
        ko: [0; MAXD],
        rd: [1; MAXD],
        rc: [0; MAXD],
        ro: [0; MAXD],
    };
    for (k, (d, [c, o])) in kept.into_iter().enumerate() {
        p.kd[k] = d;
        p.kc[k] = c;
        p.ko[k] = o;
    }
    let mut terms: i64 = 1;
    for (k, (d, [c, o])) in red.into_iter().enumerate() {
        p.rd[k] = d;
        p.rc[k] = c;
        p.ro[k] = o;
        terms = terms.saturating_mul(d);
    }
    Ok((p, terms))
}

fn register_binary(r: &mut Registry) {
    macro_rules! binary {
        ($($name:literal => $base:literal, $types:expr, $out:expr),* $(,)?) => {$(
            r.register($name, DeviceType::Cuda, "", |i| create_binary(i, $base, $types, $out));
        )*};
    }
    binary!(
        "Add" => "add", NUMERIC, None,
        "Sub" => "sub", NUMERIC, None,
        "Mul" => "mul", NUMERIC, None,
        "Div" => "div", NUMERIC, None,
        "EQ" => "eq", COMPARABLE, Some(DataType::Bool),
        "NE" => "ne", COMPARABLE, Some(DataType::Bool),
        "LT" => "lt", COMPARABLE, Some(DataType::Bool),
        "LE" => "le", COMPARABLE, Some(DataType::Bool),
        "GT" => "gt", COMPARABLE, Some(DataType::Bool),
        "GE" => "ge", COMPARABLE, Some(DataType::Bool),
        "And" => "and", BOOL, None,
        "Or" => "or", BOOL, None,
        "Xor" => "xor", BOOL, None,
    );
}

/// `C = f(A, B)` with broadcasting; the output has A's dtype, or `out` when given.
fn create_binary(
    init: &OpInit<'_>,
    base: &str,
    types: &[DataType],
    out: Option<DataType>,
) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    let ks = Kernels::load(init, base, types, &["_same", "_bc"])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        run_binary(ctx, bc, &ks, out)
    })))
}

fn run_binary(
    ctx: &mut OpContext<'_>,
    bc: BroadcastArgs,
    ks: &Kernels,
    out: Option<DataType>,
) -> Result<()> {
    let dev = device(ctx)?;
    let (la, lb, lc, c_dims) = bc.shapes(ctx)?;
    let dt = ctx.input(0)?.dtype();
    let fs = ks.get(ctx, 0, dt)?;
    let out = out.unwrap_or(dt);
    for i in 0..2 {
        if out != dt && ctx.num_outputs() > 0 && ctx.is_inplace(i, 0) {
            bail!(
                op = ctx,
                ShapeMismatch: "cannot compute in place: output shape {c_dims:?} differs from \
                 input {i}'s"
            );
        }
    }
    let a = input_of(ctx, &dev, 0, dt)?;
    let b = input_of(ctx, &dev, 1, dt)?;
    let n = numel(&c_dims);
    let (c, cp) = new_tensor(&dev, out, &c_dims)?;
    if n > 0 {
        if a.numel() == n && b.numel() == n {
            cuda_launch!(dev, pick(fs, 0)?, grid(n); a.ptr, b.ptr, cp, n64(n))?;
        } else {
            let plan = bc_plan(&la, &lb, &lc)?;
            cuda_launch!(dev, pick(fs, 1)?, grid(n); a.ptr, b.ptr, cp, n64(n), plan)?;
        }
    }
    set_output(ctx, 0, c)
}

// ---- gradients of the broadcast ops --------------------------------------------------------

/// The reduction kernels, one per mode (0: g, 1: g * other, 2: g / other,
/// 3: g * c / other), each as (one thread per output, one block per output).
struct Reducers {
    modes: Vec<(CudaFunction, CudaFunction)>,
}

impl Reducers {
    fn load(init: &OpInit<'_>) -> Result<Self> {
        let dev = init_device(init)?;
        let mut modes = Vec::with_capacity(4);
        for m in 0..4 {
            modes.push((
                dev.function(MODULE, &format!("red_thread_m{m}"))?,
                dev.function(MODULE, &format!("red_block_m{m}"))?,
            ));
        }
        Ok(Reducers { modes })
    }
}

/// One reduction: `out[o] = scale * sum of term(mode)` over `plan`, `nout` outputs.
struct Reduction {
    mode: usize,
    g: u64,
    other: u64,
    c: u64,
    out: u64,
    scale: f32,
    nout: usize,
    plan: RedPlan,
    terms: i64,
}

fn reduce(dev: &crate::cuda::DeviceCtx, rs: &Reducers, r: Reduction) -> Result<()> {
    if r.nout == 0 {
        return Ok(());
    }
    let (thread, block) = rs
        .modes
        .get(r.mode)
        .ok_or_else(|| err!(Device: "internal: no reduction mode {}", r.mode))?;
    let Reduction {
        g,
        other,
        c,
        out,
        scale,
        nout,
        plan,
        terms,
        ..
    } = r;
    if terms >= 256 && nout <= 65536 {
        let cfg = rows(nout, RED_THREADS);
        cuda_launch!(dev, block, cfg; g, other, c, out, scale, n64(nout), terms, plan)
    } else {
        cuda_launch!(dev, thread, grid(nout); g, other, c, out, scale, n64(nout), terms, plan)
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Add,
    Sub,
    Mul,
    Div,
}

/// AddGradient, SubGradient, MulGradient, DivGradient: inputs (dC, A, B[, C]), outputs
/// (dA[, dB]) summed over the dims each operand was broadcast along.
fn create_arith_grad(init: &OpInit<'_>, kind: Kind) -> Result<Box<dyn Operator>> {
    let bc = BroadcastArgs::new(init)?;
    let rs = Reducers::load(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        run_arith_grad(ctx, bc, kind, &rs)
    })))
}

fn run_arith_grad(
    ctx: &mut OpContext<'_>,
    bc: BroadcastArgs,
    kind: Kind,
    rs: &Reducers,
) -> Result<()> {
    if (0..ctx.num_inputs()).any(|i| (0..ctx.num_outputs()).any(|j| ctx.is_inplace(i, j))) {
        bail!(op = ctx, Schema: "arithmetic gradient ops cannot run in place");
    }
    let dev = device(ctx)?;
    let a_dims = ctx.input(1)?.dims().to_vec();
    let b_dims = ctx.input(2)?.dims().to_vec();
    let (la, lb, lc, c_dims) = bc.shapes_of(&a_dims, &b_dims)?;
    let dc_dims = ctx.input(0)?.dims().to_vec();
    if dc_dims != c_dims {
        bail!(ShapeMismatch: "dC has shape {dc_dims:?}, the forward output had {c_dims:?}");
    }
    for i in 0..3 {
        check_f32(ctx, i)?;
    }
    let dc = input_f32(ctx, &dev, 0)?;
    // A and B hold values only Mul and Div read; C is DivGradient's forward output.
    let (a, b) = match kind {
        Kind::Add | Kind::Sub => (None, None),
        Kind::Mul | Kind::Div => (
            Some(input_f32(ctx, &dev, 1)?),
            Some(input_f32(ctx, &dev, 2)?),
        ),
    };
    let c = match kind {
        Kind::Div => {
            let c = input_f32(ctx, &dev, 3)?;
            if c.numel() != dc.numel() {
                bail!(ShapeMismatch: "DivGradient: C must have the shape of dC");
            }
            Some(c)
        }
        _ => None,
    };
    let ptr = |x: &Option<DevIn>| x.as_ref().map_or(0, |x| x.ptr);
    let (ap, bp, cp) = (ptr(&a), ptr(&b), ptr(&c));
    let nc = numel(&c_dims);
    let cs = strides(&lc, &lc)?;
    let sa = strides(&la, &lc)?;
    let sb = strides(&lb, &lc)?;

    let na = numel(&a_dims);
    let (da, dap) = new_tensor(&dev, DataType::Float, &a_dims)?;
    if nc == 0 {
        dev.fill_zero(dap, na)?;
    } else {
        let (mode, other) = match kind {
            Kind::Add | Kind::Sub => (0, 0),
            Kind::Mul => (1, bp),
            Kind::Div => (2, bp),
        };
        let (plan, terms) = red_plan(&lc, &sa, &cs, &sb)?;
        let r = Reduction {
            mode,
            g: dc.ptr,
            other,
            c: 0,
            out: dap,
            scale: 1.0,
            nout: na,
            plan,
            terms,
        };
        reduce(&dev, rs, r)?;
    }
    set_output(ctx, 0, da)?;
    if ctx.num_outputs() > 1 {
        let nb = numel(&b_dims);
        let (db, dbp) = new_tensor(&dev, DataType::Float, &b_dims)?;
        if nc == 0 {
            dev.fill_zero(dbp, nb)?;
        } else {
            let (mode, other, other_s, scale) = match kind {
                Kind::Add => (0, 0, &sb, 1.0),
                Kind::Sub => (0, 0, &sb, -1.0),
                Kind::Mul => (1, ap, &sa, 1.0),
                Kind::Div => (3, bp, &sb, -1.0),
            };
            let (plan, terms) = red_plan(&lc, &sb, &cs, other_s)?;
            let r = Reduction {
                mode,
                g: dc.ptr,
                other,
                c: cp,
                out: dbp,
                scale,
                nout: nb,
                plan,
                terms,
            };
            reduce(&dev, rs, r)?;
        }
        set_output(ctx, 1, db)?;
    }
    Ok(())
}

/// SumReduceLike: A summed to B's shape (B one value, or B matching a run of A's dims from
/// `axis` as in the legacy broadcast).
fn create_sum_reduce_like(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let axis = init.args.int("axis", -1)?;
    let axis_str = init.args.string("axis_str", "")?;
    let order = init.args.string("order", "NCHW")?;
    let axis = if axis == -1 && !axis_str.is_empty() {
        order.find(&axis_str).ok_or_else(|| {
            err!(
                op = init,
                BadArgument: "Unrecognizable axis string {axis_str} from order string {order}"
            )
        })? as i64
    } else {
        axis
    };
    let rs = Reducers::load(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let a_dims = ctx.input(0)?.dims().to_vec();
        let b_dims = ctx.input(1)?.dims().to_vec();
        let a = input_f32(ctx, &dev, 0)?;
        let na = a.numel();
        let nb = numel(&b_dims);
        let (lc, out_s) = if nb == 1 {
            (vec![na], vec![0])
        } else {
            let (pre, n, post) = legacy_sizes(&a_dims, &b_dims, axis)?;
            let lc = vec![pre, n, post];
            let s = strides(&[n, 1], &lc)?;
            (lc, s)
        };
        let (y, yp) = new_tensor(&dev, DataType::Float, &b_dims)?;
        if na == 0 {
            dev.fill_zero(yp, nb)?;
        } else {
            let cs = strides(&lc, &lc)?;
            let (plan, terms) = red_plan(&lc, &out_s, &cs, &cs)?;
            let r = Reduction {
                mode: 0,
                g: a.ptr,
                other: 0,
                c: 0,
                out: yp,
                scale: 1.0,
                nout: nb,
                plan,
                terms,
            };
            reduce(&dev, &rs, r)?;
        }
        set_output(ctx, 0, y)
    })))
}

// ---- n-ary sums ----------------------------------------------------------------------------

/// Sum: the element-wise sum of inputs of one shape and dtype, folded in input order.
fn create_sum(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let ks = Kernels::load(init, "add", NUMERIC, &["_same"])?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let x0 = ctx.input(0)?;
        let (dims, dt) = (x0.dims().to_vec(), x0.dtype());
        let f = pick(ks.get(ctx, 0, dt)?, 0)?;
        let n_in = ctx.num_inputs();
        for i in 1..n_in {
            let x = ctx.input(i)?;
            if x.dims() != dims.as_slice() {
                bail!(
                    op = ctx,
                    ShapeMismatch: "Input #{i}, input dimension:{:?} should match output \
                     dimension: {dims:?}",
                    x.dims()
                );
            }
        }
        let xs = (0..n_in)
            .map(|i| input_of(ctx, &dev, i, dt))
            .collect::<Result<Vec<_>>>()?;
        let n = numel(&dims);
        let (y, yp) = new_tensor(&dev, dt, &dims)?;
        if n > 0 {
            match xs.as_slice() {
                [] => {}
                [x0] => {
                    let bytes = n
                        .checked_mul(dt.item_size())
                        .ok_or_else(|| err!(InvalidArgument: "tensor shape {dims:?} overflows"))?;
                    dev.copy_d2d(yp, x0.ptr, bytes)?;
                }
                [x0, x1, rest @ ..] => {
                    cuda_launch!(dev, f, grid(n); x0.ptr, x1.ptr, yp, n64(n))?;
                    for x in rest {
                        cuda_launch!(dev, f, grid(n); yp, x.ptr, yp, n64(n))?;
                    }
                }
            }
        }
        set_output(ctx, 0, y)
    })))
}

/// WeightedSum (X0, w0, X1, w1, ...): sum of w_i * X_i, the weights one-element float32
/// tensors read by the kernels on the device.
fn create_weighted_sum(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let dev0 = init_device(init)?;
    let first = dev0.function(MODULE, "wsum_first_f32")?;
    let acc = dev0.function(MODULE, "wsum_acc_f32")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let n_in = ctx.num_inputs();
        if n_in == 0 || !n_in.is_multiple_of(2) {
            bail!(Schema: "WeightedSum needs pairs of (X, weight) inputs");
        }
        let dims = ctx.input(0)?.dims().to_vec();
        for k in (0..n_in).step_by(2) {
            let w = ctx.input(k + 1)?;
            if w.numel() != 1 {
                bail!(
                    ShapeMismatch: "input {} ('{}') must hold one value, got shape {:?}",
                    k + 1,
                    ctx.input_name(k + 1),
                    w.dims()
                );
            }
            let x = ctx.input(k)?;
            if x.dims() != dims.as_slice() {
                bail!(ShapeMismatch: "Input {k} has shape {:?}, expected {dims:?}", x.dims());
            }
        }
        let dev = device(ctx)?;
        let mut terms = Vec::with_capacity(n_in / 2);
        for k in (0..n_in).step_by(2) {
            terms.push((input_f32(ctx, &dev, k)?, input_f32(ctx, &dev, k + 1)?));
        }
        let n = numel(&dims);
        let (y, yp) = new_tensor(&dev, DataType::Float, &dims)?;
        if n > 0 {
            for (k, (x, w)) in terms.iter().enumerate() {
                let f = if k == 0 { &first } else { &acc };
                cuda_launch!(dev, f, grid(n); x.ptr, w.ptr, yp, n64(n))?;
            }
        }
        set_output(ctx, 0, y)
    })))
}

// ---- Cast ----------------------------------------------------------------------------------

/// Cast between float32, int32, int64 and bool on the device (other targets run the CPU
/// kernel through the fallback).
fn create_cast(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let to = crate::ops::cpu::cast::parse_to(init)?;
    let Some(to_sfx) = suffix(to) else {
        return crate::cuda::fallback(init);
    };
    let dev0 = init_device(init)?;
    let mut ks = Vec::with_capacity(COMPARABLE.len());
    for &from in COMPARABLE {
        if let (true, Some(s)) = (from != to, suffix(from)) {
            ks.push((from, dev0.function(MODULE, &format!("cast_{s}_{to_sfx}"))?));
        }
    }
    // Inputs of other dtypes (a gradient of a cast to double) run the CPU kernel.
    let mut other = crate::cuda::fallback_locked(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let dev = device(ctx)?;
        let dt = ctx.input(0)?.dtype();
        if dt == to {
            let y = dev.duplicate(ctx.input(0)?)?;
            return set_output(ctx, 0, y);
        }
        let Some((_, f)) = ks.iter().find(|(t, _)| *t == dt) else {
            return other.run(ctx);
        };
        let x = input_of(ctx, &dev, 0, dt)?;
        let n = x.numel();
        let (y, yp) = new_tensor(&dev, to, x.dims())?;
        if n > 0 {
            cuda_launch!(dev, f, grid(n); x.ptr, yp, n64(n))?;
        }
        set_output(ctx, 0, y)
    })))
}
