//! Gradients of `Do`, `If` and `While` (Caffe2's control_ops_grad) with small test makers.

use ferrocaffe::autodiff::maker::grad_op;
use ferrocaffe::autodiff::{
    backward_pass, backward_pass_in, control, ys_list, BackwardOptions, GradRef, GradientContext,
    MakerCtx, Registry, UsedNetNames,
};
use ferrocaffe::proto::{Argument, NetDef, OperatorDef};
use ferrocaffe::{Error, Result};

fn op(t: &str, ins: &[&str], outs: &[&str]) -> OperatorDef {
    let mut o = OperatorDef::new(t, ins.iter().copied(), outs.iter().copied());
    o.name = Some(String::new());
    o
}

fn unary(ctx: &mut MakerCtx<'_>) -> Result<Vec<OperatorDef>> {
    let (y, gy, gx) = (ctx.o(0), ctx.go(0)?, ctx.gi(0));
    Ok(vec![grad_op("UnaryGradient", [y, gy], [gx], vec![])])
}

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

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register_maker("Unary", unary);
    r.register_maker("Binary", binary);
    control::register(&mut r);
    r
}

fn net(name: &str, ops: Vec<OperatorDef>) -> NetDef {
    NetDef {
        name: Some(name.into()),
        op: ops,
        ..Default::default()
    }
}

fn net_arg(name: &str, n: NetDef) -> Argument {
    Argument {
        name: Some(name.into()),
        n: Some(n),
        ..Default::default()
    }
}

fn strings(name: &str, v: &[&str]) -> Argument {
    Argument {
        name: Some(name.into()),
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> Argument {
    Argument {
        name: Some(name.into()),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn arg_strings(o: &OperatorDef, name: &str) -> Vec<String> {
    o.arg
        .iter()
        .find(|a| a.name() == name)
        .map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn arg_ints(o: &OperatorDef, name: &str) -> Vec<i64> {
    o.arg
        .iter()
        .find(|a| a.name() == name)
        .map(|a| a.ints.clone())
        .unwrap_or_default()
}

fn arg_net<'o>(o: &'o OperatorDef, name: &str) -> &'o NetDef {
    static EMPTY: std::sync::OnceLock<NetDef> = std::sync::OnceLock::new();
    o.arg
        .iter()
        .find(|a| a.name() == name)
        .and_then(|a| a.n.as_ref())
        .unwrap_or_else(|| EMPTY.get_or_init(NetDef::default))
}

fn types(n: &NetDef) -> Vec<String> {
    n.op.iter()
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

/// `Do(x, w, ws) -> (y, ws)` running `h = Binary(x, w); y = Unary(h)` on inner names.
fn do_op(outer: [&str; 3]) -> OperatorDef {
    let inner = net(
        "do_sub",
        vec![
            op("Binary", &["in_x", "in_w"], &["in_h"]),
            op("Unary", &["in_h"], &["in_y"]),
        ],
    );
    let mut d = op("Do", &[outer[0], outer[1], "ws"], &[outer[2], "ws"]);
    d.arg = vec![
        net_arg("net", inner),
        strings("inner_blobs", &["in_x", "in_w", "in_y"]),
        ints("outer_blobs_idx", &[0, 1, 2]),
    ];
    d
}

#[test]
fn do_gradient_binds_inner_gradients() -> Result<()> {
    let ops = vec![do_op(["x", "w", "y"]), op("Unary", &["y"], &["loss"])];
    let (g, m) = backward_pass(&ops, &ys_list(["loss"]), &registry())?;
    let d = &g[2];
    assert_eq!(d.r#type(), "Do");
    assert_eq!(d.input, ["y", "y_grad", "x", "w", "ws"]);
    assert_eq!(d.output, ["x_grad", "w_grad", "ws"]);
    assert_eq!(d.is_gradient_op, Some(true));
    assert_eq!(
        arg_strings(d, "inner_blobs"),
        [
            "in_x/_DO_OPERATOR_INNER_GRAD_COPY_",
            "in_w/_DO_OPERATOR_INNER_GRAD_COPY_",
            "in_y",
            "in_y/_DO_OPERATOR_INNER_GRAD_",
            "in_x",
            "in_w",
        ]
    );
    assert_eq!(arg_ints(d, "outer_blobs_idx"), [4, 5, 0, 1, 2, 3]);
    assert!(arg_strings(d, "saved_fwd_blobs").is_empty());
    assert!(d.arg.iter().any(|a| a.name() == "saved_fwd_blobs"));
    let inner = arg_net(d, "net");
    assert_eq!(inner.name(), "do_sub_grad");
    assert_eq!(
        types(inner),
        [
            "UnaryGradient(in_y,in_y/_DO_OPERATOR_INNER_GRAD_)->(in_h_grad)",
            "BinaryGradient(in_h_grad,in_x,in_w)->(in_x_grad,in_w_grad)",
            "Copy(in_x_grad)->(in_x/_DO_OPERATOR_INNER_GRAD_COPY_)",
            "Copy(in_w_grad)->(in_w/_DO_OPERATOR_INNER_GRAD_COPY_)",
        ]
    );
    assert_eq!(inner.op[2].name, None);
    assert_eq!(m.get("x"), Some(&GradRef::Dense("x_grad".into())));
    assert_eq!(m.get("w"), Some(&GradRef::Dense("w_grad".into())));
    Ok(())
}

#[test]
fn do_dedupes_one_gradient_given_for_two_outputs() -> Result<()> {
    let inner = net(
        "sub",
        vec![
            op("Unary", &["i_x"], &["i_y"]),
            op("Unary", &["i_x"], &["i_z"]),
        ],
    );
    let mut d = op("Do", &["x", "ws"], &["y", "z", "ws"]);
    d.arg = vec![
        net_arg("net", inner),
        strings("inner_blobs", &["i_x", "i_y", "i_z"]),
        ints("outer_blobs_idx", &[0, 1, 2]),
    ];
    let ys = vec![
        ("y".to_string(), GradRef::Dense("g".into())),
        ("z".to_string(), GradRef::Dense("g".into())),
    ];
    let (g, m) = backward_pass(&[d], &ys, &registry())?;
    assert_eq!(g[0].r#type(), "Copy");
    assert_eq!(g[0].input, ["g"]);
    assert_eq!(g[0].output, ["z_g_DEDUP"]);
    assert_eq!(g[1].input, ["z", "z_g_DEDUP", "y", "g", "ws"]);
    let inner = arg_net(&g[1], "net");
    assert_eq!(
        types(inner)[2],
        "Sum(i_x_grad,_i_x_grad_autosplit_0)->(i_x_grad)"
    );
    assert_eq!(m.get("x"), Some(&GradRef::Dense("x_grad".into())));
    Ok(())
}

/// `If(cond, x) -> y` whose then branch computes `y = Unary(x)` (no else branch).
fn if_op(cond: &str, x: &str, y: &str, net_name: &str) -> OperatorDef {
    let mut i = op("If", &[cond, x], &[y]);
    i.arg = vec![net_arg(
        "then_net",
        net(net_name, vec![op("Unary", &[x], &[y])]),
    )];
    i
}

#[test]
fn if_gradient_zero_fills_the_missing_branch() -> Result<()> {
    let ops = vec![if_op("c", "x", "y", "then"), op("Unary", &["y"], &["loss"])];
    let (g, m) = backward_pass(&ops, &ys_list(["loss"]), &registry())?;
    let i = &g[2];
    assert_eq!(i.r#type(), "If");
    assert_eq!(i.input, ["c", "y", "y_grad"]);
    assert_eq!(i.output, ["x_grad"]);
    assert_eq!(
        types(arg_net(i, "then_net")),
        ["UnaryGradient(y,y_grad)->(x_grad)"]
    );
    let else_net = arg_net(i, "else_net");
    assert_eq!(else_net.name(), "then_grad_auto_else_zero_blobs_");
    assert_eq!(types(else_net), ["ConstantFill(x)->(x_grad)"]);
    assert_eq!(else_net.op[0].arg[0].f, Some(0.0));
    assert_eq!(m.get("x"), Some(&GradRef::Dense("x_grad".into())));
    assert!(m.get("c").is_none());
    Ok(())
}

#[test]
fn accumulated_if_outputs_are_renamed_inside_the_branches() -> Result<()> {
    let ops = vec![
        if_op("c1", "x", "y1", "then1"),
        if_op("c2", "x", "y2", "then2"),
        op("Binary", &["y1", "y2"], &["loss"]),
    ];
    let (g, _) = backward_pass(&ops, &ys_list(["loss"]), &registry())?;
    let n = g.len();
    let first = &g[n - 2];
    assert_eq!(first.output, ["_x_grad_autosplit_0"]);
    assert_eq!(
        types(arg_net(first, "then_net")),
        ["UnaryGradient(y1,y1_grad)->(_x_grad_autosplit_0)"]
    );
    assert_eq!(
        types(arg_net(first, "else_net")),
        ["ConstantFill(x)->(_x_grad_autosplit_0)"]
    );
    assert_eq!(
        types(&net("", vec![g[n - 1].clone()])),
        ["Sum(x_grad,_x_grad_autosplit_0)->(x_grad)"]
    );
    Ok(())
}

/// A `While` whose body is `Do(y, w, ws) -> (y, ws)` running `y = Binary(y, w)`.
fn while_op() -> OperatorDef {
    let body = net("body", vec![op("Binary", &["y", "w"], &["y"])]);
    let mut d = op("Do", &["y", "w", "ws"], &["y", "ws"]);
    d.arg = vec![
        net_arg("net", body),
        strings("inner_blobs", &["y", "w"]),
        ints("outer_blobs_idx", &[2, 1]),
    ];
    let mut w = op("While", &["cond", "y", "w", "ws"], &["y", "ws"]);
    w.arg = vec![net_arg("loop_net", net("do_body", vec![d]))];
    w
}

#[test]
fn while_gradient_with_a_named_incoming_gradient() -> Result<()> {
    let r = registry();
    let ys = vec![("y".to_string(), GradRef::Dense("y_ext".into()))];
    let mut names = UsedNetNames::new();
    names.insert("gradient_loop_cond_net");
    let options = BackwardOptions::default();
    let mut cx = GradientContext {
        registry: &r,
        net_names: &mut names,
        options: &options,
    };
    let ops = [while_op()];
    let (g, m) = backward_pass_in(&ops, &ys, &mut cx)?;
    assert_eq!(
        types(&net("", g.clone()))[..2],
        [
            "HasScope(ws)->(gradient_loop_cond_net_1/cond)",
            "Copy(y_ext)->(y_grad)",
        ]
    );
    let w = &g[2];
    assert_eq!(w.r#type(), "While");
    assert_eq!(w.input[0], "gradient_loop_cond_net_1/cond");
    assert_eq!(w.is_gradient_op, Some(true));
    let cond = arg_net(w, "cond_net");
    assert_eq!(cond.name(), "gradient_loop_cond_net_1");
    assert_eq!(
        types(cond),
        [
            "HasScope(ws)->(gradient_loop_cond_net_1/cond)",
            "Copy(y_grad)->(y_ext)",
        ]
    );
    assert_eq!(cond.external_input, ["ws", "y_grad"]);
    assert_eq!(arg_net(w, "loop_net").op[0].r#type(), "Do");
    assert!(names.contains("gradient_loop_cond_net_init"));
    assert_eq!(m.get("w"), Some(&GradRef::Dense("w_grad".into())));
    Ok(())
}

#[test]
fn while_gradient_named_like_the_do_binding_fails_as_in_caffe2() {
    let ops = vec![while_op(), op("Unary", &["y"], &["loss"])];
    let err = backward_pass(&ops, &ys_list(["loss"]), &registry());
    let Err(Error::Assertion(m)) = err else {
        panic!("expected an assertion error, got {err:?}")
    };
    assert!(
        m.starts_with("Reusage of outer blob name y_grad in Do op"),
        "{m}"
    );
}

fn assertion(ops: Vec<OperatorDef>) -> String {
    let ys = vec![("y".to_string(), GradRef::Dense("y_grad".into()))];
    match backward_pass(&ops, &ys, &registry()) {
        Err(Error::Assertion(m)) => m,
        other => panic!("expected an assertion error, got {other:?}"),
    }
}

#[test]
fn malformed_control_ops_are_rejected_naming_the_op() {
    let mut no_then = op("If", &["c", "x"], &["y"]);
    no_then.name = Some("my_if".into());
    let m = assertion(vec![no_then.clone()]);
    assert!(m.starts_with("Expected then subnet in If op"), "{m}");
    assert!(m.contains("If op 'my_if'"), "{m}");

    let mut empty_then = no_then;
    empty_then.arg.push(Argument {
        name: Some("then_net".into()),
        s: Some(b"not a net".to_vec()),
        ..Default::default()
    });
    let m = assertion(vec![empty_then]);
    assert!(
        m.starts_with("Expected non empty net argument then_net"),
        "{m}"
    );

    let mut w = while_op();
    if let Some(n) = w.arg[0].n.as_mut() {
        n.op.push(op("Unary", &["a"], &["b"]));
    }
    let m = assertion(vec![w]);
    assert!(
        m.starts_with("Gradient While op requires single Do op as a loop body"),
        "{m}"
    );

    let mut d = do_op(["x", "w", "y"]);
    d.arg.retain(|a| a.name() != "inner_blobs");
    let m = assertion(vec![d]);
    assert!(
        m.starts_with("No inner_blobs argument found in Do op"),
        "{m}"
    );
}
