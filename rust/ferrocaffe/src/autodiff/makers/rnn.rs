//! Recurrent operators: `RecurrentNetwork`, `LSTMUnit`, `GRUUnit`.

use super::util::{fail, gop, grad_in, grad_out, input, output, Args};
use crate::autodiff::maker::MakerCtx;
use crate::autodiff::registry::Registry;
use crate::error::Result;
use crate::proto::OperatorDef;

/// Registers the recurrent makers.
pub fn register(r: &mut Registry) {
    r.register_maker("RecurrentNetwork", recurrent_network);
    r.register_maker("LSTMUnit", lstm_unit);
    r.register_maker("GRUUnit", gru_unit);
}

fn index(ctx: &MakerCtx<'_>, arg: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| fail(ctx, format!("negative index {v} in argument {arg}")))
}

/// `RecurrentNetwork`: one `RecurrentNetworkGradient` reading the gradients of the outputs
/// listed in `outputs_with_grads`, then every input and every output; it produces the
/// gradients of input 0, of the `param` inputs and of the `initial_recurrent_state_ids`
/// inputs. Every forward argument (step nets, links, aliases, backward step net...) is copied.
fn recurrent_network(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let args = Args::new(ctx)?;
    let params = args.ints("param");
    let recurrent = args.ints("initial_recurrent_state_ids");
    let with_grads = args.ints("outputs_with_grads");
    if with_grads.is_empty() {
        return Err(fail(ctx, "argument outputs_with_grads must not be empty"));
    }
    let mut ins = Vec::new();
    for &id in &with_grads {
        ins.push(grad_out(ctx, index(ctx, "outputs_with_grads", id)?)?);
    }
    for k in 0..ctx.def.input.len() {
        ins.push(input(ctx, k)?);
    }
    for k in 0..ctx.def.output.len() {
        ins.push(output(ctx, k)?);
    }
    let mut outs = vec![grad_in(ctx, 0)?];
    for &id in &params {
        outs.push(grad_in(ctx, index(ctx, "param", id)?)?);
    }
    for &id in &recurrent {
        outs.push(grad_in(
            ctx,
            index(ctx, "initial_recurrent_state_ids", id)?,
        )?);
    }
    Ok(vec![gop("RecurrentNetworkGradient", ins, outs, vec![])])
}

/// `LSTMUnit(hidden_prev, cell_prev, gates, [seq_lengths,] timestep)`: the inputs, both
/// outputs and both output gradients; `sequence_lengths` (default on) says whether the
/// sequence-lengths input is present.
fn lstm_unit(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let with_lengths = Args::new(ctx)?.flag("sequence_lengths", true)?;
    let n_in = if with_lengths { 5 } else { 4 };
    let mut ins = (0..n_in)
        .map(|k| input(ctx, k))
        .collect::<Result<Vec<_>>>()?;
    ins.extend([
        output(ctx, 0)?,
        output(ctx, 1)?,
        grad_out(ctx, 0)?,
        grad_out(ctx, 1)?,
    ]);
    let outs = vec![grad_in(ctx, 0)?, grad_in(ctx, 1)?, grad_in(ctx, 2)?];
    Ok(vec![gop("LSTMUnitGradient", ins, outs, vec![])])
}

/// `GRUUnit(hidden_prev, gates, [seq_lengths,] timestep)`: like `LSTMUnit` with one state.
fn gru_unit(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let with_lengths = Args::new(ctx)?.flag("sequence_lengths", true)?;
    let n_in = if with_lengths { 4 } else { 3 };
    let mut ins = (0..n_in)
        .map(|k| input(ctx, k))
        .collect::<Result<Vec<_>>>()?;
    ins.extend([output(ctx, 0)?, grad_out(ctx, 0)?]);
    let outs = vec![grad_in(ctx, 0)?, grad_in(ctx, 1)?];
    Ok(vec![gop("GRUUnitGradient", ins, outs, vec![])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::maker::GradRef;
    use crate::proto::Argument;

    fn ints(name: &str, v: &[i64]) -> Argument {
        Argument {
            name: Some(name.into()),
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    fn run(def: &OperatorDef, g: &[GradRef]) -> Result<crate::autodiff::GradientOutput> {
        super::super::util::run_registered(register, def, g)
    }

    #[test]
    fn recurrent_network_reads_listed_output_gradients() {
        let mut def = OperatorDef::new("RecurrentNetwork", ["x", "h0", "W"], ["all", "last", "ws"]);
        def.arg = vec![
            ints("param", &[2]),
            ints("initial_recurrent_state_ids", &[1]),
            ints("outputs_with_grads", &[1]),
        ];
        let g = [
            GradRef::None,
            GradRef::Dense("d_last".into()),
            GradRef::None,
        ];
        let out = run(&def, &g).expect("grad");
        let op = &out.ops[0];
        assert_eq!(
            op.input,
            vec!["d_last", "x", "h0", "W", "all", "last", "ws"]
        );
        assert_eq!(op.output, vec!["x_grad", "W_grad", "h0_grad"]);
        assert_eq!(op.arg, def.arg);
        // The listed output has no gradient: an error, as in Caffe2.
        def.arg[2] = ints("outputs_with_grads", &[0]);
        assert!(run(&def, &g).is_err());
        def.arg[2] = ints("outputs_with_grads", &[]);
        assert!(run(&def, &g).is_err());
    }
}
