//! Reductions: `ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceMin`, `Moments`, `SumElements`.

use super::util::{gop, grad_in, grad_out, input, output, single, Slot::*};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::{GradientKind, Registry};
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the reduction makers.
pub fn register(r: &mut Registry) {
    // The gradient reads dY, X and Y (Y locates the extrema for ReduceMax / ReduceMin).
    for (t, g) in [
        ("ReduceSum", "ReduceSumGradient"),
        ("ReduceMean", "ReduceMeanGradient"),
        ("ReduceMax", "ReduceMaxGradient"),
        ("ReduceMin", "ReduceMinGradient"),
        ("ReduceL1", "ReduceL1Gradient"),
        ("ReduceL2", "ReduceL2Gradient"),
    ] {
        r.register_maker(t, single(g, &[GO(0), I(0), O(0)], &[GI(0)]));
    }
    r.register_maker(
        "Moments",
        single("MomentsGradient", &[GO(0), GO(1), I(0), O(0)], &[GI(0)]),
    );
    r.register_maker(
        "SumElements",
        single("SumElementsGradient", &[I(0), GO(0)], &[GI(0)]),
    );
    // Front/back reductions: (dY, X[, Y for max][, LENGTHS]) -> dX.
    for t in [
        "ReduceFrontSum",
        "ReduceFrontMean",
        "ReduceBackSum",
        "ReduceBackMean",
    ] {
        r.register_maker(t, |ctx: &mut MakerCtx<'_>| front_back(ctx, false));
    }
    for t in ["ReduceFrontMax", "ReduceBackMax"] {
        r.register_maker(t, |ctx: &mut MakerCtx<'_>| front_back(ctx, true));
    }
    r.register_maker(
        "RowwiseMax",
        single("RowwiseMaxGradient", &[I(0), O(0), GO(0)], &[GI(0)]),
    );
    r.register_maker(
        "ColwiseMax",
        single("ColwiseMaxGradient", &[I(0), O(0), GO(0)], &[GI(0)]),
    );
    r.register("SumElementsInt", GradientKind::NoGradient);
}

/// `ReduceFront*` / `ReduceBack*`: one `<type>Gradient` op reading dY, X, (Y for the max) and
/// the LENGTHS input when the forward op has one.
fn front_back(ctx: &mut MakerCtx<'_>, with_y: bool) -> Result<Vec<OperatorDef>> {
    let mut ins = vec![grad_out(ctx, 0)?, input(ctx, 0)?];
    if with_y {
        ins.push(output(ctx, 0)?);
    }
    if ctx.def.input.len() == 2 {
        ins.push(input(ctx, 1)?);
    }
    let gi = grad_in(ctx, 0)?;
    let t = format!("{}Gradient", ctx.def.r#type());
    Ok(vec![gop(&t, ins, vec![gi], vec![])])
}
