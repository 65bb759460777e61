//! The operator contract: what a kernel sees when it is created ([`OpInit`]) and when it runs
//! ([`OpContext`]).
//!
//! An operator is instantiated once per net (its factory reads and checks the arguments) and
//! then `run()` many times. While `run` executes, the net holds the blob locks: read locks on the
//! inputs and write locks on the outputs (an input that is also an output is reached through the
//! output's write lock). Ops that run nested nets opt out with [`Operator::locks_blobs`].

use std::sync::Arc;

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

use super::args::{display_name, Args};
use crate::blas::GemmContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::proto::OperatorDef;
use crate::tensor::Tensor;
use crate::workspace::{Blob, BlobHandle, Workspace};

/// A kernel instance.
pub trait Operator: Send {
    /// Runs the op once.
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()>;

    /// Whether the net should lock this op's blobs around [`run`](Self::run) (the default).
    /// Ops that run nested nets over the same blobs return false and lock what they need.
    fn locks_blobs(&self) -> bool {
        true
    }

    /// Asks the op to apply `Relu` to its first output itself, at the end of each run: the
    /// net calls it for an in-place `Relu` that follows the op, and drops that `Relu` when the
    /// op answers true (the default answers false: the `Relu` runs as an op of its own).
    fn fuse_relu(&mut self) -> bool {
        false
    }
}

/// A closure-backed operator, for simple kernels: `Box::new(FnOp(move |ctx| ...))`.
pub struct FnOp<F>(pub F);

impl<F> Operator for FnOp<F>
where
    F: FnMut(&mut OpContext<'_>) -> Result<()> + Send,
{
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        (self.0)(ctx)
    }
}

/// What a factory sees when the op is instantiated.
pub struct OpInit<'a> {
    /// The definition (net-level device option already applied).
    pub def: &'a OperatorDef,
    /// The workspace the op belongs to.
    pub ws: &'a Arc<Workspace>,
    /// Typed argument access.
    pub args: Args<'a>,
    /// The device the op runs on (from its device option; CPU-like types run on the host).
    pub device: Device,
}

impl<'a> OpInit<'a> {
    /// For `def` in `ws`, on the device its device option names (the host when that device
    /// is not one ops can run on; [`OpInit::on`] takes a device already checked).
    pub fn new(def: &'a OperatorDef, ws: &'a Arc<Workspace>) -> Self {
        let device = Device::of_option(def.device_option.as_ref()).unwrap_or_default();
        Self::on(def, ws, device)
    }

    /// For `def` in `ws`, running on `device`.
    pub fn on(def: &'a OperatorDef, ws: &'a Arc<Workspace>, device: Device) -> Self {
        OpInit {
            def,
            ws,
            args: Args::new(def),
            device,
        }
    }

    /// An error naming this op.
    pub fn err(&self, msg: impl std::fmt::Display) -> Error {
        op_error(self.def, msg)
    }

    /// Number of inputs.
    pub fn num_inputs(&self) -> usize {
        self.def.input.len()
    }

    /// Number of outputs.
    pub fn num_outputs(&self) -> usize {
        self.def.output.len()
    }

    /// The random seed of the op's device option, if set.
    pub fn random_seed(&self) -> Option<u32> {
        self.def.device_option.as_ref().and_then(|d| d.random_seed)
    }
}

/// `msg` followed by which op raised it.
pub fn op_error(def: &OperatorDef, msg: impl std::fmt::Display) -> Error {
    Error::Runtime(op_message(def, msg))
}

/// An error a kernel returned, with the op that raised it appended; an enforced kind (shape,
/// dtype, out of memory, ...) stays that kind ([`Error::map_message`]). An enforced kind also
/// starts with Caffe2's `[enforce fail at ...]` marker (naming the op type where Caffe2 named
/// its C++ source line), once: an error passed up through nested nets is marked by the
/// innermost op only.
pub fn op_failed(def: &OperatorDef, e: Error) -> Error {
    let enforced = e.kind().is_enforce_not_met();
    e.map_message(|m| {
        if enforced && !m.starts_with(ENFORCE_MARK) {
            op_message(def, format!("{ENFORCE_MARK}{} operator] {m}", def.r#type()))
        } else {
            op_message(def, m)
        }
    })
}

/// How Caffe2's `EnforceNotMet` messages began (`[enforce fail at file:line] ...`); code and
/// tests written for Caffe2 look for it.
const ENFORCE_MARK: &str = "[enforce fail at ";

fn op_message(def: &OperatorDef, msg: impl std::fmt::Display) -> String {
    format!(
        "{msg} (Error from operator: type {}, name {}, inputs [{}], outputs [{}])",
        def.r#type(),
        display_name(def),
        def.input.join(", "),
        def.output.join(", ")
    )
}

/// How an input is reached while the op runs.
pub(crate) enum InSlot<'a> {
    Read(RwLockReadGuard<'a, Blob>),
    /// The same blob as output `k`.
    Output(usize),
    /// The same blob as an earlier input.
    Input(usize),
    /// Not locked (ops that lock by themselves).
    Unlocked,
}

/// What a kernel sees while it runs: its blobs (locked), its workspace, its device and how it
/// runs matrix products.
pub struct OpContext<'a> {
    /// The workspace the op runs in.
    pub ws: &'a Arc<Workspace>,
    /// The op's definition.
    pub def: &'a OperatorDef,
    /// The device the op runs on.
    pub device: Device,
    /// How the op's matrix products run ([`crate::blas::GemmContext::sgemm`]).
    pub gemm: GemmContext,
    /// The device backend's per-device handles (stream, BLAS handle) for ops on a device;
    /// `None` on the host.
    pub handles: Option<&'a (dyn std::any::Any + Send + Sync)>,
    pub(crate) in_handles: &'a [BlobHandle],
    pub(crate) out_handles: &'a [BlobHandle],
    pub(crate) ins: SmallVec<[InSlot<'a>; 4]>,
    pub(crate) outs: SmallVec<[Option<RwLockWriteGuard<'a, Blob>>; 2]>,
}

impl<'a> OpContext<'a> {
    /// An error naming this op.
    pub fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Runtime(msg.to_string())
    }

    /// Number of inputs.
    pub fn num_inputs(&self) -> usize {
        self.in_handles.len()
    }

    /// Number of outputs.
    pub fn num_outputs(&self) -> usize {
        self.out_handles.len()
    }

    /// Name of input `i`.
    pub fn input_name(&self, i: usize) -> &str {
        self.def.input.get(i).map(String::as_str).unwrap_or("?")
    }

    /// Name of output `j`.
    pub fn output_name(&self, j: usize) -> &str {
        self.def.output.get(j).map(String::as_str).unwrap_or("?")
    }

    /// The handle of input `i` (for ops that lock by themselves).
    pub fn input_handle(&self, i: usize) -> &BlobHandle {
        &self.in_handles[i]
    }

    /// The handle of output `j` (for ops that lock by themselves).
    pub fn output_handle(&self, j: usize) -> &BlobHandle {
        &self.out_handles[j]
    }

    /// Whether input `i` and output `j` are the same blob.
    #[inline]
    pub fn is_inplace(&self, i: usize, j: usize) -> bool {
        match (self.in_handles.get(i), self.out_handles.get(j)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    fn out_slot(&self, j: usize) -> usize {
        // A repeated output shares the guard of its first occurrence.
        let Some(h) = self.out_handles.get(j) else {
            return j;
        };
        self.out_handles
            .iter()
            .position(|o| Arc::ptr_eq(o, h))
            .unwrap_or(j)
    }

    /// The blob of input `i`.
    #[inline]
    pub fn input_blob(&self, i: usize) -> Result<&Blob> {
        if i >= self.in_handles.len() {
            return Err(Error::Schema(format!(
                "the op has {} input(s); input {i} was expected",
                self.in_handles.len()
            )));
        }
        let mut k = i;
        loop {
            match self.ins.get(k) {
                Some(InSlot::Read(g)) => return Ok(g),
                Some(InSlot::Output(j)) => {
                    return match self.outs.get(*j).and_then(|o| o.as_deref()) {
                        Some(b) => Ok(b),
                        None => Err(self.err("internal: output guard missing")),
                    }
                }
                Some(InSlot::Input(e)) => k = *e,
                Some(InSlot::Unlocked) | None => {
                    return Err(self.err(format!(
                        "input {i} ('{}') is not locked for this op",
                        self.input_name(i)
                    )))
                }
            }
        }
    }

    /// The tensor of input `i`, with an error naming the blob when it holds something else.
    #[inline]
    pub fn input(&self, i: usize) -> Result<&Tensor> {
        let b = self.input_blob(i)?;
        b.tensor().ok_or_else(|| {
            self.err(format!(
                "input {i} ('{}') holds {}, expected a tensor",
                self.input_name(i),
                b.type_name()
            ))
        })
    }

    /// The blob of output `j`, for writing.
    pub fn output_blob(&mut self, j: usize) -> Result<&mut Blob> {
        if j >= self.out_handles.len() {
            return Err(Error::Schema(format!(
                "the op has {} output(s); output {j} was expected",
                self.out_handles.len()
            )));
        }
        let k = self.out_slot(j);
        match self.outs.get_mut(k).and_then(|o| o.as_deref_mut()) {
            Some(b) => Ok(b),
            None => Err(Error::Schema(format!(
                "output {j} ('{}') is not locked for this op",
                self.def.output.get(j).map(String::as_str).unwrap_or("?")
            ))),
        }
    }

    /// The tensor of output `j` (a blob holding anything else becomes an empty tensor).
    pub fn output(&mut self, j: usize) -> Result<&mut Tensor> {
        Ok(self.output_blob(j)?.tensor_mut())
    }

    /// Splits the context into read access to the inputs that are not also outputs, and write
    /// access to the outputs, so a kernel can read the former while writing the latter.
    pub fn split(&mut self) -> (Inputs<'_, 'a>, Outputs<'_, 'a>) {
        (
            Inputs {
                ins: &self.ins,
                def: self.def,
            },
            Outputs {
                outs: &mut self.outs,
                def: self.def,
            },
        )
    }
}

/// Inputs not computed in place (see [`OpContext::split`]).
pub struct Inputs<'c, 'a> {
    ins: &'c [InSlot<'a>],
    def: &'a OperatorDef,
}

impl Inputs<'_, '_> {
    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.ins.len()
    }

    /// Whether the op has no input.
    pub fn is_empty(&self) -> bool {
        self.ins.is_empty()
    }

    /// The blob of input `i`; an error when `i` is also an output.
    #[inline]
    pub fn blob(&self, i: usize) -> Result<&Blob> {
        let mut k = i;
        loop {
            match self.ins.get(k) {
                Some(InSlot::Read(g)) => return Ok(g),
                Some(InSlot::Input(e)) => k = *e,
                _ => {
                    return Err(Error::Schema(format!(
                        "input {i} ('{}') is computed in place; read it through the output",
                        self.def.input.get(i).map(String::as_str).unwrap_or("?")
                    )))
                }
            }
        }
    }

    /// The tensor of input `i`.
    #[inline]
    pub fn tensor(&self, i: usize) -> Result<&Tensor> {
        let b = self.blob(i)?;
        b.tensor().ok_or_else(|| {
            Error::DtypeMismatch(format!(
                "input {i} ('{}') holds {}, expected a tensor",
                self.def.input.get(i).map(String::as_str).unwrap_or("?"),
                b.type_name()
            ))
        })
    }
}

/// Write access to the outputs (see [`OpContext::split`]).
pub struct Outputs<'c, 'a> {
    outs: &'c mut [Option<RwLockWriteGuard<'a, Blob>>],
    def: &'a OperatorDef,
}

impl Outputs<'_, '_> {
    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.outs.len()
    }

    /// Whether the op has no output.
    pub fn is_empty(&self) -> bool {
        self.outs.is_empty()
    }

    /// The blob of output `j`.
    #[inline]
    pub fn blob(&mut self, j: usize) -> Result<&mut Blob> {
        let def = self.def;
        match self.outs.get_mut(j).and_then(|o| o.as_deref_mut()) {
            Some(b) => Ok(b),
            None => Err(Error::Schema(format!(
                "output {j} ('{}') repeats an earlier output",
                def.output.get(j).map(String::as_str).unwrap_or("?")
            ))),
        }
    }

    /// The tensor of output `j`.
    #[inline]
    pub fn tensor(&mut self, j: usize) -> Result<&mut Tensor> {
        Ok(self.blob(j)?.tensor_mut())
    }

    /// Every output tensor at once (repeated outputs are skipped).
    pub fn tensors(&mut self) -> Vec<&mut Tensor> {
        self.outs
            .iter_mut()
            .filter_map(|o| o.as_deref_mut().map(Blob::tensor_mut))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn def(op_type: &str) -> OperatorDef {
        OperatorDef {
            r#type: Some(op_type.to_string()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            ..Default::default()
        }
    }

    #[test]
    fn enforced_failures_carry_caffe2s_marker_once() {
        let e = op_failed(&def("Split"), Error::ShapeMismatch("not divisible".into()));
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        let text = e.to_string();
        assert!(
            text.starts_with(
                "[enforce fail at Split operator] not divisible (Error from operator: type Split"
            ),
            "{text}"
        );
        // Passed up by an op running a nested net: marked once, by the innermost op.
        let outer = op_failed(&def("If"), e).to_string();
        assert_eq!(outer.matches("[enforce fail at").count(), 1, "{outer}");
        assert!(outer.contains("type If"), "{outer}");
    }

    #[test]
    fn other_failures_are_not_marked_as_enforced() {
        let e = op_failed(&def("Relu"), Error::Type("wrong kind".into()));
        assert_eq!(e.kind(), ErrorKind::Runtime);
        assert!(!e.to_string().contains("enforce fail"), "{e}");
        let e = op_failed(&def("Relu"), Error::OutOfMemory("too big".into()));
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(!e.to_string().contains("enforce fail"), "{e}");
    }
}
