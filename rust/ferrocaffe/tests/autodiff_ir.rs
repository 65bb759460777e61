//! The backward-pass IR against Caffe2's behaviour, with small test makers (independent of the
//! built-in makers): naming, accumulation, version checks and their debug help, device options,
//! the two-character quirk, dispatch between native makers and gradient functions.

use std::sync::Arc;

use ferrocaffe::autodiff::maker::grad_op;
use ferrocaffe::autodiff::registry::GradientKind;
use ferrocaffe::autodiff::{
    backward_pass, backward_pass_in, gradient_for_op, ys_list, BackwardOptions, GradRef,
    GradientContext, GradientMaker, GradientOutput, Ir, MakerCtx, Registry, UsedNetNames,
};
use ferrocaffe::proto::{DeviceOption, OperatorDef};
use ferrocaffe::{Error, Result};

fn op(t: &str, ins: &[&str], outs: &[&str]) -> OperatorDef {
    let mut o = OperatorDef::new(t, ins.iter().copied(), outs.iter().copied());
    o.name = Some(String::new());
    o
}

/// `Unary(x) -> y`: `UnaryGradient(y, dy) -> dx`.
fn unary(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let (y, gy, gx) = (ctx.o(0), ctx.go(0)?, ctx.gi(0));
    Ok(vec![grad_op("UnaryGradient", [y, gy], [gx], vec![])])
}

/// `Binary(a, b) -> c`: `BinaryGradient(dc, a, b) -> (da, db)`.
fn binary(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let (gc, a, b) = (ctx.go(0)?, ctx.i(0), ctx.i(1));
    let (ga, gb) = (ctx.gi(0), ctx.gi(1));
    Ok(vec![grad_op(
        "BinaryGradient",
        [gc, a, b],
        [ga, gb],
        vec![],
    )])
}

/// `Pass(x...) -> y` (like `Sum`): every input gets the output gradient, no op.
fn pass(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let g = ctx.go(0)?;
    for k in 0..ctx.def.input.len() {
        ctx.set_dense(k, g.clone());
    }
    Ok(vec![])
}

/// `Lookup(table, ids) -> rows` (like `Gather`): a sparse gradient passed through.
fn lookup(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let (ids, g) = (ctx.i(1), ctx.go(0)?);
    ctx.g_input[0] = GradRef::Sparse {
        indices: ids,
        values: g,
    };
    Ok(vec![])
}

/// `Zero(x)`: a zero gradient for its input even without output gradients.
fn zero(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let (x, gx) = (ctx.i(0), ctx.gi(0));
    Ok(vec![grad_op("ConstantFill", [x], [gx], vec![])])
}

/// `Leaky(x) -> y`: the gradient op reads a blob that nothing provides.
fn leaky(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let (gy, gx) = (ctx.go(0)?, ctx.gi(0));
    Ok(vec![grad_op(
        "LeakyGradient",
        [gy, "nowhere".into()],
        [gx],
        vec![],
    )])
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register_maker("Unary", unary);
    r.register_maker("Binary", binary);
    r.register_maker("Pass", pass);
    r.register_maker("Lookup", lookup);
    r.register_maker("ZeroGradient", zero);
    r.register_maker("Leaky", leaky);
    r.register("StopGradient", GradientKind::NoGradient);
    r.register("Bad", GradientKind::ShouldNotDo);
    r.register("Later", GradientKind::NotImplemented);
    r
}

fn names(ops: &[OperatorDef]) -> Vec<String> {
    ops.iter()
        .map(|o| {
            format!(
                "{}({})->({})",
                o.r#type(),
                o.input.join(","),
                o.output.join(",")
            )
        })
        .collect()
}

fn dense(s: &str) -> GradRef {
    GradRef::Dense(s.into())
}

#[test]
fn chain_seed_and_gradient_names() -> Result<()> {
    let ops = vec![op("Unary", &["x"], &["h"]), op("Unary", &["h"], &["y"])];
    let (g, m) = backward_pass(&ops, &ys_list(["y"]), &registry())?;
    assert_eq!(
        names(&g),
        [
            "ConstantFill(y)->(y_autogen_grad)",
            "UnaryGradient(y,y_autogen_grad)->(h_grad)",
            "UnaryGradient(h,h_grad)->(x_grad)",
        ]
    );
    let seed = &g[0];
    assert_eq!(seed.name.as_deref(), Some(""));
    assert_eq!(seed.arg[0].name(), "value");
    assert_eq!(seed.arg[0].f, Some(1.0));
    assert!(seed.device_option.is_none());
    assert_eq!(seed.is_gradient_op, None);
    assert_eq!(g[1].is_gradient_op, Some(true));
    assert_eq!(m.get("y"), Some(&dense("y_autogen_grad")));
    assert_eq!(m.get("x"), Some(&dense("x_grad")));
    assert_eq!(m.len(), 3);
    Ok(())
}

#[test]
fn fan_out_is_summed_with_autosplit_names() -> Result<()> {
    let ops = vec![
        op("Unary", &["x"], &["a"]),
        op("Unary", &["x"], &["b"]),
        op("Binary", &["a", "b"], &["c"]),
    ];
    let (g, m) = backward_pass(&ops, &ys_list(["c"]), &registry())?;
    assert_eq!(
        names(&g),
        [
            "ConstantFill(c)->(c_autogen_grad)",
            "BinaryGradient(c_autogen_grad,a,b)->(a_grad,b_grad)",
            "UnaryGradient(b,b_grad)->(x_grad)",
            "UnaryGradient(a,a_grad)->(_x_grad_autosplit_0)",
            "Sum(x_grad,_x_grad_autosplit_0)->(x_grad)",
        ]
    );
    let sum = &g[4];
    assert_eq!(sum.name.as_deref(), Some(""));
    let d = sum.device_option.clone().unwrap_or_default();
    assert_eq!(d.extra_info, ["is_auto_gen_sum_ops:1"]);
    assert_eq!(m.get("x"), Some(&dense("x_grad")));
    Ok(())
}

#[test]
fn same_input_twice_is_summed() -> Result<()> {
    let ops = vec![op("Binary", &["x", "x"], &["y"])];
    let (g, _) = backward_pass(&ops, &ys_list(["y"]), &registry())?;
    assert_eq!(
        names(&g)[1..],
        [
            "BinaryGradient(y_autogen_grad,x,x)->(x_grad,_x_grad_autosplit_0)",
            "Sum(x_grad,_x_grad_autosplit_0)->(x_grad)",
        ]
    );
    Ok(())
}

#[test]
fn pass_through_gradients_keep_their_names_and_sum_swaps_in_place() -> Result<()> {
    // Backward order: Pass (pass-through, first generator), then Unary.
    let ops = vec![
        op("Unary", &["x"], &["r"]),
        op("Pass", &["x", "w"], &["s"]),
        op("Binary", &["s", "r"], &["m"]),
    ];
    let (g, m) = backward_pass(&ops, &ys_list(["m"]), &registry())?;
    let last = names(&g).pop().unwrap_or_default();
    assert_eq!(last, "Sum(x_grad,s_grad)->(x_grad)");
    assert_eq!(m.get("w"), Some(&dense("s_grad")));
    assert_eq!(m.get("x"), Some(&dense("x_grad")));
    Ok(())
}

#[test]
fn sparse_gradients_are_concatenated() -> Result<()> {
    let ops = vec![
        op("Lookup", &["w", "ids"], &["e1"]),
        op("Lookup", &["w", "ids2"], &["e2"]),
        op("Binary", &["e1", "e2"], &["y"]),
    ];
    let (g, m) = backward_pass(&ops, &ys_list(["y"]), &registry())?;
    let n = names(&g);
    assert_eq!(
        n[n.len() - 2..],
        [
            "Concat(ids2,ids)->(w_grad_indices_concat,w_grad_indices_concat_split)",
            "Concat(e2_grad,e1_grad)->(w_grad_values_concat,w_grad_values_concat_split)",
        ]
    );
    assert_eq!(g[g.len() - 1].arg[0].name(), "axis");
    assert_eq!(g[g.len() - 1].arg[0].i, Some(0));
    assert_eq!(
        m.get("w"),
        Some(&GradRef::Sparse {
            indices: "w_grad_indices_concat".into(),
            values: "w_grad_values_concat".into()
        })
    );
    Ok(())
}

#[test]
fn mixing_sparse_and_dense_is_an_error() {
    let ops = vec![
        op("Lookup", &["w", "ids"], &["e"]),
        op("Unary", &["w"], &["v"]),
        op("Binary", &["e", "v"], &["y"]),
    ];
    let err = backward_pass(&ops, &ys_list(["y"]), &registry());
    match err {
        Err(Error::Runtime(m)) => assert_eq!(
            m,
            "Gradients for param ''w'' failed to verify: Automatic aggregation of a mix of \
             sparse and dense gradients is not supported yet"
        ),
        other => panic!("expected a runtime error, got {other:?}"),
    }
}

#[test]
fn overwritten_output_error_has_caffe2_debug_help() {
    let ops = vec![op("Unary", &["x"], &["y"]), op("Unary", &["y"], &["y"])];
    let err = backward_pass(&ops, &ys_list(["y"]), &registry());
    let Err(Error::Runtime(m)) = err else {
        panic!("expected a runtime error, got {err:?}")
    };
    let expected = "Gradient operator needs output \"y\" at version 0, but currently we have \
                    version 1.\n\nDEBUG HELP:\nMaybe you use same output blob twice for \
                    different ops?\n== Version history of blob [y]\nVersion (out) 0 <-- \
                    input: \"x\"\noutput: \"y\"\nname: \"\"\ntype: \"Unary\"\n\nVersion (out) 1 \
                    <-- input: \"y\"\noutput: \"y\"\nname: \"\"\ntype: \"Unary\"\n\n";
    assert_eq!(m, expected);
}

#[test]
fn overwritten_input_error_has_caffe2_debug_help() {
    let ops = vec![
        op("Binary", &["a", "b"], &["c"]),
        op("Unary", &["b"], &["b"]),
        op("Binary", &["c", "b"], &["y"]),
    ];
    let err = backward_pass(&ops, &ys_list(["y"]), &registry());
    let Err(Error::Runtime(m)) = err else {
        panic!("expected a runtime error, got {err:?}")
    };
    assert!(
        m.starts_with(
            "Gradient operator needs input \"b\" at version 0, but currently we have version \
             1.\n\nDEBUG HELP:\nMaybe the blob was overwritten by another op?\n== Version \
             history of blob [b]\nversion (in) 0 <-- input: \"a\"\ninput: \"b\"\n"
        ),
        "{m}"
    );
    assert!(
        m.contains("version (in) 1 <-- input: \"c\"\ninput: \"b\"\n"),
        "{m}"
    );
}

#[test]
fn gradient_name_of_an_old_version_is_an_error() {
    // h is written twice; the gradient of the second write is still in the table when the
    // first writer is reached.
    let ops = vec![
        op("Binary", &["x", "w"], &["h"]),
        op("Unary", &["z"], &["h"]),
        op("Unary", &["h"], &["y"]),
    ];
    let err = backward_pass(&ops, &ys_list(["y"]), &registry());
    let Err(Error::Runtime(m)) = err else {
        panic!("expected a runtime error, got {err:?}")
    };
    assert!(
        m.starts_with(
            "Gradient name \"h_grad\" is expected to correspond to version 0 of \"h\", but \
             currently we have version 1.\n\nDEBUG HELP:\nMaybe you use same output blob twice"
        ),
        "{m}"
    );
}

#[test]
fn two_character_gradient_names_are_slices_for_native_makers() {
    // Caffe2 unpacked a 2-character name into (indices, values).
    let ops = vec![op("Unary", &["x"], &["y"])];
    let ys = vec![("y".to_string(), dense("gy"))];
    let err = backward_pass(&ops, &ys, &registry());
    let Err(Error::GradientMaker {
        op_type, reason, ..
    }) = err
    else {
        panic!("expected a maker error, got {err:?}")
    };
    assert_eq!(op_type, "Unary");
    assert_eq!(reason, "Gradient of output y is sparse (expected dense).");
}

#[test]
fn blob_out_of_scope_is_an_error() {
    let ops = vec![op("Leaky", &["x"], &["y"])];
    let err = backward_pass(&ops, &ys_list(["y"]), &registry());
    let Err(Error::Runtime(m)) = err else {
        panic!("expected a runtime error, got {err:?}")
    };
    assert_eq!(
        m,
        "Blob name \"nowhere\" not in the scope of operator: input: \"x\"\noutput: \"y\"\n\
         name: \"\"\ntype: \"Leaky\"\n\nand is not generated by any of the local gradient \
         operators."
    );
}

#[test]
fn stop_gradient_blocks_and_orphans_are_rejected() -> Result<()> {
    let ops = vec![
        op("Unary", &["x"], &["h"]),
        op("StopGradient", &["h"], &["h"]),
        op("Unary", &["h"], &["y"]),
    ];
    let (g, m) = backward_pass(&ops, &ys_list(["y"]), &registry())?;
    assert_eq!(g.len(), 2);
    assert!(m.get("h").is_none());
    assert!(m.get("x").is_none());

    let orphan = vec![op("StopGradient", &["x"], &["s"])];
    let err = backward_pass(&orphan, &ys_list(["x"]), &registry());
    let Err(Error::InvalidArgument(m)) = err else {
        panic!("expected an orphan error, got {err:?}")
    };
    assert!(
        m.starts_with(
            "StopGradient's output 's' is orphan.\nYou typically want to specify same input \
             and output for\nStopGradient. Op:\n\ninput: \"x\""
        ),
        "{m}"
    );
    Ok(())
}

#[test]
fn zero_gradient_runs_without_output_gradients() -> Result<()> {
    let ops = vec![
        op("Unary", &["x"], &["h"]),
        op("ZeroGradient", &["h"], &[]),
        op("Unary", &["x"], &["y"]),
    ];
    let (g, m) = backward_pass(&ops, &ys_list(["y"]), &registry())?;
    let n = names(&g);
    assert!(
        n.contains(&"ConstantFill(h)->(h_grad)".to_string()),
        "{n:?}"
    );
    assert_eq!(m.get("h"), Some(&dense("h_grad")));
    assert_eq!(
        n.last().map(String::as_str),
        Some("Sum(x_grad,_x_grad_autosplit_0)->(x_grad)")
    );
    Ok(())
}

#[test]
fn ys_with_given_gradients_and_unknown_blobs() -> Result<()> {
    let ops = vec![op("Unary", &["x"], &["y"])];
    let ys = vec![
        ("y".to_string(), dense("y_given")),
        ("nowhere".to_string(), GradRef::None),
    ];
    let (g, m) = backward_pass(&ops, &ys, &registry())?;
    assert_eq!(
        names(&g),
        [
            "ConstantFill(nowhere)->(nowhere_autogen_grad)",
            "UnaryGradient(y,y_given)->(x_grad)",
        ]
    );
    assert_eq!(m.get("y"), Some(&dense("y_given")));
    assert_eq!(m.get("nowhere"), Some(&dense("nowhere_autogen_grad")));
    let (g, m) = backward_pass(&ops, &[], &registry())?;
    assert!(g.is_empty() && m.is_empty());
    Ok(())
}

fn with_device(mut o: OperatorDef, d: DeviceOption) -> OperatorDef {
    o.device_option = Some(d);
    o
}

fn fan_out_with(d1: DeviceOption, d2: DeviceOption) -> Result<Vec<OperatorDef>> {
    // Makers built with MakerCtx copy the forward op's device option.
    let ops = vec![
        with_device(op("Unary", &["x"], &["a"]), d1),
        with_device(op("Unary", &["x"], &["b"]), d2),
        op("Binary", &["a", "b"], &["c"]),
    ];
    Ok(backward_pass(&ops, &ys_list(["c"]), &registry())?.0)
}

#[test]
fn accumulation_device_options() -> Result<()> {
    let gpu = DeviceOption {
        device_type: Some(1),
        device_id: Some(1),
        node_name: Some("n".into()),
        ..Default::default()
    };
    let g = fan_out_with(gpu.clone(), gpu.clone())?;
    let sum = g.last().cloned().unwrap_or_default();
    let mut expected = gpu.clone();
    expected.extra_info.push("is_auto_gen_sum_ops:1".into());
    assert_eq!(sum.device_option, Some(expected));

    let keep = DeviceOption {
        extra_info: vec![
            "parallelize:shard_by_1".into(),
            "only_keep_is_auto_gen_sum_ops_tag:1".into(),
        ],
        ..Default::default()
    };
    let g = fan_out_with(keep.clone(), keep)?;
    let sum = g.last().cloned().unwrap_or_default();
    assert_eq!(
        sum.device_option,
        Some(DeviceOption {
            extra_info: vec!["is_auto_gen_sum_ops:1".into()],
            ..Default::default()
        })
    );

    let other = DeviceOption {
        device_type: Some(1),
        device_id: Some(0),
        ..Default::default()
    };
    match fan_out_with(gpu, other) {
        Err(Error::Runtime(m)) => assert_eq!(
            m,
            "Gradients for param ''x'' failed to verify: Unexpected behavior: not all grad ops \
             have the same device option."
        ),
        other => panic!("expected a device error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn dispatch_errors_name_the_op() {
    let names = UsedNetNames::new();
    let r = registry();
    let run = |t: &str| {
        let mut n = names.clone();
        let o = BackwardOptions::default();
        let mut cx = GradientContext {
            registry: &r,
            net_names: &mut n,
            options: &o,
        };
        gradient_for_op(&op(t, &["x"], &["y"]), &[dense("y_grad")], &mut cx)
    };
    let msg = |e: Result<GradientOutput>| match e {
        Err(e @ Error::GradientMaker { .. }) => e.to_string(),
        other => panic!("expected a maker error, got {other:?}"),
    };
    let m = msg(run("NoSuchOp"));
    assert!(
        m.starts_with("Exception when creating gradient for [NoSuchOp]:"),
        "{m}"
    );
    assert!(m.contains("GradientRegistry()->Has(def.type())"), "{m}");
    assert!(m.ends_with("Op: \ninput: \"x\"\noutput: \"y\"\nname: \"\"\ntype: \"NoSuchOp\"\n"));
    let m = msg(run("Bad"));
    assert!(
        m.contains("One should not call gradient for operator Bad."),
        "{m}"
    );
    let m = msg(run("Later"));
    assert!(m.contains("Operator Later should have a gradient but is not implemented yet."));
    let ok = run("StopGradient");
    assert!(matches!(ok, Ok(out) if out.ops.is_empty() && out.input_grads == [GradRef::None]));
}

struct Fixed(&'static str);

impl GradientMaker for Fixed {
    fn make(&self, op: &OperatorDef, _g: &[GradRef]) -> Result<GradientOutput> {
        Ok(GradientOutput {
            ops: vec![OperatorDef::new(self.0, op.output.iter(), op.input.iter())],
            input_grads: op.input.iter().map(|i| dense(i)).collect(),
        })
    }
}

#[test]
fn native_makers_win_and_functions_are_the_fallback() -> Result<()> {
    let mut r = registry();
    r.register_function("Unary", Arc::new(Fixed("FromFunction")));
    r.register_function("Custom", Arc::new(Fixed("FromFunction")));
    let (g, _) = backward_pass(&[op("Unary", &["x"], &["y"])], &ys_list(["y"]), &r)?;
    assert_eq!(g[1].r#type(), "UnaryGradient");
    let (g, _) = backward_pass(&[op("Custom", &["x"], &["y"])], &ys_list(["y"]), &r)?;
    assert_eq!(g[1].r#type(), "FromFunction");
    // Results of gradient functions are taken as they are: not marked as gradient ops.
    assert_eq!(g[1].is_gradient_op, None);
    // A native maker that fails hands over to the function (Caffe2 tried Python next).
    let ys = vec![("y".to_string(), dense("gy"))];
    let (g, _) = backward_pass(&[op("Unary", &["x"], &["y"])], &ys, &r)?;
    assert_eq!(g[0].r#type(), "FromFunction");
    Ok(())
}

#[test]
fn scopes_apply_to_created_ops() -> Result<()> {
    let ops = vec![
        op("Unary", &["x"], &["a"]),
        op("Unary", &["x"], &["b"]),
        op("Binary", &["a", "b"], &["c"]),
    ];
    let r = registry();
    let mut names = UsedNetNames::new();
    let gpu = DeviceOption {
        device_type: Some(1),
        ..Default::default()
    };
    let options = BackwardOptions {
        name_scope: "s/".into(),
        device_scope: Some(gpu.clone()),
    };
    let mut cx = GradientContext {
        registry: &r,
        net_names: &mut names,
        options: &options,
    };
    let (g, m) = backward_pass_in(&ops, &ys_list(["c"]), &mut cx)?;
    assert_eq!(g[0].output, ["s/c_autogen_grad"]);
    assert_eq!(g[0].device_option, Some(gpu));
    assert_eq!(m.get("c"), Some(&dense("s/c_autogen_grad")));
    Ok(())
}

#[test]
fn ir_state_matches_caffe2_shapes() -> Result<()> {
    let ops = vec![
        op("Unary", &["x"], &["x"]),
        op("Binary", &["x", "x"], &["y"]),
    ];
    let mut ir = Ir::new(&ops)?;
    let s = ir.state();
    assert_eq!(s.frontier, [("x".to_string(), 1), ("y".to_string(), 0)]);
    assert_eq!(s.ssa[0].0, [("x".to_string(), 0)]);
    assert_eq!(s.ssa[0].1, [("x".to_string(), 1)]);
    assert_eq!(s.ssa[1].0, [("x".to_string(), 1)]);
    assert_eq!(
        s.input_usages,
        [
            ("x".to_string(), 0, vec![0]),
            ("x".to_string(), 1, vec![1, 1])
        ]
    );
    let ys = ys_list(["y"]);
    let r = registry();
    let mut names = UsedNetNames::new();
    let options = BackwardOptions::default();
    let mut cx = GradientContext {
        registry: &r,
        net_names: &mut names,
        options: &options,
    };
    ir.backward(&ys, &mut cx)?;
    let s = ir.state();
    assert!(s.input_usages.contains(&("y".to_string(), 0, vec![2])));
    assert_eq!(
        s.gradient_frontier,
        [("y".to_string(), 0), ("x".to_string(), 0)]
    );
    let gens = &s
        .gradient_generators
        .iter()
        .find(|(n, v, _)| n == "x" && *v == 1)
        .map(|g| g.2.len());
    assert_eq!(*gens, Some(2));
    assert_eq!(s.out_version_history[0], ("x".to_string(), vec![(0, 1)]));
    Ok(())
}
