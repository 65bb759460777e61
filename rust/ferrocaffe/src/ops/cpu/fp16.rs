//! Half precision: FloatToHalf, HalfToFloat, Float16ConstantFill, and the momentum SGD updates
//! with weight decay FP16MomentumSGDUpdate (float16 state) and FP32MomentumSGDUpdate (float
//! state).
//!
//! The momentum updates take `(grad, momentum, lr, param)` and write `(grad, momentum, param)`
//! (Caffe2 allows grad, momentum and param in place). With `g = grad + weight_decay * param`:
//! - plain: `m' = lr * g + momentum * m`, the new grad is `m'`;
//! - nesterov: `m' = momentum * m + lr * g`, the new grad is `(1 + momentum) * m' - momentum * m`;
//!
//! and `param -= new grad`. The float16 op computes in float32 and rounds each result to
//! float16 (Caffe2's `fp32_update` mode; its default half-precision arithmetic is a GPU detail).

use half::f16;

use crate::bail;
use crate::error::Result;
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Element;

/// Largest finite float16.
const HALF_MAX: f32 = 65504.0;

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("FloatToHalf", |init| {
        let clip = init.args.bool("clip", false)?;
        Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
            convert::<f32, f16>(ctx, |v| {
                let v = if clip {
                    v.clamp(-HALF_MAX, HALF_MAX)
                } else {
                    v
                };
                f16::from_f32(v)
            })
        })))
    });
    r.cpu("HalfToFloat", |_| {
        Ok(Box::new(FnOp(|ctx: &mut OpContext<'_>| {
            convert::<f16, f32>(ctx, f16::to_f32)
        })))
    });
    r.cpu("Float16ConstantFill", create_fill);
    r.cpu("FP16MomentumSGDUpdate", create_momentum::<f16>);
    r.cpu("FP32MomentumSGDUpdate", create_momentum::<f32>);
}

/// Output 0 = f(input 0) elementwise, with a new element type (never in place).
fn convert<A: Element, B: Element>(ctx: &mut OpContext<'_>, f: impl Fn(A) -> B) -> Result<()> {
    if ctx.is_inplace(0, 0) {
        bail!(op = ctx, Schema: "this op cannot run in place: input and output types differ");
    }
    let (ins, mut outs) = ctx.split();
    let x = ins.tensor(0)?;
    if x.dtype() != A::DTYPE {
        bail!(DtypeMismatch: "input 0 holds {}, expected {}", x.dtype(), A::DTYPE);
    }
    let dims = x.dims().to_vec();
    let xs = x.as_slice::<A>()?;
    let y = outs.tensor(0)?.ensure::<B>(&dims);
    for (o, &v) in y.iter_mut().zip(xs) {
        *o = f(v);
    }
    Ok(())
}

fn create_fill(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let value = f16::from_f32(init.args.float("value", 0.0)?);
    let shape = init.args.sizes("shape")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        ctx.output(0)?.try_ensure::<f16>(&shape)?.fill(value);
        Ok(())
    })))
}

/// Element types the momentum update reads and writes through float32.
trait Real: Element {
    fn get(self) -> f32;
    fn put(v: f32) -> Self;
}

impl Real for f32 {
    fn get(self) -> f32 {
        self
    }
    fn put(v: f32) -> Self {
        v
    }
}

impl Real for f16 {
    fn get(self) -> f32 {
        self.to_f32()
    }
    fn put(v: f32) -> Self {
        f16::from_f32(v)
    }
}

fn create_momentum<T: Real>(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let momentum = init.args.float("momentum", 0.0)?;
    let weight_decay = init.args.float("weight_decay", 0.0)?;
    let nesterov = init.args.bool("nesterov", false)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        momentum_update::<T>(ctx, momentum, weight_decay, nesterov)
    })))
}

fn values<T: Real>(ctx: &OpContext<'_>, i: usize) -> Result<Vec<f32>> {
    let t = ctx.input(i)?;
    if t.dtype() != T::DTYPE {
        bail!(
            DtypeMismatch: "input {i} ('{}') holds {}, expected {}",
            ctx.input_name(i),
            t.dtype(),
            T::DTYPE
        );
    }
    Ok(t.as_slice::<T>()?.iter().map(|v| v.get()).collect())
}

fn momentum_update<T: Real>(
    ctx: &mut OpContext<'_>,
    momentum: f32,
    weight_decay: f32,
    nesterov: bool,
) -> Result<()> {
    let lr_t = ctx.input(2)?;
    if lr_t.numel() != 1 {
        bail!(
            ShapeMismatch: "input 2 ('{}') (the learning rate) must hold one value, got shape {:?}",
            ctx.input_name(2),
            lr_t.dims()
        );
    }
    let lr = lr_t.get_f64(0)? as f32;
    let g = values::<T>(ctx, 0)?;
    let m = values::<T>(ctx, 1)?;
    let p = values::<T>(ctx, 3)?;
    if g.len() != m.len() || g.len() != p.len() {
        bail!(
            ShapeMismatch: "grad ({} values), momentum ({}) and param ({}) must have the same size",
            g.len(),
            m.len(),
            p.len()
        );
    }
    let mut ng = Vec::with_capacity(g.len());
    let mut nm = Vec::with_capacity(g.len());
    let mut np = Vec::with_capacity(g.len());
    for i in 0..g.len() {
        let gi = weight_decay.mul_add(p[i], g[i]);
        let (mi, step) = if nesterov {
            let mi = lr.mul_add(gi, momentum * m[i]);
            (mi, mi.mul_add(momentum, mi) - momentum * m[i])
        } else {
            let mi = lr.mul_add(gi, momentum * m[i]);
            (mi, mi)
        };
        nm.push(mi);
        ng.push(step);
        np.push(p[i] - step);
    }
    let g_dims = ctx.input(0)?.dims().to_vec();
    let m_dims = ctx.input(1)?.dims().to_vec();
    let p_dims = ctx.input(3)?.dims().to_vec();
    let write = |ctx: &mut OpContext<'_>, j: usize, dims: &[usize], v: &[f32]| -> Result<()> {
        let out = ctx.output(j)?.ensure::<T>(dims);
        for (o, &x) in out.iter_mut().zip(v) {
            *o = T::put(x);
        }
        Ok(())
    };
    write(ctx, 0, &g_dims, &ng)?;
    write(ctx, 1, &m_dims, &nm)?;
    write(ctx, 2, &p_dims, &np)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use crate::proto::{Argument, OperatorDef};
    use crate::tensor::{DataType, Tensor};
    use crate::workspace::Workspace;

    #[test]
    fn float_half_round_trip_and_clip() {
        let ws = Workspace::new();
        ws.feed(
            "X",
            Tensor::from_vec(&[2, 2], vec![1.5f32, -0.1, 1e5, -1e5]).unwrap(),
        );
        ws.run_operator_once(&OperatorDef::new("FloatToHalf", ["X"], ["H"]))
            .unwrap();
        let h = ws.fetch("H").unwrap();
        assert_eq!(h.dtype(), DataType::Float16);
        assert_eq!(h.dims(), &[2, 2]);
        let hs = h.as_slice::<f16>().unwrap();
        assert_eq!(hs[0].to_f32(), 1.5);
        assert!(hs[2].is_infinite() && hs[3].is_infinite());
        ws.run_operator_once(&OperatorDef::new("HalfToFloat", ["H"], ["Y"]))
            .unwrap();
        let y = ws.fetch("Y").unwrap().as_slice::<f32>().unwrap().to_vec();
        assert_eq!(y[0], 1.5);
        assert!((y[1] + 0.1).abs() < 1e-4 && y[1] != -0.1);
        let mut clip = OperatorDef::new("FloatToHalf", ["X"], ["H"]);
        clip.arg.push(Argument::int("clip", 1));
        ws.run_operator_once(&clip).unwrap();
        let hs = ws.fetch("H").unwrap().as_slice::<f16>().unwrap().to_vec();
        assert_eq!(hs[2].to_f32(), 65504.0);
        assert_eq!(hs[3].to_f32(), -65504.0);
        // Wrong input types are refused.
        let e = ws
            .run_operator_once(&OperatorDef::new("HalfToFloat", ["X"], ["Z"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected float16"), "{e}");
    }

    #[test]
    fn float16_constant_fill() {
        let ws = Workspace::new();
        let mut op = OperatorDef::new("Float16ConstantFill", [] as [&str; 0], ["Y"]);
        op.arg.push(Argument::float("value", 2.5));
        op.arg.push(Argument {
            name: Some("shape".into()),
            ints: vec![2, 3],
            ..Default::default()
        });
        ws.run_operator_once(&op).unwrap();
        let y = ws.fetch("Y").unwrap();
        assert_eq!(y.dims(), &[2, 3]);
        assert!(y
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .all(|v| v.to_f32() == 2.5));
    }

    fn momentum_ws(half: bool) -> std::sync::Arc<Workspace> {
        let ws = Workspace::new();
        let feed = |name: &str, v: Vec<f32>| {
            if half {
                let h: Vec<f16> = v.into_iter().map(f16::from_f32).collect();
                ws.feed(name, Tensor::from_vec(&[2], h).unwrap());
            } else {
                ws.feed(name, Tensor::from_vec(&[2], v).unwrap());
            }
        };
        feed("g", vec![1.0, -2.0]);
        feed("m", vec![0.5, 0.25]);
        feed("p", vec![2.0, 4.0]);
        ws.feed("lr", Tensor::from_vec(&[1], vec![0.5f32]).unwrap());
        ws
    }

    fn momentum_op(op_type: &str, nesterov: bool) -> OperatorDef {
        let mut op = OperatorDef::new(op_type, ["g", "m", "lr", "p"], ["g", "m", "p"]);
        op.arg.push(Argument::float("momentum", 0.5));
        op.arg.push(Argument::float("weight_decay", 0.25));
        op.arg.push(Argument::int("nesterov", i64::from(nesterov)));
        op
    }

    #[test]
    fn fp32_momentum_update_with_weight_decay() {
        let ws = momentum_ws(false);
        ws.run_operator_once(&momentum_op("FP32MomentumSGDUpdate", false))
            .unwrap();
        // g' = g + 0.25 p = [1.5, -1]; m' = 0.5 g' + 0.5 m = [1, -0.375].
        let f = |n: &str| ws.fetch(n).unwrap().as_slice::<f32>().unwrap().to_vec();
        assert_eq!(f("m"), vec![1.0, -0.375]);
        assert_eq!(f("g"), vec![1.0, -0.375]);
        assert_eq!(f("p"), vec![1.0, 4.375]);
        let ws = momentum_ws(false);
        ws.run_operator_once(&momentum_op("FP32MomentumSGDUpdate", true))
            .unwrap();
        // nesterov: step = 1.5 m' - 0.5 m = [1.25, -0.6875].
        assert_eq!(f_of(&ws, "m"), vec![1.0, -0.375]);
        assert_eq!(f_of(&ws, "g"), vec![1.25, -0.6875]);
        assert_eq!(f_of(&ws, "p"), vec![0.75, 4.6875]);
    }

    fn f_of(ws: &Workspace, n: &str) -> Vec<f32> {
        ws.fetch(n).unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn fp16_momentum_update_keeps_half_state() {
        let ws = momentum_ws(true);
        ws.run_operator_once(&momentum_op("FP16MomentumSGDUpdate", false))
            .unwrap();
        let p = ws.fetch("p").unwrap();
        assert_eq!(p.dtype(), DataType::Float16);
        let p: Vec<f32> = p
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(p, vec![1.0, 4.375]);
        // float32 state is refused by the float16 op.
        let ws = momentum_ws(false);
        let e = ws
            .run_operator_once(&momentum_op("FP16MomentumSGDUpdate", false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected float16"), "{e}");
    }

    #[test]
    fn momentum_update_checks_sizes_and_lr() {
        let ws = momentum_ws(false);
        ws.feed("p", Tensor::from_vec(&[3], vec![1.0f32; 3]).unwrap());
        let e = ws
            .run_operator_once(&momentum_op("FP32MomentumSGDUpdate", false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("same size"), "{e}");
        let ws = momentum_ws(false);
        ws.feed("lr", Tensor::from_vec(&[2], vec![1.0f32; 2]).unwrap());
        let e = ws
            .run_operator_once(&momentum_op("FP32MomentumSGDUpdate", false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one value"), "{e}");
    }
}
