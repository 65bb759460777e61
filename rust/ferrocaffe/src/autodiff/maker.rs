//! The gradient-maker contract and the helpers makers are written with.

use super::interned::InternedCtx;
use super::net_names::NetNames;
use super::registry::Registry;
use super::scope::BackwardOptions;
use crate::error::{Error, Result};
use crate::proto::{Argument, OperatorDef};

/// The gradient of one blob: absent, a dense blob, or a sparse `GradientSlice`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum GradRef {
    /// No gradient.
    #[default]
    None,
    /// A dense gradient blob.
    Dense(String),
    /// A sparse gradient: row indices and the matching values.
    Sparse {
        /// Blob holding the indices.
        indices: String,
        /// Blob holding the values.
        values: String,
    },
}

impl GradRef {
    /// Whether there is a gradient at all (Python's `g is not None`).
    pub fn is_some(&self) -> bool {
        !matches!(self, GradRef::None)
    }

    /// Python truthiness of the gradient as Caffe2 stored it: `None` and an empty dense name
    /// are false, a `GradientSlice` is always true.
    pub fn is_truthy(&self) -> bool {
        match self {
            GradRef::None => false,
            GradRef::Dense(n) => !n.is_empty(),
            GradRef::Sparse { .. } => true,
        }
    }

    /// Whether `name` is this gradient's dense blob, indices or values.
    pub fn names_blob(&self, name: &str) -> bool {
        match self {
            GradRef::None => false,
            GradRef::Dense(n) => n == name,
            GradRef::Sparse { indices, values } => indices == name || values == name,
        }
    }
}

/// What a gradient maker returns for one forward operator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GradientOutput {
    /// The gradient operators, in execution order.
    pub ops: Vec<OperatorDef>,
    /// The gradient of each forward input (same length as the forward op's inputs).
    pub input_grads: Vec<GradRef>,
}

/// What a maker may need besides the operator: the registry in use (makers of control ops
/// generate the gradients of the nets in their arguments with it), unique net names, and the
/// scopes of the backward pass.
pub struct GradientContext<'c> {
    /// The registry the backward pass uses.
    pub registry: &'c Registry,
    /// Hands out names for nets that gradient ops carry.
    pub net_names: &'c mut dyn NetNames,
    /// Name and device scope.
    pub options: &'c BackwardOptions,
}

/// Produces the gradient operators of one forward operator type.
///
/// Implement this for your own operators and register it in a [`super::Registry`].
pub trait GradientMaker: Send + Sync {
    /// Gradient ops and input gradients of `op`, given the gradient of each of its outputs
    /// (`output_grads.len() == op.output.len()`).
    fn make(&self, op: &OperatorDef, output_grads: &[GradRef]) -> Result<GradientOutput>;

    /// Same as [`GradientMaker::make`], with access to the backward pass's context. The
    /// default ignores the context; makers that recurse into nets override it.
    fn make_in(
        &self,
        op: &OperatorDef,
        output_grads: &[GradRef],
        _cx: &mut GradientContext<'_>,
    ) -> Result<GradientOutput> {
        self.make(op, output_grads)
    }

    /// The same gradient over interned names, for a maker that can make it so: the gradient
    /// ops emitted into `cx` and the input gradients recorded there, as [`GradientMaker::make`]
    /// would give them (with the forward op's device option, engine and arguments copied onto
    /// every gradient op). `None` where the maker cannot (the default) or where `make` would
    /// fail or do anything else: `make` is then used.
    fn make_interned(&self, _cx: &mut InternedCtx<'_>) -> Option<()> {
        None
    }
}

/// Plain functions are makers: `fn(&mut MakerCtx) -> Result<Vec<OperatorDef>>`.
impl<F> GradientMaker for F
where
    F: Fn(&mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> + Send + Sync,
{
    fn make(&self, op: &OperatorDef, output_grads: &[GradRef]) -> Result<GradientOutput> {
        let mut ctx = MakerCtx::new(op, output_grads);
        let ops = self(&mut ctx)?;
        Ok(ctx.finish(ops))
    }
}

/// The state of one gradient computation, with Caffe2's `GradientMakerBase` helpers:
/// `i(k)`/`o(k)` name forward inputs/outputs, `go(k)` the gradient of output `k`, and `gi(k)`
/// names (and records) the gradient of input `k` as `<input>_grad`.
pub struct MakerCtx<'a> {
    /// The forward operator.
    pub def: &'a OperatorDef,
    /// Gradients of the forward outputs.
    pub g_output: &'a [GradRef],
    /// Gradients of the forward inputs, filled in by `gi`, `gi_i`/`gi_v`, `set_dense`...
    pub g_input: Vec<GradRef>,
    /// Copy the forward op's device option onto every gradient op (default true).
    pub copy_device_option: bool,
    /// Copy the forward op's engine onto every gradient op (default true).
    pub copy_engine: bool,
    /// Append the forward op's arguments to every gradient op (default true).
    pub copy_arguments: bool,
}

impl<'a> MakerCtx<'a> {
    /// A context for `def` with the given output gradients.
    pub fn new(def: &'a OperatorDef, g_output: &'a [GradRef]) -> Self {
        MakerCtx {
            def,
            g_output,
            g_input: vec![GradRef::None; def.input.len()],
            copy_device_option: true,
            copy_engine: true,
            copy_arguments: true,
        }
    }

    /// Forward input `k`.
    pub fn i(&self, k: usize) -> String {
        self.def.input.get(k).cloned().unwrap_or_default()
    }

    /// Forward output `k`.
    pub fn o(&self, k: usize) -> String {
        self.def.output.get(k).cloned().unwrap_or_default()
    }

    /// Name of the dense gradient of output `k`; an error if it is absent or sparse (Caffe2's
    /// messages: `Gradient of output <o> is sparse (expected dense).` / `... is not provided!`).
    pub fn go(&self, k: usize) -> Result<String> {
        match self.g_output.get(k) {
            Some(GradRef::Dense(n)) if !n.is_empty() => Ok(n.clone()),
            Some(GradRef::Sparse { .. }) => Err(Error::InvalidArgument(format!(
                "Gradient of output {} is sparse (expected dense).",
                self.o(k)
            ))),
            _ => Err(Error::InvalidArgument(format!(
                "Gradient of output {} is not provided!",
                self.o(k)
            ))),
        }
    }

    /// Indices blob of the sparse gradient of output `k`.
    pub fn go_i(&self, k: usize) -> Result<String> {
        match self.g_output.get(k) {
            Some(GradRef::Sparse { indices, .. }) => Ok(indices.clone()),
            _ => Err(self.not_sparse(k)),
        }
    }

    /// Values blob of the sparse gradient of output `k`.
    pub fn go_v(&self, k: usize) -> Result<String> {
        match self.g_output.get(k) {
            Some(GradRef::Sparse { values, .. }) => Ok(values.clone()),
            _ => Err(self.not_sparse(k)),
        }
    }

    fn not_sparse(&self, k: usize) -> Error {
        let what = match self.g_output.get(k) {
            Some(GradRef::Dense(n)) if !n.is_empty() => "is dense (expected sparse).",
            _ => "is not provided!",
        };
        Error::InvalidArgument(format!("Gradient of output {} {what}", self.o(k)))
    }

    /// Whether output `k` has a gradient.
    pub fn has_go(&self, k: usize) -> bool {
        self.g_output.get(k).is_some_and(GradRef::is_some)
    }

    /// Names the dense gradient of input `k` `<input>_grad` and records it.
    pub fn gi(&mut self, k: usize) -> String {
        let input = self.def.input.get(k).map_or("", String::as_str);
        let mut name = String::with_capacity(input.len() + 5);
        name.push_str(input);
        name.push_str("_grad");
        self.set_dense(k, name.clone());
        name
    }

    /// Names the indices of a sparse gradient of input `k` (`<input>_grad_indices`) and records
    /// the slice.
    pub fn gi_i(&mut self, k: usize) -> String {
        let indices = format!("{}_grad_indices", self.i(k));
        let values = format!("{}_grad_values", self.i(k));
        self.g_input[k] = GradRef::Sparse {
            indices: indices.clone(),
            values,
        };
        indices
    }

    /// Names the values of a sparse gradient of input `k` (`<input>_grad_values`) and records
    /// the slice.
    pub fn gi_v(&mut self, k: usize) -> String {
        let values = format!("{}_grad_values", self.i(k));
        let indices = format!("{}_grad_indices", self.i(k));
        self.g_input[k] = GradRef::Sparse {
            indices,
            values: values.clone(),
        };
        values
    }

    /// Records `name` as the dense gradient of input `k`.
    pub fn set_dense(&mut self, k: usize, name: String) {
        if let Some(slot) = self.g_input.get_mut(k) {
            *slot = GradRef::Dense(name);
        }
    }

    /// Applies Caffe2's post-processing (copy device option, engine, arguments) and packs the
    /// result.
    pub fn finish(self, mut ops: Vec<OperatorDef>) -> GradientOutput {
        for op in &mut ops {
            if self.copy_device_option && self.def.device_option.is_some() {
                op.device_option = self.def.device_option.clone();
            }
            if self.copy_engine && self.def.engine.is_some() {
                op.engine = self.def.engine.clone();
            }
            if self.copy_arguments && !self.def.arg.is_empty() {
                op.arg.extend(self.def.arg.iter().cloned());
            }
        }
        GradientOutput {
            ops,
            input_grads: self.g_input,
        }
    }
}

/// Builds a gradient `OperatorDef` the way Caffe2's `CreateOperatorDef` does: type, empty name
/// (set), inputs, outputs and extra arguments.
pub fn grad_op<I, O, S, T>(op_type: &str, inputs: I, outputs: O, args: Vec<Argument>) -> OperatorDef
where
    I: IntoIterator<Item = S>,
    O: IntoIterator<Item = T>,
    S: Into<String>,
    T: Into<String>,
{
    let mut op = OperatorDef::new(op_type, inputs, outputs);
    op.name = Some(String::new());
    op.arg = args;
    op
}
