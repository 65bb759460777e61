//! Elementwise operators: arithmetic, unary math, activations, `Cast`, `WeightedSum`.

use super::util::{
    arg_f, arg_i, arg_s, fail, gop, grad_in, grad_out, input, maker, output, set_dense, single,
    Args, Slot::*,
};
use crate::autodiff::interned::InternedCtx;
use crate::autodiff::maker::{GradRef, GradientMaker, GradientOutput, MakerCtx};
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::tensor_proto::DataType;
use crate::proto::OperatorDef;

/// Registers the elementwise makers.
pub fn register(r: &mut Registry) {
    // Binary arithmetic with broadcasting: one `<Op>Gradient` taking dC, A, B.
    for (t, g) in [
        ("Add", "AddGradient"),
        ("Sub", "SubGradient"),
        ("Mul", "MulGradient"),
    ] {
        r.register_maker(t, single(g, &[GO(0), I(0), I(1)], &[GI(0), GI(1)]));
    }
    r.register_maker(
        "Div",
        single("DivGradient", &[GO(0), I(0), I(1), O(0)], &[GI(0), GI(1)]),
    );
    r.register_maker("Max", min_max("MaxGradient"));
    r.register_maker("Min", min_max("MinGradient"));
    r.register_maker("Sum", SumMaker);

    r.register_maker("Negative", single("Negative", &[GO(0)], &[GI(0)]));
    r.register_maker("Abs", single("AbsGradient", &[I(0), GO(0)], &[GI(0)]));
    r.register_maker("Exp", single("Mul", &[O(0), GO(0)], &[GI(0)]));
    r.register_maker("Log", single("Div", &[GO(0), I(0)], &[GI(0)]));
    r.register_maker("Sqr", sqr);
    r.register_maker("Sqrt", sqrt);
    r.register_maker("Pow", pow);
    r.register_maker("Scale", single("Scale", &[GO(0)], &[GI(0)]));

    // Activations whose gradient reads the forward output.
    for (t, g) in [
        ("Relu", "ReluGradient"),
        ("LeakyRelu", "LeakyReluGradient"),
        ("Sigmoid", "SigmoidGradient"),
        ("Tanh", "TanhGradient"),
        ("Clip", "ClipGradient"),
    ] {
        r.register_maker(t, single(g, &[O(0), GO(0)], &[GI(0)]));
    }
    r.register_maker(
        "Softsign",
        single("SoftsignGradient", &[I(0), GO(0)], &[GI(0)]),
    );
    for (t, g) in [
        ("Elu", "EluGradient"),
        ("HardSigmoid", "HardSigmoidGradient"),
        ("ReluN", "ReluNGradient"),
    ] {
        r.register_maker(t, single(g, &[O(0), GO(0)], &[GI(0)]));
    }
    for (t, g) in [
        ("Gelu", "GeluGradient"),
        ("Sinh", "SinhGradient"),
        ("Cosh", "CoshGradient"),
    ] {
        r.register_maker(t, single(g, &[GO(0), I(0)], &[GI(0)]));
    }
    for (t, g) in [("Swish", "SwishGradient"), ("Mish", "MishGradient")] {
        r.register_maker(t, single(g, &[I(0), O(0), GO(0)], &[GI(0)]));
    }
    // Unary math whose gradient op reads X and dY, or the output and dY.
    for (t, g) in [
        ("Sin", "SinGradient"),
        ("Cos", "CosGradient"),
        ("Tan", "TanGradient"),
        ("Acos", "AcosGradient"),
        ("Asin", "AsinGradient"),
        ("Atan", "AtanGradient"),
    ] {
        r.register_maker(t, single(g, &[I(0), GO(0)], &[GI(0)]));
    }
    r.register_maker("Cbrt", single("CbrtGradient", &[GO(0), O(0)], &[GI(0)]));
    r.register_maker("Cube", single("CubeGradient", &[GO(0), I(0)], &[GI(0)]));
    r.register_maker("Log1p", single("Log1pGradient", &[I(0), GO(0)], &[GI(0)]));
    r.register_maker("Rsqrt", single("RsqrtGradient", &[GO(0), O(0)], &[GI(0)]));
    r.register_maker("RSqrt", single("RSqrtGradient", &[GO(0), O(0)], &[GI(0)]));
    // Precision casts: the gradient is the opposite cast.
    r.register_maker("FloatToHalf", single("HalfToFloat", &[GO(0)], &[GI(0)]));
    r.register_maker("HalfToFloat", single("FloatToHalf", &[GO(0)], &[GI(0)]));
    r.register_maker(
        "Reciprocal",
        single("ReciprocalGradient", &[O(0), GO(0)], &[GI(0)]),
    );

    r.register_maker("Cast", cast);
    r.register_maker("WeightedSum", weighted_sum);
    r.register_maker(
        "ElementwiseLinear",
        single(
            "ElementwiseLinearGradient",
            &[GO(0), I(0), I(1)],
            &[GI(0), GI(1), GI(2)],
        ),
    );
}

/// `Max`/`Min`: one gradient op reading the output, its gradient and every input.
fn min_max(
    grad_type: &'static str,
) -> impl Fn(&mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> + Send + Sync + 'static {
    maker(move |ctx: &mut MakerCtx<'_>| {
        let mut ins = vec![output(ctx, 0)?, grad_out(ctx, 0)?];
        let mut outs = Vec::new();
        for k in 0..ctx.def.input.len() {
            ins.push(input(ctx, k)?);
            outs.push(grad_in(ctx, k)?);
        }
        Ok(vec![gop(grad_type, ins, outs, vec![])])
    })
}

/// `Sum`: every input receives the output gradient itself; no op.
fn sum(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let g = grad_out(ctx, 0)?;
    for k in 0..ctx.def.input.len() {
        set_dense(ctx, k, g.clone())?;
    }
    Ok(vec![])
}

/// `Sum`'s maker ([`sum`]), made with names or over ids.
struct SumMaker;

impl GradientMaker for SumMaker {
    fn make(&self, op: &OperatorDef, output_grads: &[GradRef]) -> Result<GradientOutput> {
        let mut ctx = MakerCtx::new(op, output_grads);
        let ops = sum(&mut ctx)?;
        Ok(ctx.finish(ops))
    }

    fn make_interned(&self, cx: &mut InternedCtx<'_>) -> Option<()> {
        let g = cx.grad_out(0)?;
        for k in 0..cx.num_inputs() {
            cx.set_dense(k, g)?;
        }
        Some(())
    }
}

/// `Sqr`: scales the output gradient by 2 in place, then multiplies by X.
fn sqr(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let go = grad_out(ctx, 0)?;
    let x = input(ctx, 0)?;
    let gi = grad_in(ctx, 0)?;
    Ok(vec![
        gop(
            "Scale",
            vec![go.clone()],
            vec![go.clone()],
            vec![arg_f("scale", 2.0)],
        ),
        gop("Mul", vec![go, x], vec![gi], vec![]),
    ])
}

/// `Sqrt`: dX = 0.5 * dY / Y.
fn sqrt(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let go = grad_out(ctx, 0)?;
    let y = output(ctx, 0)?;
    let gi = grad_in(ctx, 0)?;
    Ok(vec![
        gop(
            "Scale",
            vec![go],
            vec![gi.clone()],
            vec![arg_f("scale", 0.5)],
        ),
        gop("Div", vec![gi.clone(), y], vec![gi], vec![]),
    ])
}

/// `Pow`, with the exponent as an argument or as a second input. Arguments are not copied;
/// the broadcast arguments are passed on explicitly when the forward op has `broadcast`.
fn pow(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    let args = Args::new(ctx)?;
    if args.has("exponent") {
        let exponent = args.float("exponent", 0.0)?;
        let x = input(ctx, 0)?;
        let in_place = x == output(ctx, 0)?;
        let pow_exponent = if in_place {
            if exponent.abs() <= 1e-12 {
                return Err(fail(ctx, "in-place Pow gradient needs a non-zero exponent"));
            }
            (exponent - 1.0) / exponent
        } else {
            exponent - 1.0
        };
        let go = grad_out(ctx, 0)?;
        let gi = grad_in(ctx, 0)?;
        return Ok(vec![
            gop(
                "Pow",
                vec![x],
                vec![gi.clone()],
                vec![arg_f("exponent", pow_exponent)],
            ),
            gop("Mul", vec![gi.clone(), go], vec![gi.clone()], vec![]),
            gop(
                "Scale",
                vec![gi.clone()],
                vec![gi],
                vec![arg_f("scale", exponent)],
            ),
        ]);
    }
    let (x, e, y) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
    if x == y || e == y {
        return Err(fail(
            ctx,
            "Gradient computation cannot be carried out if Pow uses in-place computation",
        ));
    }
    let bcast = if args.has("broadcast") {
        let copy_or = |name: &str, default: crate::proto::Argument| {
            args.get(name).cloned().unwrap_or(default)
        };
        Some(vec![
            copy_or("broadcast", arg_i("broadcast", 0)),
            copy_or("axis", arg_i("axis", -1)),
            copy_or("axis_str", arg_s("axis_str", "")),
            copy_or("order", arg_s("order", "NCHW")),
        ])
    } else {
        None
    };
    let go = grad_out(ctx, 0)?;
    let gx = grad_in(ctx, 0)?;
    let ge = grad_in(ctx, 1)?;
    let bargs = bcast.clone().unwrap_or_default();
    let tmp = format!("{ge}_autogen_pre_red");
    let mut ops = vec![
        // d/dX = E * X^(E-1) * dY
        gop(
            "ConstantFill",
            vec![e.clone()],
            vec![ge.clone()],
            vec![arg_f("value", 1.0)],
        ),
        gop("Sub", vec![e.clone(), ge.clone()], vec![ge.clone()], vec![]),
        gop(
            "Pow",
            vec![x.clone(), ge.clone()],
            vec![gx.clone()],
            bargs.clone(),
        ),
        gop(
            "Mul",
            vec![gx.clone(), go.clone()],
            vec![gx.clone()],
            vec![],
        ),
        gop("Mul", vec![gx.clone(), e.clone()], vec![gx], bargs),
        // d/dE = Y * ln(X) * dY
        gop("Log", vec![x], vec![tmp.clone()], vec![]),
        gop("Mul", vec![tmp.clone(), y], vec![tmp.clone()], vec![]),
    ];
    match bcast {
        Some(b) => {
            ops.push(gop("Mul", vec![tmp.clone(), go], vec![tmp.clone()], vec![]));
            ops.push(gop(
                "SumReduceLike",
                vec![tmp, e],
                vec![ge],
                b[1..].to_vec(),
            ));
        }
        None => ops.push(gop("Mul", vec![tmp, go], vec![ge], vec![])),
    }
    Ok(ops)
}

/// Reads a `Cast` data-type argument (`to` / `from_type`): a type name (any case) or its number;
/// absent means FLOAT.
fn cast_type(ctx: &MakerCtx<'_>, args: &Args<'_>, name: &str) -> Result<i64> {
    if args.has_string(name) {
        let raw = args.get(name).and_then(|a| a.s.clone()).unwrap_or_default();
        let s = String::from_utf8_lossy(&raw).to_uppercase();
        return DataType::from_str_name(&s)
            .map(|t| t as i64)
            .ok_or_else(|| fail(ctx, format!("Unknown '{name}' argument: {s}")));
    }
    args.int(name, DataType::Float as i64)
}

/// `Cast`: casts the gradient back, with `to` and `from_type` swapped (always as numbers).
fn cast(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    let args = Args::new(ctx)?;
    let go = grad_out(ctx, 0)?;
    let gi = grad_in(ctx, 0)?;
    let to = cast_type(ctx, &args, "to")?;
    if !(args.has_string("from_type") || args.has_int("from_type")) {
        return Err(fail(
            ctx,
            "Argument 'from_type' of type int or string is required to get the gradient of CastOp",
        ));
    }
    let from = cast_type(ctx, &args, "from_type")?;
    Ok(vec![gop(
        "Cast",
        vec![go],
        vec![gi],
        vec![arg_i("to", from), arg_i("from_type", to)],
    )])
}

/// `WeightedSum(X0, w0, X1, w1, ...)`: gradients of the Xs, and of the weights with
/// `grad_on_w`.
fn weighted_sum(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let grad_on_w = Args::new(ctx)?.flag("grad_on_w", false)?;
    let n = ctx.def.input.len();
    let mut ins = vec![grad_out(ctx, 0)?];
    let mut outs = Vec::new();
    for k in (0..n).step_by(2) {
        ins.push(input(ctx, k)?);
        ins.push(input(ctx, k + 1)?);
        outs.push(grad_in(ctx, k)?);
    }
    if grad_on_w {
        for k in (0..n).step_by(2) {
            outs.push(grad_in(ctx, k + 1)?);
        }
    }
    Ok(vec![gop("WeightedSumGradient", ins, outs, vec![])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;

    fn run(def: &OperatorDef, g: &[GradRef]) -> Result<crate::autodiff::GradientOutput> {
        super::super::util::run_registered(register, def, g)
    }

    #[test]
    fn pow_in_place_uses_rescaled_exponent() {
        let mut def = OperatorDef::new("Pow", ["X"], ["X"]);
        def.arg.push(arg_f("exponent", 4.0));
        let out = run(&def, &[GradRef::Dense("X_g".into())]).expect("gradient");
        assert_eq!(out.ops[0].arg, vec![arg_f("exponent", 0.75)]);
        def.arg = vec![arg_f("exponent", 0.0)];
        assert!(run(&def, &[GradRef::Dense("X_g".into())]).is_err());
    }

    #[test]
    fn cube_and_log1p_read_x_in_caffe2_order() {
        let g = [GradRef::Dense("Y_g".into())];
        let out = run(&OperatorDef::new("Cube", ["X"], ["Y"]), &g).expect("gradient");
        assert_eq!(out.ops[0].r#type(), "CubeGradient");
        assert_eq!(out.ops[0].input, vec!["Y_g", "X"]);
        let out = run(&OperatorDef::new("Log1p", ["X"], ["Y"]), &g).expect("gradient");
        assert_eq!(out.ops[0].r#type(), "Log1pGradient");
        assert_eq!(out.ops[0].input, vec!["X", "Y_g"]);
        assert_eq!(out.ops[0].output, vec!["X_grad"]);
    }

    #[test]
    fn pow_two_inputs_in_place_is_an_error() {
        let def = OperatorDef::new("Pow", ["X", "E"], ["E"]);
        let err = run(&def, &[GradRef::Dense("E_g".into())]).expect_err("error expected");
        assert!(err.to_string().contains("in-place"), "{err}");
    }

    #[test]
    fn cast_requires_from_type_and_parses_names() {
        let mut def = OperatorDef::new("Cast", ["X"], ["Y"]);
        def.arg.push(arg_s("to", "int64"));
        let g = [GradRef::Dense("Y_g".into())];
        let err = run(&def, &g).expect_err("error expected").to_string();
        assert!(err.contains("from_type"), "{err}");
        def.arg.push(arg_s("from_type", "Float16"));
        let out = run(&def, &g).expect("gradient");
        assert_eq!(
            out.ops[0].arg,
            vec![arg_i("to", 12), arg_i("from_type", 10)]
        );
        def.arg[0] = arg_s("to", "nonsense");
        assert!(run(&def, &g).is_err());
    }

    #[test]
    fn weighted_sum_grad_on_w_adds_weight_gradients() {
        let mut def = OperatorDef::new("WeightedSum", ["X0", "w0", "X1", "w1"], ["Y"]);
        def.arg.push(arg_i("grad_on_w", 1));
        let out = run(&def, &[GradRef::Dense("Y_g".into())]).expect("gradient");
        assert_eq!(
            out.ops[0].output,
            vec!["X0_grad", "X1_grad", "w0_grad", "w1_grad"]
        );
        assert!(out.input_grads.iter().all(GradRef::is_some));
    }

    #[test]
    fn sum_rejects_sparse_output_gradient() {
        let def = OperatorDef::new("Sum", ["a", "b"], ["c"]);
        let g = [GradRef::Sparse {
            indices: "i".into(),
            values: "v".into(),
        }];
        assert!(run(&def, &g).is_err());
    }
}
