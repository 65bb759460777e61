//! Sparse and segment operators: `Gather`, the `SparseLengths*` family, `LengthsSum`,
//! `UnsortedSegmentSum`, `SparseToDense`. Gradients of embedding tables come back as
//! `GradientSlice`s (`GradRef::Sparse`).

use super::util::{
    arg_i, fail, gop, grad_in, grad_in_values, grad_out, input, maker, set_sparse, single, Args,
    Slot::*,
};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the sparse and segment makers.
pub fn register(r: &mut Registry) {
    r.register_maker("Gather", gather);
    r.register_maker("SparseLengthsSum", lengths_op(LengthsReducer::SUM, true));
    r.register_maker("SparseLengthsMean", lengths_op(LengthsReducer::MEAN, true));
    r.register_maker(
        "SparseLengthsWeightedSum",
        lengths_op(LengthsReducer::WEIGHTED_SUM, true),
    );
    r.register_maker("LengthsSum", lengths_op(LengthsReducer::SUM, false));
    r.register_maker("LengthsMean", lengths_op(LengthsReducer::MEAN, false));
    r.register_maker(
        "LengthsWeightedSum",
        lengths_op(LengthsReducer::WEIGHTED_SUM, false),
    );
    r.register_maker(
        "UnsortedSegmentSum",
        single("UnsortedSegmentSumGradient", &[GO(0), I(1)], &[GI(0)]),
    );
    r.register_maker("SparseToDense", single("Gather", &[GO(0), I(0)], &[GI(1)]));
}

/// `Gather`: along axis 0 the gradient of DATA is the slice (INDICES, dY) with no op, or a
/// dense `SparseToDense` with `dense_gradient`; along another axis a `BatchGatherGradient`.
fn gather(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    const DATA: usize = 0;
    const INDICES: usize = 1;
    let args = Args::new(ctx)?;
    let dense = args.flag("dense_gradient", false)?;
    let axis = args.int("axis", 0)?;
    if axis == 0 {
        if dense {
            let ins = vec![input(ctx, INDICES)?, grad_out(ctx, 0)?, input(ctx, DATA)?];
            let gi = grad_in(ctx, DATA)?;
            return Ok(vec![gop("SparseToDense", ins, vec![gi], vec![])]);
        }
        let (indices, values) = (input(ctx, INDICES)?, grad_out(ctx, 0)?);
        set_sparse(ctx, DATA, indices, values)?;
        return Ok(vec![]);
    }
    if args.has("dense_gradient") && !dense {
        return Err(fail(ctx, "Gather with axis > 0 must use dense_gradient"));
    }
    let ins = vec![input(ctx, DATA)?, input(ctx, INDICES)?, grad_out(ctx, 0)?];
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop(
        "BatchGatherGradient",
        ins,
        vec![gi],
        vec![arg_i("axis", axis)],
    )])
}

/// The reducer of a `Lengths*` op, as far as its gradient is concerned.
#[derive(Clone, Copy)]
struct LengthsReducer {
    /// Reducer name in the op type (`Sum`, `Mean`, `WeightedSum`).
    name: &'static str,
    /// Number of leading data inputs (DATA, plus WEIGHTS for the weighted sum).
    input_count: usize,
    /// Forward inputs the gradient op reads before dY.
    original_inputs: &'static [usize],
    /// Whether `grad_on_weights` turns on a gradient for the weights.
    weighted: bool,
}

impl LengthsReducer {
    const SUM: Self = LengthsReducer {
        name: "Sum",
        input_count: 1,
        original_inputs: &[],
        weighted: false,
    };
    const MEAN: Self = LengthsReducer {
        name: "Mean",
        input_count: 1,
        original_inputs: &[],
        weighted: false,
    };
    const WEIGHTED_SUM: Self = LengthsReducer {
        name: "WeightedSum",
        input_count: 2,
        original_inputs: &[1],
        weighted: true,
    };
}

/// `SparseLengths<R>` (`sparse_fused`) and `Lengths<R>`: one
/// `[Sparse]Lengths IndicesInGradient <R> [WithMainInput] Gradient` op. The sparse forms give
/// DATA a gradient slice (INDICES, `DATA_grad_values`).
fn lengths_op(
    red: LengthsReducer,
    sparse_fused: bool,
) -> impl Fn(&mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> + Send + Sync + 'static {
    maker(move |ctx: &mut MakerCtx<'_>| {
        let indices_at = red.input_count;
        let lengths_at = red.input_count + usize::from(sparse_fused);
        let aux_grads = if red.weighted {
            usize::from(Args::new(ctx)?.flag("grad_on_weights", false)?)
        } else {
            0
        };
        let mut ins = red
            .original_inputs
            .iter()
            .map(|&k| input(ctx, k))
            .collect::<Result<Vec<_>>>()?;
        ins.push(grad_out(ctx, 0)?);
        ins.push(input(ctx, lengths_at)?);
        let mut suffix = "Gradient".to_string();
        let mut indices_pushed = false;
        if aux_grads > 0 {
            ins.push(input(ctx, 0)?);
            if sparse_fused {
                ins.push(input(ctx, indices_at)?);
                indices_pushed = true;
            }
            suffix = format!("WithMainInput{suffix}");
        }
        if !indices_pushed {
            // Without fusion the "indices" slot holds the data itself.
            ins.push(input(ctx, if sparse_fused { indices_at } else { 0 })?);
        }
        let mut outs = vec![if sparse_fused {
            grad_in_values(ctx, 0)?
        } else {
            grad_in(ctx, 0)?
        }];
        for k in 1..=aux_grads {
            outs.push(grad_in(ctx, k)?);
        }
        let prefix = if sparse_fused {
            "SparseLengths"
        } else {
            "Lengths"
        };
        let op_type = format!("{prefix}IndicesInGradient{}{suffix}", red.name);
        let op = gop(&op_type, ins, outs.clone(), vec![]);
        if sparse_fused {
            let indices = input(ctx, indices_at)?;
            set_sparse(ctx, 0, indices, outs[0].clone())?;
        }
        Ok(vec![op])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;

    fn run(def: &OperatorDef) -> Result<crate::autodiff::GradientOutput> {
        super::super::util::run_registered(register, def, &[GradRef::Dense("dY".into())])
    }

    #[test]
    fn weighted_sum_with_grad_on_weights() {
        let mut def = OperatorDef::new("SparseLengthsWeightedSum", ["D", "W", "I", "L"], ["Y"]);
        def.arg.push(arg_i("grad_on_weights", 1));
        let out = run(&def).expect("grad");
        let op = &out.ops[0];
        assert_eq!(
            op.r#type(),
            "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient"
        );
        assert_eq!(op.input, vec!["W", "dY", "L", "D", "I"]);
        assert_eq!(op.output, vec!["D_grad_values", "W_grad"]);
        assert_eq!(
            out.input_grads,
            vec![
                GradRef::Sparse {
                    indices: "I".into(),
                    values: "D_grad_values".into()
                },
                GradRef::Dense("W_grad".into()),
                GradRef::None,
                GradRef::None
            ]
        );
    }

    #[test]
    fn gather_dense_and_axis() {
        let mut def = OperatorDef::new("Gather", ["D", "I"], ["Y"]);
        def.arg.push(arg_i("dense_gradient", 1));
        let out = run(&def).expect("grad");
        assert_eq!(out.ops[0].r#type(), "SparseToDense");
        assert_eq!(out.ops[0].input, vec!["I", "dY", "D"]);
        def.arg = vec![arg_i("axis", 1)];
        let out = run(&def).expect("grad");
        assert_eq!(out.ops[0].r#type(), "BatchGatherGradient");
        assert_eq!(out.ops[0].arg, vec![arg_i("axis", 1), arg_i("axis", 1)]);
        def.arg.push(arg_i("dense_gradient", 0));
        assert!(run(&def).is_err());
    }
}
