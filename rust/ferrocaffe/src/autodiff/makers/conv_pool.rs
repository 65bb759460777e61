//! Convolution, pooling, padding and resampling: `Conv`(`2D`), `ConvTranspose`, `MaxPool`(`2D`),
//! `AveragePool`(`2D`), `PadImage`, `UpsampleBilinear`.

use super::util::{arg_i, fail, gop, grad_in, grad_out, input, maker, single, Args, Slot::*};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the convolution and pooling makers.
pub fn register(r: &mut Registry) {
    r.register_maker("Conv", conv("ConvGradient"));
    r.register_maker("Conv2D", conv("Conv2DGradient"));
    r.register_maker("Conv1D", conv("Conv1DGradient"));
    r.register_maker("Conv3D", conv("Conv3DGradient"));
    r.register_maker("ConvTranspose", conv("ConvTransposeGradient"));
    for (t, g) in [
        ("MaxPool", "MaxPoolGradient"),
        ("MaxPool2D", "MaxPool2DGradient"),
        ("AveragePool", "AveragePoolGradient"),
        ("AveragePool2D", "AveragePool2DGradient"),
        ("MaxPool1D", "MaxPool1DGradient"),
        ("MaxPool3D", "MaxPool3DGradient"),
        ("AveragePool1D", "AveragePool1DGradient"),
        ("AveragePool3D", "AveragePool3DGradient"),
        ("LpPool", "LpPoolGradient"),
    ] {
        r.register_maker(t, single(g, &[I(0), O(0), GO(0)], &[GI(0)]));
    }
    r.register_maker("PadImage", single("PadImageGradient", &[GO(0)], &[GI(0)]));
    r.register_maker("UpsampleBilinear", upsample_bilinear);
    r.register_maker("Im2Col", single("Col2Im", &[GO(0), I(0)], &[GI(0)]));
    r.register_maker("Col2Im", single("Im2Col", &[GO(0)], &[GI(0)]));
    r.register_maker(
        "RoIPool",
        single("RoIPoolGradient", &[I(0), I(1), O(1), GO(0)], &[GI(0)]),
    );
}

/// `Conv` / `ConvTranspose`: one gradient op producing dW, db (with a bias) and dX (unless
/// `no_gradient_to_input`); without a bias it gets `no_bias: 1`.
fn conv(
    grad_type: &'static str,
) -> impl Fn(&mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> + Send + Sync + 'static {
    maker(move |ctx: &mut MakerCtx<'_>| {
        let n = ctx.def.input.len();
        if n != 2 && n != 3 {
            return Err(fail(ctx, format!("expected 2 or 3 inputs, got {n}")));
        }
        let compute_dx = !Args::new(ctx)?.flag("no_gradient_to_input", false)?;
        let ins = vec![input(ctx, 0)?, input(ctx, 1)?, grad_out(ctx, 0)?];
        let mut outs = vec![grad_in(ctx, 1)?];
        if n == 3 {
            outs.push(grad_in(ctx, 2)?);
        }
        if compute_dx {
            outs.push(grad_in(ctx, 0)?);
        }
        let args = if n == 3 {
            vec![]
        } else {
            vec![arg_i("no_bias", 1)]
        };
        Ok(vec![gop(grad_type, ins, outs, args)])
    })
}

/// `UpsampleBilinear`: dY, X and the optional scales input.
fn upsample_bilinear(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let mut ins = vec![grad_out(ctx, 0)?, input(ctx, 0)?];
    if ctx.def.input.len() == 2 {
        ins.push(input(ctx, 1)?);
    }
    let gi = grad_in(ctx, 0)?;
    Ok(vec![gop("UpsampleBilinearGradient", ins, vec![gi], vec![])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;

    fn run(def: &OperatorDef) -> Result<crate::autodiff::GradientOutput> {
        super::super::util::run_registered(register, def, &[GradRef::Dense("dY".into())])
    }

    #[test]
    fn conv_without_input_gradient() {
        let mut def = OperatorDef::new("Conv", ["X", "W"], ["Y"]);
        def.arg.push(arg_i("no_gradient_to_input", 1));
        let out = run(&def).expect("grad");
        assert_eq!(out.ops[0].output, vec!["W_grad"]);
        assert_eq!(out.ops[0].arg[0], arg_i("no_bias", 1));
        assert_eq!(out.input_grads[0], GradRef::None);
        let bad = OperatorDef::new("ConvTranspose", ["X"], ["Y"]);
        assert!(run(&bad).is_err());
    }
}
