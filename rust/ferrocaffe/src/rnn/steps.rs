//! Step workspaces and the plain (one step net after another) way of running them.
//!
//! The scratch blob (the last output of `RecurrentNetwork`, an input of its gradient) holds a
//! [`WorkspaceStack`] of step workspaces, oldest first. They are children of one *shared*
//! workspace, itself a child of the op's workspace: blobs recomputed on the backward pass live
//! there, seen by every step.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::blas::{hold_constant, ConstantOperands};
use crate::err;
use crate::error::{Error, Result};
use crate::proto::NetDef;
use crate::tensor::Tensor;
use crate::workspace::{Blob, BlobHandle, OtherBlob, Workspace, WorkspaceStack};

/// The value of the scratch blob: the step workspaces (Caffe2's
/// `caffe2::detail::ScratchWorkspaces`, which is what `FetchBlob` names).
#[derive(Clone, Default)]
pub struct Scratch(pub Arc<Mutex<WorkspaceStack>>);

impl OtherBlob for Scratch {
    fn type_name(&self) -> &'static str {
        "caffe2::detail::ScratchWorkspaces"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Holds the tensors of the blobs `names` (an RNN op's parameters, which the step nets read at
/// every timestep) constant while the guard lives, so that products reuse their packed forms
/// ([`hold_constant`]). Blobs that are missing or hold no tensor are skipped: the step that
/// reads them reports it.
pub fn hold_params<'a>(
    ws: &Workspace,
    names: impl IntoIterator<Item = &'a str>,
) -> ConstantOperands {
    let snapshots = names
        .into_iter()
        .filter_map(|name| match &*ws.get_blob(name)?.read() {
            Blob::Tensor(t) => Some(t.snapshot()),
            _ => None,
        });
    hold_constant(snapshots)
}

/// A copy-on-write handle on the tensor in blob `h` (named `name` in the error).
pub fn read_tensor(h: &BlobHandle, name: &str) -> Result<Tensor> {
    match &*h.read() {
        Blob::Tensor(t) => Ok(t.clone()),
        other => Err(err!(
            DtypeMismatch: "blob {name} holds {}, expected a tensor",
            other.type_name()
        )),
    }
}

/// The tensor in blob `name` of `ws` (or an ancestor), as [`read_tensor`].
pub fn tensor_of(ws: &Workspace, name: &str) -> Result<Tensor> {
    read_tensor(&ws.blob(name)?, name)
}

/// The step workspaces a blob holds, if it holds some.
pub fn scratch_of(b: &Blob) -> Option<Arc<Mutex<WorkspaceStack>>> {
    match b {
        Blob::Other(o) => o.as_any().downcast_ref::<Scratch>().map(|s| s.0.clone()),
        Blob::Workspaces(s) => Some(s.clone()),
        _ => None,
    }
}

/// The stack in a scratch blob, creating an empty one in a blob that holds anything else.
pub fn stack_in(h: &BlobHandle) -> Arc<Mutex<WorkspaceStack>> {
    let mut b = h.write();
    if let Some(s) = scratch_of(&b) {
        return s;
    }
    let s = Scratch::default();
    *b = Blob::Other(Box::new(s.clone()));
    s.0
}

/// The stack in a scratch blob that the forward op must have filled.
pub fn existing_stack(h: &BlobHandle, name: &str) -> Result<Arc<Mutex<WorkspaceStack>>> {
    let b = h.read();
    scratch_of(&b).ok_or_else(|| {
        err!(
            DtypeMismatch: "blob {name} should hold the step workspaces of a RecurrentNetwork op, \
             found {}",
            b.type_name()
        )
    })
}

/// The shared workspace of a stack's step workspaces, if they belong to `op_ws`.
fn shared_of(st: &WorkspaceStack, op_ws: &Arc<Workspace>) -> Option<Arc<Workspace>> {
    let shared = st.workspaces.first()?.parent()?.clone();
    let ok = shared.parent().is_some_and(|p| Arc::ptr_eq(p, op_ws))
        && st
            .workspaces
            .iter()
            .all(|w| w.parent().is_some_and(|p| Arc::ptr_eq(p, &shared)));
    ok.then_some(shared)
}

/// At least `count` step workspaces (children of the shared workspace, made as needed) and the
/// shared workspace.
pub fn ensure_workspaces(
    stack: &Mutex<WorkspaceStack>,
    op_ws: &Arc<Workspace>,
    count: usize,
) -> (Arc<Workspace>, Vec<Arc<Workspace>>) {
    let mut st = stack.lock();
    let shared = match shared_of(&st, op_ws) {
        Some(s) => s,
        None => {
            st.workspaces.clear();
            Workspace::new_child(op_ws)
        }
    };
    while st.workspaces.len() < count {
        st.workspaces.push(Workspace::new_child(&shared));
    }
    st.top = st.workspaces.len();
    (shared, st.workspaces.clone())
}

/// Writes `t` (int32, shape `[1]`) into blob `name` of `ws` (created where `ws` creates it).
pub fn set_timestep(ws: &Workspace, name: &str, t: usize) -> Result<()> {
    let v = i32::try_from(t).map_err(|_| err!(Runtime: "timestep {t} does not fit int32"))?;
    let h = ws.create_blob(name);
    let mut b = h.write();
    match &mut *b {
        Blob::Tensor(x) if x.dims() == [1] => {
            if let Ok(s) = x.as_mut_slice::<i32>() {
                s[0] = v;
                return Ok(());
            }
        }
        _ => {}
    }
    *b = Blob::Tensor(Tensor::from_vec(&[1], vec![v])?);
    Ok(())
}

/// Runs `def` once in `ws` as timestep `t`: updates the timestep blob, then runs the net kept
/// in `ws` under the net's name (instantiated on first use).
pub fn run_step_net(ws: &Arc<Workspace>, def: &NetDef, timestep: &str, t: usize) -> Result<()> {
    set_timestep(ws, timestep, t)?;
    let net = match ws.get_net(def.name()) {
        Some(n) => n,
        None => ws.create_net(def, true)?,
    };
    let r = net.lock().run();
    r.map_err(|e| at_timestep(e, def.name(), t))
}

/// `e` with the step net and timestep appended (its kind kept where Caffe2 enforced it, see
/// [`Error::map_message`]).
pub fn at_timestep(e: Error, net: &str, t: usize) -> Error {
    e.map_message(|m| format!("{m} [recurrent step net '{net}', timestep {t}]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_are_grandchildren_of_the_op_workspace_and_reused() {
        let op_ws = Workspace::new();
        let h = op_ws.create_blob("scratch");
        let stack = stack_in(&h);
        assert_eq!(
            h.read().caffe2_type_name(),
            "caffe2::detail::ScratchWorkspaces"
        );
        let (shared, a) = ensure_workspaces(&stack, &op_ws, 3);
        assert_eq!(a.len(), 3);
        assert!(Arc::ptr_eq(a[1].parent().unwrap(), &shared));
        assert!(Arc::ptr_eq(shared.parent().unwrap(), &op_ws));
        let (shared2, b) = ensure_workspaces(&stack_in(&h), &op_ws, 2);
        assert!(Arc::ptr_eq(&shared, &shared2));
        assert_eq!(b.len(), 3);
        assert!(Arc::ptr_eq(&a[2], &b[2]));
        // Another op's workspace gets fresh ones.
        let other = Workspace::new();
        let (_, c) = ensure_workspaces(&stack, &other, 1);
        assert_eq!(c.len(), 1);
        assert!(!Arc::ptr_eq(&c[0], &a[0]));
    }

    #[test]
    fn timestep_blob_is_updated_in_place() {
        let ws = Workspace::new();
        set_timestep(&ws, "timestep", 4).unwrap();
        set_timestep(&ws, "timestep", 7).unwrap();
        let t = ws.fetch("timestep").unwrap();
        assert_eq!(t.dims(), &[1]);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[7]);
        let e = existing_stack(&ws.blob("timestep").unwrap(), "timestep")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("step workspaces"), "{e}");
    }
}
