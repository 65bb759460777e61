//! Gradient making over interned blob names: the gradients of a backward pass and the ops a
//! maker emits are blob ids ([`BlobId`]) of the pass's name table, so the per-op work of a
//! backward pass compares and copies ids instead of allocating strings. The gradient ops are
//! written out (serialized, or built as `OperatorDef`s) once, when they are final.
//!
//! A maker that can work this way implements [`GradientMaker::make_interned`] (the table
//! makers of the built-in op types do); any other maker, and any case an interned maker
//! declines, runs through [`GradientMaker::make`] with names, as before, and its result is
//! interned. Both give the same gradient ops and gradients.
//!
//! [`GradientMaker::make_interned`]: super::GradientMaker::make_interned
//! [`GradientMaker::make`]: super::GradientMaker::make

use super::maker::GradRef;
use crate::graph::intern::{BlobId, FxBuild, FxHashMap, Names};
use crate::proto::OperatorDef;
use crate::schema::OpSchema;

/// The gradient of one blob, by id: absent, dense, or sparse (indices, values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdGrad {
    /// No gradient.
    #[default]
    None,
    /// A dense gradient blob.
    Dense(BlobId),
    /// A sparse gradient: the indices blob and the values blob.
    Sparse(BlobId, BlobId),
}

impl IdGrad {
    /// Whether there is a gradient at all.
    pub fn is_some(self) -> bool {
        !matches!(self, IdGrad::None)
    }

    /// Whether `id` is this gradient's dense blob, indices or values.
    pub fn names_blob(self, id: BlobId) -> bool {
        match self {
            IdGrad::None => false,
            IdGrad::Dense(d) => d == id,
            IdGrad::Sparse(i, v) => i == id || v == id,
        }
    }

    /// [`GradRef::is_truthy`] of the named gradient.
    pub(crate) fn is_truthy(self, names: &Names) -> bool {
        match self {
            IdGrad::None => false,
            IdGrad::Dense(d) => !names.name(d).is_empty(),
            IdGrad::Sparse(..) => true,
        }
    }

    /// The gradient with names.
    pub(crate) fn to_ref(self, names: &Names) -> GradRef {
        match self {
            IdGrad::None => GradRef::None,
            IdGrad::Dense(d) => GradRef::Dense(names.name(d).to_string()),
            IdGrad::Sparse(i, v) => GradRef::Sparse {
                indices: names.name(i).to_string(),
                values: names.name(v).to_string(),
            },
        }
    }

    /// The gradient `g` by id, its names interned.
    pub(crate) fn intern(g: &GradRef, names: &mut Names) -> IdGrad {
        match g {
            GradRef::None => IdGrad::None,
            GradRef::Dense(d) => IdGrad::Dense(names.intern(d)),
            GradRef::Sparse { indices, values } => {
                IdGrad::Sparse(names.intern(indices), names.intern(values))
            }
        }
    }

    /// Whether Caffe2's Python layer would have handed this output gradient to a C++ maker
    /// changed (see [`super::dispatch::to_wrapper`]): an empty name, a name of two characters,
    /// or a slice of two empty names. Interned makers are not given those.
    pub(crate) fn needs_wrapping(self, names: &Names) -> bool {
        let odd = |id: BlobId| {
            let n = names.name(id);
            n.is_empty() || (n.len() <= 8 && n.chars().count() == 2)
        };
        match self {
            IdGrad::None => false,
            IdGrad::Dense(d) => odd(d),
            IdGrad::Sparse(i, v) => names.name(i).is_empty() && names.name(v).is_empty(),
        }
    }
}

/// One gradient op made over ids: its type and where its inputs and outputs are in
/// [`IdOps::ids`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdOp {
    pub(crate) op_type: &'static str,
    start: u32,
    n_in: u32,
    n_out: u32,
}

/// The gradient ops of one forward op, over ids (reused from op to op: no allocation once
/// warm).
#[derive(Debug, Default)]
pub(crate) struct IdOps {
    pub(crate) ops: Vec<IdOp>,
    ids: Vec<BlobId>,
}

impl IdOps {
    pub(crate) fn clear(&mut self) {
        self.ops.clear();
        self.ids.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Appends an op.
    pub(crate) fn push(&mut self, op_type: &'static str, inputs: &[BlobId], outputs: &[BlobId]) {
        let start = self.ids.len() as u32;
        self.ids.extend_from_slice(inputs);
        self.ids.extend_from_slice(outputs);
        self.ops.push(IdOp {
            op_type,
            start,
            n_in: inputs.len() as u32,
            n_out: outputs.len() as u32,
        });
    }

    /// Appends the inputs and outputs of `op` (interned); its type is not kept.
    pub(crate) fn push_names(&mut self, op: &OperatorDef, names: &mut Names) {
        let start = self.ids.len() as u32;
        for s in op.input.iter().chain(&op.output) {
            self.ids.push(names.intern(s));
        }
        self.ops.push(IdOp {
            op_type: "",
            start,
            n_in: op.input.len() as u32,
            n_out: op.output.len() as u32,
        });
    }

    pub(crate) fn inputs(&self, j: usize) -> &[BlobId] {
        let op = &self.ops[j];
        let s = op.start as usize;
        &self.ids[s..s + op.n_in as usize]
    }

    pub(crate) fn outputs(&self, j: usize) -> &[BlobId] {
        let op = &self.ops[j];
        let s = (op.start + op.n_in) as usize;
        &self.ids[s..s + op.n_out as usize]
    }

    /// The blobs the ops write, for [`LocalIds::written_before`].
    pub(crate) fn local(&self) -> LocalIds<'_> {
        let total = self.ops.iter().map(|o| o.n_out as usize).sum::<usize>();
        let map = (total > 32).then(|| {
            let mut m = FxHashMap::with_capacity_and_hasher(total, FxBuild::default());
            for j in 0..self.ops.len() {
                for &o in self.outputs(j) {
                    m.entry(o).or_insert(j);
                }
            }
            m
        });
        LocalIds { ops: self, map }
    }
}

/// The blobs written by the gradient ops of one forward op (Caffe2's
/// `locally_generated_blobs`), with the first op writing each: a scan while there are few, a
/// table once there are many.
pub(crate) struct LocalIds<'o> {
    ops: &'o IdOps,
    map: Option<FxHashMap<BlobId, usize>>,
}

impl LocalIds<'_> {
    /// Whether one of the first `j` ops writes `id`.
    pub(crate) fn written_before(&self, id: BlobId, j: usize) -> bool {
        match &self.map {
            Some(m) => m.get(&id).is_some_and(|&w| w < j),
            None => (0..j.min(self.ops.len())).any(|p| self.ops.outputs(p).contains(&id)),
        }
    }

    /// Whether any op writes `id`.
    pub(crate) fn written(&self, id: BlobId) -> bool {
        self.written_before(id, self.ops.len())
    }
}

/// What an interned maker works with: the forward op's inputs and outputs and the gradients
/// of its outputs, by id; it records the gradients of the inputs and emits gradient ops.
///
/// Every method answers `None` where the named maker ([`super::MakerCtx`]) would fail; the
/// maker then returns `None`, and the named maker is run instead (for its error, or for
/// whatever it makes of the case).
pub struct InternedCtx<'c> {
    pub(crate) names: &'c mut Names,
    pub(crate) inputs: &'c [BlobId],
    pub(crate) outputs: &'c [BlobId],
    pub(crate) g_output: &'c [IdGrad],
    pub(crate) g_input: &'c mut Vec<IdGrad>,
    pub(crate) ops: &'c mut IdOps,
}

impl InternedCtx<'_> {
    /// Forward input `k` (Caffe2's `I(k)`).
    pub fn input(&self, k: usize) -> Option<BlobId> {
        self.inputs.get(k).copied()
    }

    /// Forward output `k` (Caffe2's `O(k)`).
    pub fn output(&self, k: usize) -> Option<BlobId> {
        self.outputs.get(k).copied()
    }

    /// Number of forward inputs.
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// The dense gradient of output `k` (Caffe2's `GO(k)`).
    pub fn grad_out(&self, k: usize) -> Option<BlobId> {
        self.outputs.get(k)?;
        match self.g_output.get(k) {
            Some(IdGrad::Dense(d)) if !self.names.name(*d).is_empty() => Some(*d),
            _ => None,
        }
    }

    /// Records `id` as the dense gradient of input `k` (Caffe2's `SetDense`).
    pub fn set_dense(&mut self, k: usize, id: BlobId) -> Option<()> {
        match self.g_input.get_mut(k) {
            Some(IdGrad::Sparse(..)) | None => None,
            Some(slot) => {
                *slot = IdGrad::Dense(id);
                Some(())
            }
        }
    }

    /// Names the dense gradient of input `k` `<input>_grad` and records it (Caffe2's `GI(k)`).
    pub fn grad_in(&mut self, k: usize) -> Option<BlobId> {
        let input = self.input(k)?;
        if matches!(self.g_input.get(k), Some(IdGrad::Sparse(..))) {
            return None;
        }
        let id = self.names.intern_suffixed(input, "_grad");
        self.set_dense(k, id)?;
        Some(id)
    }

    /// Emits a gradient op (empty name, no arguments of its own; the forward op's device
    /// option, engine and arguments are copied onto it, as [`super::MakerCtx::finish`] does).
    pub fn emit(&mut self, op_type: &'static str, inputs: &[BlobId], outputs: &[BlobId]) {
        self.ops.push(op_type, inputs, outputs);
    }
}

/// Caffe2's `VerifyOp` over ids, where it can be decided without names: the counts of
/// inputs and outputs. `None` when an input is also an output or the schema enforces an
/// in-place pair (the named check decides those).
pub(crate) fn verify_counts(
    schema: Option<&OpSchema>,
    inputs: &[BlobId],
    outputs: &[BlobId],
) -> Option<bool> {
    let Some(schema) = schema else {
        return Some(true);
    };
    if !schema.inplace_enforced.is_empty() || inputs.iter().any(|i| outputs.contains(i)) {
        return None;
    }
    let count_ok = |n: usize, (lo, hi): (u32, u32), mask: u8| {
        if mask != 0 && n <= 6 {
            return mask & (1 << n) != 0;
        }
        n as u64 >= u64::from(lo) && n as u64 <= u64::from(hi)
    };
    Some(
        count_ok(inputs.len(), schema.inputs, schema.input_count_mask)
            && count_ok(outputs.len(), schema.outputs, schema.output_count_mask),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The interned makers give what the named ones give: each op's gradient ops in a backward
    /// pass (made over ids) are those `gradient_for_op` makes with names, arguments, engine and
    /// device option included.
    #[test]
    fn interned_and_named_makers_agree() {
        use crate::autodiff::{
            backward_pass, gradient_for_op, BackwardOptions, GradientContext, Registry,
            UsedNetNames,
        };
        use crate::proto::{Argument, DeviceOption};
        let cases: Vec<(&str, Vec<&str>, Vec<&str>)> = vec![
            ("FC", vec!["x", "w", "b"], vec!["y"]),
            ("Relu", vec!["x"], vec!["y"]),
            ("Sum", vec!["x", "w", "v"], vec!["y"]),
            ("Add", vec!["x", "w"], vec!["y"]),
            ("Mul", vec!["x", "w"], vec!["y"]),
            ("SumElements", vec!["x"], vec!["y"]),
            ("Softmax", vec!["x"], vec!["y"]),
            ("DotProduct", vec!["x", "w"], vec!["y"]),
        ];
        let registry = Registry::with_builtins();
        for (k, (t, ins, outs)) in cases.into_iter().enumerate() {
            let mut op = OperatorDef::new(t, ins, outs);
            if k % 2 == 0 {
                op.arg.push(Argument::int("axis", 1));
                op.device_option = Some(DeviceOption {
                    device_type: Some(1),
                    device_id: Some(2),
                    ..Default::default()
                });
                op.engine = Some("E".into());
            }
            let ys = vec![("y".to_string(), GradRef::Dense("y_g".into()))];
            let (grad_ops, grads) = backward_pass(std::slice::from_ref(&op), &ys, &registry)
                .unwrap_or_else(|e| panic!("{t}: {e}"));
            let mut names = UsedNetNames::new();
            let options = BackwardOptions::default();
            let mut cx = GradientContext {
                registry: &registry,
                net_names: &mut names,
                options: &options,
            };
            let named = gradient_for_op(&op, &[GradRef::Dense("y_g".into())], &mut cx).unwrap();
            assert_eq!(grad_ops, named.ops, "{t}");
            for (input, g) in op.input.iter().zip(&named.input_grads) {
                if g.is_some() {
                    assert_eq!(grads.get(input), Some(g), "{t} {input}");
                }
            }
        }
    }

    /// Gradient names are not forward blobs: a second backward pass on the same IR, for a
    /// blob it has not seen, still finds per-blob state for it.
    #[test]
    fn a_second_pass_on_one_ir_meets_new_blobs() {
        use crate::autodiff::{BackwardOptions, GradientContext, Ir, Registry, UsedNetNames};
        let ops = vec![
            OperatorDef::new("Relu", ["x"], ["y"]),
            OperatorDef::new("Relu", ["y"], ["z"]),
        ];
        let registry = Registry::with_builtins();
        let options = BackwardOptions::default();
        let mut names = UsedNetNames::new();
        let mut cx = GradientContext {
            registry: &registry,
            net_names: &mut names,
            options: &options,
        };
        let mut ir = Ir::new(&ops).unwrap();
        let first = vec![("z".to_string(), GradRef::None)];
        let (grad_ops, grads) = ir.backward(&first, &mut cx).unwrap();
        assert_eq!(grad_ops.len(), 3);
        assert_eq!(grads.get("x"), Some(&GradRef::Dense("x_grad".into())));
        let second = vec![("w".to_string(), GradRef::None)];
        let (grad_ops, _) = ir.backward(&second, &mut cx).unwrap();
        assert_eq!(grad_ops.len(), 1);
        assert!(!ir.state().frontier.is_empty());
    }

    #[test]
    fn wrapping_cases() {
        let mut names = Names::default();
        let (e, two, long) = (names.intern(""), names.intern("dy"), names.intern("y_grad"));
        assert!(IdGrad::Dense(e).needs_wrapping(&names));
        assert!(IdGrad::Dense(two).needs_wrapping(&names));
        assert!(!IdGrad::Dense(long).needs_wrapping(&names));
        assert!(IdGrad::Sparse(e, e).needs_wrapping(&names));
        assert!(!IdGrad::Sparse(e, long).needs_wrapping(&names));
        assert!(!IdGrad::None.needs_wrapping(&names));
        assert!(!IdGrad::Dense(e).is_truthy(&names));
        assert!(IdGrad::Sparse(e, e).is_truthy(&names));
    }

    #[test]
    fn ops_and_local_outputs() {
        let mut names = Names::default();
        let (a, b, c) = (names.intern("a"), names.intern("b"), names.intern("c"));
        let mut ops = IdOps::default();
        ops.push("A", &[a], &[b]);
        ops.push_names(&OperatorDef::new("B", ["b"], ["c", "a"]), &mut names);
        assert_eq!(ops.len(), 2);
        assert_eq!(ops.inputs(1), &[b]);
        assert_eq!(ops.outputs(1), &[c, a]);
        let local = ops.local();
        assert!(!local.written_before(b, 0));
        assert!(local.written_before(b, 1));
        assert!(!local.written_before(c, 1));
        assert!(local.written(c));
        let mut many = IdOps::default();
        let outs: Vec<BlobId> = (0..40).map(|k| names.intern(&format!("o{k}"))).collect();
        for o in &outs {
            many.push("A", &[a], &[*o]);
        }
        let local = many.local();
        assert!(local.written_before(outs[3], 4));
        assert!(!local.written_before(outs[3], 3));
        assert!(!local.written(a));
        ops.clear();
        assert_eq!(ops.len(), 0);
    }
}
