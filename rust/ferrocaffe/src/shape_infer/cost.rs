//! Operator cost estimates (Caffe2's `CostInferenceFunction`s): flops, bytes read and written,
//! and parameter bytes, from the input shapes.

use super::{dtype, infer_op, size_from, size_to, BlobShape};
use crate::error::{Error, Result};
use crate::ops::args::Args;
use crate::proto::OperatorDef;

/// The estimated cost of running one op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes of inputs read.
    pub bytes_read: u64,
    /// Bytes of outputs written.
    pub bytes_written: u64,
    /// Bytes of parameters (weights) read.
    pub params_bytes: u64,
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn first<'a>(op: &OperatorDef, ins: &'a [BlobShape]) -> Result<&'a BlobShape> {
    ins.first()
        .ok_or_else(|| Error::Runtime(format!("{} needs at least 1 input", op.r#type())))
}

/// Element-wise: `per_point` flops per element of input 0; every input read, input 0's size
/// written, all in input 0's element size.
fn pointwise(op: &OperatorDef, ins: &[BlobShape], per_point: u64) -> Result<Cost> {
    let x = first(op, ins)?;
    let size = dtype::item_size(x.dtype);
    let read: u64 = ins.iter().map(BlobShape::numel).sum();
    Ok(Cost {
        flops: x.numel().saturating_mul(per_point),
        bytes_read: read.saturating_mul(size),
        bytes_written: x.numel().saturating_mul(size),
        params_bytes: 0,
    })
}

/// Inputs read and outputs written as they are (pure data movement).
fn movement(op: &OperatorDef, ins: &[BlobShape]) -> Result<Cost> {
    let out = infer_op(op, ins)?;
    Ok(Cost {
        flops: 0,
        bytes_read: ins.iter().map(BlobShape::nbytes).sum(),
        bytes_written: out.iter().map(BlobShape::nbytes).sum(),
        params_bytes: 0,
    })
}

fn split(op: &OperatorDef, ins: &[BlobShape]) -> Result<Cost> {
    let x = first(op, ins)?;
    Ok(Cost {
        flops: 0,
        bytes_read: ins.iter().take(2).map(BlobShape::nbytes).sum(),
        bytes_written: x.nbytes(),
        params_bytes: 0,
    })
}

fn fc(op: &OperatorDef, ins: &[BlobShape], transposed: bool) -> Result<Cost> {
    let (Some(x), Some(w)) = (ins.first(), ins.get(1)) else {
        return Err(Error::Runtime("FC needs X and W".into()));
    };
    let args = Args::new(op);
    let canon = |a: i64, n: usize| -> Result<usize> {
        let n = n as i64;
        if !(-n..n).contains(&a) {
            return Err(Error::Runtime(format!("axis {a} out of range")));
        }
        Ok(if a < 0 { a + n } else { a } as usize)
    };
    let axis = canon(args.int("axis", 1)?, x.dims.len())?;
    let axis_w = canon(args.int("axis_w", 1)?, w.dims.len())?;
    let m = u(size_to(&x.dims, axis));
    let k = u(size_from(&x.dims, axis));
    let n = u(if transposed {
        size_from(&w.dims, axis_w)
    } else {
        size_to(&w.dims, axis_w)
    });
    let size = dtype::item_size(x.dtype);
    Ok(Cost {
        flops: m
            .saturating_mul(n)
            .saturating_mul(k.saturating_mul(2).saturating_add(1)),
        bytes_read: k
            .saturating_mul(m.saturating_add(n))
            .saturating_add(n)
            .saturating_mul(size),
        bytes_written: m.saturating_mul(n).saturating_mul(size),
        params_bytes: k.saturating_mul(n).saturating_add(n).saturating_mul(size),
    })
}

fn conv(op: &OperatorDef, ins: &[BlobShape]) -> Result<Cost> {
    let (Some(x), Some(w)) = (ins.first(), ins.get(1)) else {
        return Err(Error::Runtime("Conv needs X and filter".into()));
    };
    if x.dims.is_empty() || w.dims.is_empty() {
        return Ok(Cost::default());
    }
    let y = infer_op(op, ins)?
        .into_iter()
        .next()
        .filter(|y| !y.unknown)
        .ok_or_else(|| Error::Runtime("Conv output shape unknown".into()))?;
    let nhwc = Args::new(op).string("order", "NCHW")? == "NHWC";
    // Output spatial dims, kernel dims, input channels per group, output channels.
    let nsp = x.dims.len().saturating_sub(2);
    let (ysp, ksp, cin) = if nhwc {
        (
            y.dims.get(1..1 + nsp),
            w.dims.get(1..1 + nsp),
            w.dims.get(1 + nsp),
        )
    } else {
        (y.dims.get(2..), w.dims.get(2..), w.dims.get(1))
    };
    let (Some(ysp), Some(ksp), Some(&cin)) = (ysp, ksp, cin) else {
        return Err(Error::Runtime("Conv filter does not match input".into()));
    };
    let prod = |v: &[i64]| v.iter().fold(1u64, |a, &d| a.saturating_mul(u(d)));
    let flops = u(x.dims[0])
        .saturating_mul(prod(ysp))
        .saturating_mul(prod(ksp))
        .saturating_mul(u(cin))
        .saturating_mul(u(w.dims[0]))
        .saturating_mul(2);
    let xs = dtype::item_size(x.dtype);
    let bias = ins.get(2).map_or(0, BlobShape::numel);
    Ok(Cost {
        flops,
        bytes_read: x
            .numel()
            .saturating_add(w.numel())
            .saturating_add(bias)
            .saturating_mul(xs),
        // Caffe2 counted the output as float, whatever the input type.
        bytes_written: u(x.dims[0])
            .saturating_mul(u(w.dims[0]))
            .saturating_mul(prod(ysp))
            .saturating_mul(4),
        params_bytes: w.nbytes(),
    })
}

/// The cost of `op` over its input shapes. An op type without a cost function is an error
/// (Caffe2: "Cost inference function not defined").
pub fn operator_cost(op: &OperatorDef, ins: &[BlobShape]) -> Result<Cost> {
    match op.r#type() {
        "Split" | "DepthSplit" => split(op, ins),
        "Concat" | "DepthConcat" => movement(op, ins),
        "FC" => fc(op, ins, false),
        "FCTransposed" => fc(op, ins, true),
        "Conv" | "Conv1D" | "Conv2D" | "Conv3D" => conv(op, ins),
        "Relu" => pointwise(op, ins, 0),
        "Add" | "Sub" | "Mul" | "Div" | "Sigmoid" | "Tanh" => pointwise(op, ins, 1),
        "Sum" => {
            let mut c = pointwise(op, ins, 1)?;
            c.flops = c.flops.saturating_mul(ins.len().saturating_sub(1) as u64);
            Ok(c)
        }
        t => Err(Error::Runtime(format!(
            "Cost inference function not defined for operator type {t}"
        ))),
    }
}
