//! Shared helpers for the built-in gradient makers: checked versions of Caffe2's
//! `I`/`O`/`GI`/`GO`/`GI_V`/`SetDense`/`SetSparse`, the gradient-op builder, argument readers
//! with `ArgumentHelper` semantics, and a tiny table language for the many makers that emit one
//! op from a fixed list of blobs.

use crate::autodiff::interned::InternedCtx;
use crate::autodiff::maker::{grad_op, GradRef, GradientMaker, GradientOutput, MakerCtx};
use crate::error::{Error, Result};
use crate::graph::intern::BlobId;
use crate::proto::{Argument, OperatorDef};

/// Coerces a closure to the higher-ranked maker signature.
pub(super) fn maker<F>(f: F) -> F
where
    F: Fn(&mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> + Send + Sync + 'static,
{
    f
}

fn op_type(ctx: &MakerCtx<'_>) -> String {
    ctx.def.r#type().to_string()
}

/// An error raised while making the gradient of `ctx.def`.
pub(super) fn fail(ctx: &MakerCtx<'_>, msg: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!(
        "gradient of operator {} ('{}'): {msg}",
        op_type(ctx),
        ctx.def.name()
    ))
}

/// Forward input `k` by reference, an error when out of range.
fn input_ref<'a>(ctx: &MakerCtx<'a>, k: usize) -> Result<&'a str> {
    let def = ctx.def;
    match def.input.get(k) {
        Some(s) => Ok(s.as_str()),
        None => Err(fail(
            ctx,
            format!(
                "expected an input {k}, the operator has {} inputs",
                def.input.len()
            ),
        )),
    }
}

/// Forward output `k` by reference, an error when out of range.
fn output_ref<'a>(ctx: &MakerCtx<'a>, k: usize) -> Result<&'a str> {
    let def = ctx.def;
    match def.output.get(k) {
        Some(s) => Ok(s.as_str()),
        None => Err(fail(
            ctx,
            format!(
                "expected an output {k}, the operator has {} outputs",
                def.output.len()
            ),
        )),
    }
}

/// Caffe2's `I(k)`: forward input `k`, an error when out of range.
pub(super) fn input(ctx: &MakerCtx<'_>, k: usize) -> Result<String> {
    input_ref(ctx, k).map(str::to_string)
}

/// Caffe2's `O(k)`: forward output `k`, an error when out of range.
pub(super) fn output(ctx: &MakerCtx<'_>, k: usize) -> Result<String> {
    output_ref(ctx, k).map(str::to_string)
}

/// `base` followed by `suffix`, in one allocation.
pub(super) fn suffixed(base: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(base.len() + suffix.len());
    s.push_str(base);
    s.push_str(suffix);
    s
}

/// Whether output `k` has a gradient of any kind (Caffe2: `!GradOut(k).IsEmpty()`).
pub(super) fn has_grad_out(ctx: &MakerCtx<'_>, k: usize) -> bool {
    match ctx.g_output.get(k) {
        Some(GradRef::Dense(n)) => !n.is_empty(),
        Some(GradRef::Sparse { indices, values }) => !indices.is_empty() || !values.is_empty(),
        _ => false,
    }
}

/// Caffe2's `GO(k)`: the dense gradient of output `k`; an error when it is sparse or absent.
pub(super) fn grad_out(ctx: &MakerCtx<'_>, k: usize) -> Result<String> {
    let out = output_ref(ctx, k)?;
    match ctx.g_output.get(k) {
        Some(GradRef::Dense(n)) if !n.is_empty() => Ok(n.clone()),
        Some(GradRef::Sparse { .. }) => Err(fail(
            ctx,
            format!("Gradient of output {out} is sparse (expected dense)."),
        )),
        _ => Err(fail(
            ctx,
            format!("Gradient of output {out} is not provided!"),
        )),
    }
}

/// Caffe2's `SetDense(k, name)`: an error when input `k` already has a sparse gradient.
pub(super) fn set_dense(ctx: &mut MakerCtx<'_>, k: usize, name: String) -> Result<()> {
    let inp = input_ref(ctx, k)?;
    if matches!(ctx.g_input.get(k), Some(GradRef::Sparse { .. })) {
        return Err(fail(ctx, format!("Input {inp} already set to sparse.")));
    }
    ctx.set_dense(k, name);
    Ok(())
}

/// Caffe2's `GI(k)`: names the gradient of input `k` `<input>_grad` and records it.
pub(super) fn grad_in(ctx: &mut MakerCtx<'_>, k: usize) -> Result<String> {
    let name = suffixed(input_ref(ctx, k)?, "_grad");
    set_dense(ctx, k, name.clone())?;
    Ok(name)
}

/// Caffe2's `SetSparse(k, indices, values)`.
pub(super) fn set_sparse(
    ctx: &mut MakerCtx<'_>,
    k: usize,
    indices: String,
    values: String,
) -> Result<()> {
    let inp = input_ref(ctx, k)?;
    if matches!(ctx.g_input.get(k), Some(GradRef::Dense(_))) {
        return Err(fail(ctx, format!("Input {inp} already set to dense.")));
    }
    if let Some(slot) = ctx.g_input.get_mut(k) {
        *slot = GradRef::Sparse { indices, values };
    }
    Ok(())
}

/// Caffe2's `GI_V(k)`: names the values of a sparse gradient of input `k`
/// (`<input>_grad_values`) and records them (the indices stay as they are).
pub(super) fn grad_in_values(ctx: &mut MakerCtx<'_>, k: usize) -> Result<String> {
    let inp = input_ref(ctx, k)?;
    let values = suffixed(inp, "_grad_values");
    let indices = match ctx.g_input.get(k) {
        Some(GradRef::Dense(_)) => {
            return Err(fail(ctx, format!("Input {inp} already set to dense.")));
        }
        Some(GradRef::Sparse { indices, .. }) => indices.clone(),
        _ => String::new(),
    };
    set_sparse(ctx, k, indices, values.clone())?;
    Ok(values)
}

/// A gradient operator as Caffe2's maker base returns it: empty name (set) and
/// `is_gradient_op: true`.
pub(super) fn gop(
    op_type: &str,
    inputs: Vec<String>,
    outputs: Vec<String>,
    args: Vec<Argument>,
) -> OperatorDef {
    let mut op = grad_op(op_type, inputs, outputs, args);
    op.is_gradient_op = Some(true);
    op
}

/// `MakeArgument<int>(name, v)`.
pub(super) fn arg_i(name: &str, v: i64) -> Argument {
    Argument::int(name, v)
}

/// `MakeArgument<float>(name, v)`.
pub(super) fn arg_f(name: &str, v: f32) -> Argument {
    Argument::float(name, v)
}

/// `MakeArgument<string>(name, v)`.
pub(super) fn arg_s(name: &str, v: &str) -> Argument {
    Argument::string(name, v)
}

/// The arguments of the forward op, read the way Caffe2's `ArgumentHelper` reads them
/// (argument names must be unique; a scalar must be stored in the field of its type).
pub(super) struct Args<'a> {
    def: &'a OperatorDef,
}

impl<'a> Args<'a> {
    /// Wraps the forward op's arguments; an error when a name is repeated.
    pub(super) fn new(ctx: &MakerCtx<'a>) -> Result<Self> {
        let def = ctx.def;
        for (k, a) in def.arg.iter().enumerate() {
            if def.arg[..k].iter().any(|b| b.name() == a.name()) {
                return Err(fail(
                    ctx,
                    format!(
                        "Duplicated argument name [{}] found in operator def",
                        a.name()
                    ),
                ));
            }
        }
        Ok(Args { def })
    }

    fn err(&self, msg: String) -> Error {
        Error::InvalidArgument(format!(
            "gradient of operator {} ('{}'): {msg}",
            self.def.r#type(),
            self.def.name()
        ))
    }

    /// The argument called `name`.
    pub(super) fn get(&self, name: &str) -> Option<&'a Argument> {
        self.def.arg.iter().find(|a| a.name() == name)
    }

    /// Whether an argument called `name` exists.
    pub(super) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// `GetSingleArgument<int>(name, default)`.
    pub(super) fn int(&self, name: &str, default: i64) -> Result<i64> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => a.i.ok_or_else(|| {
                self.err(format!(
                    "Argument {name} does not have the right field: expected field i"
                ))
            }),
        }
    }

    /// `GetSingleArgument<bool>(name, default)` / `GetFlagArgument`: the `i` field, non-zero.
    pub(super) fn flag(&self, name: &str, default: bool) -> Result<bool> {
        Ok(self.int(name, i64::from(default))? != 0)
    }

    /// `GetSingleArgument<float>(name, default)`.
    pub(super) fn float(&self, name: &str, default: f32) -> Result<f32> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => a.f.ok_or_else(|| {
                self.err(format!(
                    "Argument {name} does not have the right field: expected field f"
                ))
            }),
        }
    }

    /// `GetRepeatedArgument<int>(name)`: empty when absent.
    pub(super) fn ints(&self, name: &str) -> Vec<i64> {
        self.get(name).map(|a| a.ints.clone()).unwrap_or_default()
    }

    /// `HasSingleArgumentOfType<string>(name)`.
    pub(super) fn has_string(&self, name: &str) -> bool {
        self.get(name).is_some_and(|a| a.s.is_some())
    }

    /// `HasSingleArgumentOfType<int>(name)`.
    pub(super) fn has_int(&self, name: &str) -> bool {
        self.get(name).is_some_and(|a| a.i.is_some())
    }
}

/// One blob reference in a maker table.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    /// Forward input `k`.
    I(usize),
    /// Forward output `k`.
    O(usize),
    /// Gradient of forward output `k`.
    GO(usize),
    /// Gradient of forward input `k` (`<input>_grad`, recorded).
    GI(usize),
}

/// Resolves a slot to a blob name (recording `GI` slots).
pub(super) fn resolve(ctx: &mut MakerCtx<'_>, slot: Slot) -> Result<String> {
    match slot {
        Slot::I(k) => input(ctx, k),
        Slot::O(k) => output(ctx, k),
        Slot::GO(k) => grad_out(ctx, k),
        Slot::GI(k) => grad_in(ctx, k),
    }
}

/// Resolves a list of slots.
pub(super) fn resolve_all(ctx: &mut MakerCtx<'_>, slots: &[Slot]) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(slots.len());
    for s in slots {
        out.push(resolve(ctx, *s)?);
    }
    Ok(out)
}

/// A maker emitting one op of type `grad_type` from fixed input and output slots, with the
/// forward op's arguments, engine and device option copied.
pub(super) fn single(
    grad_type: &'static str,
    inputs: &'static [Slot],
    outputs: &'static [Slot],
) -> Single {
    Single {
        grad_type,
        inputs,
        outputs,
    }
}

/// The maker [`single`] builds: one op from fixed slots, made with names or over ids.
pub(super) struct Single {
    grad_type: &'static str,
    inputs: &'static [Slot],
    outputs: &'static [Slot],
}

/// Most slots a table maker has (inputs or outputs; the built-in tables have at most 6).
const MAX_SLOTS: usize = 8;

impl Single {
    fn resolve_ids(
        cx: &mut InternedCtx<'_>,
        slots: &[Slot],
        out: &mut [BlobId; MAX_SLOTS],
    ) -> Option<usize> {
        if slots.len() > MAX_SLOTS {
            return None;
        }
        for (k, s) in slots.iter().enumerate() {
            out[k] = match *s {
                Slot::I(k) => cx.input(k)?,
                Slot::O(k) => cx.output(k)?,
                Slot::GO(k) => cx.grad_out(k)?,
                Slot::GI(k) => cx.grad_in(k)?,
            };
        }
        Some(slots.len())
    }
}

impl GradientMaker for Single {
    fn make(&self, op: &OperatorDef, output_grads: &[GradRef]) -> Result<GradientOutput> {
        let mut ctx = MakerCtx::new(op, output_grads);
        let ins = resolve_all(&mut ctx, self.inputs)?;
        let outs = resolve_all(&mut ctx, self.outputs)?;
        let ops = vec![gop(self.grad_type, ins, outs, vec![])];
        Ok(ctx.finish(ops))
    }

    fn make_interned(&self, cx: &mut InternedCtx<'_>) -> Option<()> {
        let (mut ins, mut outs) = ([BlobId(0); MAX_SLOTS], [BlobId(0); MAX_SLOTS]);
        let n_in = Self::resolve_ids(cx, self.inputs, &mut ins)?;
        let n_out = Self::resolve_ids(cx, self.outputs, &mut outs)?;
        cx.emit(self.grad_type, &ins[..n_in], &outs[..n_out]);
        Some(())
    }
}

/// Test helper: runs the maker that `register` installs for `def`'s type.
#[cfg(test)]
pub(super) fn run_registered(
    register: fn(&mut crate::autodiff::registry::Registry),
    def: &OperatorDef,
    g_output: &[GradRef],
) -> Result<crate::autodiff::GradientOutput> {
    use crate::autodiff::registry::{GradientKind, Registry};
    let mut r = Registry::new();
    register(&mut r);
    match r.get(def.r#type()) {
        Some(GradientKind::Maker(m)) => m.make(def, g_output),
        _ => Err(Error::NotFound(format!("no maker for {}", def.r#type()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> OperatorDef {
        OperatorDef::new("Foo", ["x", "y"], ["z"])
    }

    #[test]
    fn grad_out_rejects_missing_and_sparse() {
        let d = def();
        let none = [GradRef::None];
        let ctx = MakerCtx::new(&d, &none);
        assert!(grad_out(&ctx, 0).is_err());
        let sparse = [GradRef::Sparse {
            indices: "i".into(),
            values: "v".into(),
        }];
        let ctx = MakerCtx::new(&d, &sparse);
        let err = grad_out(&ctx, 0).expect_err("error expected").to_string();
        assert!(err.contains("is sparse (expected dense)"), "{err}");
        let dense = [GradRef::Dense("z_g".into())];
        let ctx = MakerCtx::new(&d, &dense);
        assert_eq!(grad_out(&ctx, 0).expect("ok"), "z_g");
        assert!(grad_out(&ctx, 1).is_err());
    }

    #[test]
    fn dense_and_sparse_conflict() {
        let d = def();
        let g = [GradRef::Dense("z_g".into())];
        let mut ctx = MakerCtx::new(&d, &g);
        assert_eq!(grad_in(&mut ctx, 0).expect("ok"), "x_grad");
        assert!(grad_in_values(&mut ctx, 0).is_err());
        assert_eq!(grad_in_values(&mut ctx, 1).expect("ok"), "y_grad_values");
        assert!(grad_in(&mut ctx, 1).is_err());
        assert!(grad_in(&mut ctx, 2).is_err());
        set_sparse(&mut ctx, 1, "idx".into(), "y_grad_values".into()).expect("ok");
        assert_eq!(
            ctx.g_input[1],
            GradRef::Sparse {
                indices: "idx".into(),
                values: "y_grad_values".into()
            }
        );
    }

    #[test]
    fn args_follow_argument_helper() {
        let mut d = def();
        d.arg = vec![arg_i("a", 3), arg_f("b", 0.5)];
        let g = [GradRef::None];
        let ctx = MakerCtx::new(&d, &g);
        let args = Args::new(&ctx).expect("ok");
        assert_eq!(args.int("a", 0).expect("ok"), 3);
        assert_eq!(args.int("missing", 7).expect("ok"), 7);
        assert!(args.int("b", 0).is_err());
        assert_eq!(args.float("b", 0.0).expect("ok"), 0.5);
        assert!(args.float("a", 0.0).is_err());
        assert!(args.flag("a", false).expect("ok"));
        d.arg.push(arg_i("a", 1));
        let ctx = MakerCtx::new(&d, &g);
        assert!(Args::new(&ctx).is_err());
    }
}
