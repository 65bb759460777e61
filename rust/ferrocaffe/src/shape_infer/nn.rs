//! Network layers: FC, convolutions and pooling (both orders, pads, strides, dilations,
//! legacy padding), batch norm, dropout, softmax losses, distances, matrix products and the
//! row-wise quantization conversions.

use super::{dtype, size_from, size_to, BlobShape, Ctx, Out, Rule, Stop};

pub(super) fn lookup(t: &str) -> Option<Rule> {
    Some(match t {
        "FC" => |c: &Ctx<'_>| fc(c, false),
        "FCTransposed" => |c: &Ctx<'_>| fc(c, true),
        "FCGradient" => fc_gradient,
        "Conv" | "Conv1D" | "Conv2D" | "Conv3D" => |c: &Ctx<'_>| conv_pool(c, Kind::Conv),
        "ConvTranspose" => conv_transpose,
        "MaxPool" | "MaxPool1D" | "MaxPool2D" | "MaxPool3D" | "AveragePool" | "AveragePool1D"
        | "AveragePool2D" | "AveragePool3D" | "LpPool" => |c: &Ctx<'_>| conv_pool(c, Kind::Pool),
        "MaxPoolWithIndex" => max_pool_with_index,
        "Im2Col" => im2col,
        "PadImage" => pad_image,
        "SpatialBN" => spatial_bn,
        "Dropout" => dropout,
        "SoftmaxWithLoss" => softmax_with_loss,
        "SpatialSoftmaxWithLoss" => spatial_softmax_with_loss,
        "LabelCrossEntropy" | "CrossEntropy" => label_cross_entropy,
        "SigmoidCrossEntropyWithLogits" => sigmoid_xent,
        "AveragedLoss" => |_: &Ctx<'_>| Ok(vec![BlobShape::new(vec![], dtype::FLOAT)]),
        "SquaredL2Distance"
        | "L1Distance"
        | "DotProduct"
        | "CosineSimilarity"
        | "DotProductWithPadding" => distance,
        "MatMul" => matmul,
        "RoIPool" => roi_pool,
        "MakeTwoClass" => make_two_class,
        "LearningRate" => learning_rate,
        "FloatToFused8BitRowwiseQuantized" => |c: &Ctx<'_>| rowwise(c, 8, dtype::UINT8),
        "HalfFloatToFused8BitRowwiseQuantized" => |c: &Ctx<'_>| rowwise(c, 8, dtype::UINT8),
        "FloatToFused8BitRowwiseQuantizedHalfScaleBias"
        | "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias" => {
            |c: &Ctx<'_>| rowwise(c, 4, dtype::UINT8)
        }
        "Fused8BitRowwiseQuantizedToFloat" => |c: &Ctx<'_>| rowwise(c, -8, dtype::FLOAT),
        "Fused8BitRowwiseQuantizedToHalfFloat" => |c: &Ctx<'_>| rowwise(c, -8, dtype::FLOAT16),
        "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat" => {
            |c: &Ctx<'_>| rowwise(c, -4, dtype::FLOAT)
        }
        "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat" => {
            |c: &Ctx<'_>| rowwise(c, -4, dtype::FLOAT16)
        }
        _ => return None,
    })
}

fn fc(c: &Ctx<'_>, transposed: bool) -> Out {
    let x = c.input(0)?;
    let w = c.input(1)?;
    let axis = c.canonical_axis(c.int("axis", 1)?, x.dims.len())?;
    let axis_w = c.canonical_axis(c.int("axis_w", 1)?, w.dims.len())?;
    let n = if transposed {
        size_from(&w.dims, axis_w)
    } else {
        size_to(&w.dims, axis_w)
    };
    let mut dims = x.dims[..axis].to_vec();
    dims.push(n);
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn fc_gradient(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let w = c.input(1)?;
    let axis_w = c.canonical_axis(c.int("axis_w", 1)?, w.dims.len())?;
    let n = size_to(&w.dims, axis_w);
    let mut out = vec![w.clone(), BlobShape::new(vec![n], w.dtype)];
    if c.n_out() > 2 {
        out.push(x.clone());
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Conv,
    Pool,
}

/// Per-spatial-dim values of an argument family: `name` for all, `name_h`/`name_w`, or the
/// list `names`, else `default`.
fn per_dim(c: &Ctx<'_>, name: &str, n: usize, default: i64) -> Result<Vec<i64>, Stop> {
    if c.has(name) {
        return Ok(vec![c.int(name, default)?; n]);
    }
    if n == 2 && (c.has(&format!("{name}_h")) || c.has(&format!("{name}_w"))) {
        return Ok(vec![
            c.int(&format!("{name}_h"), default)?,
            c.int(&format!("{name}_w"), default)?,
        ]);
    }
    let list = c.ints(&format!("{name}s"));
    if !list.is_empty() {
        if list.len() != n {
            return Err(c.fail(format!("{name}s has {} values for {n} dims", list.len())));
        }
        return Ok(list);
    }
    Ok(vec![default; n])
}

/// Head and tail pads per spatial dim.
fn pads(c: &Ctx<'_>, n: usize) -> Result<(Vec<i64>, Vec<i64>), Stop> {
    if c.has("pad") {
        let p = c.int("pad", 0)?;
        return Ok((vec![p; n], vec![p; n]));
    }
    if n == 2
        && ["pad_t", "pad_l", "pad_b", "pad_r"]
            .iter()
            .any(|a| c.has(a))
    {
        return Ok((
            vec![c.int("pad_t", 0)?, c.int("pad_l", 0)?],
            vec![c.int("pad_b", 0)?, c.int("pad_r", 0)?],
        ));
    }
    let list = c.ints("pads");
    if !list.is_empty() {
        if list.len() != 2 * n {
            return Err(c.fail(format!("pads has {} values for {n} dims", list.len())));
        }
        return Ok((list[..n].to_vec(), list[n..].to_vec()));
    }
    Ok((vec![0; n], vec![0; n]))
}

/// Caffe2's legacy padding modes.
const LEGACY_VALID: i64 = 1;
const LEGACY_SAME: i64 = 2;
const LEGACY_CAFFE_POOLING: i64 = 3;

/// Output size of one spatial dim.
#[allow(clippy::too_many_arguments)]
fn out_size(
    c: &Ctx<'_>,
    legacy: i64,
    input: i64,
    kernel: i64,
    stride: i64,
    dilation: i64,
    head: i64,
    tail: i64,
) -> Result<i64, Stop> {
    if stride <= 0 || kernel <= 0 || dilation <= 0 {
        return Err(c.fail("kernel, stride and dilation must be positive"));
    }
    let dk = dilation.saturating_mul(kernel - 1).saturating_add(1);
    Ok(match legacy {
        LEGACY_VALID => (input - dk + stride) / stride,
        LEGACY_SAME => (input + stride - 1) / stride,
        LEGACY_CAFFE_POOLING => {
            let mut o = ((input + 2 * head - kernel) as f64 / stride as f64 + 1.0).ceil() as i64;
            if head > 0 && (o - 1) * stride >= input + head {
                o -= 1;
            }
            o
        }
        _ => ((input + head + tail - dk) as f64 / stride as f64 + 1.0) as i64,
    })
}

/// Spatial output dims of a convolution or pooling over `spatial` input dims.
fn spatial_out(c: &Ctx<'_>, spatial: &[i64], kernel: &[i64]) -> Result<Vec<i64>, Stop> {
    let n = spatial.len();
    let strides = per_dim(c, "stride", n, 1)?;
    let dilations = per_dim(c, "dilation", n, 1)?;
    let (head, tail) = pads(c, n)?;
    let legacy = c.int("legacy_pad", 0)?;
    (0..n)
        .map(|i| {
            out_size(
                c,
                legacy,
                spatial[i],
                kernel[i],
                strides[i],
                dilations[i],
                head[i],
                tail[i],
            )
        })
        .collect()
}

/// (batch, channels, spatial dims) of an image input.
fn split_image(c: &Ctx<'_>, x: &BlobShape, nhwc: bool) -> Result<(i64, i64, Vec<i64>), Stop> {
    if x.dims.len() < 3 {
        return Err(c.fail(format!("input must have at least 3 dims, got {:?}", x.dims)));
    }
    let d = &x.dims;
    Ok(if nhwc {
        (d[0], d[d.len() - 1], d[1..d.len() - 1].to_vec())
    } else {
        (d[0], d[1], d[2..].to_vec())
    })
}

fn image(n: i64, ch: i64, spatial: Vec<i64>, nhwc: bool) -> Vec<i64> {
    let mut dims = vec![n];
    if nhwc {
        dims.extend(spatial);
        dims.push(ch);
    } else {
        dims.push(ch);
        dims.extend(spatial);
    }
    dims
}

fn kernel_of(
    c: &Ctx<'_>,
    spatial: &[i64],
    w: Option<&BlobShape>,
    nhwc: bool,
) -> Result<Vec<i64>, Stop> {
    let n = spatial.len();
    if c.flag("global_pooling")? {
        return Ok(spatial.to_vec());
    }
    let given =
        c.has("kernel") || c.has("kernel_h") || c.has("kernel_w") || !c.ints("kernels").is_empty();
    if !given {
        if let Some(w) = w {
            if w.dims.len() == n + 2 {
                return Ok(if nhwc {
                    w.dims[1..=n].to_vec()
                } else {
                    w.dims[2..].to_vec()
                });
            }
        }
        return Err(c.fail("no kernel size given"));
    }
    per_dim(c, "kernel", n, 0)
}

fn conv_pool(c: &Ctx<'_>, kind: Kind) -> Out {
    let x = c.input(0)?;
    let nhwc = c.nhwc()?;
    let (n, ch, spatial) = split_image(c, x, nhwc)?;
    let (w, out_ch) = if kind == Kind::Conv {
        let w = c.input(1)?;
        let m = *w.dims.first().ok_or_else(|| c.fail("filter has no dims"))?;
        (Some(w), m)
    } else {
        (None, ch)
    };
    let kernel = kernel_of(c, &spatial, w, nhwc)?;
    let out = spatial_out(c, &spatial, &kernel)?;
    let dt = if kind == Kind::Conv {
        dtype::FLOAT
    } else {
        x.dtype
    };
    Ok(vec![BlobShape::new(image(n, out_ch, out, nhwc), dt)])
}

fn max_pool_with_index(c: &Ctx<'_>) -> Out {
    let mut v = conv_pool(c, Kind::Pool)?;
    let mask = BlobShape::new(v[0].dims.clone(), dtype::INT32);
    v.push(mask);
    Ok(v)
}

fn conv_transpose(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let w = c.input(1)?;
    let nhwc = c.nhwc()?;
    let (n, _, spatial) = split_image(c, x, nhwc)?;
    let k = spatial.len();
    if w.dims.len() != k + 2 {
        return Err(c.fail(format!("filter dims {:?} do not match the input", w.dims)));
    }
    let group = c.int("group", 1)?;
    let m = if nhwc { w.dims[k + 1] } else { w.dims[1] }.saturating_mul(group);
    let kernel = kernel_of(c, &spatial, Some(w), nhwc)?;
    let strides = per_dim(c, "stride", k, 1)?;
    let adjs = per_dim(c, "adj", k, 0)?;
    let (head, tail) = pads(c, k)?;
    let out = (0..k)
        .map(|i| (spatial[i] - 1) * strides[i] + kernel[i] + adjs[i] - head[i] - tail[i])
        .collect();
    Ok(vec![BlobShape::new(image(n, m, out, nhwc), x.dtype)])
}

fn im2col(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let nhwc = c.nhwc()?;
    let (n, ch, spatial) = split_image(c, x, nhwc)?;
    if spatial.len() != 2 {
        return Err(c.fail("Im2Col takes a 4-D input"));
    }
    let kernel = per_dim(c, "kernel", 2, 0)?;
    let out = spatial_out(c, &spatial, &kernel)?;
    let cols = ch.saturating_mul(kernel[0]).saturating_mul(kernel[1]);
    Ok(vec![BlobShape::new(image(n, cols, out, nhwc), x.dtype)])
}

fn pad_image(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let nhwc = c.nhwc()?;
    let (n, ch, spatial) = split_image(c, x, nhwc)?;
    let (head, tail) = pads(c, spatial.len())?;
    let out = (0..spatial.len())
        .map(|i| spatial[i] + head[i] + tail[i])
        .collect();
    Ok(vec![BlobShape::new(image(n, ch, out, nhwc), x.dtype)])
}

fn spatial_bn(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let nhwc = c.nhwc()?;
    let mut out = vec![x.clone()];
    if c.n_out() > 1 {
        let ch = if nhwc {
            x.dims.last().copied()
        } else {
            x.dims.get(1).copied()
        }
        .ok_or_else(|| c.fail("input has too few dims"))?;
        for _ in 1..c.n_out() {
            out.push(BlobShape::new(vec![ch], x.dtype));
        }
    }
    Ok(out)
}

fn dropout(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let mut out = vec![x.clone()];
    if c.n_out() > 1 && !c.flag("is_test")? {
        out.push(BlobShape::new(x.dims.clone(), dtype::BOOL));
    }
    Ok(out)
}

fn softmax_with_loss(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    // The probabilities have the logits' shape (what the kernel produces, whatever `axis`).
    c.canonical_axis(c.int("axis", 1)?, x.dims.len())?;
    Ok(vec![
        BlobShape::new(x.dims.clone(), x.dtype),
        BlobShape::new(vec![], dtype::FLOAT),
    ])
}

fn spatial_softmax_with_loss(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    if x.dims.len() != 4 {
        return Err(c.fail("logits must be 4-D"));
    }
    Ok(vec![
        BlobShape::new(x.dims.clone(), x.dtype),
        BlobShape::new(vec![], dtype::FLOAT),
    ])
}

fn label_cross_entropy(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let n = if x.dims.len() > 1 { x.dims[0] } else { 1 };
    Ok(vec![BlobShape::new(vec![n], x.dtype)])
}

fn sigmoid_xent(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let dims = x.dims[..x.dims.len().saturating_sub(1)].to_vec();
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn distance(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let n = x.dims.first().copied().unwrap_or(1);
    Ok(vec![BlobShape::new(vec![n], x.dtype)])
}

fn matmul(c: &Ctx<'_>) -> Out {
    let a = c.input(0)?;
    let b = c.input(1)?;
    let axis_a = c.canonical_axis(c.int("axis_a", 1)?, a.dims.len())?;
    let axis_b = c.canonical_axis(c.int("axis_b", 1)?, b.dims.len())?;
    let m = if c.flag("trans_a")? {
        size_from(&a.dims, axis_a)
    } else {
        size_to(&a.dims, axis_a)
    };
    let n = if c.flag("trans_b")? {
        size_to(&b.dims, axis_b)
    } else {
        size_from(&b.dims, axis_b)
    };
    Ok(vec![BlobShape::new(vec![m, n], a.dtype)])
}

fn roi_pool(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let r = c.input(1)?;
    let nhwc = c.nhwc()?;
    if x.dims.len() != 4 || r.dims.is_empty() {
        return Err(c.fail("RoIPool takes a 4-D input and 2-D rois"));
    }
    let ch = if nhwc { x.dims[3] } else { x.dims[1] };
    let y = BlobShape::new(
        vec![r.dims[0], ch, c.int("pooled_h", 1)?, c.int("pooled_w", 1)?],
        x.dtype,
    );
    let mut out = vec![y.clone()];
    if !c.flag("is_test")? {
        out.push(BlobShape::new(y.dims, dtype::INT32));
    }
    Ok(out)
}

fn make_two_class(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let mut dims = x.dims.clone();
    dims.push(2);
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn learning_rate(c: &Ctx<'_>) -> Out {
    let it = c.input(0)?;
    Ok(vec![BlobShape::new(it.dims.clone(), dtype::FLOAT)])
}

/// Row-wise quantization: the last dim grows (or shrinks) by `delta` bytes of scale and bias.
fn rowwise(c: &Ctx<'_>, delta: i64, t: i32) -> Out {
    let x = c.input(0)?;
    let mut dims = x.dims.clone();
    let last = dims
        .last_mut()
        .ok_or_else(|| c.fail("input must have at least 1 dim"))?;
    *last += delta;
    if *last < 0 {
        return Err(c.fail("input rows are too short"));
    }
    Ok(vec![BlobShape::new(dims, t)])
}
