//! RecurrentNetwork, RecurrentNetworkGradient and RecurrentNetworkBlobFetcher.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::net::Net;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::proto::NetDef;
use crate::tensor::{DataType, Tensor};
use crate::workspace::{Blob, BlobHandle, OtherBlob, Workspace};

/// Registers the ops.
pub fn register(r: &mut Registry) {
    r.cpu("RecurrentNetwork", |i| Ok(Box::new(Forward::new(i)?)));
    r.cpu("RecurrentNetworkGradient", |i| {
        Ok(Box::new(Backward::new(i)?))
    });
    r.cpu("RecurrentNetworkBlobFetcher", create_fetcher);
}

fn rt(msg: impl std::fmt::Display) -> Error {
    Error::Runtime(msg.to_string())
}

/// The step workspaces of one RecurrentNetwork op, kept in its last output blob and read by the
/// gradient op.
#[derive(Default)]
pub struct ScratchWorkspaces {
    /// Parent of the step workspaces (child of the op's workspace).
    pub shared: Option<Arc<Workspace>>,
    /// One workspace per timestep (cycled when there is no backward pass).
    pub steps: Vec<Arc<Workspace>>,
    /// Forward step nets, per step workspace.
    nets: Vec<Option<Net>>,
}

/// Shared handle on [`ScratchWorkspaces`] (the blob value).
#[derive(Clone, Default)]
pub struct Scratch(pub Arc<Mutex<ScratchWorkspaces>>);

impl OtherBlob for Scratch {
    fn type_name(&self) -> &'static str {
        "caffe2::detail::ScratchWorkspaces"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn scratch_of(h: &BlobHandle, create: bool) -> Result<Scratch> {
    let mut b = h.write();
    if let Blob::Other(o) = &*b {
        if let Some(s) = o.as_any().downcast_ref::<Scratch>() {
            return Ok(s.clone());
        }
    }
    if !create {
        return Err(rt(format!(
            "expected step workspaces, found {}",
            b.type_name()
        )));
    }
    let s = Scratch::default();
    *b = Blob::Other(Box::new(s.clone()));
    Ok(s)
}

/// internal blob = view of `window` rows of external at row `t + offset`.
#[derive(Clone, Debug)]
struct Link {
    internal: String,
    external: String,
    offset: i64,
    window: usize,
}

fn links(init: &OpInit<'_>, prefix: &str, with_window: bool) -> Result<Vec<Link>> {
    let a = &init.args;
    let internal = a.strings(&format!("{prefix}link_internal"))?;
    let external = a.strings(&format!("{prefix}link_external"))?;
    let offset = a.ints(&format!("{prefix}link_offset"));
    let window = if with_window {
        a.ints(&format!("{prefix}link_window"))
    } else {
        Vec::new()
    };
    if internal.len() != external.len() || internal.len() != offset.len() {
        return Err(init.err(format!(
            "{prefix}link_internal, _external and _offset must have one length"
        )));
    }
    if !window.is_empty() && window.len() != internal.len() {
        return Err(init.err("link_window must have the length of link_internal"));
    }
    Ok((0..internal.len())
        .map(|i| Link {
            internal: internal[i].clone(),
            external: external[i].clone(),
            offset: offset[i],
            window: window.get(i).map_or(1, |&w| w.max(1) as usize),
        })
        .collect())
}

fn apply_link(link: &Link, t: usize, ws: &Arc<Workspace>) -> Result<()> {
    let ext = ws.get_blob(&link.external).ok_or_else(|| {
        rt(format!(
            "link external blob {} does not exist",
            link.external
        ))
    })?;
    let view = {
        let b = ext.read();
        let src = b.tensor().ok_or_else(|| {
            rt(format!(
                "link external blob {} holds no tensor",
                link.external
            ))
        })?;
        let dims = src.dims();
        if dims.is_empty() {
            return Err(rt(format!(
                "link external blob {} must have dimensions",
                link.external
            )));
        }
        let row: usize = dims[1..].iter().product();
        let start = t as i64 + link.offset;
        if start < 0 || start as usize + link.window > dims[0] {
            return Err(rt(format!(
                "link {} -> {}: rows [{start}, {}) out of range for {dims:?}",
                link.external,
                link.internal,
                start + link.window as i64
            )));
        }
        let mut vd = vec![link.window];
        vd.extend_from_slice(&dims[1..]);
        src.view(start as usize * row, &vd)?
    };
    *ws.create_blob(&link.internal).write() = Blob::Tensor(view);
    Ok(())
}

fn set_timestep(ws: &Workspace, name: &str, t: usize) {
    *ws.create_blob(name).write() =
        Blob::Tensor(Tensor::from_vec(&[1], vec![t as i32]).unwrap_or_default());
}

/// `def` with every op input/output (and external input/output) named `from` renamed `to`.
fn rename(def: &NetDef, from: &str, to: &str) -> NetDef {
    let mut d = def.clone();
    let fix = |v: &mut Vec<String>| {
        for s in v.iter_mut() {
            if s == from {
                *s = to.to_string();
            }
        }
    };
    for op in &mut d.op {
        fix(&mut op.input);
        fix(&mut op.output);
    }
    fix(&mut d.external_input);
    fix(&mut d.external_output);
    d
}

fn tensor_of(ws: &Workspace, name: &str) -> Result<Tensor> {
    ws.fetch(name)
}

/// Arguments shared by the forward and gradient ops.
struct Common {
    step_net: NetDef,
    links: Vec<Link>,
    /// (state buffer, initial state input name)
    states: Vec<(String, String)>,
    /// (src state buffer, dst output, offset)
    aliases: Vec<(String, String, i64)>,
    timestep: String,
    executor: bool,
}

impl Common {
    fn new(init: &OpInit<'_>, first_input: usize) -> Result<Common> {
        let a = &init.args;
        let step_net = a
            .net("step_net")
            .ok_or_else(|| init.err("step_net must be given"))?
            .clone();
        let recurrent = a.strings("recurrent_states")?;
        let ids = a.ints("initial_recurrent_state_ids");
        if recurrent.len() != ids.len() {
            return Err(
                init.err("recurrent_states and initial_recurrent_state_ids differ in length")
            );
        }
        let mut states = Vec::new();
        for (s, &i) in recurrent.iter().zip(&ids) {
            let name = usize::try_from(i)
                .ok()
                .and_then(|i| init.def.input.get(first_input + i))
                .ok_or_else(|| init.err(format!("initial state input {i} does not exist")))?;
            states.push((s.clone(), name.clone()));
        }
        let src = a.strings("alias_src")?;
        let dst = a.strings("alias_dst")?;
        let off = a.ints("alias_offset");
        if src.len() != dst.len() || src.len() != off.len() {
            return Err(init.err("alias_src, alias_dst and alias_offset differ in length"));
        }
        Ok(Common {
            step_net,
            links: links(init, "", true)?,
            states,
            aliases: (0..src.len())
                .map(|i| (src[i].clone(), dst[i].clone(), off[i]))
                .collect(),
            timestep: a.string("timestep", "timestep")?,
            executor: a.bool("enable_rnn_executor", true)?,
        })
    }

    fn timestep_name(&self, t: usize) -> String {
        if self.executor {
            format!("{}_rnnexec_t{t}", self.timestep)
        } else {
            self.timestep.clone()
        }
    }

    /// The step net for timestep t (timestep input renamed under the executor).
    fn step_def(&self, def: &NetDef, t: usize) -> NetDef {
        if self.executor {
            let mut d = rename(def, &self.timestep, &self.timestep_name(t));
            d.name = Some(format!("{}_rnnexec_t{t}", def.name()));
            d
        } else {
            def.clone()
        }
    }
}

struct Forward {
    c: Common,
    has_backward: bool,
}

impl Forward {
    fn new(init: &OpInit<'_>) -> Result<Forward> {
        let has_backward = init.args.net("backward_step_net").is_some();
        Ok(Forward {
            c: Common::new(init, 0)?,
            has_backward,
        })
    }
}

impl Operator for Forward {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let ws = ctx.ws;
        let x = tensor_of(ws, ctx.input_name(0))?;
        if x.ndim() < 2 {
            return Err(rt(format!(
                "the sequence input must be [T, N, ...], got {:?}",
                x.dims()
            )));
        }
        let (seq_len, batch) = (x.dims()[0], x.dims()[1]);
        // State buffers [T + initial, N, D] holding the initial states.
        for (state, input) in &self.c.states {
            let init = tensor_of(ws, input)?;
            if init.ndim() < 1 || init.ndim() > 3 {
                return Err(rt(format!(
                    "initial state {input} must have 1 to 3 dimensions"
                )));
            }
            let d = init.dims()[init.ndim() - 1];
            let init_len = if init.ndim() == 3 { init.dims()[0] } else { 1 };
            let mut buf = Tensor::new(DataType::Float, &[seq_len + init_len, batch, d]);
            {
                let src = init.as_slice::<f32>()?;
                let dst = buf.as_mut_slice::<f32>()?;
                if init.ndim() >= 2 {
                    if init.dims()[init.ndim() - 2] != batch {
                        return Err(rt(format!(
                            "initial state {input} must have batch size {batch}"
                        )));
                    }
                    dst[..src.len()].copy_from_slice(src);
                } else {
                    for b in 0..batch {
                        dst[b * d..(b + 1) * d].copy_from_slice(src);
                    }
                }
            }
            ws.feed(state, buf);
        }
        let scratch = scratch_of(ctx.output_handle(ctx.num_outputs() - 1), true)?;
        let mut sc = scratch.0.lock();
        let shared = match &sc.shared {
            Some(s) => s.clone(),
            None => {
                let s = Workspace::new_child(ws);
                sc.shared = Some(s.clone());
                s
            }
        };
        let n_ws = if self.has_backward {
            seq_len
        } else if self.c.executor {
            4
        } else {
            2
        };
        while sc.steps.len() < n_ws {
            sc.steps.push(Workspace::new_child(&shared));
            sc.nets.push(None);
        }
        for t in 0..seq_len {
            let k = if self.has_backward { t } else { t % n_ws };
            let step_ws = sc.steps[k].clone();
            for link in &self.c.links {
                apply_link(link, t, &step_ws)?;
            }
            set_timestep(&step_ws, &self.c.timestep_name(t), t);
            let def = self.c.step_def(&self.c.step_net, t);
            let stale = sc.nets[k].as_ref().is_none_or(|n| n.name() != def.name());
            if stale {
                sc.nets[k] = Some(Net::new(&def, &step_ws)?);
            }
            if let Some(net) = &mut sc.nets[k] {
                net.run()?;
            }
        }
        drop(sc);
        for (src, dst, offset) in &self.c.aliases {
            let s = ws.blob(src)?;
            let view = {
                let b = s.read();
                let st = b
                    .tensor()
                    .ok_or_else(|| rt(format!("alias source {src} holds no tensor")))?;
                let rows = st.dims().first().copied().unwrap_or(0) as i64;
                let start = if *offset >= 0 { *offset } else { rows + offset };
                let n = rows - start;
                if start < 0 || n < 1 {
                    return Err(rt(format!(
                        "Invalid offset {offset} for alias {dst} of {src}"
                    )));
                }
                let row: usize = st.dims()[1..].iter().product();
                let mut d = st.dims().to_vec();
                d[0] = n as usize;
                st.view(start as usize * row, &d)?
            };
            *ws.create_blob(dst).write() = Blob::Tensor(view);
        }
        Ok(())
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}

struct Param {
    grad: String,
    cell_grad: String,
}

struct Backward {
    c: Common,
    step_net: NetDef,
    back_links: Vec<Link>,
    n_grad_inputs: usize,
    params: Vec<Param>,
    /// (state buffer grad, external "all" grad input, offset, external "last" grad input)
    state_grads: Vec<(String, Option<String>, i64, Option<String>)>,
    n_sequences: usize,
    recurrent_ids: Vec<usize>,
    param_ids: Vec<usize>,
    /// Backward step workspace (child of the forward one) and net, per timestep.
    nets: HashMap<usize, (Arc<Workspace>, Net)>,
}

impl Backward {
    fn new(init: &OpInit<'_>) -> Result<Backward> {
        let a = &init.args;
        let grad_inputs: Vec<usize> = a
            .ints("outputs_with_grads")
            .iter()
            .map(|&v| v.max(0) as usize)
            .collect();
        let n_grad_inputs = grad_inputs.len();
        let c = Common::new(init, n_grad_inputs)?;
        let mut step_net = a
            .net("backward_step_net")
            .ok_or_else(|| init.err("backward_step_net must be given"))?
            .clone();
        let param_ids = a.ints("param");
        let param_grads = a.strings("param_grads")?;
        let recurrent_ids: Vec<usize> = a
            .ints("initial_recurrent_state_ids")
            .iter()
            .map(|&v| v.max(0) as usize)
            .collect();
        let n_out = init.num_outputs();
        let n_sequences = n_out
            .checked_sub(param_ids.len() + recurrent_ids.len())
            .ok_or_else(|| init.err("too few outputs for the parameters and recurrent inputs"))?;
        let mut params = Vec::new();
        for i in 0..param_ids.len() {
            let grad = init
                .def
                .output
                .get(i + n_sequences)
                .ok_or_else(|| init.err("missing parameter gradient output"))?
                .clone();
            let blob = param_grads.get(i).cloned().unwrap_or_else(|| grad.clone());
            let cell_grad = format!("{blob}_tmpstep");
            step_net = rename(&step_net, &blob, &cell_grad);
            params.push(Param { grad, cell_grad });
        }
        let recurrent = a.strings("recurrent_states")?;
        let alias_src = a.strings("alias_src")?;
        let offsets = a.ints("alias_offset");
        let mut state_grads = Vec::new();
        for r in &recurrent {
            let mut all = None;
            let mut last = None;
            let mut off = 0;
            for (j, src) in alias_src.iter().enumerate() {
                if src != r {
                    continue;
                }
                let Some(k) = grad_inputs.iter().position(|&g| g == j) else {
                    continue;
                };
                let name = init.def.input.get(k).cloned().unwrap_or_default();
                match offsets.get(j) {
                    Some(1) => {
                        all = Some(name);
                        off = 1;
                    }
                    Some(-1) => last = Some(name),
                    other => {
                        return Err(init.err(format!(
                            "alias offset {other:?} has no gradient rule (1 or -1)"
                        )))
                    }
                }
            }
            state_grads.push((format!("{r}_grad"), all, off, last));
        }
        Ok(Backward {
            c,
            step_net,
            back_links: links(init, "backward_", false)?,
            n_grad_inputs,
            params,
            state_grads,
            n_sequences,
            recurrent_ids,
            param_ids: param_ids.iter().map(|&v| v.max(0) as usize).collect(),
            nets: HashMap::new(),
        })
    }
}

fn add_rows(dst: &mut Tensor, row_start: usize, src: &[f32]) -> Result<()> {
    let d = dst.as_mut_slice::<f32>()?;
    let at = row_start;
    if at + src.len() > d.len() {
        return Err(rt("gradient accumulation out of range"));
    }
    for (o, v) in d[at..at + src.len()].iter_mut().zip(src) {
        *o += v;
    }
    Ok(())
}

impl Operator for Backward {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let ws = ctx.ws.clone();
        let g0 = self.n_grad_inputs;
        let x = tensor_of(&ws, ctx.input_name(g0))?;
        let seq_len = *x
            .dims()
            .first()
            .ok_or_else(|| rt("the sequence input must not be 0-d"))?;
        let scratch = scratch_of(ctx.input_handle(ctx.num_inputs() - 1), false)?;
        let steps: Vec<Arc<Workspace>> = scratch.0.lock().steps.clone();
        if steps.len() < seq_len {
            return Err(rt(format!(
                "the forward pass kept {} step workspaces for {seq_len} timesteps",
                steps.len()
            )));
        }
        // Parameter gradients start at zero.
        for (p, &pid) in self.params.iter().zip(&self.param_ids) {
            let dims = tensor_of(&ws, ctx.input_name(g0 + pid))?.dims().to_vec();
            ws.feed(&p.grad, Tensor::new(DataType::Float, &dims));
        }
        // State gradients: shaped like the state buffers, zero.
        for ((grad, _, _, last), (state, _)) in self.state_grads.iter().zip(&self.c.states) {
            let st = tensor_of(&ws, state)?;
            let mut g = Tensor::new(DataType::Float, st.dims());
            if let Some(l) = last {
                let lg = tensor_of(&ws, l)?;
                let row: usize = st.dims()[1..].iter().product();
                add_rows(&mut g, seq_len * row, lg.as_slice::<f32>()?)?;
            }
            ws.feed(grad, g);
        }
        // Sequence input gradients, shaped like the inputs.
        for i in 0..self.n_sequences {
            let input = tensor_of(&ws, ctx.input_name(g0 + i))?;
            ws.feed(
                ctx.output_name(i),
                Tensor::new(DataType::Float, input.dims()),
            );
        }
        let all_links: Vec<Link> = self
            .c
            .links
            .iter()
            .chain(&self.back_links)
            .cloned()
            .collect();
        for t in (0..seq_len).rev() {
            // g[t + offset] += dOutput[t]
            for (grad, all, off, _) in &self.state_grads {
                let Some(all) = all else { continue };
                let og = tensor_of(&ws, all)?;
                let row: usize = og.dims()[1..].iter().product();
                let src = &og.as_slice::<f32>()?[t * row..(t + 1) * row];
                let h = ws.blob(grad)?;
                let mut b = h.write();
                add_rows(b.tensor_mut(), (t as i64 + off) as usize * row, src)?;
            }
            if !self.nets.contains_key(&t) {
                let b = Workspace::new_child(&steps[t]);
                for link in &all_links {
                    apply_link(link, t, &b)?;
                }
                let def = self.c.step_def(&self.step_net, t);
                let net = Net::new(&def, &b)?;
                self.nets.insert(t, (b, net));
            }
            let (bws, net) = self
                .nets
                .get_mut(&t)
                .ok_or_else(|| rt("backward step net missing"))?;
            let bws = bws.clone();
            for link in &all_links {
                apply_link(link, t, &bws)?;
            }
            net.run()?;
            for p in &self.params {
                let g = tensor_of(&bws, &p.cell_grad)?;
                let h = ws.blob(&p.grad)?;
                let mut b = h.write();
                add_rows(b.tensor_mut(), 0, g.as_slice::<f32>()?)?;
            }
        }
        // Gradients of the initial states: the first rows of the state gradients.
        for (i, &rid) in self.recurrent_ids.iter().enumerate() {
            let out = self.n_sequences + self.params.len() + i;
            let input = tensor_of(&ws, ctx.input_name(g0 + rid))?;
            let g = tensor_of(&ws, &self.state_grads[i].0)?;
            let gs = g.as_slice::<f32>()?;
            let n = input.numel();
            let value = if input.ndim() >= 2 {
                Tensor::from_slice(input.dims(), &gs[..n])?
            } else {
                let batch = g.dims().get(1).copied().unwrap_or(1);
                let mut acc = vec![0f32; n];
                for b in 0..batch {
                    for (a, v) in acc.iter_mut().zip(&gs[b * n..(b + 1) * n]) {
                        *a += v;
                    }
                }
                Tensor::from_vec(input.dims(), acc)?
            };
            ws.feed(ctx.output_name(out), value);
        }
        Ok(())
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}

struct Fetcher {
    prefix: String,
}

impl Operator for Fetcher {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let scratch = scratch_of(ctx.input_handle(0), false)?;
        let steps: Vec<Arc<Workspace>> = scratch.0.lock().steps.clone();
        let mut names = Vec::new();
        for (i, sw) in steps.iter().enumerate() {
            for name in sw.local_blob_names() {
                let t = tensor_of(sw, &name)?;
                let new_name = format!("{}_{name}{i}", self.prefix);
                ctx.ws.feed(&new_name, t.deep_copy());
                names.push(new_name.into_bytes());
            }
        }
        let n = names.len();
        *ctx.output_handle(0).write() = Blob::Tensor(Tensor::from_strings(&[n], names)?);
        Ok(())
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}

fn create_fetcher(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Fetcher {
        prefix: init.args.string("prefix", "rnn")?,
    }))
}
