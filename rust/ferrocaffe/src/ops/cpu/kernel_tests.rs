//! The pooling, LRN, normalisation, PRelu and Tanh kernels against naive references (odd
//! shapes, padding, `count_include_pad`, global pooling, long LRN windows), and the NHWC
//! kernels against the NCHW ones on transposed data.

use crate::proto::{Argument, OperatorDef};
use crate::tensor::Tensor;
use crate::workspace::Workspace;

enum A {
    I(i64),
    F(f32),
    S(&'static str),
}

fn op(ty: &str, ins: &[&str], outs: &[&str], args: &[(&str, A)]) -> OperatorDef {
    let mut d = OperatorDef::new(ty, ins.iter().copied(), outs.iter().copied());
    for (name, v) in args {
        let mut a = Argument {
            name: Some((*name).into()),
            ..Default::default()
        };
        match v {
            A::I(i) => a.i = Some(*i),
            A::F(f) => a.f = Some(*f),
            A::S(s) => a.s = Some(s.as_bytes().to_vec()),
        }
        d.arg.push(a);
    }
    d
}

/// Deterministic values in [-2, 2), with some exact repeats (ties for max pooling).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) % 64) as f32 / 16.0 - 2.0
        })
        .collect()
}

fn run(ws: &std::sync::Arc<Workspace>, d: &OperatorDef, out: &str) -> Vec<f32> {
    ws.run_operator_once(d).unwrap();
    ws.fetch(out).unwrap().as_slice::<f32>().unwrap().to_vec()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let ok = (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()) || a == b;
        assert!(ok, "{what}: element {i}: got {a}, want {b}");
    }
}

/// NCHW -> NHWC of an `[n, c, h, w]` array.
fn to_nhwc(x: &[f32], (n, c, h, w): (usize, usize, usize, usize)) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for i in 0..n {
        for ch in 0..c {
            for p in 0..h * w {
                y[(i * h * w + p) * c + ch] = x[(i * c + ch) * h * w + p];
            }
        }
    }
    y
}

struct PoolCase {
    dims: (usize, usize, usize, usize),
    k: (usize, usize),
    s: (usize, usize),
    pad: [usize; 4],
    global: bool,
    include_pad: bool,
}

/// The pooling reference, NCHW: (Y, dX for dY) with the window of each output clipped as
/// Caffe2 clips it, max gradient to the first maximal element in row-major order.
fn pool_reference(
    c: &PoolCase,
    x: &[f32],
    dy_of: impl Fn(usize) -> f32,
    max: bool,
) -> (Vec<f32>, Vec<f32>, (usize, usize)) {
    let (n, ch, h, w) = c.dims;
    let (kh, kw) = if c.global { (h, w) } else { c.k };
    let (sh, sw) = if c.global { (1, 1) } else { c.s };
    let p = if c.global { [0; 4] } else { c.pad };
    let (oh, ow) = if c.global {
        (1, 1)
    } else {
        (
            (h + p[0] + p[2] - kh) / sh + 1,
            (w + p[1] + p[3] - kw) / sw + 1,
        )
    };
    let mut y = vec![0f32; n * ch * oh * ow];
    let mut dx = vec![0f32; x.len()];
    for plane in 0..n * ch {
        for oy in 0..oh {
            for ox in 0..ow {
                let y0 = (oy * sh) as i64 - p[0] as i64;
                let x0 = (ox * sw) as i64 - p[1] as i64;
                let y1 = (y0 + kh as i64).min((h + p[2]) as i64);
                let x1 = (x0 + kw as i64).min((w + p[3]) as i64);
                let mut idx = vec![];
                for iy in y0.max(0)..y1.min(h as i64) {
                    for ix in x0.max(0)..x1.min(w as i64) {
                        idx.push(plane * h * w + iy as usize * w + ix as usize);
                    }
                }
                let o = (plane * oh + oy) * ow + ox;
                let g = dy_of(o);
                if max {
                    let m = idx.iter().map(|&i| x[i]).fold(f32::NEG_INFINITY, f32::max);
                    y[o] = m;
                    if let Some(&i) = idx.iter().find(|&&i| x[i] == m) {
                        dx[i] += g;
                    }
                } else {
                    let div = if c.include_pad {
                        ((y1 - y0) * (x1 - x0)).max(1) as f32
                    } else {
                        idx.len().max(1) as f32
                    };
                    y[o] = idx.iter().map(|&i| x[i]).sum::<f32>() / div;
                    for &i in &idx {
                        dx[i] += g / div;
                    }
                }
            }
        }
    }
    (y, dx, (oh, ow))
}

#[test]
fn pooling_matches_the_reference_in_both_layouts() {
    let cases = [
        PoolCase {
            dims: (2, 3, 7, 9),
            k: (3, 3),
            s: (2, 2),
            pad: [0; 4],
            global: false,
            include_pad: false,
        },
        PoolCase {
            dims: (1, 2, 8, 8),
            k: (2, 2),
            s: (2, 2),
            pad: [0; 4],
            global: false,
            include_pad: false,
        },
        PoolCase {
            dims: (2, 5, 7, 7),
            k: (3, 3),
            s: (1, 1),
            pad: [1; 4],
            global: false,
            include_pad: false,
        },
        PoolCase {
            dims: (2, 5, 7, 7),
            k: (3, 3),
            s: (1, 1),
            pad: [1; 4],
            global: false,
            include_pad: true,
        },
        PoolCase {
            dims: (1, 3, 6, 11),
            k: (2, 4),
            s: (3, 2),
            pad: [1, 2, 0, 3],
            global: false,
            include_pad: true,
        },
        PoolCase {
            dims: (1, 3, 6, 11),
            k: (2, 4),
            s: (3, 2),
            pad: [1, 2, 0, 3],
            global: false,
            include_pad: false,
        },
        PoolCase {
            dims: (3, 4, 5, 3),
            k: (0, 0),
            s: (1, 1),
            pad: [0; 4],
            global: true,
            include_pad: false,
        },
        // Large enough to run in parallel parts.
        PoolCase {
            dims: (2, 16, 33, 35),
            k: (3, 3),
            s: (2, 2),
            pad: [1; 4],
            global: false,
            include_pad: false,
        },
        // Windows wholly in the padding: max -inf, average 0.
        PoolCase {
            dims: (1, 2, 2, 2),
            k: (2, 2),
            s: (1, 1),
            pad: [3; 4],
            global: false,
            include_pad: false,
        },
        PoolCase {
            dims: (1, 1, 1, 1),
            k: (1, 1),
            s: (1, 1),
            pad: [0; 4],
            global: false,
            include_pad: false,
        },
    ];
    for (ci, c) in cases.iter().enumerate() {
        let (n, ch, h, w) = c.dims;
        let x = values(n * ch * h * w, ci as u64);
        for max in [true, false] {
            let gval = |o: usize| (o % 7) as f32 - 3.0;
            let (want_y, want_dx, (oh, ow)) = pool_reference(c, &x, gval, max);
            let dy: Vec<f32> = (0..want_y.len()).map(gval).collect();
            for nhwc in [false, true] {
                let what = format!("case {ci}, max {max}, nhwc {nhwc}");
                let ws = Workspace::new();
                let (xd, yd) = if nhwc {
                    (vec![n, h, w, ch], vec![n, oh, ow, ch])
                } else {
                    (vec![n, ch, h, w], vec![n, ch, oh, ow])
                };
                let lay = |v: &[f32], d: (usize, usize, usize, usize)| {
                    if nhwc {
                        to_nhwc(v, d)
                    } else {
                        v.to_vec()
                    }
                };
                ws.feed("X", Tensor::from_vec(&xd, lay(&x, c.dims)).unwrap());
                let mut args = vec![
                    ("order", A::S(if nhwc { "NHWC" } else { "NCHW" })),
                    ("count_include_pad", A::I(i64::from(c.include_pad))),
                ];
                if c.global {
                    args.push(("global_pooling", A::I(1)));
                } else {
                    args.extend([
                        ("kernel_h", A::I(c.k.0 as i64)),
                        ("kernel_w", A::I(c.k.1 as i64)),
                        ("stride_h", A::I(c.s.0 as i64)),
                        ("stride_w", A::I(c.s.1 as i64)),
                        ("pad_t", A::I(c.pad[0] as i64)),
                        ("pad_l", A::I(c.pad[1] as i64)),
                        ("pad_b", A::I(c.pad[2] as i64)),
                        ("pad_r", A::I(c.pad[3] as i64)),
                    ]);
                }
                let ty = if max { "MaxPool" } else { "AveragePool" };
                let y = run(&ws, &op(ty, &["X"], &["Y"], &args), "Y");
                assert_close(&y, &lay(&want_y, (n, ch, oh, ow)), 1e-6, &what);
                ws.feed(
                    "dY",
                    Tensor::from_vec(&yd, lay(&dy, (n, ch, oh, ow))).unwrap(),
                );
                let gty = format!("{ty}Gradient");
                let dx = run(&ws, &op(&gty, &["X", "Y", "dY"], &["dX"], &args), "dX");
                assert_close(
                    &dx,
                    &lay(&want_dx, c.dims),
                    1e-5,
                    &format!("{what} gradient"),
                );
            }
        }
    }
}

/// LRN reference: (Y, scale, dX for dY) in NCHW, straight from the definitions.
#[allow(clippy::type_complexity)]
fn lrn_reference(
    x: &[f32],
    dy: &[f32],
    (n, c, inner): (usize, usize, usize),
    size: usize,
    alpha: f32,
    beta: f32,
    bias: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let at = |i: usize, ch: usize, s: usize| (i * c + ch) * inner + s;
    let pre = (size - 1) / 2;
    let win = |ch: usize| ch.saturating_sub(pre)..(ch + pre + 1).min(c);
    let mut scale = vec![0f32; x.len()];
    let mut y = vec![0f32; x.len()];
    for i in 0..n {
        for s in 0..inner {
            for ch in 0..c {
                let sum: f64 = win(ch).map(|j| f64::from(x[at(i, j, s)]).powi(2)).sum();
                let k = at(i, ch, s);
                scale[k] = bias + alpha / size as f32 * sum as f32;
                y[k] = x[k] * scale[k].powf(-beta);
            }
        }
    }
    let mut dx = vec![0f32; x.len()];
    for i in 0..n {
        for s in 0..inner {
            for ch in 0..c {
                let k = at(i, ch, s);
                let acc: f64 = win(ch)
                    .map(|j| {
                        let q = at(i, j, s);
                        f64::from(dy[q]) * f64::from(y[q]) / f64::from(scale[q])
                    })
                    .sum();
                dx[k] = dy[k] * scale[k].powf(-beta)
                    - 2.0 * alpha * beta / size as f32 * x[k] * acc as f32;
            }
        }
    }
    (y, scale, dx)
}

#[test]
fn lrn_matches_the_reference_for_short_and_long_windows_in_both_layouts() {
    // The second shape is large enough to run in parallel parts.
    for (n, c, h, w) in [(2, 13, 3, 5), (3, 17, 19, 21)] {
        lrn_case((n, c, h, w));
    }
}

fn lrn_case((n, c, h, w): (usize, usize, usize, usize)) {
    let x = values(n * c * h * w, 7);
    let dy = values(x.len(), 8);
    for (size, beta, bias) in [
        (5, 0.75, 1.0),
        (3, 0.5, 2.0),
        (1, 1.0, 1.0),
        (11, 0.6, 1.5),
        (31, 0.75, 1.0),
        (7, 0.0, 1.0),
    ] {
        let alpha = 0.7;
        let (want_y, want_s, want_dx) =
            lrn_reference(&x, &dy, (n, c, h * w), size, alpha, beta, bias);
        for nhwc in [false, true] {
            let what = format!("size {size}, beta {beta}, nhwc {nhwc}");
            let lay = |v: &[f32]| {
                if nhwc {
                    to_nhwc(v, (n, c, h, w))
                } else {
                    v.to_vec()
                }
            };
            let dims = if nhwc { [n, h, w, c] } else { [n, c, h, w] };
            let ws = Workspace::new();
            ws.feed("X", Tensor::from_vec(&dims, lay(&x)).unwrap());
            ws.feed("dY", Tensor::from_vec(&dims, lay(&dy)).unwrap());
            let args = [
                ("size", A::I(size as i64)),
                ("alpha", A::F(alpha)),
                ("beta", A::F(beta)),
                ("bias", A::F(bias)),
                ("order", A::S(if nhwc { "NHWC" } else { "NCHW" })),
            ];
            let y = run(&ws, &op("LRN", &["X"], &["Y", "S"], &args), "Y");
            assert_close(&y, &lay(&want_y), 2e-6, &what);
            let s = ws.fetch("S").unwrap().as_slice::<f32>().unwrap().to_vec();
            assert_close(&s, &lay(&want_s), 2e-6, &what);
            let dx = run(
                &ws,
                &op("LRNGradient", &["X", "Y", "dY"], &["dX"], &args),
                "dX",
            );
            assert_close(&dx, &lay(&want_dx), 1e-5, &format!("{what} gradient"));
        }
    }
}

/// Runs `ty` on NCHW inputs and on their NHWC transposes (inputs named in `images` are
/// images, the rest per-channel vectors) and compares every output (images transposed back).
fn same_in_both_layouts(
    ty: &str,
    inputs: &[(&str, Vec<usize>, Vec<f32>)],
    images: &[&str],
    outs: &[&str],
    image_outs: &[&str],
    args: &[(&str, A)],
) {
    let mut results = vec![];
    for nhwc in [false, true] {
        let ws = Workspace::new();
        for (name, dims, v) in inputs {
            if images.contains(name) {
                let d = (dims[0], dims[1], dims[2], dims[3]);
                let (t, v) = if nhwc {
                    ([d.0, d.2, d.3, d.1], to_nhwc(v, d))
                } else {
                    ([d.0, d.1, d.2, d.3], v.clone())
                };
                ws.feed(name, Tensor::from_vec(&t, v).unwrap());
            } else {
                ws.feed(name, Tensor::from_vec(dims, v.clone()).unwrap());
            }
        }
        let order = if nhwc { "NHWC" } else { "NCHW" };
        let mut a: Vec<(&str, A)> = vec![("order", A::S(order))];
        for (k, v) in args {
            a.push((
                k,
                match v {
                    A::I(i) => A::I(*i),
                    A::F(f) => A::F(*f),
                    A::S(s) => A::S(s),
                },
            ));
        }
        let ins: Vec<&str> = inputs.iter().map(|i| i.0).collect();
        ws.run_operator_once(&op(ty, &ins, outs, &a)).unwrap();
        let got: Vec<Vec<f32>> = outs
            .iter()
            .map(|o| {
                let t = ws.fetch(o).unwrap();
                let v = t.as_slice::<f32>().unwrap().to_vec();
                if nhwc && image_outs.contains(o) {
                    // NHWC -> NCHW.
                    let d = t.dims().to_vec();
                    let (n, h, w, c) = (d[0], d[1], d[2], d[3]);
                    let mut back = vec![0f32; v.len()];
                    for i in 0..n {
                        for ch in 0..c {
                            for p in 0..h * w {
                                back[(i * c + ch) * h * w + p] = v[(i * h * w + p) * c + ch];
                            }
                        }
                    }
                    back
                } else {
                    v
                }
            })
            .collect();
        results.push(got);
    }
    for (k, o) in outs.iter().enumerate() {
        assert_close(
            &results[1][k],
            &results[0][k],
            2e-5,
            &format!("{ty} output {o}"),
        );
    }
}

#[test]
fn norms_and_prelu_agree_across_layouts() {
    // The second shape is large enough to run in parallel parts.
    for dims in [(2, 5, 3, 7), (3, 16, 20, 24)] {
        layouts_case(dims);
    }
}

fn layouts_case((n, c, h, w): (usize, usize, usize, usize)) {
    let img = |seed| (vec![n, c, h, w], values(n * c * h * w, seed));
    let vec_c = |seed: u64, pos: bool| {
        let v: Vec<f32> = values(c, seed)
            .iter()
            .map(|v| if pos { v.abs() + 0.5 } else { *v })
            .collect();
        (vec![c], v)
    };
    let named = |name: &'static str, (d, v): (Vec<usize>, Vec<f32>)| (name, d, v);
    // SpatialBN: inference, training, gradient.
    let bn_in = vec![
        named("X", img(1)),
        named("s", vec_c(2, false)),
        named("b", vec_c(3, false)),
        named("m", vec_c(4, false)),
        named("v", vec_c(5, true)),
    ];
    same_in_both_layouts(
        "SpatialBN",
        &bn_in,
        &["X"],
        &["Y"],
        &["Y"],
        &[("is_test", A::I(1)), ("epsilon", A::F(1e-3))],
    );
    same_in_both_layouts(
        "SpatialBN",
        &bn_in,
        &["X"],
        &["Y", "m", "v", "sm", "si"],
        &["Y"],
        &[],
    );
    let bn_grad = vec![
        named("X", img(1)),
        named("s", vec_c(2, false)),
        named("dY", img(6)),
        named("sm", vec_c(4, false)),
        named("si", vec_c(5, true)),
    ];
    same_in_both_layouts(
        "SpatialBNGradient",
        &bn_grad,
        &["X", "dY"],
        &["dX", "ds", "db"],
        &["dX"],
        &[],
    );
    // InstanceNorm and its gradient (with and without the saved statistics).
    let inorm = vec![
        named("X", img(7)),
        named("s", vec_c(8, false)),
        named("b", vec_c(9, false)),
    ];
    same_in_both_layouts(
        "InstanceNorm",
        &inorm,
        &["X"],
        &["Y", "mean", "rstd"],
        &["Y"],
        &[],
    );
    let ig = vec![
        named("X", img(7)),
        named("s", vec_c(8, false)),
        named("b", vec_c(9, false)),
        named("dY", img(10)),
    ];
    same_in_both_layouts(
        "InstanceNormGradient",
        &ig,
        &["X", "dY"],
        &["dX", "ds", "db"],
        &["dX"],
        &[],
    );
    // PRelu with per-channel and shared slopes, and its gradient.
    for slope in [vec_c(11, false), (vec![1], vec![0.25])] {
        let pr = vec![named("X", img(12)), named("S", slope.clone())];
        same_in_both_layouts("PRelu", &pr, &["X"], &["Y"], &["Y"], &[]);
        let prg = vec![
            named("Y", img(12)),
            named("dY", img(13)),
            named("X", img(12)),
            named("S", slope),
        ];
        same_in_both_layouts(
            "PReluGradient",
            &prg,
            &["Y", "dY", "X"],
            &["dX", "dS"],
            &["dX"],
            &[],
        );
    }
}

#[test]
fn instance_norm_matches_its_definition() {
    let (n, c, h, w) = (2, 3, 4, 5);
    let x = values(n * c * h * w, 21);
    let ws = Workspace::new();
    ws.feed("X", Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap());
    ws.feed("s", Tensor::from_vec(&[c], vec![1.0f32, 2.0, 0.5]).unwrap());
    ws.feed(
        "b",
        Tensor::from_vec(&[c], vec![0.0f32, -1.0, 3.0]).unwrap(),
    );
    let y = run(
        &ws,
        &op(
            "InstanceNorm",
            &["X", "s", "b"],
            &["Y"],
            &[("epsilon", A::F(1e-5))],
        ),
        "Y",
    );
    let (sc, bi) = ([1.0f32, 2.0, 0.5], [0.0f32, -1.0, 3.0]);
    for plane in 0..n * c {
        let xp = &x[plane * h * w..(plane + 1) * h * w];
        let mean = xp.iter().map(|&v| f64::from(v)).sum::<f64>() / (h * w) as f64;
        let var = xp
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / (h * w) as f64;
        for (k, &v) in xp.iter().enumerate() {
            let want = ((f64::from(v) - mean) / (var + 1e-5).sqrt()) as f32 * sc[plane % c]
                + bi[plane % c];
            assert_close(&[y[plane * h * w + k]], &[want], 1e-5, "InstanceNorm");
        }
    }
}

#[test]
fn tanh_stays_within_a_few_ulp_of_the_exact_value() {
    let mut xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 400.0).collect();
    xs.extend([
        0.0,
        -0.0,
        1e-30,
        -1e-8,
        0.2999,
        0.3,
        0.3001,
        20.0,
        -100.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let ws = Workspace::new();
    ws.feed("X", Tensor::from_vec(&[xs.len()], xs.clone()).unwrap());
    let y = run(&ws, &op("Tanh", &["X"], &["Y"], &[]), "Y");
    for (&x, &got) in xs.iter().zip(&y) {
        let want = f64::from(x).tanh();
        if x.is_nan() {
            assert!(got.is_nan());
            continue;
        }
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 4e-7 * want.abs().max(1e-30),
            "tanh({x}) = {got}, want {want}"
        );
        assert_eq!(
            got.is_sign_negative(),
            x.is_sign_negative(),
            "sign of tanh({x})"
        );
    }
    // Doubles keep the exact tanh.
    ws.feed("D", Tensor::from_vec(&[2], vec![0.5f64, -3.0]).unwrap());
    ws.run_operator_once(&op("Tanh", &["D"], &["E"], &[]))
        .unwrap();
    let e = ws.fetch("E").unwrap();
    assert_eq!(
        e.as_slice::<f64>().unwrap(),
        &[0.5f64.tanh(), (-3.0f64).tanh()]
    );
}
