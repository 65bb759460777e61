//! Gradient of `Do` (Caffe2's `gen_do_gradient`): a gradient `Do` op running the backward
//! pass of the inner net, with the inner gradients bound to outer `<input>_grad` blobs.
//!
//! A `Do` op binds inner blob names (`inner_blobs`) to its outer inputs and outputs
//! (`outer_blobs_idx` indexes `inputs[:-1] + outputs[:-1]`); the last input and output are the
//! workspace blob.

use super::{
    copy_op, dedupe_g_output, ensure, grad_str, net_argument, net_shell, subgradient_pass, NameMap,
    NameSet,
};
use crate::autodiff::maker::{GradRef, GradientContext, GradientOutput};
use crate::error::{Error, Result};
use crate::graph::intern::FxHashMap;
use crate::proto::{Argument, NetDef, OperatorDef};

/// The bindings of a `Do` op, checked (Caffe2's `_do_op_sanity_check_and_process`).
pub(super) struct Bindings<'o> {
    pub subnet: &'o NetDef,
    pub outer_to_inner: FxHashMap<&'o str, String>,
    pub inner_to_outer: FxHashMap<String, &'o str>,
    pub workspace: &'o str,
}

/// Checks a `Do` op's net argument and blob bindings.
pub(super) fn sanity_check(op: &OperatorDef) -> Result<Bindings<'_>> {
    ensure(op.r#type() == "Do", || "Expected Do op".into(), op)?;
    let subnet = net_argument(op, "net")?;
    let Some(subnet) = subnet else {
        return Err(super::assertion(
            "No net argument found in Do op".into(),
            op,
        ));
    };
    let mut inner_blobs: Option<Vec<String>> = None;
    let mut outer_idx: Option<&[i64]> = None;
    for arg in &op.arg {
        if arg.name() == "inner_blobs" {
            ensure(
                inner_blobs.is_none(),
                || "inner_blobs redefinition".into(),
                op,
            )?;
            ensure(
                !arg.strings.is_empty(),
                || "Empty inner_blobs argument in Do op".into(),
                op,
            )?;
            let mut names = Vec::with_capacity(arg.strings.len());
            for s in &arg.strings {
                names.push(String::from_utf8(s.clone()).map_err(|_| {
                    super::assertion("inner_blobs of Do op is not valid UTF-8".into(), op)
                })?);
            }
            inner_blobs = Some(names);
        }
        if arg.name() == "outer_blobs_idx" {
            ensure(
                outer_idx.is_none(),
                || "outer_blobs_idx redefinition".into(),
                op,
            )?;
            ensure(
                !arg.ints.is_empty(),
                || "Empty outer_blobs_idx argument in Do op".into(),
                op,
            )?;
            outer_idx = Some(&arg.ints);
        }
        if inner_blobs.is_some() && outer_idx.is_some() {
            break;
        }
    }
    let Some(inner_blobs) = inner_blobs else {
        return Err(super::assertion(
            "No inner_blobs argument found in Do op".into(),
            op,
        ));
    };
    let Some(outer_idx) = outer_idx else {
        return Err(super::assertion(
            "No outer_blobs_idx argument found in Do op".into(),
            op,
        ));
    };
    ensure(
        inner_blobs.len() == outer_idx.len(),
        || "Arguments inner_blobs and outer_blobs_idx of different length in Do op".into(),
        op,
    )?;
    let distinct = |v: &[&str]| {
        let mut s = crate::graph::intern::FxHashSet::default();
        v.iter().all(|x| s.insert(*x))
    };
    let inner_refs: Vec<&str> = inner_blobs.iter().map(String::as_str).collect();
    ensure(
        distinct(&inner_refs),
        || "Found duplicates in inner_blobs in Do op".into(),
        op,
    )?;
    ensure(
        !op.input.is_empty(),
        || "Expected at least one input blob".into(),
        op,
    )?;
    ensure(
        !op.output.is_empty(),
        || "Expected at least one output blob".into(),
        op,
    )?;
    let in_ws = &op.input[op.input.len() - 1];
    let workspace = op.output[op.output.len() - 1].as_str();
    ensure(
        in_ws == workspace,
        || "Expected same input/output workspace blob".into(),
        op,
    )?;
    let ins: Vec<&str> = op.input[..op.input.len() - 1]
        .iter()
        .map(String::as_str)
        .collect();
    let outs: Vec<&str> = op.output[..op.output.len() - 1]
        .iter()
        .map(String::as_str)
        .collect();
    ensure(
        distinct(&ins),
        || "Found duplicates in Do op inputs".into(),
        op,
    )?;
    ensure(
        distinct(&outs),
        || "Found duplicates in Do op outputs".into(),
        op,
    )?;
    let ordered: Vec<&str> = ins.iter().chain(outs.iter()).copied().collect();
    let all: crate::graph::intern::FxHashSet<&str> = ordered.iter().copied().collect();
    let mut used: crate::graph::intern::FxHashSet<&str> = Default::default();
    let mut outer_to_inner = FxHashMap::default();
    let mut inner_to_outer = FxHashMap::default();
    for (inner, &idx) in inner_blobs.iter().zip(outer_idx) {
        ensure(
            idx >= 0 && (idx as usize) < ordered.len(),
            || "Outer blob index is out of bounds in Do op".into(),
            op,
        )?;
        let outer = ordered[idx as usize];
        ensure(
            !used.contains(outer),
            || format!("Reusage of outer blob name {outer} in Do op"),
            op,
        )?;
        used.insert(outer);
        outer_to_inner.insert(outer, inner.clone());
        inner_to_outer.insert(inner.clone(), outer);
    }
    ensure(
        used.len() == all.len(),
        || "Not all outer blob names are used in blob bindings in Do op".into(),
        op,
    )?;
    Ok(Bindings {
        subnet,
        outer_to_inner,
        inner_to_outer,
        workspace,
    })
}

fn strings_arg(name: &str, values: impl Iterator<Item = String>) -> Argument {
    Argument {
        name: Some(name.into()),
        strings: values.map(String::into_bytes).collect(),
        ..Default::default()
    }
}

/// Caffe2's `gen_do_gradient`.
pub(super) fn gradient(
    op: &OperatorDef,
    g_output: &[GradRef],
    cx: &mut GradientContext<'_>,
) -> Result<GradientOutput> {
    let b = sanity_check(op)?;
    ensure(
        g_output.len() == op.output.len(),
        || "Different number of gradient blobs and Do op outputs".into(),
        op,
    )?;
    let (mut grad_ops, g_output) = dedupe_g_output(op, g_output)?;
    let op_outputs = &op.output[..op.output.len() - 1];
    let op_inputs = &op.input[..op.input.len() - 1];
    let inner_of = |outer: &str| {
        b.outer_to_inner.get(outer).cloned().ok_or_else(|| {
            super::assertion(format!("outer blob {outer} has no binding in Do op"), op)
        })
    };

    let mut init: Vec<(String, GradRef)> = Vec::new();
    let mut initial_grad_map = NameMap::default();
    for (outer_out, g) in op_outputs.iter().zip(&g_output) {
        if !g.is_truthy() {
            continue;
        }
        let inner_out = inner_of(outer_out)?;
        let inner_grad = format!("{inner_out}/_DO_OPERATOR_INNER_GRAD_");
        init.push((inner_out, GradRef::Dense(inner_grad.clone())));
        initial_grad_map.insert(inner_grad, grad_str(g));
    }
    ensure(
        !initial_grad_map.entries.is_empty(),
        || "Empty initial gradient map for Do op".into(),
        op,
    )?;

    let (mut inner_grad_ops, inner_map) = subgradient_pass(&b.subnet.op, &init, cx)?;
    if inner_grad_ops.is_empty() {
        return Ok(GradientOutput::default());
    }
    let inner_map = NameMap::from_entries(inner_map);

    let mut copies = Vec::new();
    let mut g_input = Vec::with_capacity(op_inputs.len());
    let mut new_outputs: Vec<String> = Vec::new();
    let mut bindings = NameMap::default();
    for outer_in in op_inputs {
        let inner_in = inner_of(outer_in)?;
        match inner_map.get(&inner_in) {
            Some(inner_grad) => {
                let outer_grad = format!("{outer_in}_grad");
                let copy_name = format!("{inner_in}/_DO_OPERATOR_INNER_GRAD_COPY_");
                copies.push(copy_op(inner_grad, &copy_name));
                bindings.insert(copy_name, outer_grad.clone());
                new_outputs.push(outer_grad.clone());
                g_input.push(GradRef::Dense(outer_grad));
            }
            None => g_input.push(GradRef::None),
        }
    }

    let mut new_inputs = NameSet::default();
    let mut overwritten = crate::graph::intern::FxHashSet::<&str>::default();
    let mut saved = NameSet::default();
    for gop in &inner_grad_ops {
        for name in &gop.input {
            if overwritten.contains(name.as_str()) {
                continue;
            }
            let outer = match b.inner_to_outer.get(name) {
                Some(o) if !o.is_empty() => Some(o.to_string()),
                _ => initial_grad_map
                    .get(name)
                    .filter(|o| !o.is_empty())
                    .map(str::to_string),
            };
            match outer {
                Some(outer) => {
                    new_inputs.insert(&outer);
                    bindings.insert(name.clone(), outer);
                }
                None => saved.insert(name),
            }
        }
        overwritten.extend(gop.output.iter().map(String::as_str));
    }
    inner_grad_ops.extend(copies);

    let new_inputs: Vec<String> = new_inputs.iter().cloned().collect();
    let grad_do = gradient_do_op(
        op,
        b.subnet,
        inner_grad_ops,
        &new_inputs,
        &new_outputs,
        &bindings,
        &saved,
        b.workspace,
    )?;
    sanity_check(&grad_do)?;
    grad_ops.push(grad_do);
    Ok(GradientOutput {
        ops: grad_ops,
        input_grads: g_input,
    })
}

/// Caffe2's `_prepare_gradient_do_op`.
#[allow(clippy::too_many_arguments)]
fn gradient_do_op(
    fwd: &OperatorDef,
    fwd_net: &NetDef,
    grad_ops: Vec<OperatorDef>,
    inputs: &[String],
    outputs: &[String],
    bindings: &NameMap,
    saved: &NameSet,
    workspace: &str,
) -> Result<OperatorDef> {
    let mut net = net_shell(fwd_net, "_grad");
    net.op = grad_ops;
    let mut d = fwd.clone();
    if let Some(n) = d.name.as_mut().filter(|n| !n.is_empty()) {
        n.push_str("_grad");
    }
    d.input = inputs.to_vec();
    d.input.push(workspace.to_string());
    d.output = outputs.to_vec();
    d.output.push(workspace.to_string());
    let mut position: FxHashMap<&str, usize> = FxHashMap::default();
    for (k, name) in inputs.iter().chain(outputs).enumerate() {
        position.entry(name.as_str()).or_insert(k);
    }
    let mut idx = Vec::with_capacity(bindings.entries.len());
    for (inner, outer) in bindings.iter() {
        let p = position.get(outer.as_str()).ok_or_else(|| {
            Error::Assertion(format!(
                "binding of {inner} to {outer}: {outer} is not an input or output of the \
                 gradient Do op"
            ))
        })?;
        idx.push(*p as i64);
    }
    d.arg = vec![
        Argument {
            name: Some("net".into()),
            n: Some(net),
            ..Default::default()
        },
        strings_arg("inner_blobs", bindings.iter().map(|(k, _)| k.clone())),
        Argument {
            name: Some("outer_blobs_idx".into()),
            ints: idx,
            ..Default::default()
        },
        strings_arg("saved_fwd_blobs", saved.iter().cloned()),
    ];
    d.control_input.clear();
    d.is_gradient_op = Some(true);
    Ok(d)
}
