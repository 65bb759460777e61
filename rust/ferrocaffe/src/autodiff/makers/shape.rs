//! Shape and layout operators: `Reshape`, `Flatten`, `FlattenToVec`, `Transpose`, `Concat`,
//! `Split` (and their legacy names `DepthConcat`, `DepthSplit`), `Slice`, `Squeeze`, `ExpandDims`, `Tile`, `NHWC2NCHW`, `NCHW2NHWC`.

use super::util::{
    fail, gop, grad_in, grad_out, has_grad_out, input, output, single, Args, Slot::*,
};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the shape and layout makers.
pub fn register(r: &mut Registry) {
    r.register_maker("Reshape", reshape);
    r.register_maker("Flatten", single("ResizeLike", &[GO(0), I(0)], &[GI(0)]));
    r.register_maker(
        "FlattenToVec",
        single("ResizeLike", &[GO(0), I(0)], &[GI(0)]),
    );
    r.register_maker("Transpose", transpose);
    // DepthConcat / DepthSplit are Caffe2's legacy names of Concat / Split and share their
    // makers, which emit Split / Concat.
    r.register_maker("Concat", concat);
    r.register_maker("DepthConcat", concat);
    r.register_maker("Split", split);
    r.register_maker("DepthSplit", split);
    r.register_maker("SplitByLengths", split_by_lengths);
    r.register_maker("Slice", slice);
    r.register_maker("Squeeze", single("ExpandDims", &[GO(0)], &[GI(0)]));
    r.register_maker("ExpandDims", single("Squeeze", &[GO(0)], &[GI(0)]));
    r.register_maker("Tile", tile);
    r.register_maker("NHWC2NCHW", single("NCHW2NHWC", &[GO(0)], &[GI(0)]));
    r.register_maker("NCHW2NHWC", single("NHWC2NCHW", &[GO(0)], &[GI(0)]));
}

/// `Reshape`: reshapes the gradient back to the saved old shape; the `shape` argument is not
/// copied.
fn reshape(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    let ins = vec![grad_out(ctx, 0)?, output(ctx, 1)?];
    let gi = grad_in(ctx, 0)?;
    let dims = format!("_{gi}_dims");
    Ok(vec![gop("Reshape", ins, vec![gi, dims], vec![])])
}

/// `Transpose`: transposes back. The forward arguments are copied in place, with `axes`
/// replaced by its inverse permutation.
fn transpose(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    Args::new(ctx)?;
    let go = grad_out(ctx, 0)?;
    let gi = grad_in(ctx, 0)?;
    let mut args = ctx.def.arg.clone();
    if let Some(a) = args.iter_mut().find(|a| a.name() == "axes") {
        let old = a.ints.clone();
        let mut inverse = vec![0i64; old.len()];
        for (k, &axis) in old.iter().enumerate() {
            let slot = usize::try_from(axis)
                .ok()
                .and_then(|x| inverse.get_mut(x))
                .ok_or_else(|| fail(ctx, format!("axes {old:?} is not a permutation")))?;
            *slot = k as i64;
        }
        a.ints = inverse;
    }
    Ok(vec![gop("Transpose", vec![go], vec![gi], args)])
}

/// `Concat`: splits the gradient with the saved split sizes; nothing without an output
/// gradient.
fn concat(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    if !has_grad_out(ctx, 0) {
        return Ok(vec![]);
    }
    let outs = (0..ctx.def.input.len())
        .map(|k| grad_in(ctx, k))
        .collect::<Result<Vec<_>>>()?;
    let ins = vec![grad_out(ctx, 0)?, output(ctx, 1)?];
    Ok(vec![gop("Split", ins, outs, vec![])])
}

/// `Split`: concatenates the gradients of the outputs that have one (outputs without a
/// gradient are left out, as Caffe2 does); nothing when none has.
fn split(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ins = Vec::new();
    for k in 0..ctx.def.output.len() {
        if has_grad_out(ctx, k) {
            ins.push(grad_out(ctx, k)?);
        }
    }
    if ins.is_empty() {
        return Ok(vec![]);
    }
    let gi = grad_in(ctx, 0)?;
    let dims = format!("_{gi}_dims");
    Ok(vec![gop("Concat", ins, vec![gi, dims], vec![])])
}

/// `SplitByLengths`: `Split`'s gradient. Its default axis is 0 where Concat's is 1, so the axis
/// is made explicit when the forward op leaves it out (Caffe2 copied the arguments only, and
/// its gradient failed for the default axis).
fn split_by_lengths(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ops = split(ctx)?;
    if !ctx.def.arg.iter().any(|a| a.name() == "axis") {
        for op in &mut ops {
            op.arg.push(crate::proto::Argument::int("axis", 0));
        }
    }
    Ok(ops)
}

/// `Slice`: with `starts`/`ends` given as inputs they are passed on too.
fn slice(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let ins = if ctx.def.input.len() > 1 {
        vec![
            input(ctx, 0)?,
            input(ctx, 1)?,
            input(ctx, 2)?,
            grad_out(ctx, 0)?,
        ]
    } else {
        vec![input(ctx, 0)?, grad_out(ctx, 0)?]
    };
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop("SliceGradient", ins, vec![gi], vec![])])
}

/// `Tile`: `tiles`/`axis` given as inputs are passed on too.
fn tile(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ins = vec![grad_out(ctx, 0)?];
    for k in 1..ctx.def.input.len().min(3) {
        ins.push(input(ctx, k)?);
    }
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop("TileGradient", ins, vec![gi], vec![])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;
    use crate::proto::Argument;

    fn run(def: &OperatorDef, g: &[GradRef]) -> Result<crate::autodiff::GradientOutput> {
        super::super::util::run_registered(register, def, g)
    }

    #[test]
    fn transpose_inverts_axes_in_place() {
        let mut def = OperatorDef::new("Transpose", ["X"], ["Y"]);
        def.arg.push(Argument {
            name: Some("axes".into()),
            ints: vec![2, 0, 1],
            ..Default::default()
        });
        let out = run(&def, &[GradRef::Dense("dY".into())]).expect("grad");
        assert_eq!(out.ops[0].arg.len(), 1);
        assert_eq!(out.ops[0].arg[0].ints, vec![1, 2, 0]);
        def.arg[0].ints = vec![0, 5];
        assert!(run(&def, &[GradRef::Dense("dY".into())]).is_err());
    }

    #[test]
    fn split_skips_outputs_without_gradient() {
        let def = OperatorDef::new("Split", ["X"], ["a", "b", "c"]);
        let g = [
            GradRef::Dense("da".into()),
            GradRef::None,
            GradRef::Dense("dc".into()),
        ];
        let out = run(&def, &g).expect("grad");
        assert_eq!(out.ops[0].input, vec!["da", "dc"]);
        let none = [GradRef::None, GradRef::None, GradRef::None];
        let out = run(&def, &none).expect("grad");
        assert!(out.ops.is_empty());
        assert_eq!(out.input_grads, vec![GradRef::None]);
    }

    #[test]
    fn depth_concat_and_depth_split_use_the_concat_and_split_makers() {
        let def = OperatorDef::new("DepthConcat", ["a", "b"], ["y", "info"]);
        let out = run(&def, &[GradRef::Dense("dy".into()), GradRef::None]).expect("grad");
        assert_eq!(out.ops[0].r#type(), "Split");
        assert_eq!(out.ops[0].input, vec!["dy", "info"]);
        assert_eq!(out.ops[0].output, vec!["a_grad", "b_grad"]);
        let def = OperatorDef::new("DepthSplit", ["X"], ["a", "b"]);
        let g = [GradRef::Dense("da".into()), GradRef::Dense("db".into())];
        let out = run(&def, &g).expect("grad");
        assert_eq!(out.ops[0].r#type(), "Concat");
        assert_eq!(out.ops[0].input, vec!["da", "db"]);
        assert_eq!(out.ops[0].output, vec!["X_grad", "_X_grad_dims"]);
    }

    #[test]
    fn concat_without_gradient_makes_nothing() {
        let def = OperatorDef::new("Concat", ["a", "b"], ["y", "info"]);
        let out = run(&def, &[GradRef::None, GradRef::Dense("di".into())]).expect("grad");
        assert!(out.ops.is_empty());
        assert_eq!(out.input_grads, vec![GradRef::None, GradRef::None]);
    }
}
