//! Replays Caffe2's recorded gradient makers (`GetGradientForOp`) against the built-in makers:
//! the `ops/` corpus, the op catalog, the single-op cases of the `gradients/` corpus and the
//! recurrent networks of the `gradients/` and `rnn/` corpora.
//!
//! The golden directory is `<repo>/tests/golden`, or `$FERROCAFFE_GOLDEN`.

use std::collections::{BTreeMap, HashSet};
use std::fs;

use base64::Engine;
use ferrocaffe::autodiff::makers;
use ferrocaffe::autodiff::registry::GradientKind;
use ferrocaffe::autodiff::{GradRef, GradientOutput, Registry};
use ferrocaffe::proto::{self, NetDef, OperatorDef};
use serde_json::Value;

mod golden_data;
use golden_data::{golden_dir, side_file};

fn read_jsonl(rel: &str) -> Vec<Value> {
    let path = golden_dir().join(rel);
    let text =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

fn b64<M: proto::Named>(v: &Value) -> M {
    let s = v.as_str().expect("base64 string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("valid base64");
    proto::decode(&bytes).expect("valid protobuf")
}

fn registry() -> Registry {
    let mut r = Registry::new();
    makers::register_all(&mut r);
    r
}

/// `null` -> none, a string -> dense, `[indices, values]` -> slice.
fn grad_ref(v: &Value) -> GradRef {
    match v {
        Value::Null => GradRef::None,
        Value::String(s) => GradRef::Dense(s.clone()),
        Value::Array(a) if a.len() == 2 => GradRef::Sparse {
            indices: a[0].as_str().expect("indices name").to_string(),
            values: a[1].as_str().expect("values name").to_string(),
        },
        other => panic!("unexpected gradient reference {other}"),
    }
}

fn grad_refs(v: &Value) -> Vec<GradRef> {
    v.as_array()
        .expect("list of gradients")
        .iter()
        .map(grad_ref)
        .collect()
}

/// What `GetGradientForOp` does for each registration kind.
fn get_gradient(
    r: &Registry,
    op: &OperatorDef,
    g_output: &[GradRef],
) -> Result<GradientOutput, String> {
    match r.get(op.r#type()) {
        Some(GradientKind::Maker(m)) => m.make(op, g_output).map_err(|e| e.to_string()),
        Some(GradientKind::NoGradient) => Ok(GradientOutput {
            ops: vec![],
            input_grads: vec![GradRef::None; op.input.len()],
        }),
        Some(GradientKind::ShouldNotDo) => Err(format!(
            "One should not call gradient for operator {}.",
            op.r#type()
        )),
        Some(GradientKind::NotImplemented) => Err(format!(
            "Operator {} should have a gradient but is not implemented yet.",
            op.r#type()
        )),
        None => Err(format!("no gradient registered for {}", op.r#type())),
    }
}

fn kind_name(k: Option<&GradientKind>) -> &'static str {
    match k {
        Some(GradientKind::Maker(_)) => "defined",
        Some(GradientKind::NoGradient) => "no_gradient",
        Some(GradientKind::ShouldNotDo) => "should_not_call",
        Some(GradientKind::NotImplemented) => "not_implemented_yet",
        None => "none",
    }
}

/// A readable, field-by-field difference between two op lists, or `None` when equal.
fn diff_ops(expected: &[OperatorDef], actual: &[OperatorDef]) -> Option<String> {
    if expected == actual {
        return None;
    }
    let mut out = String::new();
    if expected.len() != actual.len() {
        out += &format!(
            "  {} ops expected {:?}, got {} {:?}\n",
            expected.len(),
            expected.iter().map(|o| o.r#type()).collect::<Vec<_>>(),
            actual.len(),
            actual.iter().map(|o| o.r#type()).collect::<Vec<_>>()
        );
    }
    for (k, (e, a)) in expected.iter().zip(actual).enumerate() {
        if e == a {
            continue;
        }
        let mut field = |name: &str, ev: String, av: String| {
            if ev != av {
                out += &format!("  op {k} {name}:\n    expected {ev}\n    actual   {av}\n");
            }
        };
        field("type", format!("{:?}", e.r#type), format!("{:?}", a.r#type));
        field("name", format!("{:?}", e.name), format!("{:?}", a.name));
        field("input", format!("{:?}", e.input), format!("{:?}", a.input));
        field(
            "output",
            format!("{:?}", e.output),
            format!("{:?}", a.output),
        );
        field("arg", format!("{:?}", e.arg), format!("{:?}", a.arg));
        field(
            "engine",
            format!("{:?}", e.engine),
            format!("{:?}", a.engine),
        );
        field(
            "device_option",
            format!("{:?}", e.device_option),
            format!("{:?}", a.device_option),
        );
        field(
            "is_gradient_op",
            format!("{:?}", e.is_gradient_op),
            format!("{:?}", a.is_gradient_op),
        );
        let (mut e2, mut a2) = (e.clone(), a.clone());
        for o in [&mut e2, &mut a2] {
            o.r#type = None;
            o.name = None;
            o.input.clear();
            o.output.clear();
            o.arg.clear();
            o.engine = None;
            o.device_option = None;
            o.is_gradient_op = None;
        }
        field("other fields", format!("{e2:?}"), format!("{a2:?}"));
    }
    Some(out)
}

fn diff_grads(expected: &[GradRef], actual: &[GradRef]) -> Option<String> {
    (expected != actual)
        .then(|| format!("  g_input:\n    expected {expected:?}\n    actual   {actual:?}\n"))
}

/// Pass/fail bookkeeping of one section.
#[derive(Default)]
struct Tally {
    passed: usize,
    failures: Vec<String>,
}

impl Tally {
    fn check(&mut self, case: &str, problems: Vec<String>) {
        if problems.is_empty() {
            self.passed += 1;
        } else {
            self.failures
                .push(format!("{case}:\n{}", problems.concat()));
        }
    }

    fn finish(self, section: &str, min_cases: usize) {
        let total = self.passed + self.failures.len();
        println!(
            "{section}: {} passed, {} failed",
            self.passed,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{section}: {} of {total} cases failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
        assert!(total >= min_cases, "{section}: only {total} cases found");
    }
}

/// Every differentiable case of the `ops/` corpus: exact gradient ops and input gradients.
#[test]
fn ops_corpus_gradients() {
    let r = registry();
    let mut tally = Tally::default();
    for case in read_jsonl("ops/cases.jsonl") {
        let Some(g) = case.get("gradient") else {
            continue;
        };
        let name = case["name"].as_str().unwrap_or("?");
        let op: OperatorDef = b64(&case["op_b64"]);
        let expected_ops: NetDef = b64(&g["grad_ops_b64"]);
        let expected_gin = grad_refs(&g["g_input"]);
        let problems = match get_gradient(&r, &op, &grad_refs(&g["g_output"])) {
            Err(e) => vec![format!("  unexpected error: {e}\n")],
            Ok(out) => diff_ops(&expected_ops.op, &out.ops)
                .into_iter()
                .chain(diff_grads(&expected_gin, &out.input_grads))
                .collect(),
        };
        tally.check(name, problems);
    }
    tally.finish("ops corpus", 100);
}

/// Every op type of the catalog: registration kind, and `GetGradientForOp` on its typical def
/// (op type sequence and input gradients, or the error).
#[test]
fn catalog_gradients() {
    let r = registry();
    let path = side_file("op-catalog.json");
    let text =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let catalog: Value = serde_json::from_str(&text).expect("catalog JSON");
    let ops = catalog["ops"].as_object().expect("ops object");
    let mut tally = Tally::default();
    for (op_type, entry) in ops {
        let mut problems = Vec::new();
        let want_kind = entry["gradient_maker"].as_str().unwrap_or("?");
        let got_kind = kind_name(r.get(op_type));
        if want_kind != got_kind {
            problems.push(format!(
                "  registered as {got_kind}, Caffe2 has {want_kind}\n"
            ));
        }
        let python = entry["python_gradient"].as_bool().unwrap_or(false);
        if let (Some(g), false) = (entry.get("gradient"), python) {
            let op: OperatorDef = b64(&g["typical_def_b64"]);
            let result = get_gradient(&r, &op, &grad_refs(&g["g_output"]));
            match (g["status"].as_str(), result) {
                (Some("ok"), Ok(out)) => {
                    let want: Vec<&str> = g["grad_op_type_sequence"]
                        .as_array()
                        .expect("type sequence")
                        .iter()
                        .map(|v| v.as_str().unwrap_or("?"))
                        .collect();
                    let got: Vec<&str> = out.ops.iter().map(|o| o.r#type()).collect();
                    if want != got {
                        problems.push(format!("  op types: expected {want:?}, got {got:?}\n"));
                    }
                    if let Some(gin) = g.get("g_input") {
                        problems.extend(diff_grads(&grad_refs(gin), &out.input_grads));
                    }
                    if out.ops.iter().any(|o| o.is_gradient_op != Some(true)) {
                        problems.push("  gradient op without is_gradient_op\n".into());
                    }
                }
                (Some("ok"), Err(e)) => problems.push(format!("  unexpected error: {e}\n")),
                (_, Ok(out)) => problems.push(format!(
                    "  Caffe2 failed ({}), got {} ops\n",
                    g["error_first_line"].as_str().unwrap_or("?"),
                    out.ops.len()
                )),
                (_, Err(_)) => {}
            }
        }
        tally.check(op_type, problems);
    }
    tally.finish("catalog", 150);
}

/// The gradient of output `o` asked for by a case's `ys`.
fn ys_gradients(ys: &Value) -> BTreeMap<String, GradRef> {
    let mut m = BTreeMap::new();
    match ys["kind"].as_str() {
        Some("list") => {
            for b in ys["blobs"].as_array().expect("blobs") {
                let b = b.as_str().expect("blob").to_string();
                m.insert(b.clone(), GradRef::Dense(format!("{b}_autogen_grad")));
            }
        }
        _ => {
            for item in ys["items"].as_array().expect("items") {
                let b = item[0].as_str().expect("blob").to_string();
                let g = match &item[1] {
                    Value::Null => GradRef::Dense(format!("{b}_autogen_grad")),
                    v => grad_ref(v),
                };
                m.insert(b, g);
            }
        }
    }
    m
}

/// The single-op cases of the `gradients/` corpus: the ops that the maker emitted (those marked
/// `is_gradient_op`) and the gradient map, or the error.
#[test]
fn single_op_backward_passes() {
    let r = registry();
    let mut tally = Tally::default();
    for case in read_jsonl("gradients/cases.jsonl") {
        let name = case["name"].as_str().unwrap_or("?");
        if !name.starts_with("grad.single.") && !name.starts_with("grad.single_named.") {
            continue;
        }
        let net: NetDef = b64(&case["forward_b64"]);
        if net.op.len() != 1 {
            continue;
        }
        let op = &net.op[0];
        let ys = ys_gradients(&case["ys"]);
        let g_output: Vec<GradRef> = op
            .output
            .iter()
            .map(|o| ys.get(o).cloned().unwrap_or_default())
            .collect();
        let called = g_output.iter().any(GradRef::is_some) || op.r#type() == "ZeroGradient";
        let mut problems = Vec::new();
        if case["expected"] == "error" {
            let matches: Vec<&str> = case["error"]["match"]
                .as_array()
                .expect("match list")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let kind = kind_name(r.get(op.r#type()));
            let joined = matches.join(" | ");
            if joined.contains("One should not call gradient") {
                if kind != "should_not_call" {
                    problems.push(format!("  expected should_not_call, registered {kind}\n"));
                }
            } else if joined.contains("GradientRegistry()->Has") {
                if kind != "none" {
                    problems.push(format!("  expected no registration, registered {kind}\n"));
                }
            } else if joined.contains("is orphan") {
                if kind != "no_gradient" {
                    problems.push(format!("  expected no_gradient, registered {kind}\n"));
                }
            } else {
                match get_gradient(&r, op, &g_output) {
                    Ok(_) => problems.push(format!("  expected an error matching {joined}\n")),
                    Err(e) => {
                        let last = matches.last().copied().unwrap_or("");
                        if !e.contains(last) {
                            problems.push(format!("  error {e:?} does not contain {last:?}\n"));
                        }
                    }
                }
            }
        } else {
            let all: NetDef = b64(&case["grad_ops_b64"]);
            let (expected, seeds): (Vec<_>, Vec<_>) = all
                .op
                .into_iter()
                .partition(|o| o.is_gradient_op == Some(true));
            if seeds.iter().any(|o| o.r#type() != "ConstantFill") {
                problems.push("  unexpected non-seed op without is_gradient_op\n".into());
            }
            if called {
                match get_gradient(&r, op, &g_output) {
                    Err(e) => problems.push(format!("  unexpected error: {e}\n")),
                    Ok(out) => {
                        problems.extend(diff_ops(&expected, &out.ops));
                        let grad_map = case["grad_map"].as_object().expect("grad_map");
                        let outputs: HashSet<&String> = op.output.iter().collect();
                        for (k, inp) in op.input.iter().enumerate() {
                            if outputs.contains(inp) || ys.contains_key(inp) {
                                continue;
                            }
                            let want = grad_map.get(inp).map(grad_ref).unwrap_or_default();
                            let got = out.input_grads.get(k).cloned().unwrap_or_default();
                            if want != got {
                                problems.push(format!(
                                    "  gradient of {inp}: expected {want:?}, got {got:?}\n"
                                ));
                            }
                        }
                    }
                }
            } else if !expected.is_empty() {
                problems.push("  Caffe2 called the maker though no output has a gradient\n".into());
            }
        }
        tally.check(name, problems);
    }
    tally.finish("single-op gradient cases", 150);
}

/// `RecurrentNetworkGradient` ops recorded in `net` (a forward net followed by, or a list
/// holding, its gradient ops): each is matched with its forward op (the gradient op's inputs
/// end with the forward inputs and outputs), the output gradients are read from its leading
/// inputs, and the maker must rebuild it exactly.
fn check_recurrent(r: &Registry, forward: &[OperatorDef], grads: &[OperatorDef]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut found = 0;
    for fwd in forward.iter().filter(|o| o.r#type() == "RecurrentNetwork") {
        let tail: Vec<&String> = fwd.input.iter().chain(&fwd.output).collect();
        let Some(grad) = grads.iter().find(|g| {
            g.r#type() == "RecurrentNetworkGradient"
                && g.input.len() >= tail.len()
                && g.input[g.input.len() - tail.len()..]
                    .iter()
                    .eq(tail.iter().copied())
        }) else {
            continue;
        };
        found += 1;
        let with_grads: Vec<usize> = fwd
            .arg
            .iter()
            .find(|a| a.name() == "outputs_with_grads")
            .map(|a| a.ints.iter().map(|&i| i as usize).collect())
            .unwrap_or_default();
        let mut g_output = vec![GradRef::None; fwd.output.len()];
        for (k, &id) in with_grads.iter().enumerate() {
            g_output[id] = GradRef::Dense(grad.input[k].clone());
        }
        match get_gradient(r, fwd, &g_output) {
            Err(e) => problems.push(format!("  unexpected error: {e}\n")),
            Ok(out) => problems.extend(diff_ops(std::slice::from_ref(grad), &out.ops)),
        }
    }
    if found == 0 {
        problems.push("  no RecurrentNetworkGradient matched a RecurrentNetwork op\n".into());
    }
    problems
}

/// The recurrent networks of `grad.rnn.*` and of the `rnn/` corpus (non-forward-only models).
#[test]
fn recurrent_network_gradients() {
    let r = registry();
    let mut tally = Tally::default();
    for case in read_jsonl("gradients/cases.jsonl") {
        let name = case["name"].as_str().unwrap_or("?");
        if !name.starts_with("grad.rnn.") || case["expected"] != "ok" {
            continue;
        }
        let fwd: NetDef = b64(&case["forward_b64"]);
        let grads: NetDef = b64(&case["grad_ops_b64"]);
        tally.check(name, check_recurrent(&r, &fwd.op, &grads.op));
    }
    for case in read_jsonl("rnn/cases.jsonl") {
        let name = case["name"].as_str().unwrap_or("?");
        if case["forward_only"].as_bool().unwrap_or(false) {
            continue;
        }
        let net: NetDef = b64(&case["main_net_b64"]);
        tally.check(name, check_recurrent(&r, &net.op, &net.op));
    }
    tally.finish("recurrent networks", 4);
}
