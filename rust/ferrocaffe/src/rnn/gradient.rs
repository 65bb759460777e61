//! `RecurrentNetworkGradient`: runs `backward_step_net` from the last timestep down to the
//! first, in a child workspace of each forward step workspace (it sees the forward blobs; its
//! own blobs stay out of the forward workspaces).
//!
//! Inputs: the gradients of the forward outputs listed in `outputs_with_grads`, every forward
//! input, every forward output (the step workspaces last). Outputs: the gradient of the input
//! sequence, of each `param` input, of each initial recurrent state.
//!
//! Before the steps: parameter gradients are zeroed; each state gradient buffer
//! (`<state>_grad`, shaped like the state) gets a zero last row plus the gradient of the state's
//! `-1` alias output if it has one; the input-sequence gradient is sized like the input. The
//! backward step net gets, in this order: the link ops (forward links and `backward_link_*`),
//! an `rnn_internal_accumulate_gradient_input` for each state whose `1` alias output has a
//! gradient (adding row t of that gradient to row t + 1 of the state gradient), its own ops
//! with each parameter gradient renamed `<grad>_tmpstep`, and per parameter an
//! `rnn_internal_accumulate_param_gradient` adding that into the parameter gradient (Caffe2
//! appends a `Sum`; the result is the same, element by element) — except where an
//! `FCGradient` alone writes the parameter gradient: it then adds into it directly, or, where
//! its operands are linked rows that stay as the step left them, leaves it to one product over
//! all timesteps after the steps ([`super::deferred`]). The parameters are held constant over
//! the steps, so products reuse their packed forms ([`crate::blas::hold_constant`]).
//! Afterwards each initial-state gradient is copied from the first rows of its state gradient
//! buffer.

use std::sync::Arc;

use super::config::{self, rename_in_net};
use super::deferred::{self, Deferred};
use super::executor::RnnExecutor;
use super::forward::executor_for;
use super::steps::{self, read_tensor};
use crate::error::Result;
use crate::ops::cpu::fc;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::proto::{Argument, NetDef, OperatorDef};
use crate::tensor::DataType;
use crate::workspace::{Blob, BlobHandle, Workspace};
use crate::{bail, err};

struct Param {
    param: String,
    grad: String,
}

struct RecurrentGradient {
    state: String,
    grad: String,
    last_external_grad: Option<String>,
}

struct RecurrentNetworkGradient {
    step_net: NetDef,
    timestep: String,
    params: Vec<Param>,
    rgs: Vec<RecurrentGradient>,
    recurrent_ids: Vec<usize>,
    num_grad_inputs: usize,
    seq_grad: String,
    /// Whether the sequence gradient is zeroed before the steps (not when every step fully
    /// writes its row: see [`steps_overwrite`]).
    zero_seq_grad: bool,
    /// Parameter gradients summed after the steps instead of in them ([`deferred`]).
    deferred: Vec<Deferred>,
    executor: Option<RnnExecutor>,
    /// Per timestep: (forward step workspace, the backward workspace made as its child).
    bwd: Vec<Option<(Arc<Workspace>, Arc<Workspace>)>>,
}

fn index(init: &OpInit<'_>, what: &str, v: i64, len: usize) -> Result<usize> {
    usize::try_from(v).ok().filter(|&i| i < len).ok_or_else(|| {
        err!(
            op = init,
            BadArgument: "{what}: index {v} out of range ({len} available)"
        )
    })
}

/// Factory of `RecurrentNetworkGradient`.
pub fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let def = init.def;
    let mut step_net = config::net_arg(init, "backward_step_net")?.ok_or_else(|| {
        err!(
            op = init,
            BadArgument: "Argument backward_step_net must be specified (a NetDef or text)"
        )
    })?;
    let timestep = init.args.string("timestep", "timestep")?;
    let grad_inputs = init.args.ints("outputs_with_grads");
    let ng = grad_inputs.len();
    let mut links = config::links(
        init,
        "link_internal",
        "link_external",
        "link_offset",
        Some("link_window"),
    )?;
    links.extend(config::links(
        init,
        "backward_link_internal",
        "backward_link_external",
        "backward_link_offset",
        None,
    )?);

    // Parameters: the step net's gradient of each is renamed <grad>_tmpstep.
    let param_ids = init.args.ints("param");
    let param_grads = init.args.strings("param_grads")?;
    if !param_grads.is_empty() && param_grads.len() != param_ids.len() {
        bail!(
            op = init,
            BadArgument: "param ({}) and param_grads ({}) must have the same length",
            param_ids.len(),
            param_grads.len()
        );
    }
    let mut params = Vec::new();
    let mut cell_grads = Vec::new();
    for (i, &id) in param_ids.iter().enumerate() {
        let input = index(init, "param", id + ng as i64, def.input.len())?;
        let output = index(
            init,
            "param gradient output",
            (i + 1) as i64,
            def.output.len(),
        )?;
        let p = Param {
            param: def.input[input].clone(),
            grad: def.output[output].clone(),
        };
        let grad_blob = match param_grads.get(i) {
            Some(g) => config::remapped(init, g)?,
            None => p.grad.clone(),
        };
        if accumulate_in_place(&mut step_net, &grad_blob) {
            step_net.external_input.push(grad_blob);
            cell_grads.push(None);
        } else {
            let cell = format!("{grad_blob}_tmpstep");
            rename_in_net(&mut step_net, &grad_blob, &cell);
            cell_grads.push(Some(cell));
        }
        params.push(p);
    }

    // State gradients and the output gradients that feed them.
    let states = init.args.strings("recurrent_states")?;
    let alias_src = init.args.strings("alias_src")?;
    let alias_offset = init.args.ints("alias_offset");
    let mut rgs = Vec::new();
    let mut accumulate = Vec::new();
    for state in &states {
        let mut rg = RecurrentGradient {
            state: state.clone(),
            grad: config::remapped(init, &format!("{state}_grad"))?,
            last_external_grad: None,
        };
        for (j, src) in alias_src.iter().enumerate() {
            if src != state {
                continue;
            }
            let Some(idx) = grad_inputs.iter().rposition(|&g| g == j as i64) else {
                continue;
            };
            let external =
                def.input[index(init, "outputs_with_grads", idx as i64, def.input.len())?].clone();
            match alias_offset.get(j) {
                Some(1) => {
                    let mut op = OperatorDef::new(
                        super::analysis::ACCUMULATE,
                        [timestep.as_str(), external.as_str(), rg.grad.as_str()],
                        [rg.grad.as_str()],
                    );
                    for l in links.iter().filter(|l| l.external == rg.grad) {
                        op.arg.push(Argument {
                            name: Some(format!("rnn_dependency.{}", l.internal)),
                            s: Some(l.internal.clone().into_bytes()),
                            ..Default::default()
                        });
                    }
                    op.device_option = def.device_option.clone();
                    op.arg.push(Argument {
                        name: Some("offset".into()),
                        i: Some(1),
                        ..Default::default()
                    });
                    accumulate.push(op);
                    step_net.external_input.push(rg.grad.clone());
                    step_net.external_input.push(external);
                }
                Some(-1) => rg.last_external_grad = Some(external),
                other => {
                    bail!(
                        op = init,
                        BadArgument: "alias {j} of recurrent state {state} has offset {other:?}; \
                         a state output with a gradient must have offset 1 or -1"
                    )
                }
            }
        }
        rgs.push(rg);
    }
    let recurrent_ids: Vec<usize> = init
        .args
        .ints("initial_recurrent_state_ids")
        .into_iter()
        .map(|id| {
            index(
                init,
                "initial_recurrent_state_ids",
                id + ng as i64,
                def.input.len(),
            )
        })
        .collect::<Result<_>>()?;
    if recurrent_ids.len() != rgs.len() {
        bail!(
            op = init,
            BadArgument: "initial_recurrent_state_ids ({}) and recurrent_states ({}) must have \
             the same length",
            recurrent_ids.len(),
            rgs.len()
        );
    }
    if def.output.len() < 1 + params.len() + rgs.len() {
        bail!(
            op = init,
            Schema: "needs {} outputs (input, parameter and initial state gradients), has {}",
            1 + params.len() + rgs.len(),
            def.output.len()
        );
    }

    if !step_net.external_input.contains(&timestep) {
        step_net.external_input.push(timestep.clone());
    }
    accumulate.append(&mut step_net.op);
    step_net.op = accumulate;
    config::add_apply_link_ops(&links, &timestep, def.device_option.as_ref(), &mut step_net);
    for (p, cell) in params.iter().zip(&cell_grads) {
        let Some(cell) = cell else { continue };
        step_net.op.push(OperatorDef::new(
            super::analysis::ACCUMULATE_PARAM,
            [p.grad.as_str(), cell.as_str()],
            [p.grad.as_str()],
        ));
        step_net.external_input.push(p.grad.clone());
    }
    let deferred = deferred::plan(&mut step_net, &links);
    let seq_input = def.input.get(ng).ok_or_else(|| {
        err!(
            op = init,
            Schema: "the forward input sequence is missing from the inputs"
        )
    })?;
    let seq_grad = config::remapped(init, &format!("{seq_input}_grad"))?;
    let zero_seq_grad = !steps_overwrite(&step_net, &links, &seq_grad);
    let executor = executor_for(init, &step_net, &timestep)?;
    Ok(Box::new(RecurrentNetworkGradient {
        step_net,
        timestep,
        params,
        rgs,
        recurrent_ids,
        num_grad_inputs: ng,
        seq_grad,
        zero_seq_grad,
        deferred,
        executor,
        bwd: Vec::new(),
    }))
}

/// When the step net's only writer of parameter gradient `grad` is an `FCGradient` (or
/// `FCTransposedGradient`) producing it as dW or db, and no step op reads it, that op is told
/// to add into `grad` directly (its [`fc::ACCUMULATE_ARG`]): the per-step temporary and the
/// `rnn_internal_accumulate_param_gradient` op are not needed. The executor's analysis orders
/// the writes of every timestep as the sequential run does, so results stay deterministic.
fn accumulate_in_place(step_net: &mut NetDef, grad: &str) -> bool {
    let mut writer = None;
    for (i, op) in step_net.op.iter().enumerate() {
        if op.input.iter().any(|b| b == grad) {
            return false;
        }
        let mut outs = op.output.iter().enumerate().filter(|(_, b)| *b == grad);
        if let Some((j, _)) = outs.next() {
            if writer.is_some() || outs.next().is_some() {
                return false;
            }
            writer = Some((i, j));
        }
    }
    let Some((i, j)) = writer else { return false };
    let op = &mut step_net.op[i];
    if !matches!(op.r#type(), "FCGradient" | "FCTransposedGradient") || j > 1 {
        return false;
    }
    match op.arg.iter_mut().find(|a| a.name() == fc::ACCUMULATE_ARG) {
        Some(a) => a.ints.push(j as i64),
        None => op.arg.push(Argument {
            name: Some(fc::ACCUMULATE_ARG.to_string()),
            ints: vec![j as i64],
            ..Default::default()
        }),
    }
    true
}

/// Whether the steps fully overwrite the sequence gradient `seq_grad`, so that it needs no
/// zeroing: one backward link makes row `t` of it (offset 0, window 1: the T steps cover every
/// row) the step blob `X`, and the first step op (link ops aside) that touches `X` or
/// `seq_grad` writes `X` without reading it and without adding into it (an `FCGradient` told
/// to accumulate). Ops produce every element of an output they do not read, so the row is then
/// fully written before anything reads it.
fn steps_overwrite(step_net: &NetDef, links: &[config::Link], seq_grad: &str) -> bool {
    let mut linked = links.iter().filter(|l| l.external == seq_grad);
    let (Some(link), None) = (linked.next(), linked.next()) else {
        return false;
    };
    if link.offset != 0 || link.window != 1 {
        return false;
    }
    let x = link.internal.as_str();
    for op in &step_net.op {
        if op.r#type() == super::analysis::APPLY_LINK {
            continue;
        }
        if op.input.iter().any(|b| b == x || b == seq_grad)
            || op.output.iter().any(|b| b == seq_grad)
        {
            return false;
        }
        if op.output.iter().any(|b| b == x) {
            return !op.arg.iter().any(|a| a.name() == fc::ACCUMULATE_ARG);
        }
    }
    false
}

/// The dtype and shape of the tensor in `h` (without keeping a copy-on-write reference to its
/// buffer: one held during the steps would make the first write through a link copy it).
fn meta_of(h: &BlobHandle, name: &str) -> Result<(DataType, Vec<usize>)> {
    match &*h.read() {
        Blob::Tensor(t) => Ok((t.dtype(), t.dims().to_vec())),
        other => Err(err!(
            DtypeMismatch: "blob {name} holds {}, expected a tensor",
            other.type_name()
        )),
    }
}

/// Sizes the tensor in `h` to `dtype` and `dims`, zero-filled when `zero`.
fn shaped_like(h: &BlobHandle, (dtype, dims): &(DataType, Vec<usize>), zero: bool) {
    let mut b = h.write();
    let g = b.tensor_mut();
    g.reset(*dtype, dims);
    if zero {
        g.bytes_mut().fill(0);
    }
}

impl RecurrentNetworkGradient {
    fn prepare(&self, ws: &Arc<Workspace>, seq_input: &(DataType, Vec<usize>)) -> Result<()> {
        for p in &self.params {
            let value = meta_of(&ws.blob(&p.param)?, &p.param)?;
            shaped_like(&ws.blob(&p.grad)?, &value, true);
        }
        for rg in &self.rgs {
            let (dtype, dims) = meta_of(&ws.blob(&rg.state)?, &rg.state)?;
            if dims.len() != 3 {
                bail!(
                    ShapeMismatch: "recurrent state {} must be 3-dimensional, got {dims:?}",
                    rg.state
                );
            }
            let h = ws.create_blob(&rg.grad);
            let mut b = h.write();
            let g = b.tensor_mut();
            g.reset(dtype, &dims);
            let rows = dims[0];
            let row = dims[1] * dims[2];
            let data = g.as_mut_slice::<f32>()?;
            let last = &mut data[(rows.max(1) - 1) * row..];
            last.fill(0.0);
            if let Some(og_name) = &rg.last_external_grad {
                let og = read_tensor(&ws.blob(og_name)?, og_name)?;
                if og.numel() != row {
                    bail!(
                        ShapeMismatch: "gradient {og_name} of the last state has {} values, a \
                         timestep of {} has {row}",
                        og.numel(),
                        rg.state
                    );
                }
                for (d, s) in last.iter_mut().zip(og.as_slice::<f32>()?) {
                    *d += *s;
                }
            }
        }
        shaped_like(&ws.blob(&self.seq_grad)?, seq_input, self.zero_seq_grad);
        Ok(())
    }

    fn backward_workspace(&mut self, t: usize, fwd: &Arc<Workspace>) -> Arc<Workspace> {
        if self.bwd.len() <= t {
            self.bwd.resize_with(t + 1, || None);
        }
        match &self.bwd[t] {
            Some((f, b)) if Arc::ptr_eq(f, fwd) => b.clone(),
            _ => {
                let b = Workspace::new_child(fwd);
                self.bwd[t] = Some((fwd.clone(), b.clone()));
                b
            }
        }
    }
}

impl Operator for RecurrentNetworkGradient {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let ws: Arc<Workspace> = ctx.ws.clone();
        let ng = self.num_grad_inputs;
        let seq_input = meta_of(ctx.input_handle(ng), ctx.input_name(ng))?;
        let t_len = seq_input.1.first().copied().unwrap_or(0);
        let last = ctx.num_inputs() - 1;
        let stack = steps::existing_stack(ctx.input_handle(last), ctx.input_name(last))?;
        let fwd: Vec<Arc<Workspace>> = stack.lock().workspaces.clone();
        if fwd.len() < t_len {
            bail!(
                op = ctx,
                ShapeMismatch: "{} holds {} step workspaces, the sequence has {t_len} timesteps \
                 (did the forward op run with a backward_step_net?)",
                ctx.input_name(last),
                fwd.len()
            );
        }
        self.prepare(&ws, &seq_input)?;
        let bwd: Vec<Arc<Workspace>> = (0..t_len)
            .map(|t| self.backward_workspace(t, &fwd[t]))
            .collect();
        // The weights are read by every step: their packed forms are made once.
        let _held = steps::hold_params(&ws, self.params.iter().map(|p| p.param.as_str()));
        if let Some(ex) = &mut self.executor {
            for t in (0..t_len).rev() {
                ex.ensure_timestep(t, &bwd[t])?;
            }
            ex.run(t_len, true)?;
        } else {
            for t in (0..t_len).rev() {
                steps::run_step_net(&bwd[t], &self.step_net, &self.timestep, t)?;
            }
        }
        for d in &self.deferred {
            d.finish(&ws, t_len, &ctx.gemm)?;
        }
        for (i, (rg, &input)) in self.rgs.iter().zip(&self.recurrent_ids).enumerate() {
            let init = read_tensor(ctx.input_handle(input), ctx.input_name(input))?;
            let grad = read_tensor(&ws.blob(&rg.grad)?, &rg.grad)?;
            let n = init.numel() * init.dtype().item_size();
            if grad.bytes().len() < n {
                bail!(
                    op = ctx,
                    ShapeMismatch: "state gradient {} is smaller than the initial state {}",
                    rg.grad,
                    ctx.input_name(input)
                );
            }
            let h = ctx.output_handle(i + self.params.len() + 1);
            let mut b = h.write();
            let out = b.tensor_mut();
            out.reset(init.dtype(), init.dims());
            if init.dims().len() >= 2 {
                out.bytes_mut().copy_from_slice(&grad.bytes()[..n]);
                continue;
            }
            // A 1-D initial state was repeated over the batch by the forward op: its gradient
            // is the first row of the state gradient summed over the batch.
            let size = init.numel();
            let batch = seq_input.1.get(1).copied().unwrap_or(1).max(1);
            let g = grad.as_slice::<f32>().map_err(|_| {
                err!(
                    op = ctx,
                    DtypeMismatch: "the gradient of the 1-D initial state {} must be float",
                    ctx.input_name(input)
                )
            })?;
            let rows = size
                .checked_mul(batch)
                .filter(|&r| r <= g.len())
                .ok_or_else(|| {
                    err!(
                        op = ctx,
                        ShapeMismatch: "state gradient {} is smaller than the initial state {} \
                         repeated over a batch of {batch}",
                        rg.grad,
                        ctx.input_name(input)
                    )
                })?;
            let o = out.as_mut_slice::<f32>()?;
            o.copy_from_slice(&g[..size]);
            for row in g[size..rows].chunks_exact(size.max(1)) {
                for (d, s) in o.iter_mut().zip(row) {
                    *d += *s;
                }
            }
        }
        Ok(())
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rnn::config::Link;

    fn link(internal: &str, external: &str, offset: i64, window: i64) -> Link {
        Link::new(internal, external, offset, window)
    }

    fn net(ops: Vec<OperatorDef>, links: &[Link]) -> NetDef {
        let mut n = NetDef {
            op: ops,
            ..Default::default()
        };
        config::add_apply_link_ops(links, "timestep", None, &mut n);
        n
    }

    #[test]
    fn sequence_gradient_is_zeroed_unless_each_step_overwrites_its_row() {
        let unit = || OperatorDef::new("LSTMUnitGradient", ["g", "dh"], ["dh_prev", "dx"]);
        let links = [link("dx", "x_grad", 0, 1), link("dh", "h_grad", 1, 1)];
        assert!(steps_overwrite(
            &net(vec![unit()], &links),
            &links,
            "x_grad"
        ));
        // Not linked, linked twice, or not row t alone.
        assert!(!steps_overwrite(
            &net(vec![unit()], &links),
            &links,
            "other"
        ));
        let twice = [links[0].clone(), link("dy", "x_grad", 0, 1)];
        assert!(!steps_overwrite(
            &net(vec![unit()], &twice),
            &twice,
            "x_grad"
        ));
        for l in [link("dx", "x_grad", 1, 1), link("dx", "x_grad", 0, 2)] {
            assert!(!steps_overwrite(
                &net(vec![unit()], std::slice::from_ref(&l)),
                std::slice::from_ref(&l),
                "x_grad"
            ));
        }
        // Read before (or while) being written, or written by accumulation.
        let reader = OperatorDef::new("Scale", ["dx"], ["y"]);
        assert!(!steps_overwrite(
            &net(vec![reader, unit()], &links),
            &links,
            "x_grad"
        ));
        let inplace = OperatorDef::new("Sum", ["dx", "y"], ["dx"]);
        assert!(!steps_overwrite(
            &net(vec![inplace], &links),
            &links,
            "x_grad"
        ));
        let mut acc = OperatorDef::new("FCGradient", ["h", "w", "dy"], ["dw", "db", "dx"]);
        acc.arg.push(Argument {
            name: Some(fc::ACCUMULATE_ARG.into()),
            ints: vec![1],
            ..Default::default()
        });
        assert!(!steps_overwrite(&net(vec![acc], &links), &links, "x_grad"));
        // Nothing writes it.
        assert!(!steps_overwrite(&net(vec![], &links), &links, "x_grad"));
    }
}
