//! Backward passes over serialized ops (`autodiff::net_bytes`, what the Python binding runs)
//! give exactly what decoding the ops and running `backward_pass_in` gives: the same gradient
//! ops byte for byte, the same gradient map, the same IR state, the same errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferrocaffe::autodiff::net_bytes::{
    backward_pass_net_bytes, backward_pass_op_bytes, decode_ops_from, encode_ops_as_net, Extras,
};
use ferrocaffe::autodiff::{
    backward_pass_in, BackwardOptions, GradRef, GradientContext, GradientMaker, GradientOutput, Ir,
    Registry, UsedNetNames,
};
use ferrocaffe::proto::{encode, Argument, DeviceOption, NetDef, OperatorDef};
use ferrocaffe::Result;

fn op(t: &str, ins: &[&str], outs: &[&str]) -> OperatorDef {
    let mut o = OperatorDef::new(t, ins.iter().copied(), outs.iter().copied());
    o.name = Some(String::new());
    o
}

fn with_arg(mut o: OperatorDef, name: &str, i: i64) -> OperatorDef {
    o.arg.push(Argument {
        name: Some(name.into()),
        i: Some(i),
        ..Default::default()
    });
    o
}

fn net(ops: Vec<OperatorDef>) -> NetDef {
    NetDef {
        name: Some("n".into()),
        op: ops,
        external_input: vec!["x".into()],
        ..Default::default()
    }
}

/// Nets covering chains, accumulation (a blob read by several ops), in-place ops, sparse
/// gradients, arguments, engines and device options, `StopGradient`.
fn nets() -> Vec<(NetDef, Vec<(String, GradRef)>)> {
    let loss = || vec![("loss".to_string(), GradRef::None)];
    let mut cuda = op("Relu", &["h"], &["r"]);
    cuda.device_option = Some(DeviceOption {
        device_type: Some(1),
        device_id: Some(0),
        ..Default::default()
    });
    cuda.engine = Some("CUDNN".into());
    vec![
        (
            net(vec![
                op("FC", &["x", "w", "b"], &["h"]),
                op("Relu", &["h"], &["r"]),
                op("SumElements", &["r"], &["loss"]),
            ]),
            loss(),
        ),
        (
            // x and h are read twice: their gradients are summed.
            net(vec![
                with_arg(op("FC", &["x", "w", "b"], &["h"]), "axis", 1),
                op("Relu", &["h"], &["r"]),
                op("Sum", &["r", "h", "x"], &["s"]),
                op("Relu", &["s"], &["s"]),
                op("SumElements", &["s"], &["loss"]),
            ]),
            loss(),
        ),
        (
            net(vec![
                op("FC", &["x", "w", "b"], &["h"]),
                cuda,
                op("StopGradient", &["r"], &["r"]),
                op("Mul", &["r", "x"], &["m"]),
                op("SumElements", &["m"], &["loss"]),
            ]),
            loss(),
        ),
        (
            // A sparse gradient (Gather), read twice.
            net(vec![
                op("Gather", &["emb", "ids"], &["rows"]),
                op("Gather", &["emb", "ids2"], &["rows2"]),
                op("Add", &["rows", "rows2"], &["z"]),
                op("SumElements", &["z"], &["loss"]),
            ]),
            vec![
                ("loss".to_string(), GradRef::Dense("loss_g".into())),
                ("z".to_string(), GradRef::None),
            ],
        ),
    ]
}

fn cx_parts() -> (Arc<Registry>, UsedNetNames, BackwardOptions) {
    (
        Registry::builtin(),
        UsedNetNames::new(),
        BackwardOptions::default(),
    )
}

type Plain = (Vec<u8>, Vec<(String, GradRef)>, Vec<String>);

/// Decoding, then the plain backward pass.
fn plain(bytes: &[u8], skip: usize, ys: &[(String, GradRef)]) -> Result<Plain> {
    let (registry, mut names, options) = cx_parts();
    let mut cx = GradientContext {
        registry: &registry,
        net_names: &mut names,
        options: &options,
    };
    let ops = decode_ops_from(bytes, skip)?;
    let (grad_ops, map) = backward_pass_in(&ops, ys, &mut cx)?;
    let mut outputs: Vec<String> = grad_ops.iter().flat_map(|o| o.output.clone()).collect();
    outputs.sort();
    Ok((encode_ops_as_net(&grad_ops), map.into_entries(), outputs))
}

fn serialized(bytes: &[u8], skip: usize, ys: &[(String, GradRef)]) -> Result<Plain> {
    let (registry, mut names, options) = cx_parts();
    let mut cx = GradientContext {
        registry: &registry,
        net_names: &mut names,
        options: &options,
    };
    let extras = Extras {
        state: false,
        output_names: true,
    };
    let out = backward_pass_net_bytes(bytes, skip, ys, &mut cx, extras)?;
    let (text, ends) = out.output_names.unwrap_or_default();
    let mut outputs: Vec<String> = (0..ends.len())
        .map(|k| text[if k == 0 { 0 } else { ends[k - 1] }..ends[k]].to_string())
        .collect();
    outputs.sort();
    Ok((out.net, out.grads.into_entries(), outputs))
}

#[test]
fn nets_give_the_same_gradients_either_way() {
    for (n, ys) in nets() {
        let bytes = encode(&n);
        for skip in [0, 1] {
            let a = plain(&bytes, skip, &ys).expect("plain backward pass");
            let b = serialized(&bytes, skip, &ys).expect("serialized backward pass");
            assert_eq!(a, b, "net {:?}, skip {skip}", n.op[0].r#type());
        }
    }
}

#[test]
fn operator_lists_give_the_same_gradients_and_state() {
    for (n, ys) in nets() {
        let items: Vec<Vec<u8>> = n.op.iter().map(encode).collect();
        let (registry, mut names, options) = cx_parts();
        let mut cx = GradientContext {
            registry: &registry,
            net_names: &mut names,
            options: &options,
        };
        let extras = Extras {
            state: true,
            output_names: false,
        };
        let out = backward_pass_op_bytes(&items, &ys, &mut cx, extras).expect("serialized");

        let (registry, mut names, options) = cx_parts();
        let mut cx = GradientContext {
            registry: &registry,
            net_names: &mut names,
            options: &options,
        };
        let mut ir = Ir::new(&n.op).expect("ir");
        let (grad_ops, map) = ir.backward(&ys, &mut cx).expect("plain");
        assert_eq!(out.net, encode_ops_as_net(&grad_ops));
        assert_eq!(out.grads, map);
        assert_eq!(out.state, Some(ir.state()));
    }
}

#[test]
fn errors_are_the_same() {
    let loss = vec![("loss".to_string(), GradRef::None)];
    // No gradient for this op type.
    let unknown = encode(&net(vec![
        op("NoSuchOp", &["x"], &["y"]),
        op("SumElements", &["y"], &["loss"]),
    ]));
    // An orphan StopGradient output.
    let orphan = encode(&net(vec![
        op("StopGradient", &["x"], &["unused"]),
        op("SumElements", &["x"], &["loss"]),
    ]));
    // Malformed: truncated (inside the last field, the external input "x").
    let good = encode(&nets()[0].0);
    let truncated = good[..good.len() - 1].to_vec();
    // An op that does not get a gradient but cannot be decoded (invalid UTF-8 in an argument
    // name): decoding the whole net fails.
    let mut bad_arg = good.clone();
    bad_arg.extend_from_slice(&[0x12, 0x07, 0x2a, 0x05, 0x0a, 0x01, 0xff, 0x18, 0x01]);
    for bytes in [unknown, orphan, truncated, bad_arg] {
        let a = plain(&bytes, 0, &loss)
            .map(|_| ())
            .map_err(|e| e.to_string());
        let b = serialized(&bytes, 0, &loss)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(a.is_err(), "{a:?}");
        assert_eq!(a, b);
    }
}

/// A gradient function that counts its calls.
struct Counting(Arc<AtomicUsize>);

impl GradientMaker for Counting {
    fn make(&self, op: &OperatorDef, g: &[GradRef]) -> Result<GradientOutput> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let name = match g.first() {
            Some(GradRef::Dense(n)) => n.clone(),
            _ => String::new(),
        };
        Ok(GradientOutput {
            ops: vec![op.clone()],
            input_grads: vec![GradRef::Dense(name); op.input.len()],
        })
    }
}

#[test]
fn gradient_functions_run_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut registry = Registry::layered(Registry::builtin());
    registry.register_function("Custom", Arc::new(Counting(calls.clone())));
    let (mut names, options) = (UsedNetNames::new(), BackwardOptions::default());
    let mut cx = GradientContext {
        registry: &registry,
        net_names: &mut names,
        options: &options,
    };
    let bytes = encode(&net(vec![
        op("Custom", &["x"], &["y"]),
        op("SumElements", &["y"], &["loss"]),
    ]));
    let ys = vec![("loss".to_string(), GradRef::None)];
    let out = backward_pass_net_bytes(&bytes, 0, &ys, &mut cx, Extras::default()).expect("pass");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(out.grads.get("x").is_some());
}
