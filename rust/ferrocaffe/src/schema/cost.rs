//! Caffe2's cost estimates of an operator (`workspace.GetOperatorCost`): floating-point
//! operations and bytes read and written, from the op's arguments and its inputs' shapes.
//! Caffe2 declared a cost function for a few op types; those of the convolution family are
//! here (`Conv`, `Conv1D`, `Conv2D`, `Conv3D`), with Caffe2's formula (groups not counted).

use crate::bail;
use crate::error::Result;
use crate::proto::OperatorDef;

/// What an op costs (Caffe2's `OpSchema::Cost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes of the outputs.
    pub bytes_written: u64,
    /// Bytes of the inputs.
    pub bytes_read: u64,
}

/// The shape of an input: its dims and the byte size of its elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputShape {
    /// Dimensions.
    pub dims: Vec<u64>,
    /// Bytes per element.
    pub item_size: u64,
}

/// The cost of `def` over inputs of these shapes; an op type without a cost function, or
/// inputs that do not fit it, is an error naming the op.
pub fn op_cost(def: &OperatorDef, inputs: &[InputShape]) -> Result<Cost> {
    match def.r#type() {
        "Conv" | "Conv1D" | "Conv2D" | "Conv3D" => conv_cost(def, inputs),
        other => bail!(Runtime: "operator type {other} has no cost inference function"),
    }
}

fn arg_int(def: &OperatorDef, name: &str) -> Option<i64> {
    def.arg.iter().find(|a| a.name() == name).and_then(|a| a.i)
}

fn arg_ints(def: &OperatorDef, name: &str) -> Option<Vec<i64>> {
    def.arg
        .iter()
        .find(|a| a.name() == name)
        .map(|a| a.ints.clone())
}

fn arg_str(def: &OperatorDef, name: &str) -> Option<String> {
    def.arg
        .iter()
        .find(|a| a.name() == name)
        .and_then(|a| a.s.as_ref())
        .map(|s| String::from_utf8_lossy(s).into_owned())
}

/// One value per spatial dim from `single` (all dims), `list`, or the `per_dim` names (h, w,
/// ...), else `default`.
fn per_dim(
    def: &OperatorDef,
    single: &str,
    list: &str,
    per_dim: &[&str],
    n: usize,
    default: Option<&[u64]>,
) -> Result<Vec<u64>> {
    let checked = |v: i64| -> Result<u64> {
        u64::try_from(v).map_err(
            |_| crate::err!(BadArgument: "argument {single} of {} is negative", def.r#type()),
        )
    };
    if let Some(v) = arg_int(def, single) {
        return Ok(vec![checked(v)?; n]);
    }
    if let Some(vs) = arg_ints(def, list).filter(|v| !v.is_empty()) {
        return vs.into_iter().take(n).map(checked).collect();
    }
    if per_dim.len() >= n && per_dim[..n].iter().any(|p| arg_int(def, p).is_some()) {
        return per_dim[..n]
            .iter()
            .map(|p| checked(arg_int(def, p).unwrap_or(1)))
            .collect();
    }
    match default {
        Some(d) => Ok(d.to_vec()),
        None => Ok(vec![1; n]),
    }
}

fn conv_cost(def: &OperatorDef, inputs: &[InputShape]) -> Result<Cost> {
    let (Some(x), Some(w)) = (inputs.first(), inputs.get(1)) else {
        bail!(Schema: "{} requires at least 2 inputs for its cost", def.r#type());
    };
    if x.dims.is_empty() || w.dims.is_empty() {
        return Ok(Cost::default());
    }
    let nhwc = arg_str(def, "order").as_deref() == Some("NHWC");
    let spatial = x.dims.len().saturating_sub(2);
    if !(1..=3).contains(&spatial) || w.dims.len() != x.dims.len() {
        bail!(
            ShapeMismatch: "{}: input of {} dims and filter of {} dims do not make a 1-3D \
             convolution",
            def.r#type(),
            x.dims.len(),
            w.dims.len()
        );
    }
    let (x_sp, w_sp, in_channels) = if nhwc {
        (
            &x.dims[1..=spatial],
            &w.dims[1..=spatial],
            w.dims[spatial + 1],
        )
    } else {
        (&x.dims[2..], &w.dims[2..], w.dims[1])
    };
    let kernel = per_dim(
        def,
        "kernel",
        "kernels",
        &["kernel_h", "kernel_w"],
        spatial,
        Some(w_sp),
    )?;
    let stride = per_dim(
        def,
        "stride",
        "strides",
        &["stride_h", "stride_w"],
        spatial,
        None,
    )?;
    let dilation = per_dim(
        def,
        "dilation",
        "dilations",
        &["dilation_h", "dilation_w"],
        spatial,
        None,
    )?;
    let pad_begin = per_dim(
        def,
        "pad",
        "pads",
        &["pad_t", "pad_l"],
        spatial,
        Some(&vec![0; spatial]),
    )?;
    let pad_end = match arg_ints(def, "pads").filter(|p| p.len() >= 2 * spatial) {
        Some(p) => p[spatial..2 * spatial]
            .iter()
            .map(|&v| u64::try_from(v).unwrap_or(0))
            .collect(),
        None => per_dim(
            def,
            "pad",
            "",
            &["pad_b", "pad_r"],
            spatial,
            Some(&vec![0; spatial]),
        )?,
    };
    let mut out = Vec::with_capacity(spatial);
    for i in 0..spatial {
        let span = dilation[i]
            .saturating_mul(kernel[i].saturating_sub(1))
            .saturating_add(1);
        let padded = x_sp[i]
            .saturating_add(pad_begin[i])
            .saturating_add(pad_end[i]);
        if stride[i] == 0 || padded < span {
            bail!(
                ShapeMismatch: "{}: a kernel of {} (dilated) does not fit an input of {} \
                 (padded) in spatial dim {i}",
                def.r#type(),
                span,
                padded
            );
        }
        out.push((padded - span) / stride[i] + 1);
    }
    let product = |v: &[u64]| v.iter().fold(1u64, |a, &b| a.saturating_mul(b));
    let n = x.dims[0];
    let out_channels = w.dims[0];
    let y = product(&out);
    let k = product(&kernel[..]);
    let bias = inputs.get(2).map_or(0, |b| product(&b.dims));
    Ok(Cost {
        flops: product(&[n, y, k, in_channels, out_channels, 2]),
        bytes_read: product(&x.dims)
            .saturating_add(product(&w.dims))
            .saturating_add(bias)
            .saturating_mul(x.item_size),
        // Caffe2 inferred a float output.
        bytes_written: product(&[n, out_channels, y, 4]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Argument;

    fn shape(dims: &[u64], item_size: u64) -> InputShape {
        InputShape {
            dims: dims.to_vec(),
            item_size,
        }
    }

    #[test]
    fn conv_cost_follows_caffe2s_formula() {
        let mut op = OperatorDef::new("Conv2D", ["X", "W"], ["Y"]);
        for (k, v) in [("stride_h", 1), ("stride_w", 1), ("pad_t", 1), ("pad_l", 1)] {
            op.arg.push(Argument::int(k, v));
        }
        for (k, v) in [("pad_b", 1), ("pad_r", 1), ("kernel", 3)] {
            op.arg.push(Argument::int(k, v));
        }
        let c = op_cost(&op, &[shape(&[1, 8, 8, 8], 8), shape(&[1, 1, 3, 3], 8)]).unwrap();
        assert_eq!(
            c,
            Cost {
                flops: 1152,
                bytes_written: 256,
                bytes_read: 4168
            }
        );
        // Without padding the output is 6x6; a bias is read too.
        let mut op = OperatorDef::new("Conv", ["X", "W", "b"], ["Y"]);
        op.arg.push(Argument::int("kernel", 3));
        let c = op_cost(
            &op,
            &[
                shape(&[2, 3, 8, 8], 4),
                shape(&[5, 3, 3, 3], 4),
                shape(&[5], 4),
            ],
        )
        .unwrap();
        assert_eq!(c.flops, 2 * 36 * 9 * 3 * 5 * 2);
        assert_eq!(c.bytes_written, 2 * 5 * 36 * 4);
        assert_eq!(c.bytes_read, (384 + 135 + 5) * 4);
    }

    #[test]
    fn types_without_a_cost_function_and_misfit_inputs_are_errors() {
        let op = OperatorDef::new("Relu", ["X"], ["Y"]);
        assert!(op_cost(&op, &[shape(&[2], 4)]).is_err());
        let mut op = OperatorDef::new("Conv", ["X", "W"], ["Y"]);
        op.arg.push(Argument::int("kernel", 9));
        let e = op_cost(&op, &[shape(&[1, 1, 4, 4], 4), shape(&[1, 1, 9, 9], 4)]).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
    }
}
