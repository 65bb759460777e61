//! Pass-through and bookkeeping operators (`Alias`, `Copy`, `ZeroGradient`), and the op types
//! registered without a maker: `NO_GRADIENT` and `SHOULD_NOT_DO_GRADIENT` ones.

use super::util::{arg_f, fail, gop, grad_in, grad_out, input, set_dense, single, Slot::*};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::{GradientKind, Registry};
use crate::error::Result;
use crate::proto::OperatorDef;

/// Op types whose inputs get no gradient (fills, counters, `StopGradient`...).
pub const NO_GRADIENT: &[&str] = &[
    "OneHot",
    "GatherPadding",
    "AtomicIter",
    "ConstantFill",
    "EnsureCPUOutput",
    "GaussianFill",
    "GivenTensorBoolFill",
    "GivenTensorFill",
    "GivenTensorInt64Fill",
    "GivenTensorIntFill",
    "Iter",
    "LearningRate",
    "MSRAFill",
    "RangeFill",
    "Size",
    "StopGradient",
    "UniformFill",
    "UniformIntFill",
    "XavierFill",
];

/// Op types through which asking for a gradient is an error (comparisons, optimizers,
/// resource and bookkeeping ops...).
pub const SHOULD_NOT_DO_GRADIENT: &[&str] = &[
    "Accuracy",
    "Adagrad",
    "Adam",
    "And",
    "AtomicFetchAdd",
    "ChannelBackpropStats",
    "ChannelStats",
    "CheckAtomicBool",
    "ConditionalSetAtomicBool",
    "CreateAtomicBool",
    "CreateMutex",
    "CreateScope",
    "EQ",
    "Free",
    "GE",
    "GT",
    "HasScope",
    "LE",
    "LT",
    "MomentumSGD",
    "MomentumSGDUpdate",
    "NE",
    "Not",
    "Or",
    "Print",
    "RecurrentNetworkBlobFetcher",
    "ResizeLike",
    "ScatterAssign",
    "ScatterWeightedSum",
    "Shape",
    "SparseAdagrad",
    "SparseAdam",
    "SparseMomentumSGDUpdate",
    "Where",
];

/// Registers the pass-through makers and the gradient-less op types.
pub fn register(r: &mut Registry) {
    r.register_maker("SequenceMask", sequence_mask);
    r.register_maker("AddPadding", add_padding);
    r.register_maker("RemovePadding", remove_padding);
    for t in NO_GRADIENT {
        r.register(t, GradientKind::NoGradient);
    }
    for t in SHOULD_NOT_DO_GRADIENT {
        r.register(t, GradientKind::ShouldNotDo);
    }
    r.register_maker("Alias", alias);
    r.register_maker("Copy", single("CopyOnDeviceLike", &[GO(0), I(0)], &[GI(0)]));
    r.register_maker("ZeroGradient", zero_gradient);
    r.register_maker(
        "MakeTwoClass",
        single("MakeTwoClassGradient", &[GO(0)], &[GI(0)]),
    );
}

/// `Alias`: the input's gradient is the output's gradient itself; no op.
fn alias(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let g = grad_out(ctx, 0)?;
    set_dense(ctx, 0, g)?;
    Ok(vec![])
}

/// `ZeroGradient`: a zero gradient for its input, made like the input.
fn zero_gradient(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let x = input(ctx, 0)?;
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop(
        "ConstantFill",
        vec![x],
        vec![gi],
        vec![arg_f("value", 0.0)],
    )])
}

/// `SequenceMask`: the same mask applied to the output gradient with zeros (`grad`), the
/// forward arguments copied.
fn sequence_mask(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    let mut args = ctx.def.arg.clone();
    args.push(crate::proto::Argument::int("grad", 1));
    let mut ins = vec![grad_out(ctx, 0)?];
    if ctx.def.input.len() > 1 {
        ins.push(input(ctx, 1)?);
    }
    Ok(vec![gop("SequenceMask", ins, vec![grad_in(ctx, 0)?], args)])
}

/// The gradient inputs of the padding ops: the output gradient, and the forward op's output
/// lengths when it had lengths (they describe the gradient's segments).
fn padding_grad_inputs(ctx: &MakerCtx<'_>) -> Result<Vec<String>> {
    let mut ins = vec![grad_out(ctx, 0)?];
    if ctx.def.input.len() > 1 {
        if ctx.def.output.len() < 2 {
            return Err(fail(
                ctx,
                "needs its lengths output (output 1) for the gradient",
            ));
        }
        ins.push(ctx.def.output[1].clone());
    }
    Ok(ins)
}

/// `AddPadding`: `RemovePadding` of the gradient; with padding inputs, `GatherPadding` sums the
/// padding rows' gradient into theirs.
fn add_padding(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let ins = padding_grad_inputs(ctx)?;
    let mut ops = vec![gop(
        "RemovePadding",
        ins.clone(),
        vec![grad_in(ctx, 0)?],
        vec![],
    )];
    if ctx.def.input.len() >= 3 {
        let mut outs = vec![grad_in(ctx, 2)?];
        if ctx.def.input.len() == 4 {
            outs.push(grad_in(ctx, 3)?);
        }
        ops.push(gop("GatherPadding", ins, outs, vec![]));
    }
    Ok(ops)
}

/// `RemovePadding`: `AddPadding` (zeros) of the gradient.
fn remove_padding(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let ins = padding_grad_inputs(ctx)?;
    Ok(vec![gop("AddPadding", ins, vec![grad_in(ctx, 0)?], vec![])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;
    use crate::autodiff::makers::util::run_registered;
    use crate::proto::DeviceOption;

    #[test]
    fn gradient_ops_inherit_device_and_engine() {
        let mut def = OperatorDef::new("Copy", ["X"], ["Y"]);
        def.device_option = Some(DeviceOption {
            device_type: Some(1),
            device_id: Some(2),
            ..Default::default()
        });
        def.engine = Some("CUDNN".into());
        let out = run_registered(register, &def, &[GradRef::Dense("dY".into())]).expect("grad");
        let op = &out.ops[0];
        assert_eq!(op.r#type(), "CopyOnDeviceLike");
        assert_eq!(op.device_option, def.device_option);
        assert_eq!(op.engine.as_deref(), Some("CUDNN"));
        assert_eq!(op.is_gradient_op, Some(true));
        assert_eq!(op.name.as_deref(), Some(""));
    }

    #[test]
    fn zero_gradient_and_alias() {
        let def = OperatorDef::new("ZeroGradient", ["x"], Vec::<String>::new());
        let out = run_registered(register, &def, &[]).expect("grad");
        assert_eq!(out.ops[0].arg, vec![arg_f("value", 0.0)]);
        assert_eq!(out.input_grads, vec![GradRef::Dense("x_grad".into())]);
        let def = OperatorDef::new("Alias", ["x"], ["y"]);
        let out = run_registered(register, &def, &[GradRef::Dense("gy".into())]).expect("grad");
        assert!(out.ops.is_empty());
        assert_eq!(out.input_grads, vec![GradRef::Dense("gy".into())]);
    }

    #[test]
    fn kinds_without_maker() {
        let mut r = Registry::new();
        register(&mut r);
        assert!(matches!(
            r.get("StopGradient"),
            Some(GradientKind::NoGradient)
        ));
        assert!(matches!(r.get("Accuracy"), Some(GradientKind::ShouldNotDo)));
        assert!(r.get("ReluGradient").is_none());
    }
}
