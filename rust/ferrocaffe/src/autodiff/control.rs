//! Gradients of the control-flow operators `Do`, `If` and `While`, which run nets held in
//! their arguments. Caffe2 wrote these as Python gradient functions (`control_ops_grad.py`);
//! they are registered as gradient functions here too, so a user registration replaces them,
//! their results are used as they are, and their errors (`AssertionError` for malformed ops)
//! are not wrapped.
//!
//! Each generates the backward pass of the nets in its arguments with a nested [`Ir`] and
//! wraps the result in a gradient op of the same type.

mod do_grad;
mod if_grad;
mod while_grad;

use std::sync::Arc;

use super::ir::Ir;
use super::maker::{GradRef, GradientContext, GradientMaker, GradientOutput};
use super::net_names::UsedNetNames;
use super::registry::Registry;
use super::scope::BackwardOptions;
use crate::error::{Error, Result};
use crate::graph::intern::{FxHashMap, FxHashSet};
use crate::proto::{NetDef, OperatorDef};

/// Registers the `Do`, `If` and `While` gradient functions.
pub fn register(r: &mut Registry) {
    r.register_function("Do", Arc::new(Control(do_grad::gradient)));
    r.register_function("If", Arc::new(Control(if_grad::gradient)));
    r.register_function("While", Arc::new(Control(while_grad::gradient)));
}

type ControlFn = fn(&OperatorDef, &[GradRef], &mut GradientContext<'_>) -> Result<GradientOutput>;

struct Control(ControlFn);

impl GradientMaker for Control {
    /// Without a context: the built-in registry, fresh net names, no scopes.
    fn make(&self, op: &OperatorDef, output_grads: &[GradRef]) -> Result<GradientOutput> {
        let registry = Registry::builtin();
        let mut names = UsedNetNames::new();
        let options = BackwardOptions::default();
        let mut cx = GradientContext {
            registry: &registry,
            net_names: &mut names,
            options: &options,
        };
        (self.0)(op, output_grads, &mut cx)
    }

    fn make_in(
        &self,
        op: &OperatorDef,
        output_grads: &[GradRef],
        cx: &mut GradientContext<'_>,
    ) -> Result<GradientOutput> {
        (self.0)(op, output_grads, cx)
    }
}

/// Short description of an operator for error messages (its nets left out).
fn describe(op: &OperatorDef) -> String {
    format!(
        "{} op '{}' (inputs: {}; outputs: {})",
        op.r#type(),
        op.name(),
        op.input.join(", "),
        op.output.join(", ")
    )
}

/// Caffe2's `assert cond, msg` in the control gradients: an `AssertionError` whose message
/// starts with Caffe2's text and names the operator.
fn ensure(cond: bool, msg: impl FnOnce() -> String, op: &OperatorDef) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(assertion(msg(), op))
    }
}

fn assertion(msg: String, op: &OperatorDef) -> Error {
    Error::Assertion(format!(
        "{msg}\n  (while making the gradient of {})",
        describe(op)
    ))
}

/// Caffe2's `_get_net_argument`: the net of the first argument called `name`; an argument of
/// that name without a net is malformed.
fn net_argument<'o>(op: &'o OperatorDef, name: &str) -> Result<Option<&'o NetDef>> {
    match op.arg.iter().find(|a| a.name() == name) {
        None => Ok(None),
        Some(a) => match &a.n {
            Some(n) => Ok(Some(n)),
            None => Err(assertion(
                format!("Expected non empty net argument {name}"),
                op,
            )),
        },
    }
}

/// Python's `repr` of a string (single quotes unless the string holds one and no double quote).
fn py_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// `str(g)` of an output gradient as Caffe2's gradient functions received it: a name, or a
/// `GradientSlice` of two strings.
fn grad_str(g: &GradRef) -> String {
    match g {
        GradRef::None => "None".into(),
        GradRef::Dense(n) => n.clone(),
        GradRef::Sparse { indices, values } => format!(
            "GradientSlice(indices={}, values={})",
            py_repr(indices),
            py_repr(values)
        ),
    }
}

/// `str(g)` of a gradient in the map a nested backward pass returned (names were
/// `BlobReference`s there).
fn blobref_str(g: &GradRef) -> String {
    match g {
        GradRef::None => "None".into(),
        GradRef::Dense(n) => n.clone(),
        GradRef::Sparse { indices, values } => format!(
            "GradientSlice(indices=BlobReference(\"{indices}\"), values=BlobReference(\"{values}\"))"
        ),
    }
}

/// `(name, name)` pairs in dict order.
type NamePairs = Vec<(String, String)>;

/// An insertion-ordered set of names (Caffe2 used Python sets; their iteration order was
/// hash-dependent, any consistent order reproduces it up to that).
#[derive(Default)]
struct NameSet {
    order: Vec<String>,
    set: FxHashSet<String>,
}

impl NameSet {
    fn insert(&mut self, s: &str) {
        if !self.set.contains(s) {
            self.set.insert(s.to_string());
            self.order.push(s.to_string());
        }
    }

    fn contains(&self, s: &str) -> bool {
        self.set.contains(s)
    }

    fn iter(&self) -> impl Iterator<Item = &String> {
        self.order.iter()
    }
}

/// An insertion-ordered map of names (a Python dict).
#[derive(Default)]
struct NameMap {
    entries: Vec<(String, String)>,
    index: FxHashMap<String, usize>,
}

impl NameMap {
    fn from_entries(entries: Vec<(String, String)>) -> Self {
        let mut m = NameMap::default();
        for (k, v) in entries {
            m.insert(k, v);
        }
        m
    }

    fn insert(&mut self, k: String, v: String) {
        match self.index.get(&k) {
            Some(&p) => self.entries[p].1 = v,
            None => {
                self.index.insert(k.clone(), self.entries.len());
                self.entries.push((k, v));
            }
        }
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.index.get(k).map(|&p| self.entries[p].1.as_str())
    }

    fn iter(&self) -> impl Iterator<Item = &(String, String)> {
        self.entries.iter()
    }
}

/// Caffe2's `dedupe_g_output`: the same gradient blob given for two different outputs is
/// copied to `<output>_<grad>_DEDUP` for the second one.
fn dedupe_g_output(
    op: &OperatorDef,
    g_output: &[GradRef],
) -> Result<(Vec<OperatorDef>, Vec<GradRef>)> {
    let mut ops = Vec::new();
    let mut deduped = Vec::with_capacity(g_output.len());
    let mut by_output: FxHashMap<&str, GradRef> = FxHashMap::default();
    let mut used: FxHashSet<GradRef> = FxHashSet::default();
    for (out, g) in op.output.iter().zip(g_output) {
        if !g.is_truthy() {
            deduped.push(g.clone());
            continue;
        }
        if let Some(prev) = by_output.get(out.as_str()) {
            deduped.push(prev.clone());
        } else if !used.contains(g) {
            by_output.insert(out, g.clone());
            used.insert(g.clone());
            deduped.push(g.clone());
        } else {
            let GradRef::Dense(name) = g else {
                return Err(Error::Type(format!(
                    "can only concatenate str (not \"GradientSlice\") to str: the sparse \
                     gradient of output {out} of {} is also given for another output",
                    describe(op)
                )));
            };
            let dedup = GradRef::Dense(format!("{out}_{name}_DEDUP"));
            ensure(
                !used.contains(&dedup),
                || format!("{out}_{name}_DEDUP is already a gradient"),
                op,
            )?;
            ops.push(copy_op(name, &format!("{out}_{name}_DEDUP")));
            by_output.insert(out, dedup.clone());
            used.insert(dedup.clone());
            deduped.push(dedup);
        }
    }
    Ok((ops, deduped))
}

/// A bare `Copy` op as the control gradients build it (no name).
fn copy_op(from: &str, to: &str) -> OperatorDef {
    OperatorDef::new("Copy", [from], [to])
}

/// Caffe2's `_gen_subgradient_pass`: the backward pass of `ops` seeded with `init` (each blob
/// with its gradient name); the gradient map with its values as strings.
fn subgradient_pass(
    ops: &[OperatorDef],
    init: &[(String, GradRef)],
    cx: &mut GradientContext<'_>,
) -> Result<(Vec<OperatorDef>, NamePairs)> {
    let mut ir = Ir::new(ops)?;
    ir.skip_unused_generators();
    let (grad_ops, grad_map) = ir.backward(init, cx)?;
    let names = grad_map
        .into_entries()
        .into_iter()
        .map(|(b, g)| {
            let s = blobref_str(&g);
            (b, s)
        })
        .collect();
    Ok((grad_ops, names))
}

/// A copy of `net` without ops and external inputs/outputs, named `<name><suffix>` when it
/// has a name.
fn net_shell(net: &NetDef, suffix: &str) -> NetDef {
    NetDef {
        name: net.name.as_ref().map(|n| {
            if n.is_empty() {
                n.clone()
            } else {
                format!("{n}{suffix}")
            }
        }),
        op: Vec::new(),
        r#type: net.r#type.clone(),
        num_workers: net.num_workers,
        device_option: net.device_option.clone(),
        arg: net.arg.clone(),
        external_input: Vec::new(),
        external_output: Vec::new(),
        partition_info: net.partition_info.clone(),
    }
}

/// Result of [`subnet_gradient`].
struct SubnetGradient {
    net: NetDef,
    grad_map: NameMap,
    inputs: NameSet,
    outputs: NameSet,
}

/// Caffe2's `_gen_subnet_gradient`: the gradient net of `subnet`, its gradient map, the blobs
/// its ops read before any of them writes them, and the blobs they write.
fn subnet_gradient(
    subnet: &NetDef,
    init: &[(String, GradRef)],
    cx: &mut GradientContext<'_>,
) -> Result<SubnetGradient> {
    let (grad_ops, grad_map) = subgradient_pass(&subnet.op, init, cx)?;
    let mut inputs = NameSet::default();
    let mut outputs = NameSet::default();
    for gop in &grad_ops {
        for i in &gop.input {
            if !outputs.contains(i) {
                inputs.insert(i);
            }
        }
        for o in &gop.output {
            outputs.insert(o);
        }
    }
    let mut net = net_shell(subnet, "_grad");
    net.op = grad_ops;
    Ok(SubnetGradient {
        net,
        grad_map: NameMap::from_entries(grad_map),
        inputs,
        outputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_reprs() {
        assert_eq!(py_repr("a"), "'a'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(
            grad_str(&GradRef::Sparse {
                indices: "i".into(),
                values: "v".into()
            }),
            "GradientSlice(indices='i', values='v')"
        );
        assert_eq!(
            blobref_str(&GradRef::Sparse {
                indices: "i".into(),
                values: "v".into()
            }),
            "GradientSlice(indices=BlobReference(\"i\"), values=BlobReference(\"v\"))"
        );
    }

    #[test]
    fn dedupe_copies_a_gradient_given_twice() -> Result<()> {
        let op = OperatorDef::new("Do", ["x", "ws"], ["y", "z", "ws"]);
        let g = [
            GradRef::Dense("g".into()),
            GradRef::Dense("g".into()),
            GradRef::None,
        ];
        let (ops, d) = dedupe_g_output(&op, &g)?;
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].input, vec!["g"]);
        assert_eq!(ops[0].output, vec!["z_g_DEDUP"]);
        assert_eq!(d[1], GradRef::Dense("z_g_DEDUP".into()));
        assert_eq!(d[2], GradRef::None);
        Ok(())
    }
}
