//! Gradient of `If` (Caffe2's `gen_if_gradient`): a gradient `If` on the same condition whose
//! branches are the gradient nets of the forward branches; a gradient that only one branch
//! computes is zero-filled (or copied from the incoming gradient) in the other branch.

use super::{
    assertion, copy_op, dedupe_g_output, ensure, grad_str, net_argument, net_shell,
    subnet_gradient, NameMap, NameSet, SubnetGradient,
};
use crate::autodiff::maker::{GradRef, GradientContext, GradientOutput};
use crate::autodiff::scope::float_arg;
use crate::error::{Error, Result};
use crate::proto::{Argument, NetDef, OperatorDef};

/// Caffe2's `gen_if_gradient`.
pub(super) fn gradient(
    op: &OperatorDef,
    g_output: &[GradRef],
    cx: &mut GradientContext<'_>,
) -> Result<GradientOutput> {
    ensure(op.r#type() == "If", || "Expected If op".into(), op)?;
    ensure(
        !op.input.is_empty(),
        || "Expected at least one input in If op".into(),
        op,
    )?;
    ensure(
        op.output.len() == g_output.len(),
        || "Different number of gradient blobs and If op outputs".into(),
        op,
    )?;
    let (grad_ops, g_output) = dedupe_g_output(op, g_output)?;
    let mut init_grad_map = NameMap::default();
    for (out, g) in op.output.iter().zip(&g_output) {
        if g.is_truthy() {
            init_grad_map.insert(out.clone(), grad_str(g));
        }
    }
    ensure(
        !init_grad_map.entries.is_empty(),
        || "Empty initial gradient map for If op".into(),
        op,
    )?;
    let init: Vec<(String, GradRef)> = init_grad_map
        .iter()
        .map(|(k, v)| (k.clone(), GradRef::Dense(v.clone())))
        .collect();

    let then_net = net_argument(op, "then_net")?
        .ok_or_else(|| assertion("Expected then subnet in If op".into(), op))?;
    let SubnetGradient {
        net: mut then_grad_net,
        grad_map: then_grad_map,
        inputs: then_inputs,
        outputs: then_outputs,
    } = subnet_gradient(then_net, &init, cx)?;
    let mut grad_map = NameMap::default();
    for (k, v) in then_grad_map.iter() {
        grad_map.insert(k.clone(), v.clone());
    }

    let mut else_inputs = NameSet::default();
    let mut else_outputs = NameSet::default();
    let mut else_grad_map = NameMap::default();
    let mut else_grad_net: Option<NetDef> = None;
    if let Some(else_net) = net_argument(op, "else_net")? {
        let g = subnet_gradient(else_net, &init, cx)?;
        else_inputs = g.inputs;
        else_outputs = g.outputs;
        else_grad_map = g.grad_map;
        else_grad_net = Some(g.net);
        for (blob, else_grad) in else_grad_map.iter() {
            match then_grad_map.get(blob) {
                Some(then_grad) if then_grad != else_grad => {
                    let init_grad = init_grad_map.get(blob);
                    if Some(then_grad) == init_grad {
                        grad_map.insert(blob.clone(), else_grad.clone());
                    } else if Some(else_grad.as_str()) == init_grad {
                        grad_map.insert(blob.clone(), then_grad.to_string());
                    } else {
                        // Caffe2 raised a plain string here, which Python turns into a
                        // TypeError.
                        return Err(Error::Type(format!(
                            "exceptions must derive from BaseException (Caffe2 failed to \
                             raise: Unexpected grad blob name {blob}, {else_grad}, {then_grad})"
                        )));
                    }
                }
                Some(_) => {}
                None => grad_map.insert(blob.clone(), else_grad.clone()),
            }
        }
    }

    // Gradients that only one branch computes must be initialised in the other one.
    let then_values: crate::graph::intern::FxHashSet<&str> =
        then_grad_map.iter().map(|(_, v)| v.as_str()).collect();
    let then_only: Vec<&String> = then_outputs
        .iter()
        .filter(|o| !else_outputs.contains(o) && then_values.contains(o.as_str()))
        .collect();
    let zero_then = zero_init_ops(&init_grad_map, &then_grad_map, &then_only, op)?;
    match else_grad_net.as_mut() {
        Some(n) => n.op.extend(zero_then),
        None if !zero_then.is_empty() => {
            let mut n = net_shell(&then_grad_net, "_auto_else_zero_blobs_");
            n.op = zero_then;
            else_grad_net = Some(n);
        }
        None => {}
    }
    let else_values: crate::graph::intern::FxHashSet<&str> =
        else_grad_map.iter().map(|(_, v)| v.as_str()).collect();
    let else_only: Vec<&String> = else_outputs
        .iter()
        .filter(|o| !then_outputs.contains(o) && else_values.contains(o.as_str()))
        .collect();
    let zero_else = zero_init_ops(&init_grad_map, &else_grad_map, &else_only, op)?;
    then_grad_net.op.extend(zero_else);

    let mut outputs = NameSet::default();
    for o in then_outputs.iter().chain(else_outputs.iter()) {
        outputs.insert(o);
    }
    let cond = op.input[0].as_str();
    let mut inputs = vec![cond.to_string()];
    let mut all_inputs = NameSet::default();
    for i in then_inputs.iter().chain(else_inputs.iter()) {
        all_inputs.insert(i);
    }
    // Caffe2 removed `set(cond)` here: the set of the condition name's characters.
    inputs.extend(
        all_inputs
            .iter()
            .filter(|i| !(i.chars().count() == 1 && cond.contains(i.as_str())))
            .cloned(),
    );

    let mut d = op.clone();
    d.input = inputs;
    d.output = outputs.iter().cloned().collect();
    let mut args = vec![Argument {
        name: Some("then_net".into()),
        n: Some(then_grad_net),
        ..Default::default()
    }];
    if let Some(n) = else_grad_net {
        args.push(Argument {
            name: Some("else_net".into()),
            n: Some(n),
            ..Default::default()
        });
    }
    d.arg = args;
    if let Some(n) = d.name.as_mut().filter(|n| !n.is_empty()) {
        n.push_str("_grad");
    }
    d.control_input.clear();
    d.is_gradient_op = Some(true);

    let g_input = op
        .input
        .iter()
        .map(|i| {
            grad_map
                .get(i)
                .map_or(GradRef::None, |g| GradRef::Dense(g.to_string()))
        })
        .collect();
    let mut ops = grad_ops;
    ops.push(d);
    Ok(GradientOutput {
        ops,
        input_grads: g_input,
    })
}

/// Caffe2's `_gen_grad_zero_init_ops`: for each gradient blob, a `Copy` from the incoming
/// gradient when the blob is an output of the `If` with another gradient name, else a
/// `ConstantFill` of zeros shaped like the blob.
fn zero_init_ops(
    init_grad_map: &NameMap,
    grad_map: &NameMap,
    grad_outputs: &[&String],
    op: &OperatorDef,
) -> Result<Vec<OperatorDef>> {
    let mut by_grad: crate::graph::intern::FxHashMap<&str, &str> = Default::default();
    for (blob, g) in grad_map.iter() {
        by_grad.entry(g.as_str()).or_insert(blob.as_str());
    }
    let mut ops = Vec::new();
    for g in grad_outputs {
        let blob = by_grad.get(g.as_str()).copied().filter(|b| !b.is_empty());
        let blob = blob.ok_or_else(|| assertion(format!("Unknown gradient output {g}"), op))?;
        match init_grad_map.get(blob) {
            Some(init) if init != g.as_str() => ops.push(copy_op(init, g)),
            Some(_) => {}
            None => {
                let mut fill = OperatorDef::new("ConstantFill", [blob], [g.as_str()]);
                fill.arg.push(float_arg("value", 0.0));
                ops.push(fill);
            }
        }
    }
    Ok(ops)
}
