use super::*;
use crate::proto::{Argument, OperatorDef};

fn s(dims: &[i64], t: i32) -> BlobShape {
    BlobShape::new(dims.to_vec(), t)
}

fn op(t: &str, ins: &[&str], outs: &[&str], args: Vec<Argument>) -> OperatorDef {
    let mut o = OperatorDef::new(t, ins.iter().copied(), outs.iter().copied());
    o.arg = args;
    o
}

fn ints(name: &str, v: &[i64]) -> Argument {
    Argument {
        name: Some(name.into()),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn net(ops: Vec<OperatorDef>) -> NetDef {
    NetDef {
        op: ops,
        ..Default::default()
    }
}

fn known(v: &[(&str, BlobShape)]) -> BTreeMap<String, BlobShape> {
    v.iter().map(|(n, s)| (n.to_string(), s.clone())).collect()
}

fn run(ops: Vec<OperatorDef>, v: &[(&str, BlobShape)]) -> BTreeMap<String, BlobShape> {
    infer(&[net(ops)], known(v))
}

use dtype::*;

#[test]
fn fc_and_fills() {
    let r = run(
        vec![
            op("XavierFill", &[], &["w"], vec![ints("shape", &[32, 96])]),
            op("ConstantFill", &[], &["b"], vec![ints("shape", &[32])]),
            op("FC", &["x", "w", "b"], &["y"], vec![]),
            op("FCTransposed", &["x", "wt", "b"], &["yt"], vec![]),
        ],
        &[("x", s(&[7, 96], FLOAT)), ("wt", s(&[96, 5], FLOAT))],
    );
    assert_eq!(r["w"], s(&[32, 96], FLOAT));
    assert_eq!(r["y"], s(&[7, 32], FLOAT));
    assert_eq!(r["yt"], s(&[7, 5], FLOAT));
}

#[test]
fn conv_and_pool_in_both_orders() {
    let r = run(
        vec![
            op(
                "Conv",
                &["x", "w"],
                &["y"],
                vec![
                    Argument::int("kernel", 7),
                    Argument::int("stride", 2),
                    Argument::int("pad", 3),
                ],
            ),
            op(
                "MaxPool",
                &["y"],
                &["p"],
                vec![Argument::int("kernel", 3), Argument::int("stride", 2)],
            ),
            op(
                "AveragePool",
                &["xh"],
                &["ph"],
                vec![
                    Argument::int("kernel", 3),
                    Argument::int("stride", 2),
                    Argument::int("pad", 1),
                    Argument::int("legacy_pad", 3),
                    Argument::string("order", "NHWC"),
                ],
            ),
        ],
        &[
            ("x", s(&[16, 3, 227, 227], FLOAT)),
            ("w", s(&[64, 3, 7, 7], FLOAT)),
            ("xh", s(&[2, 6, 6, 5], FLOAT)),
        ],
    );
    assert_eq!(r["y"].dims, vec![16, 64, 114, 114]);
    assert_eq!(r["p"].dims, vec![16, 64, 56, 56]);
    // ceil((6 + 2 - 3) / 2 + 1) = 4; (4 - 1) * 2 >= 6 + 1 is false, so 4 stays.
    assert_eq!(r["ph"].dims, vec![2, 4, 4, 5]);
}

#[test]
fn concat_split_and_types() {
    let r = run(
        vec![
            op(
                "Concat",
                &["a", "b"],
                &["c", "info"],
                vec![Argument::int("axis", 1)],
            ),
            op(
                "Concat",
                &["a", "a"],
                &["g"],
                vec![
                    Argument::int("add_axis", 1),
                    Argument::string("order", "NHWC"),
                ],
            ),
            op(
                "Split",
                &["c"],
                &["s1", "s2"],
                vec![ints("split", &[5, 16])],
            ),
            op("Split", &["a", "sizes"], &["t1", "t2"], vec![]),
        ],
        &[
            ("a", s(&[10, 12, 9, 10], INT32)),
            ("b", s(&[10, 9, 9, 10], INT32)),
        ],
    );
    assert_eq!(r["c"], s(&[10, 21, 9, 10], INT32));
    assert_eq!(r["info"], s(&[2], INT32));
    assert_eq!(r["g"], s(&[10, 12, 9, 2, 10], INT32));
    assert_eq!(r["s2"], s(&[10, 16, 9, 10], INT32));
    assert!(r["t1"].unknown, "split sizes from a blob are runtime data");
}

#[test]
fn reshape_and_its_gradient() {
    let mut grad = op("Reshape", &["y_grad", "old"], &["x_grad", "old2"], vec![]);
    grad.is_gradient_op = Some(true);
    let r = run(
        vec![
            op(
                "Reshape",
                &["x"],
                &["y", "old"],
                vec![ints("shape", &[8, 0, -1, 2])],
            ),
            grad,
        ],
        &[
            ("x", s(&[4, 26, 32], FLOAT)),
            ("y_grad", BlobShape::unknown()),
        ],
    );
    assert_eq!(r["y"].dims, vec![8, 26, 8, 2]);
    assert_eq!(r["old"], s(&[3], INT64));
    assert_eq!(r["x_grad"], s(&[4, 26, 32], FLOAT));
}

#[test]
fn inconsistent_op_empties_the_result() {
    let r = run(
        vec![op(
            "Reshape",
            &["x"],
            &["y", "old"],
            vec![ints("shape", &[5, -1])],
        )],
        &[("x", s(&[4, 3], FLOAT))],
    );
    assert!(r.is_empty());
}

#[test]
fn unknown_inputs_and_gradient_fallback() {
    let mut g = op(
        "ConvGradient",
        &["x", "w", "dy"],
        &["w_grad", "x_grad"],
        vec![],
    );
    g.is_gradient_op = Some(true);
    let r = run(
        vec![
            op("Relu", &["missing"], &["r"], vec![]),
            op("NoSuchOp", &["x"], &["z"], vec![]),
            g,
        ],
        &[("x", s(&[2, 3], DOUBLE)), ("w", s(&[4], FLOAT))],
    );
    assert!(r["r"].unknown);
    assert!(r["z"].unknown);
    assert_eq!(r["x_grad"], s(&[2, 3], DOUBLE));
    assert_eq!(r["w_grad"], s(&[4], FLOAT));
}

#[test]
fn elementwise_broadcast_cast_and_compare() {
    let r = run(
        vec![
            op("Add", &["a", "b"], &["c"], vec![]),
            op(
                "Add",
                &["a", "d"],
                &["e"],
                vec![Argument::int("broadcast", 1)],
            ),
            op("GT", &["a", "b"], &["f"], vec![]),
            op(
                "Cast",
                &["a"],
                &["g"],
                vec![Argument::int("to", INT64 as i64)],
            ),
            op(
                "Cast",
                &["a"],
                &["h"],
                vec![Argument::string("to", "double")],
            ),
        ],
        &[
            ("a", s(&[4, 1, 3], FLOAT)),
            ("b", s(&[5, 1], FLOAT)),
            ("d", s(&[3], FLOAT)),
        ],
    );
    assert_eq!(r["c"], s(&[4, 5, 3], FLOAT));
    assert_eq!(r["e"], s(&[4, 1, 3], FLOAT));
    assert_eq!(r["f"], s(&[4, 5, 3], BOOL));
    assert_eq!(r["g"], s(&[4, 1, 3], INT64));
    assert_eq!(r["h"], s(&[4, 1, 3], DOUBLE));
}

#[test]
fn tensor_manipulations() {
    let r = run(
        vec![
            op("Transpose", &["x"], &["t"], vec![ints("axes", &[1, 2, 0])]),
            op(
                "Slice",
                &["x"],
                &["sl"],
                vec![ints("starts", &[0, 1]), ints("ends", &[-1, -2])],
            ),
            op(
                "Tile",
                &["x"],
                &["ti"],
                vec![Argument::int("tiles", 3), Argument::int("axis", 1)],
            ),
            op("Gather", &["x", "idx"], &["ga"], vec![]),
            op("Flatten", &["x"], &["fl"], vec![Argument::int("axis", 2)]),
            op("ReduceBackSum", &["x"], &["rb"], vec![]),
            op(
                "ReduceMean",
                &["x"],
                &["rm"],
                vec![ints("axes", &[1]), Argument::int("keepdims", 0)],
            ),
            op("Squeeze", &["q"], &["sq"], vec![ints("dims", &[3, 1])]),
            op("Shape", &["x"], &["sh"], vec![]),
            op("Unique", &["u"], &["uy", "remap"], vec![]),
        ],
        &[
            ("x", s(&[2, 3, 4], FLOAT)),
            ("idx", s(&[5, 6], INT32)),
            ("q", s(&[64, 1, 96, 1, 4], FLOAT)),
            ("u", s(&[7], INT64)),
        ],
    );
    assert_eq!(r["t"].dims, vec![3, 4, 2]);
    assert_eq!(r["sl"].dims, vec![2, 1, 4]);
    assert_eq!(r["ti"].dims, vec![2, 9, 4]);
    assert_eq!(r["ga"].dims, vec![5, 6, 3, 4]);
    assert_eq!(r["fl"].dims, vec![6, 4]);
    assert_eq!(r["rb"].dims, vec![2, 3]);
    assert_eq!(r["rm"].dims, vec![2, 4]);
    assert_eq!(r["sq"].dims, vec![64, 96, 4]);
    assert_eq!(r["sh"], s(&[3], INT64));
    assert!(r["uy"].unknown);
    assert_eq!(r["remap"], s(&[7], INT32));
}

#[test]
fn costs() {
    let split = op(
        "Split",
        &["x", "sizes"],
        &["a", "b", "c"],
        vec![Argument::int("axis", 1)],
    );
    let c = operator_cost(&split, &[s(&[2, 3], INT32), s(&[3], INT32)]).unwrap();
    assert_eq!((c.flops, c.bytes_written, c.bytes_read), (0, 24, 36));
    let concat = op("Concat", &["a", "b"], &["y", "info"], vec![]);
    let c = operator_cost(&concat, &[s(&[2, 3], INT64), s(&[2, 1], INT64)]).unwrap();
    assert_eq!((c.flops, c.bytes_written, c.bytes_read), (0, 72, 64));
    let fc = op("FC", &["x", "w", "b"], &["y"], vec![]);
    let c = operator_cost(&fc, &[s(&[4, 5], FLOAT), s(&[3, 5], FLOAT), s(&[3], FLOAT)]).unwrap();
    assert_eq!(c.flops, 4 * 3 * 11);
    assert_eq!(c.bytes_read, (5 * 7 + 3) * 4);
    assert_eq!(c.bytes_written, 12 * 4);
    assert_eq!(c.params_bytes, (15 + 3) * 4);
    let conv = op(
        "Conv",
        &["x", "w"],
        &["y"],
        vec![Argument::int("kernel", 3)],
    );
    let c = operator_cost(&conv, &[s(&[1, 2, 5, 5], FLOAT), s(&[4, 2, 3, 3], FLOAT)]).unwrap();
    assert_eq!(c.flops, 3 * 3 * 3 * 3 * 2 * 4 * 2);
    assert_eq!(c.bytes_written, 4 * 9 * 4);
    let add = op("Add", &["a", "b"], &["c"], vec![]);
    let c = operator_cost(&add, &[s(&[6], FLOAT), s(&[6], FLOAT)]).unwrap();
    assert_eq!((c.flops, c.bytes_read, c.bytes_written), (6, 48, 24));
    assert!(operator_cost(&op("NoSuchOp", &[], &[], vec![]), &[]).is_err());
}

#[test]
fn layers_caffe2_shape_inference_test_uses() {
    let r = run(
        vec![
            op("L1Distance", &["x1", "y1"], &["d1"], vec![]),
            op("DotProductWithPadding", &["x2", "z2"], &["d2"], vec![]),
            op("ReduceFrontMean", &["x"], &["rf"], vec![]),
            op(
                "ReduceBackMax",
                &["x"],
                &["rb"],
                vec![Argument::int("num_reduce_dim", 2)],
            ),
            op(
                "Im2Col",
                &["img"],
                &["cols"],
                vec![
                    Argument::int("pad", 1),
                    Argument::int("kernel_h", 8),
                    Argument::int("kernel_w", 4),
                    Argument::int("dilation", 2),
                    Argument::int("stride", 2),
                ],
            ),
            op(
                "Im2Col",
                &["imgh"],
                &["colsh"],
                vec![
                    Argument::int("pad", 1),
                    Argument::int("kernel", 4),
                    Argument::int("dilation", 2),
                    Argument::int("stride", 2),
                    Argument::string("order", "NHWC"),
                ],
            ),
            op(
                "RoIPool",
                &["img", "rois"],
                &["pooled", "argmaxes"],
                vec![Argument::int("pooled_h", 4), Argument::int("pooled_w", 5)],
            ),
            op("MakeTwoClass", &["v"], &["v2"], vec![]),
            op(
                "LengthsPad",
                &["data", "lengths"],
                &["padded"],
                vec![Argument::int("target_length", 10)],
            ),
            op(
                "FloatToFused8BitRowwiseQuantized",
                &["data"],
                &["q"],
                vec![],
            ),
            op(
                "Fused8BitRowwiseQuantizedToHalfFloat",
                &["q"],
                &["h"],
                vec![],
            ),
            op(
                "SpatialSoftmaxWithLoss",
                &["img", "labels"],
                &["sm", "loss"],
                vec![],
            ),
            op(
                "SoftmaxWithLoss",
                &["x", "lab"],
                &["probs", "xent"],
                vec![Argument::int("axis", 2)],
            ),
            op(
                "PadImage",
                &["img"],
                &["pad"],
                vec![Argument::int("pad_t", 100), Argument::int("pad_r", 20)],
            ),
        ],
        &[
            ("x1", s(&[10], FLOAT)),
            ("y1", s(&[10], FLOAT)),
            ("x2", s(&[10, 5], FLOAT)),
            ("z2", s(&[10, 4], FLOAT)),
            ("x", s(&[10, 12, 18], FLOAT)),
            ("img", s(&[16, 3, 228, 114], FLOAT)),
            ("imgh", s(&[16, 228, 228, 3], FLOAT)),
            ("rois", s(&[2, 5], FLOAT)),
            ("v", s(&[32], FLOAT)),
            ("data", s(&[6, 32], FLOAT)),
            ("lengths", s(&[3], INT32)),
            ("labels", s(&[16, 228, 114], INT32)),
        ],
    );
    assert_eq!(r["d1"], s(&[10], FLOAT));
    assert_eq!(r["d2"], s(&[10], FLOAT));
    assert_eq!(r["rf"].dims, vec![12, 18]);
    assert_eq!(r["rb"].dims, vec![10]);
    assert_eq!(r["cols"].dims, vec![16, 96, 108, 55]);
    assert_eq!(r["colsh"].dims, vec![16, 112, 112, 48]);
    assert_eq!(r["pooled"], s(&[2, 3, 4, 5], FLOAT));
    assert_eq!(r["argmaxes"], s(&[2, 3, 4, 5], INT32));
    assert_eq!(r["v2"].dims, vec![32, 2]);
    assert_eq!(r["padded"].dims, vec![30, 32]);
    assert_eq!(r["q"], s(&[6, 40], UINT8));
    assert_eq!(r["h"], s(&[6, 32], FLOAT16));
    assert_eq!(r["sm"], s(&[16, 3, 228, 114], FLOAT));
    assert_eq!(r["loss"], s(&[], FLOAT));
    assert_eq!(r["pad"].dims, vec![16, 3, 328, 134]);
    assert_eq!(r["probs"], s(&[10, 12, 18], FLOAT));
    assert_eq!(r["xent"], s(&[], FLOAT));
}
