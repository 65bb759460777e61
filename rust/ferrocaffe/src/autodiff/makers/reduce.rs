//! Reductions: `ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceMin`, `Moments`, `SumElements`.

use super::util::{single, Slot::*};
use crate::autodiff::registry::Registry;

/// Registers the reduction makers.
pub fn register(r: &mut Registry) {
    // The gradient reads dY, X and Y (Y locates the extrema for ReduceMax / ReduceMin).
    for (t, g) in [
        ("ReduceSum", "ReduceSumGradient"),
        ("ReduceMean", "ReduceMeanGradient"),
        ("ReduceMax", "ReduceMaxGradient"),
        ("ReduceMin", "ReduceMinGradient"),
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
}
