//! Integration tests of the runtime: nets, executors, in-place ops, aliases, plans, threads.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ferrocaffe::proto::{Argument, ExecutionStep, NetDef, OperatorDef, PlanDef};
use ferrocaffe::tensor::Tensor;
use ferrocaffe::workspace::Workspace;

fn op(t: &str, i: &[&str], o: &[&str]) -> OperatorDef {
    OperatorDef::new(t, i.iter().copied(), o.iter().copied())
}

fn net(name: &str, ops: Vec<OperatorDef>, ty: &str, workers: i32) -> NetDef {
    NetDef {
        name: Some(name.into()),
        op: ops,
        r#type: Some(ty.into()),
        num_workers: Some(workers),
        ..Default::default()
    }
}

fn f32s(ws: &Workspace, name: &str) -> Vec<f32> {
    ws.fetch(name).unwrap().as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn in_place_sum_with_repeated_inputs() {
    let ws = Workspace::new();
    ws.feed("a", Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap());
    ws.feed(
        "b",
        Tensor::from_vec(&[3], vec![10.0f32, 20.0, 30.0]).unwrap(),
    );
    ws.run_operator_once(&op("Sum", &["a", "b", "b"], &["a"]))
        .unwrap();
    assert_eq!(f32s(&ws, "a"), vec![21.0, 42.0, 63.0]);
    ws.run_operator_once(&op("Mul", &["b", "b"], &["b"]))
        .unwrap();
    assert_eq!(f32s(&ws, "b"), vec![100.0, 400.0, 900.0]);
}

#[test]
fn alias_shares_writes_and_copy_does_not() {
    let ws = Workspace::new();
    ws.feed("x", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
    ws.run_operator_once(&op("Alias", &["x"], &["view"]))
        .unwrap();
    ws.run_operator_once(&op("Copy", &["x"], &["copy"]))
        .unwrap();
    let mut scale = op("Scale", &["view"], &["view"]);
    scale.arg.push(Argument::float("scale", 3.0));
    ws.run_operator_once(&scale).unwrap();
    assert_eq!(f32s(&ws, "view"), vec![3.0, 6.0]);
    assert_eq!(f32s(&ws, "copy"), vec![1.0, 2.0]);
}

#[test]
fn dag_with_write_after_read_matches_simple() {
    // b reads a, then a is overwritten: the dag must keep that order.
    let ops = vec![
        op("Sigmoid", &["a"], &["b"]),
        op("Tanh", &["c"], &["a"]),
        op("Add", &["a", "b"], &["d"]),
        op("Relu", &["d"], &["d"]),
        op("Sum", &["d", "b", "a"], &["e"]),
    ];
    let mut results = Vec::new();
    for ty in ["simple", "dag"] {
        let ws = Workspace::new();
        ws.feed(
            "a",
            Tensor::from_vec(&[4], vec![0.5f32, -1.0, 2.0, 0.0]).unwrap(),
        );
        ws.feed(
            "c",
            Tensor::from_vec(&[4], vec![1.0f32, -2.0, 0.25, 3.0]).unwrap(),
        );
        ws.create_net(&net("n", ops.clone(), ty, 3), false).unwrap();
        for _ in 0..20 {
            ws.run_net("n", 1).unwrap();
        }
        results.push((f32s(&ws, "b"), f32s(&ws, "e")));
    }
    assert_eq!(results[0], results[1]);
}

#[test]
fn concurrent_substeps_run_on_threads() {
    let ws = Workspace::new();
    let mut init = Vec::new();
    for k in 0..3 {
        let mut fill = op("ConstantFill", &[], &[&format!("acc{k}")]);
        fill.arg.push(Argument {
            name: Some("shape".into()),
            ints: vec![1],
            ..Default::default()
        });
        init.push(fill);
    }
    let mut one = op("ConstantFill", &[], &["one"]);
    one.arg.push(Argument {
        name: Some("shape".into()),
        ints: vec![1],
        ..Default::default()
    });
    one.arg.push(Argument::float("value", 1.0));
    init.push(one);
    let mut plan = PlanDef {
        name: Some("p".into()),
        network: vec![net("init", init, "", 0)],
        ..Default::default()
    };
    let mut par = ExecutionStep {
        name: Some("par".into()),
        concurrent_substeps: Some(true),
        num_iter: Some(4),
        ..Default::default()
    };
    for k in 0..3 {
        let name = format!("inc{k}");
        let acc = format!("acc{k}");
        plan.network
            .push(net(&name, vec![op("Add", &[&acc, "one"], &[&acc])], "", 0));
        par.substep.push(ExecutionStep {
            name: Some(format!("s{k}")),
            network: vec![name],
            num_iter: Some(k as i64 + 1),
            ..Default::default()
        });
    }
    plan.execution_step.push(ExecutionStep {
        name: Some("init".into()),
        network: vec!["init".into()],
        ..Default::default()
    });
    plan.execution_step.push(par);
    ws.run_plan(&plan).unwrap();
    for k in 0..3 {
        assert_eq!(f32s(&ws, &format!("acc{k}")), vec![4.0 * (k as f32 + 1.0)]);
    }
}

#[test]
fn errors_name_op_and_blob() {
    let ws = Workspace::new();
    ws.feed("x", Tensor::from_vec(&[2], vec![1i64, 2]).unwrap());
    let e = ws
        .run_operator_once(&op("Relu", &["x"], &["y"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("type Relu") && e.contains("inputs [x]"), "{e}");
    let e = ws
        .run_net_once(&net("n", vec![op("Relu", &["nope"], &["y"])], "", 0))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "op Relu: Encountered a non-existing input blob: nope");
}

#[test]
fn threads_share_a_workspace() {
    let ws = Workspace::new();
    ws.feed("one", Tensor::from_vec(&[4], vec![1.0f32; 4]).unwrap());
    for t in 0..4 {
        let acc = format!("acc{t}");
        ws.feed(&acc, Tensor::new(ferrocaffe::tensor::DataType::Float, &[4]));
        let ops = (0..3).map(|_| op("Add", &[&acc, "one"], &[&acc])).collect();
        ws.create_net(
            &net(
                &format!("n{t}"),
                ops,
                if t % 2 == 0 { "" } else { "dag" },
                2,
            ),
            false,
        )
        .unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..4 {
            let ws: &Arc<Workspace> = &ws;
            s.spawn(move || ws.run_net(&format!("n{t}"), 100).unwrap());
        }
    });
    for t in 0..4 {
        assert_eq!(f32s(&ws, &format!("acc{t}")), vec![300.0; 4]);
    }
}

#[test]
fn sum_folds_in_input_order_across_blocks_with_aliased_inputs() {
    // 600 values span several of the kernel's blocks; the output aliases input 0.
    let ws = Workspace::new();
    let a: Vec<f32> = (0..600).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..600).map(|i| 1.0 - i as f32).collect();
    ws.feed("a", Tensor::from_vec(&[20, 30], a.clone()).unwrap());
    ws.feed("b", Tensor::from_vec(&[20, 30], b.clone()).unwrap());
    ws.run_operator_once(&op("Sum", &["a", "b", "b"], &["a"]))
        .unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| (x + y) + y).collect();
    assert_eq!(f32s(&ws, "a"), want);
}

#[test]
fn fc_gradient_accumulates_into_outputs_when_asked() {
    use ferrocaffe::ops::cpu::fc::ACCUMULATE_ARG;
    let ws = Workspace::new();
    let x: Vec<f32> = (0..6).map(|i| i as f32).collect(); // M=2, K=3
    let w: Vec<f32> = (0..12).map(|i| (i as f32) * 0.1).collect(); // N=4, K=3
    let dy: Vec<f32> = (0..8).map(|i| 1.0 + i as f32).collect(); // M=2, N=4
    ws.feed("x", Tensor::from_vec(&[2, 3], x).unwrap());
    ws.feed("w", Tensor::from_vec(&[4, 3], w).unwrap());
    ws.feed("dy", Tensor::from_vec(&[2, 4], dy).unwrap());
    let plain = op("FCGradient", &["x", "w", "dy"], &["dw", "db", "dx"]);
    ws.run_operator_once(&plain).unwrap();
    let (dw, db) = (f32s(&ws, "dw"), f32s(&ws, "db"));
    // Accumulating twice on top of one plain run gives three times the gradients.
    let mut acc = plain.clone();
    acc.arg.push(Argument {
        name: Some(ACCUMULATE_ARG.into()),
        ints: vec![0, 1],
        ..Default::default()
    });
    ws.run_operator_once(&acc).unwrap();
    ws.run_operator_once(&acc).unwrap();
    let close = |got: Vec<f32>, want: &[f32]| {
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - 3.0 * w).abs() <= 1e-4 * w.abs().max(1.0),
                "{g} vs 3 * {w}"
            );
        }
    };
    close(f32s(&ws, "dw"), &dw);
    close(f32s(&ws, "db"), &db);
    // An accumulated output of the wrong shape is an error naming the expectation.
    ws.feed("dw", Tensor::from_vec(&[2], vec![0.0f32; 2]).unwrap());
    let err = ws.run_operator_once(&acc).unwrap_err().to_string();
    assert!(err.contains("expected float [4, 3]"), "{err}");
}
