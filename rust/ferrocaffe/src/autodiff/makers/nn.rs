//! Dense layers and normalisation: `FC`, `MatMul`, `BatchMatMul`, `DotProduct`, `Softmax`,
//! `LRN`, `Dropout`, `SpatialBN`, `LayerNorm`, `GroupNorm`, `InstanceNorm`, `PRelu`.

use super::util::{
    arg_f, arg_i, fail, gop, grad_in, grad_out, input, output, single, Args, Slot::*,
};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::{Argument, OperatorDef};

/// Registers the dense-layer and normalisation makers.
pub fn register(r: &mut Registry) {
    r.register_maker(
        "FC",
        single("FCGradient", &[I(0), I(1), GO(0)], &[GI(1), GI(2), GI(0)]),
    );
    r.register_maker(
        "FCTransposed",
        single(
            "FCTransposedGradient",
            &[I(0), I(1), GO(0)],
            &[GI(1), GI(2), GI(0)],
        ),
    );
    r.register_maker("MatMul", matmul);
    r.register_maker("BatchMatMul", batch_matmul);
    r.register_maker(
        "DotProduct",
        single("DotProductGradient", &[I(0), I(1), GO(0)], &[GI(0), GI(1)]),
    );
    r.register_maker(
        "Softmax",
        single("SoftmaxGradient", &[O(0), GO(0)], &[GI(0)]),
    );
    r.register_maker("LRN", single("LRNGradient", &[I(0), O(0), GO(0)], &[GI(0)]));
    r.register_maker("Dropout", dropout);
    r.register_maker("SpatialBN", spatial_bn);
    r.register_maker("LayerNorm", layer_norm);
    // GroupNorm's gradient reads dY, X, gamma, beta and the saved mean and inverse std.
    r.register_maker(
        "GroupNorm",
        single(
            "GroupNormGradient",
            &[GO(0), I(0), I(1), I(2), O(1), O(2)],
            &[GI(0), GI(1), GI(2)],
        ),
    );
    r.register_maker("InstanceNorm", instance_norm);
    r.register_maker(
        "PRelu",
        single("PReluGradient", &[O(0), GO(0), I(0), I(1)], &[GI(0), GI(1)]),
    );
    r.register_maker("DotProductWithPadding", dot_product_with_padding);
}

/// `DotProductWithPadding`: the gradient op gets `pad_value` (float) and `replicate` (bool)
/// as the forward op's fields hold them (0 when absent), then the forward op's arguments.
fn dot_product_with_padding(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let args = Args::new(ctx)?;
    let pad_value = args.get("pad_value").and_then(|a| a.f).unwrap_or(0.0);
    let replicate = args.get("replicate").and_then(|a| a.i).unwrap_or(0) != 0;
    let ins = vec![input(ctx, 0)?, input(ctx, 1)?, grad_out(ctx, 0)?];
    let outs = vec![grad_in(ctx, 0)?, grad_in(ctx, 1)?];
    Ok(vec![gop(
        "DotProductWithPaddingGradient",
        ins,
        outs,
        vec![
            arg_f("pad_value", pad_value),
            arg_i("replicate", i64::from(replicate)),
        ],
    )])
}

/// `MatMul`: two MatMuls with explicit transposition arguments; the forward arguments are not
/// copied. `axis_a`/`axis_b` are passed on as booleans (Caffe2 stores them in a `bool`).
fn matmul(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    if ctx.def.input.len() != 2 {
        return Err(fail(ctx, "MatMul gradient needs exactly 2 inputs"));
    }
    let args = Args::new(ctx)?;
    let trans_a = args.get("trans_a").is_some_and(|a| a.i() != 0);
    let trans_b = args.get("trans_b").is_some_and(|a| a.i() != 0);
    let axis_a = args.get("axis_a").map_or(1, |a| i64::from(a.i() != 0));
    let axis_b = args.get("axis_b").map_or(1, |a| i64::from(a.i() != 0));
    let (a, b, g) = (input(ctx, 0)?, input(ctx, 1)?, grad_out(ctx, 0)?);
    let (ga, gb) = (grad_in(ctx, 0)?, grad_in(ctx, 1)?);
    let t_a = || arg_i("trans_a", 1);
    let t_b = || arg_i("trans_b", 1);
    let mm = |ins: [&String; 3], out: &String, args: Vec<Argument>| {
        gop(
            "MatMul",
            ins.iter().map(|s| (*s).clone()).collect(),
            vec![out.clone()],
            args,
        )
    };
    Ok(match (trans_a, trans_b) {
        // A'B': dA = B'G', dB = G'A'
        (true, true) => vec![
            mm(
                [&b, &g, &a],
                &ga,
                vec![t_a(), t_b(), arg_i("axis_a", axis_b)],
            ),
            mm(
                [&g, &a, &b],
                &gb,
                vec![t_a(), t_b(), arg_i("axis_b", axis_a)],
            ),
        ],
        // A'B: dA = BG', dB = AG
        (true, false) => vec![
            mm([&b, &g, &a], &ga, vec![t_b(), arg_i("axis_a", axis_b)]),
            mm([&a, &g, &b], &gb, vec![arg_i("axis_a", axis_a)]),
        ],
        // AB': dA = GB, dB = G'A
        (false, true) => vec![
            mm([&g, &b, &a], &ga, vec![arg_i("axis_b", axis_b)]),
            mm([&g, &a, &b], &gb, vec![t_a(), arg_i("axis_b", axis_a)]),
        ],
        // AB: dA = GB', dB = A'G
        (false, false) => vec![
            mm([&g, &b, &a], &ga, vec![t_b(), arg_i("axis_b", axis_b)]),
            mm([&a, &g, &b], &gb, vec![t_a(), arg_i("axis_a", axis_a)]),
        ],
    })
}

/// `BatchMatMul`: two BatchMatMuls; not supported with `broadcast`; arguments not copied.
fn batch_matmul(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    ctx.copy_arguments = false;
    if ctx.def.input.len() != 2 {
        return Err(fail(ctx, "BatchMatMul gradient needs exactly 2 inputs"));
    }
    let args = Args::new(ctx)?;
    if args.get("broadcast").is_some_and(|a| a.i() != 0) {
        return Err(fail(
            ctx,
            "Gradient is currently not supported with broadcast=1 for BatchMatMul.",
        ));
    }
    let trans_a = args.get("trans_a").is_some_and(|a| a.i() != 0);
    let trans_b = args.get("trans_b").is_some_and(|a| a.i() != 0);
    let (a, b, g) = (input(ctx, 0)?, input(ctx, 1)?, grad_out(ctx, 0)?);
    let (ga, gb) = (grad_in(ctx, 0)?, grad_in(ctx, 1)?);
    let none = Vec::new;
    let ta = || vec![arg_i("trans_a", 1)];
    let tb = || vec![arg_i("trans_b", 1)];
    let both = || vec![arg_i("trans_a", 1), arg_i("trans_b", 1)];
    let bmm = |x: &String, y: &String, out: &String, args: Vec<Argument>| {
        gop(
            "BatchMatMul",
            vec![x.clone(), y.clone()],
            vec![out.clone()],
            args,
        )
    };
    Ok(match (trans_a, trans_b) {
        (true, true) => vec![bmm(&b, &g, &ga, both()), bmm(&g, &a, &gb, both())],
        (true, false) => vec![bmm(&b, &g, &ga, tb()), bmm(&a, &g, &gb, none())],
        (false, true) => vec![bmm(&g, &b, &ga, none()), bmm(&g, &a, &gb, ta())],
        (false, false) => vec![bmm(&g, &b, &ga, tb()), bmm(&a, &g, &gb, ta())],
    })
}

/// `Dropout`: in test mode the mask output is not used.
fn dropout(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let is_test = Args::new(ctx)?.flag("is_test", false)?;
    let mut ins = vec![grad_out(ctx, 0)?];
    if !is_test {
        ins.push(output(ctx, 1)?);
    }
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop("DropoutGrad", ins, vec![gi], vec![])])
}

/// `SpatialBN`: test mode reads the running statistics, training mode the saved ones; with
/// `num_batches > 1` the scale and bias gradients are also inputs (already reduced).
fn spatial_bn(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let args = Args::new(ctx)?;
    let is_test = args.int("is_test", 0)? != 0;
    let num_batches = args.int("num_batches", 1)?;
    let (n_in, n_out) = (ctx.def.input.len(), ctx.def.output.len());
    let outs = vec![grad_in(ctx, 0)?, grad_in(ctx, 1)?, grad_in(ctx, 2)?];
    let expect = |want_in: usize, want_out: usize| {
        if n_in == want_in && n_out == want_out {
            Ok(())
        } else {
            Err(fail(
                ctx,
                format!("expected {want_in} inputs and {want_out} outputs, got {n_in} and {n_out}"),
            ))
        }
    };
    let ins = if is_test {
        expect(5, 1)?;
        vec![
            input(ctx, 0)?,
            input(ctx, 1)?,
            grad_out(ctx, 0)?,
            input(ctx, 3)?,
            input(ctx, 4)?,
        ]
    } else if num_batches > 1 {
        expect(7, 5)?;
        vec![
            input(ctx, 0)?,
            input(ctx, 1)?,
            grad_out(ctx, 0)?,
            output(ctx, 3)?,
            output(ctx, 4)?,
            outs[1].clone(),
            outs[2].clone(),
        ]
    } else {
        expect(5, 5)?;
        vec![
            input(ctx, 0)?,
            input(ctx, 1)?,
            grad_out(ctx, 0)?,
            output(ctx, 3)?,
            output(ctx, 4)?,
        ]
    };
    Ok(vec![gop("SpatialBNGradient", ins, outs, vec![])])
}

/// `LayerNorm`: reads dY, Y, mean, std, X (and gamma with `elementwise_affine`).
fn layer_norm(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let affine = Args::new(ctx)?
        .get("elementwise_affine")
        .is_some_and(|a| a.i() != 0);
    let mut ins = vec![
        grad_out(ctx, 0)?,
        output(ctx, 0)?,
        output(ctx, 1)?,
        output(ctx, 2)?,
        input(ctx, 0)?,
    ];
    let mut outs = vec![grad_in(ctx, 0)?];
    if affine {
        ins.push(input(ctx, 1)?);
        outs.push(grad_in(ctx, 1)?);
        outs.push(grad_in(ctx, 2)?);
    }
    Ok(vec![gop("LayerNormGradient", ins, outs, vec![])])
}

/// `InstanceNorm`: X, scale, bias, dY, plus the saved mean / inverse std when produced.
fn instance_norm(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ins = vec![
        input(ctx, 0)?,
        input(ctx, 1)?,
        input(ctx, 2)?,
        grad_out(ctx, 0)?,
    ];
    for k in 1..ctx.def.output.len().min(3) {
        ins.push(output(ctx, k)?);
    }
    let outs = vec![grad_in(ctx, 0)?, grad_in(ctx, 1)?, grad_in(ctx, 2)?];
    Ok(vec![gop("InstanceNormGradient", ins, outs, vec![])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;

    fn run(def: &OperatorDef, g: &[GradRef]) -> Result<crate::autodiff::GradientOutput> {
        super::super::util::run_registered(register, def, g)
    }

    #[test]
    fn dropout_training_reads_the_mask() {
        let def = OperatorDef::new("Dropout", ["X"], ["Y", "mask"]);
        let out = run(&def, &[GradRef::Dense("dY".into()), GradRef::None]).expect("grad");
        assert_eq!(out.ops[0].input, vec!["dY", "mask"]);
        assert_eq!(out.ops[0].r#type(), "DropoutGrad");
    }

    #[test]
    fn batch_matmul_broadcast_is_rejected() {
        let mut def = OperatorDef::new("BatchMatMul", ["A", "B"], ["Y"]);
        def.arg.push(arg_i("broadcast", 1));
        let err = run(&def, &[GradRef::Dense("dY".into())]).expect_err("broadcast");
        assert!(err.to_string().contains("broadcast=1"), "{err}");
    }

    #[test]
    fn matmul_both_transposed() {
        let mut def = OperatorDef::new("MatMul", ["A", "B"], ["Y"]);
        def.arg = vec![arg_i("trans_a", 1), arg_i("trans_b", 1), arg_i("axis_b", 2)];
        let out = run(&def, &[GradRef::Dense("dY".into())]).expect("grad");
        assert_eq!(out.ops[0].input, vec!["B", "dY", "A"]);
        assert_eq!(
            out.ops[0].arg,
            vec![arg_i("trans_a", 1), arg_i("trans_b", 1), arg_i("axis_a", 1)]
        );
        assert_eq!(out.ops[1].input, vec!["dY", "A", "B"]);
    }

    #[test]
    fn instance_norm_uses_saved_statistics() {
        let def = OperatorDef::new("InstanceNorm", ["X", "s", "b"], ["Y", "m", "v"]);
        let g = [GradRef::Dense("dY".into()), GradRef::None, GradRef::None];
        let out = run(&def, &g).expect("grad");
        assert_eq!(out.ops[0].input, vec!["X", "s", "b", "dY", "m", "v"]);
        assert_eq!(out.ops[0].output, vec!["X_grad", "s_grad", "b_grad"]);
    }
}
