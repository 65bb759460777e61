//! Segment reductions keyed by SEGMENT_IDS, the range reducers and `LengthsMax` (the sparse
//! forms give DATA a gradient slice (INDICES, `DATA_grad_values`)); `BatchGather`,
//! `NanCheck`, and the gradient-less lengths, range and 8-bit row-wise ops.

use super::util::{
    gop, grad_in, grad_in_values, grad_out, input, output, set_sparse, single, Slot::*,
};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::{GradientKind, Registry};
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the segment makers.
pub fn register(r: &mut Registry) {
    r.register_maker(
        "UnsortedSegmentMean",
        single("UnsortedSegmentMeanGradient", &[GO(0), I(1)], &[GI(0)]),
    );
    for red in ["Sum", "Mean"] {
        let g = if red == "Sum" {
            "SortedSegmentSumGradient"
        } else {
            "SortedSegmentMeanGradient"
        };
        r.register_maker(
            &format!("SortedSegment{red}"),
            single(g, &[GO(0), I(1)], &[GI(0)]),
        );
    }
    r.register_maker("SparseSortedSegmentSum", |c: &mut MakerCtx<'_>| {
        sparse(c, "SortedSegmentSumGradient")
    });
    r.register_maker("SparseSortedSegmentMean", |c: &mut MakerCtx<'_>| {
        sparse(c, "SortedSegmentMeanGradient")
    });
    r.register_maker("SparseUnsortedSegmentSum", |c: &mut MakerCtx<'_>| {
        sparse(c, "UnsortedSegmentSumGradient")
    });
    r.register_maker("SparseUnsortedSegmentMean", |c: &mut MakerCtx<'_>| {
        sparse(c, "UnsortedSegmentMeanGradient")
    });
    for red in ["Sum", "Mean", "LogSumExp", "LogMeanExp", "Max"] {
        r.register_maker(&format!("SortedSegmentRange{red}"), range);
    }
    r.register_maker(
        "BatchGather",
        single("BatchGatherGradient", &[I(0), I(1), GO(0)], &[GI(0)]),
    );
    r.register_maker("NanCheck", single("NanCheck", &[GO(0)], &[GI(0)]));
    for t in [
        "LengthsGather",
        "LengthsToRanges",
        "LengthsRangeFill",
        "Range",
        "FloatToFused8BitRowwiseQuantized",
        "Fused8BitRowwiseQuantizedToFloat",
        "GatherFused8BitRowwise",
        "SparseLengthsSum8BitsRowwise",
        "SparseLengthsMean8BitsRowwise",
        "SparseLengthsWeightedSum8BitsRowwise",
        "SparseLengthsWeightedMean8BitsRowwise",
        "HalfFloatToFused8BitRowwiseQuantized",
        "FloatToFused8BitRowwiseQuantizedHalfScaleBias",
        "HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias",
        "Fused8BitRowwiseQuantizedToHalfFloat",
        "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat",
        "Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat",
        "LengthsPad",
    ] {
        r.register(t, GradientKind::NoGradient);
    }
    r.register_maker("LengthsMax", |c: &mut MakerCtx<'_>| {
        let ins = vec![output(c, 0)?, grad_out(c, 0)?, input(c, 1)?, input(c, 0)?];
        let gi = grad_in(c, 0)?;
        Ok(vec![gop(
            "LengthsMaxWithMainInputAndForwardOutputGradient",
            ins,
            vec![gi],
            vec![],
        )])
    });
}

/// `SparseSorted/UnsortedSegment*`: (dY, SEGMENT_IDS) -> values of DATA's gradient slice.
fn sparse(ctx: &mut MakerCtx<'_>, grad_type: &str) -> Result<Vec<OperatorDef>> {
    let ins = vec![grad_out(ctx, 0)?, input(ctx, 2)?];
    let values = grad_in_values(ctx, 0)?;
    set_sparse(ctx, 0, input(ctx, 1)?, values.clone())?;
    Ok(vec![gop(grad_type, ins, vec![values], vec![])])
}

/// `SortedSegmentRange<R>`: `<type>Gradient` reading (dY, DATA, Y, SEGMENT_IDS).
fn range(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let ins = vec![
        grad_out(ctx, 0)?,
        input(ctx, 0)?,
        output(ctx, 0)?,
        input(ctx, 1)?,
    ];
    let gi = grad_in(ctx, 0)?;
    let t = format!("{}Gradient", ctx.def.r#type());
    Ok(vec![gop(&t, ins, vec![gi], vec![])])
}
