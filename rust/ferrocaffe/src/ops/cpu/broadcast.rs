//! Shapes and loops for elementwise ops with broadcasting: numpy rules, and Caffe2's legacy
//! `broadcast=1` / `axis` rule (B matches a contiguous run of A's dims starting at `axis`).
//!
//! The loops take raw pointers so that an output may be the same buffer as an input (in-place
//! ops): every element of an input is read before the output element of the same index is
//! written, which is what in-place elementwise ops need.

use crate::bail;
use crate::error::Result;

/// The output shape of numpy-style broadcasting of `a` and `b` (Caffe2's
/// `ComputeBinaryBroadcastForwardDims`).
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut c = vec![0; n];
    for k in 0..n {
        let ad = if k < n - a.len() {
            None
        } else {
            Some(a[k - (n - a.len())])
        };
        let bd = if k < n - b.len() {
            None
        } else {
            Some(b[k - (n - b.len())])
        };
        c[k] = match (ad, bd) {
            (Some(x), Some(y)) => {
                if !(x == y || x == 1 || y == 1) {
                    bail!(
                        ShapeMismatch: "A_dim == B_dim || A_dim == 1 || B_dim == 1. A_dim: \
                         {x},B_dim: {y}"
                    );
                }
                if x == 0 || y == 0 {
                    0
                } else {
                    x.max(y)
                }
            }
            (Some(x), None) => x,
            (None, Some(y)) => y,
            (None, None) => 1,
        };
    }
    Ok(c)
}

/// Caffe2's legacy broadcast: returns `(pre, n, post)` such that A is `[pre, n, post]` and B is
/// `[n]` (B's leading and trailing 1s dropped), B matching A's dims from `axis` (-1: align B to
/// the end of A).
pub fn legacy_sizes(a: &[usize], b: &[usize], axis: i64) -> Result<(usize, usize, usize)> {
    if a.len() < b.len() {
        bail!(
            ShapeMismatch: "If you are doing broadcasting, input1 should have a smaller or equal \
             number of dimensions."
        );
    }
    let axis = if axis == -1 {
        (a.len() - b.len()) as i64
    } else {
        axis
    };
    if axis < 0 || axis as usize > a.len() - b.len() {
        bail!(
            BadArgument: "Broadcast axis should be in the range of[0, A.ndim() - B.ndim()], but \
             axis = {axis}"
        );
    }
    let axis = axis as usize;
    let mut start = 0;
    while start < b.len() && b[start] == 1 {
        start += 1;
    }
    let mut end = b.len();
    while end > start && b[end - 1] == 1 {
        end -= 1;
    }
    let pre: usize = a[..axis + start].iter().product();
    let mut n = 1;
    for i in start..end {
        if a[i + axis] != b[i] {
            bail!(
                ShapeMismatch: "Broadcast dimension mismatch. A dim {} is {}, B dim {i} is {}",
                i + axis,
                a[i + axis],
                b[i]
            );
        }
        n *= b[i];
    }
    let post: usize = a[(axis + end).min(a.len())..].iter().product();
    Ok((pre, n, post))
}

/// Shapes of a binary op: `(a_dims, b_dims, c_dims)` as the loops see them. With `legacy`,
/// A keeps its shape and B is laid out as `[n, 1]` against `[pre, n, post]`.
pub fn binary_shapes(
    a: &[usize],
    b: &[usize],
    legacy: bool,
    axis: i64,
) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    if legacy {
        let numel_b: usize = b.iter().product();
        if numel_b == 1 {
            let na: usize = a.iter().product();
            return Ok((vec![na], vec![1], a.to_vec()));
        }
        let (pre, n, post) = legacy_sizes(a, b, axis)?;
        Ok((vec![pre, n, post], vec![n, 1], a.to_vec()))
    } else {
        let c = broadcast_dims(a, b)?;
        Ok((a.to_vec(), b.to_vec(), c))
    }
}

/// Strides (in elements) of `dims` aligned to the end of `out` (0 where broadcast).
fn strides_for(dims: &[usize], out: &[usize]) -> Vec<usize> {
    let off = out.len() - dims.len();
    let mut s = vec![0; out.len()];
    let mut acc = 1;
    for k in (0..dims.len()).rev() {
        s[k + off] = if dims[k] == 1 { 0 } else { acc };
        acc *= dims[k];
    }
    s
}

/// `c[i] = f(a[ia], b[ib])` over the broadcast of `a_dims` and `b_dims` (= `c_dims`).
///
/// # Safety
/// `a`, `b` must be valid for reads of their shapes' element counts, `c` for writes of
/// `c_dims`' count. `c` may equal `a` (or `b`) only if that input has shape `c_dims`.
pub unsafe fn binary_loop<A: Copy, B: Copy, C>(
    a: *const A,
    a_dims: &[usize],
    b: *const B,
    b_dims: &[usize],
    c: *mut C,
    c_dims: &[usize],
    f: impl Fn(A, B) -> C,
) {
    let n: usize = c_dims.iter().product();
    if n == 0 {
        return;
    }
    let na: usize = a_dims.iter().product();
    let nb: usize = b_dims.iter().product();
    // SAFETY (all branches): indices stay below the element counts checked above.
    unsafe {
        if na == n && nb == n {
            for i in 0..n {
                let v = f(*a.add(i), *b.add(i));
                *c.add(i) = v;
            }
            return;
        }
        if nb == 1 && na == n {
            let bv = *b;
            for i in 0..n {
                let v = f(*a.add(i), bv);
                *c.add(i) = v;
            }
            return;
        }
        if na == 1 && nb == n {
            let av = *a;
            for i in 0..n {
                let v = f(av, *b.add(i));
                *c.add(i) = v;
            }
            return;
        }
        let sa = strides_for(a_dims, c_dims);
        let sb = strides_for(b_dims, c_dims);
        let nd = c_dims.len();
        let inner = c_dims[nd - 1];
        let (ia_step, ib_step) = (sa[nd - 1], sb[nd - 1]);
        let mut idx = vec![0usize; nd];
        let mut out = 0;
        let outer = n / inner.max(1);
        for _ in 0..outer {
            let mut pa = 0;
            let mut pb = 0;
            for k in 0..nd - 1 {
                pa += idx[k] * sa[k];
                pb += idx[k] * sb[k];
            }
            for j in 0..inner {
                let v = f(*a.add(pa + j * ia_step), *b.add(pb + j * ib_step));
                *c.add(out + j) = v;
            }
            out += inner;
            for k in (0..nd - 1).rev() {
                idx[k] += 1;
                if idx[k] < c_dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
}

/// `a` broadcast to `c_dims`, element by element, passed to `f(out_index, value)`.
pub fn for_each_broadcast<T: Copy>(
    a: &[T],
    a_dims: &[usize],
    c_dims: &[usize],
    mut f: impl FnMut(usize, T),
) {
    let n: usize = c_dims.iter().product();
    if a.len() == n {
        for (i, &v) in a.iter().enumerate() {
            f(i, v);
        }
        return;
    }
    let sa = strides_for(a_dims, c_dims);
    let nd = c_dims.len();
    let mut idx = vec![0usize; nd];
    for i in 0..n {
        let p: usize = (0..nd).map(|k| idx[k] * sa[k]).sum();
        f(i, a[p]);
        for k in (0..nd).rev() {
            idx[k] += 1;
            if idx[k] < c_dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Calls `f(i, ia, ib)` for every element `i` of `c_dims` with the matching element indices of
/// the broadcast operands `a_dims` and `b_dims` (aligned to the end of `c_dims`).
pub fn for_each_index(
    a_dims: &[usize],
    b_dims: &[usize],
    c_dims: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    let n: usize = c_dims.iter().product();
    let na: usize = a_dims.iter().product();
    let nb: usize = b_dims.iter().product();
    if na == n && nb == n {
        for i in 0..n {
            f(i, i, i);
        }
        return;
    }
    let sa = strides_for(a_dims, c_dims);
    let sb = strides_for(b_dims, c_dims);
    let nd = c_dims.len();
    let mut idx = vec![0usize; nd];
    let (mut pa, mut pb) = (0usize, 0usize);
    for i in 0..n {
        f(i, pa, pb);
        for k in (0..nd).rev() {
            idx[k] += 1;
            pa += sa[k];
            pb += sb[k];
            if idx[k] < c_dims[k] {
                break;
            }
            pa -= sa[k] * idx[k];
            pb -= sb[k] * idx[k];
            idx[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_rules() {
        assert_eq!(broadcast_dims(&[2, 3], &[3]).unwrap(), vec![2, 3]);
        assert_eq!(broadcast_dims(&[2, 1], &[1, 4]).unwrap(), vec![2, 4]);
        assert_eq!(broadcast_dims(&[0, 1], &[1, 4]).unwrap(), vec![0, 4]);
        let e = broadcast_dims(&[3], &[4]).unwrap_err().to_string();
        assert!(e.contains("A_dim == B_dim || A_dim == 1 || B_dim == 1. A_dim: 3,B_dim: 4"));
    }

    #[test]
    fn legacy_rules() {
        assert_eq!(legacy_sizes(&[2, 3, 4, 5], &[3, 4], 1).unwrap(), (2, 12, 5));
        assert_eq!(
            legacy_sizes(&[2, 3, 4, 5], &[4, 5], -1).unwrap(),
            (6, 20, 1)
        );
        assert_eq!(
            legacy_sizes(&[2, 3, 4, 5], &[1, 4, 1], 1).unwrap(),
            (6, 4, 5)
        );
        assert!(legacy_sizes(&[2, 3], &[4], 1).is_err());
        assert!(legacy_sizes(&[2], &[2, 3], -1).is_err());
    }

    #[test]
    fn indices_follow_broadcast() {
        let mut seen = Vec::new();
        for_each_index(&[2, 1], &[3], &[2, 3], |i, a, b| seen.push((i, a, b)));
        assert_eq!(
            seen,
            vec![
                (0, 0, 0),
                (1, 0, 1),
                (2, 0, 2),
                (3, 1, 0),
                (4, 1, 1),
                (5, 1, 2)
            ]
        );
    }

    #[test]
    fn loops_broadcast_both_ways() {
        let a = [1.0f32, 2.0];
        let b = [10.0f32, 20.0, 30.0];
        let mut c = [0.0f32; 6];
        unsafe {
            binary_loop(
                a.as_ptr(),
                &[2, 1],
                b.as_ptr(),
                &[1, 3],
                c.as_mut_ptr(),
                &[2, 3],
                |x, y| x + y,
            )
        };
        assert_eq!(c, [11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
        let mut inplace = [1i64, 2, 3];
        let p = inplace.as_mut_ptr();
        unsafe {
            binary_loop(
                p as *const i64,
                &[3],
                [5i64].as_ptr(),
                &[1],
                p,
                &[3],
                |x, y| x * y,
            )
        };
        assert_eq!(inplace, [5, 10, 15]);
    }
}
