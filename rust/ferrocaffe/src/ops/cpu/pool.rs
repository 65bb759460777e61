//! 2-d pooling: MaxPool, AveragePool (padding not counted unless `count_include_pad`),
//! `global_pooling`, NCHW or NHWC, and their gradients (inputs X, Y, dY).

use super::conv_args::{Geometry, Order};
use crate::bail;
use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;

/// Registers the family.
pub fn register(r: &mut Registry) {
    for (name, max, grad) in [
        ("MaxPool", true, false),
        ("MaxPool2D", true, false),
        ("AveragePool", false, false),
        ("AveragePool2D", false, false),
        ("MaxPoolGradient", true, true),
        ("MaxPool2DGradient", true, true),
        ("AveragePoolGradient", false, true),
        ("AveragePool2DGradient", false, true),
    ] {
        let f: crate::ops::registry::Factory = match (max, grad) {
            (true, false) => |i| create(i, true, false),
            (true, true) => |i| create(i, true, true),
            (false, false) => |i| create(i, false, false),
            (false, true) => |i| create(i, false, true),
        };
        r.cpu(name, f);
    }
}

struct Pool {
    g: Geometry,
    max: bool,
    gradient: bool,
    include_pad: bool,
}

/// Geometry of one run: (n, c, h, w, kh, kw, oh, ow).
type Shape = (usize, usize, usize, usize, usize, usize, usize, usize);

impl Pool {
    fn shape(&self, dims: &[usize]) -> Result<Shape> {
        let (n, c, h, w) = self.g.nchw(dims)?;
        let (kh, kw) = if self.g.global {
            (h, w)
        } else {
            (self.g.kernel[0], self.g.kernel[1])
        };
        if kh == 0 || kw == 0 {
            bail!(BadArgument: "pooling needs a kernel size (or global_pooling)");
        }
        let (oh, ow) = if self.g.global {
            (1, 1)
        } else {
            self.g.out_size(h, w, kh, kw)?
        };
        Ok((n, c, h, w, kh, kw, oh, ow))
    }

    /// Calls `f(out_index, in_indices_of_window, divisor)` for every output element.
    fn windows(&self, s: Shape, mut f: impl FnMut(usize, &[usize], f32)) {
        let (n, c, h, w, kh, kw, oh, ow) = s;
        let (sh, sw) = if self.g.global {
            (1, 1)
        } else {
            (self.g.stride[0], self.g.stride[1])
        };
        let (pt, pl) = if self.g.global {
            (0, 0)
        } else {
            (self.g.pad[0], self.g.pad[1])
        };
        let (pb, pr) = if self.g.global {
            (0, 0)
        } else {
            (self.g.pad[2], self.g.pad[3])
        };
        // A window holds at most min(kh, h) x min(kw, w) elements of the input, whatever the
        // kernel argument says.
        let mut idx = Vec::with_capacity(kh.min(h).saturating_mul(kw.min(w)));
        for img in 0..n {
            for ch in 0..c {
                for oy in 0..oh {
                    let y0 = (oy * sh) as isize - pt as isize;
                    let y1 = (y0 + kh as isize).min((h + pb) as isize);
                    let (ys, ye) = (y0.max(0) as usize, (y1.min(h as isize)).max(0) as usize);
                    for ox in 0..ow {
                        let x0 = (ox * sw) as isize - pl as isize;
                        let x1 = (x0 + kw as isize).min((w + pr) as isize);
                        let (xs, xe) = (x0.max(0) as usize, (x1.min(w as isize)).max(0) as usize);
                        idx.clear();
                        for iy in ys..ye {
                            for ix in xs..xe {
                                idx.push(match self.g.order {
                                    Order::Nchw => ((img * c + ch) * h + iy) * w + ix,
                                    Order::Nhwc => ((img * h + iy) * w + ix) * c + ch,
                                });
                            }
                        }
                        let out = match self.g.order {
                            Order::Nchw => ((img * c + ch) * oh + oy) * ow + ox,
                            Order::Nhwc => ((img * oh + oy) * ow + ox) * c + ch,
                        };
                        let div = if self.include_pad {
                            ((y1 - y0) * (x1 - x0)).max(1) as f32
                        } else {
                            idx.len().max(1) as f32
                        };
                        f(out, &idx, div);
                    }
                }
            }
        }
    }
}

impl Operator for Pool {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(0)?;
        let s = self.shape(x.dims())?;
        let (n, c, _, _, _, _, oh, ow) = s;
        let xs = x.as_slice::<f32>()?;
        let y_dims = self.g.dims(n, c, oh, ow);
        if !self.gradient {
            let y = outs.tensor(0)?.try_ensure::<f32>(&y_dims)?;
            let max = self.max;
            self.windows(s, |o, win, div| {
                y[o] = if max {
                    win.iter().map(|&i| xs[i]).fold(f32::NEG_INFINITY, f32::max)
                } else {
                    win.iter().map(|&i| xs[i]).sum::<f32>() / div
                };
            });
            return Ok(());
        }
        let y = ins.tensor(1)?.as_slice::<f32>()?;
        let dy = ins.tensor(2)?;
        if dy.dims() != y_dims.as_slice() || y.len() != dy.numel() {
            bail!(ShapeMismatch: "dY has shape {:?}, expected {y_dims:?}", dy.dims());
        }
        let g = dy.as_slice::<f32>()?;
        let dims = x.dims().to_vec();
        let dx = outs.tensor(0)?.ensure::<f32>(&dims);
        dx.fill(0.0);
        let max = self.max;
        self.windows(s, |o, win, div| {
            if max {
                // The first element equal to the max gets the gradient.
                if let Some(&i) = win.iter().find(|&&i| xs[i] == y[o]) {
                    dx[i] += g[o];
                }
            } else {
                for &i in win {
                    dx[i] += g[o] / div;
                }
            }
        });
        Ok(())
    }
}

fn create(init: &OpInit<'_>, max: bool, gradient: bool) -> Result<Box<dyn Operator>> {
    let g = Geometry::new(init)?;
    if g.dilation != [1, 1] {
        bail!(op = init, NotImplemented: "Pooling op does not support dilation right now.");
    }
    Ok(Box::new(Pool {
        g,
        max,
        gradient,
        include_pad: init.args.bool("count_include_pad", false)?,
    }))
}
