//! Static shape and type inference over nets, and operator cost estimates (Caffe2's
//! `InferBlobShapesAndTypes` and `OpSchema::InferCost`).
//!
//! A blob is described by a [`BlobShape`]: dims, a `TensorProto.DataType` number, and whether
//! the shape is unknown. [`infer`] walks the ops of each net in order and applies the rule of
//! each op type (one file per op family); an op type without a rule, or a rule whose inputs are
//! unknown, leaves its outputs unknown. Gradient ops whose outputs stay unknown take the shape
//! of the blob their `_grad` output is named after, as Caffe2 did. A rule that finds its
//! arguments or inputs inconsistent makes the whole inference return nothing (Caffe2 logged the
//! failure and returned empty results); it never raises.

mod cost;
mod elementwise;
mod fill;
mod nn;
mod tensor_ops;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::ops::args::Args;
use crate::proto::{NetDef, OperatorDef};
use crate::workspace::{Blob, Workspace};

pub use cost::{operator_cost, Cost};

/// `TensorProto.DataType` numbers used by the rules.
pub mod dtype {
    /// `UNDEFINED`.
    pub const UNDEFINED: i32 = 0;
    /// `FLOAT`.
    pub const FLOAT: i32 = 1;
    /// `INT32`.
    pub const INT32: i32 = 2;
    /// `BYTE`.
    pub const BYTE: i32 = 3;
    /// `STRING`.
    pub const STRING: i32 = 4;
    /// `BOOL`.
    pub const BOOL: i32 = 5;
    /// `UINT8`.
    pub const UINT8: i32 = 6;
    /// `INT8`.
    pub const INT8: i32 = 7;
    /// `UINT16`.
    pub const UINT16: i32 = 8;
    /// `INT16`.
    pub const INT16: i32 = 9;
    /// `INT64`.
    pub const INT64: i32 = 10;
    /// `FLOAT16`.
    pub const FLOAT16: i32 = 12;
    /// `DOUBLE`.
    pub const DOUBLE: i32 = 13;

    /// Bytes per element of a type (0 for undefined and strings, as Caffe2's type metadata
    /// gave for types without a fixed size... strings count as one pointer-sized handle).
    pub fn item_size(t: i32) -> u64 {
        match t {
            FLOAT | INT32 => 4,
            BYTE | BOOL | UINT8 | INT8 => 1,
            UINT16 | INT16 | FLOAT16 => 2,
            INT64 | DOUBLE => 8,
            STRING => 32,
            _ => 0,
        }
    }
}

/// What inference knows about one blob (Caffe2's `TensorShape`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobShape {
    /// The dims (empty for a scalar or an unknown shape).
    pub dims: Vec<i64>,
    /// `TensorProto.DataType` number (FLOAT unless a rule says otherwise, as in Caffe2).
    pub dtype: i32,
    /// The shape is not known.
    pub unknown: bool,
}

impl BlobShape {
    /// A known shape.
    pub fn new(dims: Vec<i64>, dtype: i32) -> Self {
        BlobShape {
            dims,
            dtype,
            unknown: false,
        }
    }

    /// An unknown shape.
    pub fn unknown() -> Self {
        BlobShape {
            dims: Vec::new(),
            dtype: dtype::FLOAT,
            unknown: true,
        }
    }

    /// Number of elements (saturating; 0 for an unknown shape).
    pub fn numel(&self) -> u64 {
        if self.unknown {
            return 0;
        }
        self.dims.iter().fold(1u64, |acc, &d| {
            acc.saturating_mul(u64::try_from(d).unwrap_or(0))
        })
    }

    /// Bytes of the elements.
    pub fn nbytes(&self) -> u64 {
        self.numel().saturating_mul(dtype::item_size(self.dtype))
    }
}

/// Why a rule gave no shapes.
pub(crate) enum Stop {
    /// An input it needs is unknown: every output is unknown.
    Unknown,
    /// The op is inconsistent (Caffe2's enforce failed): inference returns nothing.
    Fail(String),
}

pub(crate) type Out = std::result::Result<Vec<BlobShape>, Stop>;

/// An inference rule of an op type.
pub(crate) type Rule = fn(&Ctx<'_>) -> Out;

/// What a rule sees: the op, its arguments and its input shapes.
pub(crate) struct Ctx<'a> {
    pub op: &'a OperatorDef,
    pub args: Args<'a>,
    pub ins: &'a [BlobShape],
}

impl<'a> Ctx<'a> {
    fn new(op: &'a OperatorDef, ins: &'a [BlobShape]) -> Self {
        Ctx {
            op,
            args: Args::new(op),
            ins,
        }
    }

    /// Known input `i` (unknown -> every output unknown; missing -> failure).
    pub fn input(&self, i: usize) -> std::result::Result<&'a BlobShape, Stop> {
        match self.ins.get(i) {
            Some(s) if !s.unknown => Ok(s),
            Some(_) => Err(Stop::Unknown),
            None => Err(self.fail(format!("expected input {i}"))),
        }
    }

    pub fn n_in(&self) -> usize {
        self.ins.len()
    }

    pub fn n_out(&self) -> usize {
        self.op.output.len()
    }

    pub fn fail(&self, msg: impl std::fmt::Display) -> Stop {
        Stop::Fail(format!("{} ({}): {msg}", self.op.r#type(), self.op.name()))
    }

    pub fn int(&self, name: &str, default: i64) -> std::result::Result<i64, Stop> {
        self.args
            .int(name, default)
            .map_err(|e| Stop::Fail(e.to_string()))
    }

    pub fn flag(&self, name: &str) -> std::result::Result<bool, Stop> {
        Ok(self.int(name, 0)? != 0)
    }

    pub fn string(&self, name: &str, default: &str) -> std::result::Result<String, Stop> {
        self.args
            .string(name, default)
            .map_err(|e| Stop::Fail(e.to_string()))
    }

    pub fn ints(&self, name: &str) -> Vec<i64> {
        self.args.ints(name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.args.has(name)
    }

    /// Whether `order` is NHWC (anything but NCHW/NHWC fails).
    pub fn nhwc(&self) -> std::result::Result<bool, Stop> {
        match self.string("order", "NCHW")?.as_str() {
            "NCHW" => Ok(false),
            "NHWC" => Ok(true),
            o => Err(self.fail(format!("unknown storage order {o}"))),
        }
    }

    /// `axis` normalised against `ndim` (negative counts from the end).
    pub fn canonical_axis(&self, axis: i64, ndim: usize) -> std::result::Result<usize, Stop> {
        let n = ndim as i64;
        if !(-n..n).contains(&axis) {
            return Err(self.fail(format!("axis {axis} out of range for {ndim} dims")));
        }
        Ok(if axis < 0 { axis + n } else { axis } as usize)
    }
}

/// Product of `dims[..k]` (saturating).
pub(crate) fn size_to(dims: &[i64], k: usize) -> i64 {
    dims[..k.min(dims.len())]
        .iter()
        .fold(1i64, |a, &d| a.saturating_mul(d))
}

/// Product of `dims[k..]` (saturating).
pub(crate) fn size_from(dims: &[i64], k: usize) -> i64 {
    dims[k.min(dims.len())..]
        .iter()
        .fold(1i64, |a, &d| a.saturating_mul(d))
}

/// The rule of `op_type`, if it has one.
fn rule(op_type: &str) -> Option<Rule> {
    elementwise::lookup(op_type)
        .or_else(|| nn::lookup(op_type))
        .or_else(|| tensor_ops::lookup(op_type))
        .or_else(|| fill::lookup(op_type))
}

/// Whether `op_type` has an inference rule.
pub fn has_rule(op_type: &str) -> bool {
    rule(op_type).is_some()
}

/// The output shapes of one op from its input shapes: `Ok(None)` when the op cannot be
/// inferred at all (all outputs unknown), `Err` when the op is inconsistent.
pub fn infer_op(op: &OperatorDef, ins: &[BlobShape]) -> Result<Vec<BlobShape>> {
    let unknown = || vec![BlobShape::unknown(); op.output.len()];
    let Some(f) = rule(op.r#type()) else {
        return Ok(unknown());
    };
    match f(&Ctx::new(op, ins)) {
        Ok(mut v) => {
            v.resize(op.output.len(), BlobShape::unknown());
            Ok(v)
        }
        Err(Stop::Unknown) => Ok(unknown()),
        Err(Stop::Fail(msg)) => Err(Error::Runtime(format!("Shape inference error: {msg}"))),
    }
}

/// The blob a gradient output named `<x>_grad` is the gradient of.
fn grad_param(name: &str) -> Option<&str> {
    name.strip_suffix("_grad").filter(|p| !p.is_empty())
}

/// Infers the shapes and types of every blob the nets produce, starting from `known`, and
/// returns every blob's description (unknown ones included, as Caffe2's `TensorShapes`).
/// An inconsistent op makes the result empty, as in Caffe2.
pub fn infer(nets: &[NetDef], known: BTreeMap<String, BlobShape>) -> BTreeMap<String, BlobShape> {
    let mut desc = known;
    for net in nets {
        // Old-shape output of each forward Reshape -> the shape its input had.
        let mut reshape_cache: BTreeMap<String, BlobShape> = BTreeMap::new();
        for op in &net.op {
            let is_grad = op.is_gradient_op();
            if op.r#type() == "Reshape" && is_grad && op.input.len() == 2 {
                if let Some(cached) = reshape_cache.get(&op.input[1]).cloned() {
                    let rank = cached.dims.len() as i64;
                    if let Some(o) = op.output.first() {
                        desc.insert(o.clone(), cached);
                    }
                    if let Some(o) = op.output.get(1) {
                        desc.insert(o.clone(), BlobShape::new(vec![rank], dtype::INT64));
                    }
                    continue;
                }
            }
            let ins: Vec<BlobShape> = op
                .input
                .iter()
                .map(|n| desc.get(n).cloned().unwrap_or_else(BlobShape::unknown))
                .collect();
            let Ok(mut out) = infer_op(op, &ins) else {
                return BTreeMap::new();
            };
            if is_grad {
                for (o, name) in out.iter_mut().zip(&op.output) {
                    if o.unknown {
                        if let Some(p) = grad_param(name).and_then(|p| desc.get(p)) {
                            *o = p.clone();
                        }
                    }
                }
            }
            if op.r#type() == "Reshape" && !is_grad && op.output.len() > 1 {
                if let Some(first) = ins.first() {
                    reshape_cache.insert(op.output[1].clone(), first.clone());
                }
            }
            for (name, o) in op.output.iter().zip(out) {
                desc.insert(name.clone(), o);
            }
        }
    }
    desc
}

/// The description of what a blob holds (a tensor's dims and type; anything else unknown).
pub fn describe_blob(blob: &Blob) -> BlobShape {
    match blob.tensor() {
        Some(t) => BlobShape::new(
            t.dims().iter().map(|&d| d as i64).collect(),
            t.dtype().to_proto(),
        ),
        None => BlobShape::unknown(),
    }
}

/// The descriptions of every blob visible in `ws`.
pub fn workspace_shapes(ws: &Workspace) -> BTreeMap<String, BlobShape> {
    ws.blob_names()
        .into_iter()
        .filter_map(|n| {
            let h = ws.get_blob(&n)?;
            let d = describe_blob(&h.read());
            Some((n, d))
        })
        .collect()
}

#[cfg(test)]
mod tests;
