//! `RecurrentNetwork`: runs `step_net` once per timestep of input 0 (`T x N x ...`).
//!
//! Before the steps, each recurrent state buffer (`recurrent_states[i]`, in the op's workspace)
//! becomes `(T + k) x N x D` with the initial value (input `initial_recurrent_state_ids[i]`:
//! `D` repeated over the batch, `N x D`, or `k x N x D`) in its first `k` rows. Step `t` runs in
//! step workspace `t` (forward-only nets, without a `backward_step_net`, cycle over
//! `num_workspaces` of them: 2, or 4 with the executor, which then keeps at most that many
//! timesteps in flight). Afterwards each alias output becomes a view of its buffer.
//!
//! Arguments: `step_net` (NetDef or text), `timestep` (blob name, default `timestep`),
//! `link_internal`/`link_external`/`link_offset`/`link_window`, `alias_src`/`alias_dst`/
//! `alias_offset`, `recurrent_states`, `initial_recurrent_state_ids`,
//! `recompute_blobs_on_backward` (created in the shared workspace, so every step sees one),
//! `backward_step_net` (its presence keeps one workspace per step for the gradient),
//! `num_workspaces`, `enable_rnn_executor`, `rnn_executor.num_threads`,
//! `rnn_executor.max_parallel_timesteps`. The last output holds the step workspaces.

use std::sync::Arc;

use super::config::{self, Alias, RecurrentInput};
use super::executor::RnnExecutor;
use super::steps::{self, tensor_of};
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::proto::NetDef;
use crate::tensor::{DataType, Tensor};
use crate::workspace::{Blob, Workspace};
use crate::{bail, err};

struct RecurrentNetwork {
    step_net: NetDef,
    timestep: String,
    aliases: Vec<Alias>,
    recurrent: Vec<RecurrentInput>,
    recompute: Vec<String>,
    has_backward: bool,
    num_workspaces: usize,
    max_parallel: usize,
    executor: Option<RnnExecutor>,
}

/// Reads the executor settings shared by the forward and the gradient op.
pub fn executor_for(
    init: &OpInit<'_>,
    net: &NetDef,
    timestep: &str,
) -> Result<Option<RnnExecutor>> {
    if !init.args.bool("enable_rnn_executor", false)? {
        return Ok(None);
    }
    let threads = init.args.int("rnn_executor.num_threads", 0)?.max(0) as usize;
    let max_par = init
        .args
        .int("rnn_executor.max_parallel_timesteps", -1)?
        .max(0) as usize;
    Ok(Some(RnnExecutor::new(
        net.clone(),
        timestep,
        threads,
        max_par,
    )))
}

/// Factory of `RecurrentNetwork`.
pub fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let mut step_net = config::net_arg(init, "step_net")?.ok_or_else(|| {
        err!(
            op = init,
            BadArgument: "Argument step_net must be specified (a NetDef or text)"
        )
    })?;
    let timestep = init.args.string("timestep", "timestep")?;
    let links = config::links(
        init,
        "link_internal",
        "link_external",
        "link_offset",
        Some("link_window"),
    )?;
    let aliases = config::aliases(init)?;
    let recurrent = config::recurrent_inputs(init)?;
    // The state buffers are shared by the forward and the backward pass.
    for r in &recurrent {
        init.ws.create_blob(&r.state);
    }
    if !step_net.external_input.contains(&timestep) {
        step_net.external_input.push(timestep.clone());
    }
    config::add_apply_link_ops(
        &links,
        &timestep,
        init.def.device_option.as_ref(),
        &mut step_net,
    );
    let executor = executor_for(init, &step_net, &timestep)?;
    let num_workspaces = init
        .args
        .int("num_workspaces", if executor.is_some() { 4 } else { 2 })?;
    if num_workspaces < 1 {
        bail!(op = init, BadArgument: "num_workspaces must be positive, got {num_workspaces}");
    }
    let max_parallel = init
        .args
        .int("rnn_executor.max_parallel_timesteps", -1)?
        .max(0) as usize;
    Ok(Box::new(RecurrentNetwork {
        step_net,
        timestep,
        aliases,
        recurrent,
        recompute: init.args.strings("recompute_blobs_on_backward")?,
        has_backward: config::has_net(init, "backward_step_net"),
        num_workspaces: num_workspaces as usize,
        max_parallel,
        executor,
    }))
}

/// Sizes the state buffer of `ri` to `(T + k) x N x D` and copies the initial value in.
pub fn init_recurrent_state(ws: &Workspace, ri: &RecurrentInput, t: usize, n: usize) -> Result<()> {
    let input = tensor_of(ws, &ri.input)?;
    let nd = input.ndim();
    if !(1..=3).contains(&nd) || input.dtype() == DataType::String {
        bail!(
            ShapeMismatch: "initial recurrent state {} must be a 1-3 dimensional numeric tensor, \
             got {:?} {}",
            ri.input,
            input.dims(),
            input.dtype()
        );
    }
    let d = input.dims()[nd - 1];
    let k = if nd == 3 { input.dims()[0] } else { 1 };
    if nd >= 2 && input.dims()[nd - 2] != n {
        bail!(
            ShapeMismatch: "initial recurrent state {} has batch size {}, the input sequence {n}",
            ri.input,
            input.dims()[nd - 2]
        );
    }
    let h = ws.create_blob(&ri.state);
    let mut b = h.write();
    let state = b.tensor_mut();
    state.reset(input.dtype(), &[t + k, n, d]);
    let src = input.bytes();
    let dst = state.bytes_mut();
    if nd >= 2 {
        dst[..src.len()].copy_from_slice(src);
    } else {
        for row in dst[..src.len() * n].chunks_exact_mut(src.len().max(1)) {
            row.copy_from_slice(src);
        }
    }
    Ok(())
}

/// Makes alias `a.dst` a view of `a.src` from row `a.offset` (negative: from the end).
pub fn apply_alias(ws: &Workspace, a: &Alias) -> Result<()> {
    let view = {
        let h = ws.blob(&a.src)?;
        let b = h.read();
        let src = b
            .tensor()
            .ok_or_else(|| err!(DtypeMismatch: "alias source {} holds no tensor", a.src))?;
        let rows = src.dims().first().copied().unwrap_or(0) as i64;
        let start = if a.offset >= 0 {
            a.offset
        } else {
            rows + a.offset
        };
        let count = rows - start;
        if count >= 1 && start >= 0 {
            super::link_ops::row_view(src, start, count)?
        } else if count == 0 {
            let mut dims = src.dims().to_vec();
            dims[0] = 0;
            Tensor::new(src.dtype(), &dims)
        } else {
            bail!(
                ShapeMismatch: "Invalid number of timesteps: alias {} of {} at offset {} (it has \
                 {rows} rows)",
                a.dst,
                a.src,
                a.offset
            );
        }
    };
    *ws.create_blob(&a.dst).write() = Blob::Tensor(view);
    Ok(())
}

impl Operator for RecurrentNetwork {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let ws: Arc<Workspace> = ctx.ws.clone();
        let (t_len, n) = {
            let x = match &*ctx.input_handle(0).read() {
                Blob::Tensor(t) => t.clone(),
                other => {
                    bail!(
                        op = ctx,
                        DtypeMismatch: "input {} holds {}, expected the input sequence",
                        ctx.input_name(0),
                        other.type_name()
                    )
                }
            };
            if x.ndim() < 2 {
                bail!(
                    op = ctx,
                    ShapeMismatch: "input {} must be T x N x ..., got shape {:?}",
                    ctx.input_name(0),
                    x.dims()
                );
            }
            (x.dims()[0], x.dims()[1])
        };
        for ri in &self.recurrent {
            init_recurrent_state(&ws, ri, t_len, n)?;
        }
        let stack = steps::stack_in(ctx.output_handle(ctx.num_outputs() - 1));
        let count = if self.has_backward {
            t_len
        } else {
            self.num_workspaces
        };
        let (shared, wss) = steps::ensure_workspaces(&stack, &ws, count);
        for b in &self.recompute {
            shared.create_blob(b);
        }
        let slot = |t: usize| {
            if self.has_backward {
                t
            } else {
                t % self.num_workspaces
            }
        };
        if let Some(ex) = &mut self.executor {
            let bound = if self.has_backward {
                self.max_parallel
            } else if self.max_parallel == 0 {
                self.num_workspaces
            } else {
                self.max_parallel.min(self.num_workspaces)
            };
            ex.set_max_parallel_timesteps(bound);
            for t in 0..t_len {
                ex.ensure_timestep(t, &wss[slot(t)])?;
            }
            ex.run(t_len, false)?;
        } else {
            for t in 0..t_len {
                steps::run_step_net(&wss[slot(t)], &self.step_net, &self.timestep, t)?;
            }
        }
        for a in &self.aliases {
            apply_alias(&ws, a)?;
        }
        Ok(())
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}
