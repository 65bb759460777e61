//! Operators that run nested nets (`If`, `While`, `Do`) and the scope ops that manage the
//! workspace stacks of `Do` (`CreateScope`, `HasScope`).
//!
//! `If` and `While` run their nets in the op's own workspace (nets instantiated when the op is).
//! `Do` runs its net in a child workspace taken from the workspace stack held in its last
//! input/output blob; that workspace sees only the bound blobs (`inner_blobs[k]` is the outer
//! blob `outer_blobs_idx[k]` of the op's inputs and outputs, the stack blob excluded, inputs
//! first). These ops lock no blobs around their run: the nested ops lock their own.

use std::sync::Arc;

use parking_lot::Mutex;

use super::Net;
use crate::error::{Error, Result};
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::proto::NetDef;
use crate::tensor::DataType;
use crate::workspace::{Blob, BlobHandle, Workspace, WorkspaceStack};

/// Registers the control ops.
pub fn register(r: &mut Registry) {
    r.cpu("If", create_if);
    r.cpu("While", create_while);
    r.cpu("Do", create_do);
    r.cpu("CreateScope", create_create_scope);
    r.cpu("HasScope", create_has_scope);
}

fn read_condition(h: &BlobHandle, op: &str) -> Result<bool> {
    let b = h.read();
    let t = b.tensor().ok_or_else(|| {
        Error::DtypeMismatch(format!(
            "Invalid condition in {op} operator: tensor expected"
        ))
    })?;
    if t.numel() != 1 {
        return Err(Error::ShapeMismatch(format!(
            "Invalid condition tensor in {op} operator: single value expected, got {} values",
            t.numel()
        )));
    }
    let v = t
        .as_slice::<bool>()
        .map_err(|e| Error::DtypeMismatch(format!("Invalid condition in {op} operator: {e}")))?;
    Ok(v[0])
}

fn nested_net(init: &OpInit<'_>, arg: &str, required: bool) -> Result<Option<Net>> {
    match init.args.net(arg) {
        Some(def) => Ok(Some(Net::new(def, init.ws)?)),
        None if required => Err(init.err(format!(
            "{arg} must be specified in {} operator",
            init.def.r#type()
        ))),
        None => Ok(None),
    }
}

struct IfOp {
    then_net: Net,
    else_net: Option<Net>,
}

impl Operator for IfOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        if read_condition(ctx.input_handle(0), "If")? {
            self.then_net.run()
        } else if let Some(n) = &mut self.else_net {
            n.run()
        } else {
            Ok(())
        }
    }
    fn locks_blobs(&self) -> bool {
        false
    }
}

fn create_if(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    if init.num_inputs() == 0 {
        return Err(init.err("If needs a condition input"));
    }
    let then_net = nested_net(init, "then_net", true)?.ok_or_else(|| init.err("no then_net"))?;
    let else_net = nested_net(init, "else_net", false)?;
    Ok(Box::new(IfOp { then_net, else_net }))
}

struct WhileOp {
    loop_net: Net,
    cond_net: Option<Net>,
}

impl Operator for WhileOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        loop {
            if let Some(c) = &mut self.cond_net {
                c.run()?;
            }
            if !read_condition(ctx.input_handle(0), "While")? {
                return Ok(());
            }
            self.loop_net.run()?;
        }
    }
    fn locks_blobs(&self) -> bool {
        false
    }
}

fn create_while(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    if init.num_inputs() == 0 {
        return Err(init.err("While needs a condition input"));
    }
    let loop_net = nested_net(init, "loop_net", true)?.ok_or_else(|| init.err("no loop_net"))?;
    let cond_net = nested_net(init, "cond_net", false)?;
    Ok(Box::new(WhileOp { loop_net, cond_net }))
}

struct DoOp {
    net: NetDef,
    bindings: Vec<(String, String)>,
    inner: Vec<String>,
    is_gradient: bool,
    reuse_workspace: bool,
    copy_external_blobs: bool,
}

fn stack_of(h: &BlobHandle) -> Arc<Mutex<WorkspaceStack>> {
    let mut b = h.write();
    match &*b {
        Blob::Workspaces(s) => s.clone(),
        _ => {
            let s = Arc::new(Mutex::new(WorkspaceStack::default()));
            *b = Blob::Workspaces(s.clone());
            s
        }
    }
}

impl Operator for DoOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let parent = ctx.ws;
        let stack = stack_of(ctx.output_handle(ctx.num_outputs() - 1));
        let net_ws = {
            let mut st = stack.lock();
            if self.is_gradient {
                if st.top == 0 {
                    return Err(ctx.err("Empty workspace stack in popGradientWorkspace"));
                }
                let ws = st.workspaces[st.top - 1].clone();
                ws.add_blob_mapping(parent, &self.bindings, true)?;
                st.top -= 1;
                ws
            } else if self.reuse_workspace && st.top > 0 {
                let ws = st.workspaces[st.top - 1].clone();
                ws.add_blob_mapping(parent, &self.bindings, false)?;
                ws
            } else if st.workspaces.len() > st.top {
                let ws = st.workspaces[st.top].clone();
                ws.add_blob_mapping(parent, &self.bindings, false)?;
                st.top += 1;
                ws
            } else {
                let ws = Workspace::new_forwarding(parent, &self.bindings)?;
                st.workspaces.push(ws.clone());
                st.top += 1;
                ws
            }
        };
        let net = match net_ws.get_net(self.net.name()) {
            Some(n) => n,
            None => net_ws.create_net(&self.net, true)?,
        };
        net.lock().run()?;
        if !self.is_gradient && self.copy_external_blobs {
            net_ws.copy_forwarded_tensors(&self.inner)?;
        }
        Ok(())
    }
    fn locks_blobs(&self) -> bool {
        false
    }
}

fn create_do(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let def = init.def;
    let net = init
        .args
        .net("net")
        .ok_or_else(|| init.err("net must be specified in Do operator"))?
        .clone();
    let is_gradient = def.is_gradient_op();
    let reuse_workspace = init.args.bool("reuse_workspace", false)?;
    let copy_external_blobs = init.args.bool("copy_external_blobs", false)?;
    if is_gradient && reuse_workspace {
        return Err(init.err("Gradient Do op requires use of stacked workspaces"));
    }
    if copy_external_blobs && reuse_workspace {
        return Err(init.err("Reuse workspace and copy external blobs options are not compatible"));
    }
    if def.input.is_empty() || def.output.is_empty() {
        return Err(init.err("Do needs the workspace stack blob as its last input and output"));
    }
    let inner = init.args.strings("inner_blobs")?;
    let idx = init.args.ints("outer_blobs_idx");
    if inner.len() != idx.len() {
        return Err(init.err("Invalid blob bindings: different inner/outer blobs lengths"));
    }
    let outer_names: Vec<&String> = def.input[..def.input.len() - 1]
        .iter()
        .chain(def.output[..def.output.len() - 1].iter())
        .collect();
    let mut bindings = Vec::new();
    let mut used: Vec<&String> = Vec::new();
    for (name, &k) in inner.iter().zip(&idx) {
        if bindings.iter().any(|(i, _): &(String, String)| i == name) {
            return Err(init.err(format!(
                "Invalid blob bindings: redefinition of inner blob {name}"
            )));
        }
        let outer = usize::try_from(k)
            .ok()
            .and_then(|k| outer_names.get(k))
            .ok_or_else(|| {
                init.err(format!(
                    "Invalid blob bindings: outer blob index ({k}, inner name: {name}) is out of bounds [0, {})",
                    outer_names.len()
                ))
            })?;
        if used.contains(outer) {
            return Err(init.err(format!("Reusage of outer blob name: {outer}")));
        }
        used.push(outer);
        bindings.push((name.clone(), (*outer).clone()));
    }
    let mut all: Vec<&String> = outer_names.clone();
    all.sort();
    all.dedup();
    if all.len() != used.len() {
        return Err(init.err("All outer blob names must be used in blob bindings"));
    }
    Ok(Box::new(DoOp {
        net,
        bindings,
        inner,
        is_gradient,
        reuse_workspace,
        copy_external_blobs,
    }))
}

struct CreateScopeOp;

impl Operator for CreateScopeOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        *ctx.output_blob(0)? = Blob::Workspaces(Arc::new(Mutex::new(WorkspaceStack::default())));
        Ok(())
    }
}

fn create_create_scope(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(CreateScopeOp))
}

struct HasScopeOp;

impl Operator for HasScopeOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let has = match ctx.input_blob(0)? {
            Blob::Workspaces(s) => !s.lock().is_empty(),
            other => {
                return Err(ctx.err(format!(
                    "HasScope expects a workspace stack in '{}', found {}",
                    ctx.input_name(0),
                    other.type_name()
                )))
            }
        };
        let out = ctx.output(0)?;
        out.reset(DataType::Bool, &[1]);
        out.as_mut_slice::<bool>()?[0] = has;
        Ok(())
    }
}

fn create_has_scope(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(HasScopeOp))
}
