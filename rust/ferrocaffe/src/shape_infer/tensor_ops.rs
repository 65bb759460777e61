//! Shape manipulation: concat/split, reshape, transpose, slice, tile, gather, flatten,
//! squeeze, layout changes, reductions, segment (lengths) reductions.

use super::{dtype, size_from, size_to, BlobShape, Ctx, Out, Rule, Stop};

pub(super) fn lookup(t: &str) -> Option<Rule> {
    Some(match t {
        "Concat" | "DepthConcat" => concat,
        "Split" | "DepthSplit" => split,
        "Reshape" => reshape,
        "Transpose" => transpose,
        "Slice" => slice,
        "Tile" => tile,
        "Gather" => gather,
        "Flatten" => flatten,
        "FlattenToVec" => |c: &Ctx<'_>| {
            let x = c.input(0)?;
            Ok(vec![BlobShape::new(vec![size_from(&x.dims, 0)], x.dtype)])
        },
        "Squeeze" => squeeze,
        "ExpandDims" => expand_dims,
        "NHWC2NCHW" => nhwc2nchw,
        "NCHW2NHWC" => nchw2nhwc,
        "ReduceFrontSum" | "ReduceFrontMean" | "ReduceFrontMax" => {
            |c: &Ctx<'_>| reduce_front_back(c, true)
        }
        "ReduceBackSum" | "ReduceBackMean" | "ReduceBackMax" => {
            |c: &Ctx<'_>| reduce_front_back(c, false)
        }
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" => reduce,
        "Unique" => unique,
        "LengthsSum" | "LengthsMean" | "LengthsMax" => |c: &Ctx<'_>| segments(c, 0, 1),
        "LengthsWeightedSum" => |c: &Ctx<'_>| segments(c, 0, 2),
        "SparseLengthsSum" | "SparseLengthsMean" | "SparseLengthsMax" => {
            |c: &Ctx<'_>| segments(c, 0, 2)
        }
        "SparseLengthsWeightedSum" => |c: &Ctx<'_>| segments(c, 0, 3),
        "LengthsPad" => lengths_pad,
        "Shape" => shape,
        // [B, M, N] -> [B, M] (row maxima) / [B, N] (column maxima).
        "RowwiseMax" | "ColwiseMax" => |c: &Ctx<'_>| {
            let x = c.input(0)?;
            if x.dims.len() != 3 {
                return Err(c.fail("the input must have 3 dimensions"));
            }
            let keep = if c.op.r#type() == "RowwiseMax" { 1 } else { 2 };
            Ok(vec![BlobShape::new(vec![x.dims[0], x.dims[keep]], x.dtype)])
        },
        // In place on the data (input 0).
        "ScatterAssign" | "ScatterWeightedSum" => super::elementwise::identical,
        // [N] lengths -> [N, 2] int32 (offset, length) pairs.
        "LengthsToRanges" => |c: &Ctx<'_>| {
            let l = c.input(0)?;
            let n = l.dims.first().copied().unwrap_or(1);
            Ok(vec![BlobShape::new(vec![n, 2], dtype::INT32)])
        },
        "ResizeLike" => |c: &Ctx<'_>| {
            let x = c.input(0)?;
            Ok(vec![BlobShape::new(c.input(1)?.dims.clone(), x.dtype)])
        },
        _ => return None,
    })
}

/// The concat/split axis: `axis`, else the channel axis of `order`.
fn concat_axis(c: &Ctx<'_>) -> Result<i64, Stop> {
    if c.has("axis") {
        return c.int("axis", -1);
    }
    Ok(if c.nhwc()? { 3 } else { 1 })
}

fn concat(c: &Ctx<'_>) -> Out {
    let ins = (0..c.n_in())
        .map(|i| c.input(i))
        .collect::<Result<Vec<_>, _>>()?;
    let first = ins.first().ok_or_else(|| c.fail("no inputs"))?;
    let add_axis = c.flag("add_axis")?;
    let ndim = first.dims.len() + usize::from(add_axis);
    let axis = c.canonical_axis(concat_axis(c)?, ndim)?;
    for x in &ins[1..] {
        if x.dtype != first.dtype {
            return Err(c.fail("all inputs must have the same type"));
        }
        if x.dims.len() != first.dims.len() {
            return Err(c.fail("all inputs must have the same rank"));
        }
    }
    let mut dims = first.dims.clone();
    if add_axis {
        if ins.iter().any(|x| x.dims != first.dims) {
            return Err(c.fail("all inputs must have the same shape with add_axis"));
        }
        dims.insert(axis, ins.len() as i64);
    } else {
        for x in &ins[1..] {
            for (j, (&a, &b)) in first.dims.iter().zip(&x.dims).enumerate() {
                if j != axis && a != b {
                    return Err(c.fail(format!(
                        "input dims {:?} and {:?} differ off the axis",
                        first.dims, x.dims
                    )));
                }
            }
            dims[axis] = dims[axis].saturating_add(x.dims[axis]);
        }
    }
    let mut out = vec![BlobShape::new(dims, first.dtype)];
    if c.n_out() > 1 {
        out.push(BlobShape::new(vec![ins.len() as i64], dtype::INT32));
    }
    Ok(out)
}

fn split(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let add_axis = c.flag("add_axis")?;
    let axis = c.canonical_axis(concat_axis(c)?, x.dims.len())?;
    let n = c.n_out();
    let mut sizes = c.ints("split");
    if c.n_in() > 1 && sizes.is_empty() {
        // The sizes are runtime data.
        return Err(Stop::Unknown);
    }
    if sizes.is_empty() {
        let total = x.dims[axis];
        if n == 0 || total % n as i64 != 0 {
            return Err(Stop::Unknown);
        }
        sizes = vec![total / n as i64; n];
    } else if sizes.len() != n {
        return Err(Stop::Unknown);
    }
    sizes
        .into_iter()
        .map(|s| {
            let mut dims = x.dims.clone();
            if add_axis {
                if s != 1 {
                    return Err(c.fail("with add_axis every split must be 1"));
                }
                dims.remove(axis);
            } else {
                dims[axis] = s;
            }
            Ok(BlobShape::new(dims, x.dtype))
        })
        .collect()
}

fn reshape(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let old = BlobShape::new(vec![x.dims.len() as i64], dtype::INT64);
    if !c.has("shape") {
        if c.n_in() != 2 {
            return Err(c.fail("the new shape must be given by an input or `shape`"));
        }
        return Ok(vec![BlobShape::unknown(), old]);
    }
    if c.n_in() != 1 {
        return Err(c.fail("the new shape must not be given both by an input and `shape`"));
    }
    let mut shape = c.ints("shape");
    let total = size_from(&x.dims, 0);
    let mut missing = None;
    let mut known = 1i64;
    for (i, d) in shape.iter_mut().enumerate() {
        if *d < -1 {
            return Err(c.fail("the dims of `shape` must not be negative"));
        }
        if *d == 0 {
            *d = *x
                .dims
                .get(i)
                .ok_or_else(|| c.fail("a zero dim of `shape` is past the input's rank"))?;
        }
        if *d == -1 {
            if missing.replace(i).is_some() {
                return Err(c.fail("`shape` has more than one missing dim"));
            }
        } else {
            known = known.saturating_mul(*d);
        }
    }
    match missing {
        Some(i) => {
            if known == 0 || total % known != 0 {
                return Err(c.fail("the input size does not divide into `shape`"));
            }
            shape[i] = total / known;
        }
        None if known != total => {
            return Err(c.fail(format!(
                "new shape {shape:?} does not match {} elements",
                total
            )));
        }
        None => {}
    }
    Ok(vec![BlobShape::new(shape, x.dtype), old])
}

fn transpose(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let n = x.dims.len();
    let axes = c.ints("axes");
    let dims = if axes.is_empty() {
        x.dims.iter().rev().copied().collect()
    } else {
        if axes.len() != n {
            return Err(c.fail("axes must name every dim"));
        }
        let mut seen = vec![false; n];
        let mut dims = Vec::with_capacity(n);
        for &a in &axes {
            let a = c.canonical_axis(a, n)?;
            if std::mem::replace(&mut seen[a], true) {
                return Err(c.fail("axes must be a permutation"));
            }
            dims.push(x.dims[a]);
        }
        dims
    };
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn slice(c: &Ctx<'_>) -> Out {
    if c.n_in() > 1 {
        return Err(Stop::Unknown);
    }
    let x = c.input(0)?;
    let starts = c.ints("starts");
    let ends = c.ints("ends");
    if starts.len() != ends.len() || starts.len() > x.dims.len() {
        return Err(c.fail("starts and ends must have one value per leading dim"));
    }
    let dims = x
        .dims
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if i >= starts.len() || d <= 0 {
                return if i >= starts.len() { d } else { 0 };
            }
            let fix = |v: i64| if v < 0 { d + 1 + v } else { v }.clamp(0, d);
            (fix(ends[i]) - fix(starts[i])).max(0)
        })
        .collect();
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn tile(c: &Ctx<'_>) -> Out {
    if c.n_in() > 1 {
        return Err(Stop::Unknown);
    }
    let x = c.input(0)?;
    let axis = c.canonical_axis(c.int("axis", 0)?, x.dims.len())?;
    let tiles = c.int("tiles", 1)?;
    let mut dims = x.dims.clone();
    dims[axis] = dims[axis].saturating_mul(tiles);
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn gather(c: &Ctx<'_>) -> Out {
    let data = c.input(0)?;
    let idx = c.input(1)?;
    let axis = c.canonical_axis(c.int("axis", 0)?, data.dims.len())?;
    if data.dims[axis] == 0 {
        // An empty axis gathers into DATA's own empty shape (as the kernel does).
        return Ok(vec![BlobShape::new(data.dims.clone(), data.dtype)]);
    }
    let mut dims = data.dims[..axis].to_vec();
    // With match_outer the indices' leading `axis` dims are DATA's own.
    let skip = if c.flag("match_outer")? { axis } else { 0 };
    dims.extend(idx.dims.iter().skip(skip));
    dims.extend(&data.dims[axis + 1..]);
    Ok(vec![BlobShape::new(dims, data.dtype)])
}

fn flatten(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let axis = c.int("axis", 1)?;
    let n = x.dims.len() as i64;
    if !(0..=n).contains(&axis) {
        return Err(c.fail(format!("axis {axis} out of range for {n} dims")));
    }
    let axis = axis as usize;
    let dims = vec![size_to(&x.dims, axis), size_from(&x.dims, axis)];
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn squeeze(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let mut drop = c.ints("dims");
    drop.sort_unstable();
    drop.dedup();
    let dims = x
        .dims
        .iter()
        .enumerate()
        .filter(|(i, _)| drop.binary_search(&(*i as i64)).is_err())
        .map(|(_, &d)| d)
        .collect();
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn expand_dims(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let mut add = c.ints("dims");
    add.sort_unstable();
    add.dedup();
    let mut dims = x.dims.clone();
    for a in add {
        if a < 0 || a as usize > dims.len() {
            return Err(c.fail(format!("dim {a} out of range")));
        }
        dims.insert(a as usize, 1);
    }
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn nhwc2nchw(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let n = x.dims.len();
    if n < 3 {
        return Err(c.fail("input must have at least 3 dims"));
    }
    let mut dims = vec![x.dims[0], x.dims[n - 1]];
    dims.extend(&x.dims[1..n - 1]);
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn nchw2nhwc(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    if x.dims.len() < 3 {
        return Err(c.fail("input must have at least 3 dims"));
    }
    let mut dims = vec![x.dims[0]];
    dims.extend(&x.dims[2..]);
    dims.push(x.dims[1]);
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn reduce_front_back(c: &Ctx<'_>, front: bool) -> Out {
    let x = c.input(0)?;
    let k = c.int("num_reduce_dim", 1)?;
    let n = x.dims.len();
    let k = usize::try_from(k)
        .ok()
        .filter(|&k| k <= n)
        .ok_or_else(|| c.fail("num_reduce_dim out of range"))?;
    let dims = if front {
        x.dims[k..].to_vec()
    } else {
        x.dims[..n - k].to_vec()
    };
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn reduce(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let n = x.dims.len();
    let keep = c.int("keepdims", 1)? != 0;
    let axes = c.ints("axes");
    let mut reduced = vec![axes.is_empty(); n];
    for a in axes {
        reduced[c.canonical_axis(a, n)?] = true;
    }
    let dims = x
        .dims
        .iter()
        .zip(&reduced)
        .filter_map(|(&d, &r)| match (r, keep) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Ok(vec![BlobShape::new(dims, x.dtype)])
}

fn unique(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    if x.dims.len() != 1 {
        return Err(c.fail("input must be 1-D"));
    }
    let y = if x.dims[0] <= 1 {
        BlobShape::new(x.dims.clone(), x.dtype)
    } else {
        BlobShape::unknown()
    };
    let mut out = vec![y];
    if c.n_out() > 1 {
        out.push(BlobShape::new(x.dims.clone(), dtype::INT32));
    }
    Ok(out)
}

/// Segment reductions: one row per length, the data's trailing dims.
fn segments(c: &Ctx<'_>, data: usize, lengths: usize) -> Out {
    let d = c.input(data)?;
    let l = c.input(lengths)?;
    let mut dims = vec![l.dims.first().copied().unwrap_or(1)];
    dims.extend(d.dims.iter().skip(1));
    Ok(vec![BlobShape::new(dims, d.dtype)])
}

fn lengths_pad(c: &Ctx<'_>) -> Out {
    let d = c.input(0)?;
    let l = c.input(1)?;
    let target = c.int("target_length", -1)?;
    if target < 0 {
        return Err(c.fail("target_length must be given"));
    }
    let mut dims = d.dims.clone();
    let first = dims
        .first_mut()
        .ok_or_else(|| c.fail("data must have at least 1 dim"))?;
    *first = size_from(&l.dims, 0).saturating_mul(target);
    Ok(vec![BlobShape::new(dims, d.dtype)])
}

fn shape(c: &Ctx<'_>) -> Out {
    let x = c.input(0)?;
    let axes = c.ints("axes");
    let n = if axes.is_empty() {
        x.dims.len()
    } else {
        axes.len()
    };
    Ok(vec![BlobShape::new(vec![n as i64], dtype::INT64)])
}
