//! Gradient of `While` (Caffe2's `gen_while_gradient`): a gradient `While` that runs the
//! gradient of the loop body (a single `Do` op) once per saved forward workspace, with a
//! condition net that checks that a forward workspace is left (`HasScope`) and copies the
//! loop-carried gradients back to the names the next iteration reads.

use super::{
    assertion, dedupe_g_output, ensure, grad_str, net_argument, subnet_gradient, NameMap,
    SubnetGradient,
};
use crate::autodiff::maker::{GradRef, GradientContext, GradientOutput};
use crate::autodiff::scope::BackwardOptions;
use crate::error::Result;
use crate::graph::intern::FxHashSet;
use crate::proto::{Argument, NetDef, OperatorDef};

/// Caffe2's `gen_while_gradient`.
pub(super) fn gradient(
    op: &OperatorDef,
    g_output: &[GradRef],
    cx: &mut GradientContext<'_>,
) -> Result<GradientOutput> {
    ensure(op.r#type() == "While", || "Expected While op".into(), op)?;
    ensure(
        !op.input.is_empty(),
        || "Expected at least one input in While op".into(),
        op,
    )?;
    ensure(
        op.output.len() == g_output.len(),
        || "Different number of gradient blobs and While op outputs".into(),
        op,
    )?;
    let (mut grad_ops, g_output) = dedupe_g_output(op, g_output)?;
    let mut init_grad_map = NameMap::default();
    for (out, g) in op.output.iter().zip(&g_output) {
        if g.is_truthy() {
            init_grad_map.insert(out.clone(), grad_str(g));
        }
    }
    ensure(
        !init_grad_map.entries.is_empty(),
        || "Empty initial gradient map for While op".into(),
        op,
    )?;

    let loop_net = net_argument(op, "loop_net")?
        .ok_or_else(|| assertion("Expected loop subnet in While op".into(), op))?;
    ensure(
        loop_net.op.len() == 1 && loop_net.op[0].r#type() == "Do",
        || "Gradient While op requires single Do op as a loop body".into(),
        op,
    )?;
    let do_op = &loop_net.op[0];
    check_do_arguments(do_op, op)?;
    let workspace = do_op
        .output
        .last()
        .ok_or_else(|| assertion("Expected Do op with at least one output".into(), op))?;

    let init: Vec<(String, GradRef)> = init_grad_map
        .iter()
        .map(|(k, v)| (k.clone(), GradRef::Dense(v.clone())))
        .collect();
    let SubnetGradient {
        net: loop_grad_net,
        grad_map: loop_grad_map,
        inputs,
        outputs,
    } = subnet_gradient(loop_net, &init, cx)?;

    let cond_name = cx.net_names.next_net_name("gradient_loop_cond_net")?;
    let init_name = cx.net_names.next_net_name("gradient_loop_cond_net_init")?;
    let options = cx.options;
    let cond_blob = options.scoped(&format!("{cond_name}/cond"));
    let ws = options.scoped(workspace);
    let mut cond_net = MiniNet::new(cond_name);
    let mut cond_init = MiniNet::new(init_name);
    cond_init.add("HasScope", &ws, &cond_blob, options);
    cond_net.add("HasScope", &ws, &cond_blob, options);
    for (blob, init_grad) in init_grad_map.iter() {
        if let Some(loop_grad) = loop_grad_map.get(blob) {
            if loop_grad != init_grad {
                cond_net.add("Copy", loop_grad, init_grad, options);
                cond_init.add("Copy", init_grad, loop_grad, options);
            }
        }
    }

    let mut w = op.clone();
    if let Some(n) = w.name.as_mut().filter(|n| !n.is_empty()) {
        n.push_str("_grad");
    }
    w.arg = vec![
        Argument {
            name: Some("loop_net".into()),
            n: Some(loop_grad_net),
            ..Default::default()
        },
        Argument {
            name: Some("cond_net".into()),
            n: Some(cond_net.def),
            ..Default::default()
        },
    ];
    w.control_input.clear();
    w.input = std::iter::once(cond_blob)
        .chain(inputs.iter().cloned())
        .collect();
    w.output = outputs.iter().cloned().collect();
    w.is_gradient_op = Some(true);

    grad_ops.extend(cond_init.def.op);
    grad_ops.push(w);
    let g_input = op
        .input
        .iter()
        .map(|i| {
            loop_grad_map
                .get(i)
                .map_or(GradRef::None, |g| GradRef::Dense(g.to_string()))
        })
        .collect();
    Ok(GradientOutput {
        ops: grad_ops,
        input_grads: g_input,
    })
}

/// Caffe2's `_get_do_arguments` checks plus the `reuse_workspace` restriction.
fn check_do_arguments(do_op: &OperatorDef, op: &OperatorDef) -> Result<()> {
    let mut reuse = false;
    for arg in &do_op.arg {
        match arg.name() {
            "reuse_workspace" => {
                ensure(
                    arg.i.unwrap_or(0) != 0,
                    || "Expected non empty reuse_workspace argument".into(),
                    op,
                )?;
                reuse = true;
            }
            "inner_blobs" => ensure(
                !arg.strings.is_empty(),
                || "Expected non empty inner_blobs argument".into(),
                op,
            )?,
            "outer_blobs_idx" => ensure(
                !arg.ints.is_empty(),
                || "Expected non empty outer_blobs_idx argument".into(),
                op,
            )?,
            _ => {}
        }
    }
    ensure(
        !reuse,
        || "Gradient While op requires Do loop body op without reuse_workspace set".into(),
        op,
    )
}

/// The part of `core.Net` the condition nets need: ops created with `CreateOperator`, inputs
/// not produced by an earlier op recorded as external inputs.
struct MiniNet {
    def: NetDef,
    defined: FxHashSet<String>,
}

impl MiniNet {
    fn new(name: String) -> Self {
        MiniNet {
            def: NetDef {
                name: Some(name),
                ..Default::default()
            },
            defined: FxHashSet::default(),
        }
    }

    fn add(&mut self, op_type: &str, input: &str, output: &str, options: &BackwardOptions) {
        if !self.defined.contains(input) {
            self.def.external_input.push(input.to_string());
            self.defined.insert(input.to_string());
        }
        self.defined.insert(output.to_string());
        self.def.op.push(options.create_operator(
            op_type,
            vec![input.to_string()],
            vec![output.to_string()],
            vec![],
        ));
    }
}
