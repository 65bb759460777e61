//! Losses: `SoftmaxWithLoss`, `CrossEntropy`, `LabelCrossEntropy`,
//! `SigmoidCrossEntropyWithLogits`, `AveragedLoss`, `SquaredL2Distance`.

use super::util::{gop, grad_in, grad_out, input, output, single, Slot::*};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the loss makers.
pub fn register(r: &mut Registry) {
    r.register_maker("SoftmaxWithLoss", softmax_with_loss);
    r.register_maker(
        "CrossEntropy",
        single("CrossEntropyGradient", &[I(0), I(1), GO(0)], &[GI(0)]),
    );
    r.register_maker(
        "LabelCrossEntropy",
        single("LabelCrossEntropyGradient", &[I(0), I(1), GO(0)], &[GI(0)]),
    );
    r.register_maker(
        "SigmoidCrossEntropyWithLogits",
        single(
            "SigmoidCrossEntropyWithLogitsGradient",
            &[GO(0), I(0), I(1)],
            &[GI(0)],
        ),
    );
    r.register_maker(
        "WeightedSigmoidCrossEntropyWithLogits",
        single(
            "WeightedSigmoidCrossEntropyWithLogitsGradient",
            &[GO(0), I(0), I(1), I(2)],
            &[GI(0)],
        ),
    );
    r.register_maker(
        "CosineSimilarity",
        single(
            "CosineSimilarityGradient",
            &[I(0), I(1), GO(0)],
            &[GI(0), GI(1)],
        ),
    );
    r.register_maker(
        "L1Distance",
        single("L1DistanceGradient", &[I(0), I(1), GO(0)], &[GI(0), GI(1)]),
    );
    r.register_maker("SpatialSoftmaxWithLoss", spatial_softmax_with_loss);
    r.register_maker(
        "AveragedLoss",
        single("AveragedLossGradient", &[I(0), GO(0)], &[GI(0)]),
    );
    r.register_maker(
        "SquaredL2Distance",
        single(
            "SquaredL2DistanceGradient",
            &[I(0), I(1), GO(0)],
            &[GI(0), GI(1)],
        ),
    );
}

/// `SpatialSoftmaxWithLoss`: as `SoftmaxWithLoss`, into `SpatialSoftmaxWithLossGradient`.
fn spatial_softmax_with_loss(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ops = softmax_with_loss(ctx)?;
    for op in &mut ops {
        op.r#type = Some("SpatialSoftmaxWithLossGradient".to_string());
    }
    Ok(ops)
}

/// `SoftmaxWithLoss`: reads logits, labels, (weights,) the probabilities and the gradient of
/// the loss; the gradient of the probabilities output is ignored.
fn softmax_with_loss(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ins = vec![input(ctx, 0)?, input(ctx, 1)?];
    if ctx.def.input.len() == 3 {
        ins.push(input(ctx, 2)?);
    }
    ins.push(output(ctx, 0)?);
    ins.push(grad_out(ctx, 1)?);
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop("SoftmaxWithLossGradient", ins, vec![gi], vec![])])
}
