use super::std_order::{pop_heap_min, push_heap_min, std_string_hash, StdKeyOrder};
use super::*;
use crate::error::ErrorKind;
use crate::proto::DeviceOption;

// The expected orders below were printed by a program built with GCC's libstdc++ (the
// standard library Caffe2 was built with), inserting the same keys.

#[test]
fn string_hash_is_libstdcxx_hash() {
    assert_eq!(std_string_hash(b""), 0x553e93901e462a6e);
    assert_eq!(std_string_hash(b"a"), 0x454ddee488c1ed6b);
    assert_eq!(std_string_hash(b"fc1"), 0x68be911a519a9e48);
    assert_eq!(std_string_hash(b"name_x/fc1_w_grad"), 0x4607dd9634863513);
    assert_eq!(std_string_hash(b"0123456789abcdef"), 0x934b0d760642ed86);
}

fn order_of<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut o = StdKeyOrder::new();
    for k in keys {
        o.insert(k);
    }
    o.iter().map(str::to_string).collect()
}

#[test]
fn key_order_matches_libstdcxx_small_tables() {
    assert_eq!(order_of(["d", "e"]), ["e", "d"]);
    assert_eq!(order_of(["b", "c"]), ["c", "b"]);
    assert_eq!(
        order_of(["fc1", "fc2", "fc1_w", "data", "relu"]),
        ["relu", "data", "fc1_w", "fc2", "fc1"]
    );
    // Inserting a key twice changes nothing.
    assert_eq!(order_of(["d", "e", "d"]), ["e", "d"]);
}

#[test]
fn key_order_matches_libstdcxx_across_rehashes() {
    let keys: Vec<String> = (0..40).map(|i| format!("blob_{}", i * 7 % 40)).collect();
    let want = "blob_33 blob_38 blob_31 blob_4 blob_0 blob_37 blob_22 blob_23 blob_2 blob_30 \
                blob_5 blob_24 blob_9 blob_11 blob_26 blob_3 blob_13 blob_21 blob_14 blob_7 \
                blob_18 blob_39 blob_25 blob_12 blob_6 blob_32 blob_8 blob_20 blob_19 blob_16 \
                blob_35 blob_27 blob_15 blob_34 blob_1 blob_28 blob_29 blob_17 blob_10 blob_36";
    assert_eq!(
        order_of(keys.iter().map(String::as_str)),
        want.split_whitespace().collect::<Vec<_>>()
    );

    let keys: Vec<String> = (0..30).map(|i| format!("name_x/fc{i}_grad")).collect();
    let want: Vec<String> = [
        29, 10, 28, 0, 8, 2, 7, 6, 11, 5, 4, 13, 12, 14, 3, 15, 17, 20, 24, 16, 21, 1, 22, 23, 18,
        25, 19, 26, 9, 27,
    ]
    .iter()
    .map(|i| format!("name_x/fc{i}_grad"))
    .collect();
    assert_eq!(order_of(keys.iter().map(String::as_str)), want);
}

#[test]
fn heap_operations_match_libstdcxx_layout() {
    let vals = [3, -1, 0, -2, 5, -1, 0, 4, -3, 2];
    let mut h: Vec<(i64, String)> = Vec::new();
    for (i, v) in vals.iter().enumerate() {
        h.push((*v, format!("b{i}")));
        push_heap_min(&mut h);
    }
    let show = |h: &[(i64, String)]| {
        h.iter()
            .map(|(v, s)| format!("{v}:{s}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        show(&h),
        "-3:b8 -2:b3 -1:b5 -1:b1 2:b9 0:b2 0:b6 4:b7 3:b0 5:b4"
    );
    pop_heap_min(&mut h);
    assert_eq!(h.pop(), Some((-3, "b8".to_string())));
    assert_eq!(show(&h), "-2:b3 -1:b1 -1:b5 3:b0 2:b9 0:b2 0:b6 4:b7 5:b4");
    // Taking from the middle (as the size-aware choice does) breaks the heap; later pushes
    // and pops work on what is there, as std::push_heap / std::pop_heap did.
    h.remove(2);
    h.push((-5, "z".to_string()));
    push_heap_min(&mut h);
    pop_heap_min(&mut h);
    assert_eq!(h.pop(), Some((-5, "z".to_string())));
    assert_eq!(show(&h), "-2:b3 -1:b1 3:b0 2:b9 0:b2 0:b6 4:b7 5:b4");
}

fn op(t: &str, ins: &[&str], outs: &[&str]) -> OperatorDef {
    OperatorDef::new(t, ins.iter().copied(), outs.iter().copied())
}

fn net_of(ops: Vec<OperatorDef>) -> NetDef {
    NetDef {
        op: ops,
        ..Default::default()
    }
}

fn io(net: &NetDef) -> Vec<(Vec<String>, Vec<String>)> {
    net.op
        .iter()
        .map(|o| (o.input.clone(), o.output.clone()))
        .collect()
}

fn chain() -> NetDef {
    net_of(vec![
        op("Relu", &["x"], &["a"]),
        op("Relu", &["a"], &["b"]),
        op("Relu", &["b"], &["c"]),
        op("Relu", &["c"], &["d"]),
    ])
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn inference_net_recycles_last_freed_blob_first() {
    let out = optimize_inference_net(&chain(), &strings(&["x", "d"])).unwrap();
    let want = vec![
        (strings(&["x"]), strings(&["__m0_shared"])),
        (strings(&["__m0_shared"]), strings(&["__m1_shared"])),
        (strings(&["__m1_shared"]), strings(&["__m0_shared"])),
        (strings(&["__m0_shared"]), strings(&["d"])),
    ];
    assert_eq!(io(&out), want);
}

#[test]
fn inference_net_leaves_other_nets_alone() {
    let mut dag = chain();
    dag.r#type = Some("dag".into());
    assert_eq!(optimize_inference_net(&dag, &[]).unwrap(), dag);

    // Already optimized: a shared name is taken.
    let mut done = chain();
    done.op[0].output[0] = "__m0_shared".into();
    done.op[1].input[0] = "__m0_shared".into();
    assert_eq!(
        optimize_inference_net(&done, &strings(&["x", "d"])).unwrap(),
        done
    );

    let mut rnn = chain();
    rnn.op.push(op("RecurrentNetwork", &["d"], &["e", "h"]));
    assert_eq!(optimize_inference_net(&rnn, &[]).unwrap(), rnn);
}

#[test]
fn inference_net_frees_a_blob_read_twice_once() {
    let net = net_of(vec![
        op("Relu", &["x"], &["a"]),
        op("Sum", &["a", "a"], &["b"]),
        op("Relu", &["b"], &["c"]),
        op("Sum", &["c", "c"], &["d"]),
    ]);
    let out = optimize_inference_net(&net, &strings(&["x", "d"])).unwrap();
    for o in &out.op {
        let mut outs = o.output.clone();
        outs.dedup();
        assert_eq!(outs.len(), o.output.len());
    }
    assert_eq!(out.op[2].output, strings(&["__m0_shared"]));
    assert_eq!(out.op[3].input, strings(&["__m0_shared", "__m0_shared"]));
}

fn dag_opts(heads: &[&str], shareable: &[&str], n_ops: usize, ns: &str) -> DagRecycling {
    DagRecycling {
        heads: strings(heads),
        op_indices: (0..n_ops).collect(),
        shareable: shareable.iter().map(|s| s.to_string()).collect(),
        namescope: ns.into(),
        ..Default::default()
    }
}

#[test]
fn dag_chain_shares_with_namescope() {
    let opts = dag_opts(&["x"], &["a", "b", "c"], 4, "ns/");
    let out = compute_blob_recycling_for_dag(&chain(), &opts).unwrap();
    let want = vec![
        (strings(&["x"]), strings(&["ns/__m0_shared"])),
        (strings(&["ns/__m0_shared"]), strings(&["b"])),
        (strings(&["b"]), strings(&["ns/__m0_shared"])),
        (strings(&["ns/__m0_shared"]), strings(&["d"])),
    ];
    assert_eq!(io(&out), want);
}

fn diamond() -> NetDef {
    net_of(vec![
        op("Relu", &["x"], &["a"]),
        op("Relu", &["a"], &["b"]),
        op("Relu", &["a"], &["c"]),
        op("Sum", &["b", "c"], &["d"]),
        op("Relu", &["d"], &["e"]),
    ])
}

#[test]
fn dag_branches_do_not_share_until_they_join() {
    let opts = dag_opts(&["x"], &["a", "b", "c", "d", "e"], 5, "ns");
    let out = compute_blob_recycling_for_dag(&diamond(), &opts).unwrap();
    // d reuses a (free once both branches read it), e reuses b; the mapping is named in
    // libstdc++'s order of {d, e}: e first.
    let want = vec![
        (strings(&["x"]), strings(&["ns__m1_shared"])),
        (strings(&["ns__m1_shared"]), strings(&["ns__m0_shared"])),
        (strings(&["ns__m1_shared"]), strings(&["c"])),
        (
            strings(&["ns__m0_shared", "c"]),
            strings(&["ns__m1_shared"]),
        ),
        (strings(&["ns__m1_shared"]), strings(&["ns__m0_shared"])),
    ];
    assert_eq!(io(&out), want);
}

#[test]
fn dag_respects_dont_share_and_devices() {
    let mut opts = dag_opts(&["x"], &["a", "b", "c"], 4, "");
    opts.dont_share.insert("a".into());
    let out = compute_blob_recycling_for_dag(&chain(), &opts).unwrap();
    assert_eq!(io(&out), io(&chain()));

    let mut net = chain();
    net.op[2].device_option = Some(DeviceOption {
        device_type: Some(1),
        device_id: Some(0),
        ..Default::default()
    });
    let opts = dag_opts(&["x"], &["a", "b", "c"], 4, "");
    let out = compute_blob_recycling_for_dag(&net, &opts).unwrap();
    // c is written on another device than a lives on: nothing to share.
    assert_eq!(io(&out), io(&net));
}

#[test]
fn dag_with_shapes_prefers_fitting_blobs() {
    // When e (size 8) is written, a (size 2) and z (size 8) are free. Without shapes the heap
    // gives the least shared blob, ties by name: a. With shapes, the best fit: z.
    let net = net_of(vec![
        op("Relu", &["x"], &["z"]),
        op("Relu", &["x"], &["a"]),
        op("Sum", &["z", "a"], &["c"]),
        op("Relu", &["c"], &["e"]),
        op("Sum", &["e", "c"], &["f"]),
    ]);
    let mut opts = dag_opts(&["x"], &["a", "z", "c", "e"], 5, "");
    let out = compute_blob_recycling_for_dag(&net, &opts).unwrap();
    assert_eq!(out.op[0].output, strings(&["z"]));
    assert_eq!(out.op[1].output, strings(&["__m0_shared"]));
    assert_eq!(out.op[3].output, strings(&["__m0_shared"]));

    opts.blob_shapes = HashMap::from([
        ("z".to_string(), vec![2, 4]),
        ("a".to_string(), vec![2]),
        ("c".to_string(), vec![8]),
        ("e".to_string(), vec![8]),
    ]);
    let out = compute_blob_recycling_for_dag(&net, &opts).unwrap();
    assert_eq!(out.op[0].output, strings(&["__m0_shared"]));
    assert_eq!(out.op[1].output, strings(&["a"]));
    assert_eq!(out.op[3].output, strings(&["__m0_shared"]));
}

#[test]
fn dag_dont_share_outputs_keep_their_names() {
    // c must keep its storage once written: it may still take a's storage (a is free when it
    // is written), but nothing is given c's.
    let mut opts = dag_opts(&["x"], &["a", "b", "c"], 4, "");
    opts.dont_share.insert("c".into());
    let out = compute_blob_recycling_for_dag(&chain(), &opts).unwrap();
    assert_eq!(out.op[2].output, strings(&["__m0_shared"]));
    // Head read in place by the first op (not shareable itself).
    let net = net_of(vec![
        op("Copy", &["A"], &["A2"]),
        op("Relu", &["A2"], &["B"]),
        op("Relu", &["B"], &["C"]),
        op("Relu", &["C"], &["D"]),
    ]);
    let out =
        compute_blob_recycling_for_dag(&net, &dag_opts(&["A"], &["A2", "B", "C", "D"], 4, ""))
            .unwrap();
    // C takes A2's storage and D takes B's; libstdc++ visits {C, D} as D, C.
    assert_eq!(out.op[0].output, strings(&["__m1_shared"]));
    assert_eq!(out.op[2].output, strings(&["__m1_shared"]));
    assert_eq!(out.op[1].output, strings(&["__m0_shared"]));
    assert_eq!(out.op[3].output, strings(&["__m0_shared"]));
}

#[test]
fn dag_renames_async_if_branches() {
    let mut net = chain();
    let branch = NetDef {
        op: vec![op("Relu", &["c"], &["inner"])],
        external_input: strings(&["c"]),
        ..Default::default()
    };
    let mut async_if = op("AsyncIf", &["cond", "c"], &["d"]);
    async_if.arg.push(Argument {
        name: Some("then_net".into()),
        n: Some(branch),
        ..Default::default()
    });
    net.op[3] = async_if;
    let out =
        compute_blob_recycling_for_dag(&net, &dag_opts(&["x"], &["a", "b", "c"], 4, "")).unwrap();
    let then = out.op[3].arg[0].n.as_ref().unwrap();
    assert_eq!(then.op[0].input, strings(&["__m0_shared"]));
    assert_eq!(then.external_input, strings(&["__m0_shared"]));
}

#[test]
fn dag_renames_inside_recurrent_step_nets() {
    let mut net = chain();
    let step = net_of(vec![op("Relu", &["c"], &["inner"])]);
    let mut rnn = op("RecurrentNetwork", &["c"], &["d", "h"]);
    rnn.arg.push(Argument {
        name: Some("step_net".into()),
        n: Some(step),
        ..Default::default()
    });
    net.op[3] = rnn;
    let opts = dag_opts(&["x"], &["a", "b", "c"], 4, "");
    let out = compute_blob_recycling_for_dag(&net, &opts).unwrap();
    let r = &out.op[3];
    assert_eq!(r.input, strings(&["__m0_shared"]));
    let step = r.arg[0].n.as_ref().unwrap();
    assert_eq!(step.op[0].input, strings(&["__m0_shared"]));
    assert_eq!(r.arg[1].name(), "c.rename");
    assert_eq!(r.arg[1].s.as_deref(), Some(&b"__m0_shared"[..]));
}

#[test]
fn dag_errors_name_the_problem() {
    // A shareable input that an optimized op writes only later.
    let net = net_of(vec![op("Relu", &["y"], &["a"]), op("Relu", &["a"], &["y"])]);
    let e =
        compute_blob_recycling_for_dag(&net, &dag_opts(&["x"], &["a", "y"], 2, "")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Runtime);
    assert!(e.to_string().contains("'y'"), "{e}");

    // A head read by an op that also waits for another op is reached through that op.
    let net = net_of(vec![
        op("Relu", &["x"], &["a"]),
        op("Sum", &["a", "w"], &["b"]),
        op("Relu", &["b"], &["c"]),
    ]);
    let out = compute_blob_recycling_for_dag(&net, &dag_opts(&["w", "x"], &["a", "b", "c"], 3, ""))
        .unwrap();
    assert_eq!(out.op[2].output, strings(&["__m0_shared"]));
    assert_eq!(out.op[0].output, strings(&["__m0_shared"]));

    let e = compute_blob_recycling_for_dag(
        &chain(),
        &DagRecycling {
            op_indices: vec![0, 9],
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    // Schema check before anything else.
    let net = net_of(vec![op("Relu", &["x", "y"], &["a"])]);
    let e = compute_blob_recycling_for_dag(&net, &dag_opts(&["x"], &["a"], 1, "")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Schema);
    let e = optimize_inference_net(&net, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Schema);
    assert!(e.to_string().contains("operator 0"), "{e}");

    let mut net = chain();
    let mut rnn = op("RecurrentNetwork", &["c"], &["d", "h"]);
    rnn.arg.push(Argument {
        name: Some("step_net".into()),
        s: Some(b"op { type: 'Relu' }".to_vec()),
        ..Default::default()
    });
    net.op[3] = rnn;
    let e = compute_blob_recycling_for_dag(&net, &dag_opts(&["x"], &["a", "b", "c"], 4, ""))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotImplemented);
}
