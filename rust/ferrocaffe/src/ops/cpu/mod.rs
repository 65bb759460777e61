//! CPU kernels, one file per family. Each family has `pub fn register(r: &mut Registry)`;
//! [`register_all`] lists them (add one line per new family).
//!
//! # Adding a kernel family
//!
//! 1. Write `ops/cpu/<family>.rs` with `pub fn register(r: &mut Registry)`, add
//!    `pub mod <family>;` and `<family>::register(r);` below. Register each op type with
//!    `r.cpu("Type", factory)` (or `r.register("Type", DeviceType::Cpu, "ENGINE", factory)` for an
//!    engine-specific kernel; ops asking for an unknown engine fall back to the default one).
//! 2. A factory (`fn(&OpInit) -> Result<Box<dyn Operator>>`) runs once per net: read and check
//!    the arguments there (`init.args.int("axis", 1)?`, `.float`, `.bool`, `.string`,
//!    `.sizes("shape")?`, `.ints`, `.floats`, `.strings`, `.net`), and fail with
//!    `bail!(op = init, BadArgument: "...")`, which names the op (see step 6 for the kinds).
//!    The schema in `crate::schema` (input/output counts, in-place rules) is checked before
//!    the factory runs; add a `schema/table.rs` entry for a type that has none.
//! 3. The operator's `run(&mut self, ctx: &mut OpContext)` runs many times with its blobs
//!    locked. Read with `ctx.input(i)?` (`&Tensor`: `.dims()`, `.dtype()`,
//!    `.as_slice::<f32>()?`), write with `ctx.output(j)?` (`&mut Tensor`:
//!    `.ensure::<f32>(&dims)` sizes it, reusing its buffer, and returns the slice). To read
//!    inputs while writing outputs, `let (ins, mut outs) = ctx.split();`. Ops whose schema
//!    allows in-place use `ctx.is_inplace(i, j)`: an input that is also an output is read
//!    through the output (see `elementwise::{unary, binary, nary_same_shape}`, which handle it).
//!    `dispatch!(dtype, [Float => f32, Int64 => i64], |T| ...)` picks the element type.
//!    Fail with `bail!(ShapeMismatch: "...")` (or `ensure!(cond, Kind: "...")`); the net
//!    appends the op's type, name and blobs. A panic is caught and reported as an internal
//!    error, but user input must never cause one.
//! 4. Random ops seed `rng::Rng::from_option(init.random_seed())` in the factory.
//! 5. Test: unit tests next to the kernel, and `tests/test_ops_forward_golden.py` picks up every
//!    golden `ops/` case whose type now has a kernel.
//! 6. Errors name their kind (`crate::error`): `ShapeMismatch` (sizes or ranks that do not fit),
//!    `DtypeMismatch` (an element or blob type the op cannot take), `BadArgument` (an argument,
//!    or an input used as one, with an unusable value: an unknown mode, an index out of range),
//!    `Schema` (inputs or outputs that do not pair up, a forbidden in-place use),
//!    `NotImplemented`, `MissingBlob`, `Device`, `OutOfMemory` (a user-sized buffer that cannot
//!    be allocated), and `Runtime` for the rest (a failed read or write of a file). Keep
//!    Caffe2's wording: golden tests compare the messages.
//!
//! ```
//! use ferrocaffe::ops::operator::{FnOp, OpContext, OpInit, Operator};
//! use ferrocaffe::ops::registry::Registry;
//! use ferrocaffe::Result;
//!
//! /// `Y = alpha * X + beta` on floats.
//! fn create_affine(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
//!     let alpha = init.args.float("alpha", 1.0)?;
//!     let beta = init.args.float("beta", 0.0)?;
//!     Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
//!         let (ins, mut outs) = ctx.split();
//!         let x = ins.tensor(0)?;
//!         let dims = x.dims().to_vec();
//!         let y = outs.tensor(0)?.ensure::<f32>(&dims);
//!         for (o, v) in y.iter_mut().zip(x.as_slice::<f32>()?) {
//!             *o = alpha * v + beta;
//!         }
//!         Ok(())
//!     })))
//! }
//!
//! let mut r = Registry::new();
//! r.cpu("Affine", create_affine);
//! assert!(r.lookup("Affine", ferrocaffe::device::DeviceType::Cpu, "").is_some());
//!
//! // Running ops of the built-in registry from Rust:
//! use ferrocaffe::proto::OperatorDef;
//! use ferrocaffe::tensor::Tensor;
//! use ferrocaffe::workspace::Workspace;
//! let ws = Workspace::new();
//! ws.feed("x", Tensor::from_vec(&[2], vec![-1.0f32, 2.0])?);
//! ws.run_operator_once(&OperatorDef::new("Relu", ["x"], ["y"]))?;
//! assert_eq!(ws.fetch("y")?.as_slice::<f32>()?, &[0.0, 2.0]);
//! # Ok::<(), ferrocaffe::Error>(())
//! ```

pub mod activations;
pub mod activations_more;
pub mod arg_ops;
pub mod broadcast;
pub mod cast;
pub mod compare;
pub mod conv;
pub mod conv_args;
mod conv_direct;
pub mod conv_nd;
pub mod conv_transpose;
pub mod copy;
pub mod counters;
pub mod db;
pub mod depthwise;
pub mod dot_padding;
pub mod elementwise;
pub mod elementwise_linear;
pub mod elementwise_more;
pub mod fc;
pub mod fill;
pub mod fp16;
pub mod fused_rowwise;
pub mod group_norm;
pub mod im2col;
pub mod im2col_ops;
#[cfg(test)]
mod kernel_tests;
pub mod lars;
pub mod lengths_pad;
pub mod load_save;
pub mod losses_more;
pub mod math;
pub mod math_grad;
pub mod matmul;
pub mod minmax;
pub mod moments;
pub mod nn;
pub mod norm;
pub mod optim;
pub mod optim_more;
pub mod pad_image;
pub mod padding;
pub(crate) mod par;
pub mod pool;
mod pool_fwd;
#[cfg(target_arch = "x86_64")]
mod pool_planes;
pub mod queue;
pub mod reduce;
pub mod reduce_front_back;
pub mod resize;
pub mod rng;
pub mod rnn_units;
pub mod roi_pool;
pub mod rowwise_optim;
pub mod segment;
pub mod sequence_mask;
pub mod shape;
pub mod sigmoid_xent;
pub mod sparse;
pub mod sparse_optim;
mod sums;
pub mod two_class;
pub mod unary_grad;
pub mod utility;
pub(crate) mod winograd;

use super::registry::Registry;

/// Registers every CPU kernel family.
pub fn register_all(r: &mut Registry) {
    fill::register(r);
    copy::register(r);
    math::register(r);
    math_grad::register(r);
    counters::register(r);
    compare::register(r);
    fc::register(r);
    activations::register(r);
    minmax::register(r);
    reduce::register(r);
    matmul::register(r);
    cast::register(r);
    nn::register(r);
    optim::register(r);
    shape::register(r);
    conv::register(r);
    pool::register(r);
    norm::register(r);
    sparse::register(r);
    conv_transpose::register(r);
    resize::register(r);
    rnn_units::register(r);
    load_save::register(r);
    queue::register(r);
    elementwise_linear::register(r);
    sigmoid_xent::register(r);
    sparse_optim::register(r);
    arg_ops::register(r);
    fp16::register(r);
    group_norm::register(r);
    lars::register(r);
    moments::register(r);
    pad_image::register(r);
    rowwise_optim::register(r);
    unary_grad::register(r);
    sequence_mask::register(r);
    two_class::register(r);
    reduce_front_back::register(r);
    segment::register(r);
    fused_rowwise::register(r);
    utility::register(r);
    optim_more::register(r);
    activations_more::register(r);
    elementwise_more::register(r);
    losses_more::register(r);
    padding::register(r);
    lengths_pad::register(r);
    dot_padding::register(r);
    im2col_ops::register(r);
    roi_pool::register(r);
}
