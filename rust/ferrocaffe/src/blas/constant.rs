//! Operands held constant for a while, so that their packed form can be reused: an RNN's
//! weights over all the timesteps of one run.
//!
//! A step of an LSTM's backward pass computes `dX = dY W` with the `1024 x 256` weight as the
//! wide right-hand operand, whose column strips the small-dimension kernels copy tight on every
//! call ([`super::small`]): 64 copies of the whole weight per pass. Inside a
//! [`hold_constant`] scope the strips are copied once, on first use, and every later product
//! with the same operand reads them.
//!
//! An operand is known by its address and length. That is sound because the scope holds a
//! [`Snapshot`] of each tensor: a buffer that a snapshot shares is never written in place (the
//! tensor's first write copies it away, copy-on-write), and it is not freed, so its address
//! cannot be reused for other data while the scope lives. A product whose operand has that
//! address and length reads exactly the held data; one whose tensor was written since has a
//! new address and takes the ordinary path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::tensor::{DataType, Snapshot};

/// One held operand and, once a product asked for them, its column strips.
struct Entry {
    addr: usize,
    len: usize,
    /// Keeps the buffer alive and unwritten (see the module docs).
    _held: Snapshot,
    strips: OnceLock<Strips>,
}

/// A `k x n` row-major matrix cut in column strips of `width` (the last one narrower), each
/// `k x width` and tight, strip `s` at offset `s * width * k` (so columns `c..` of a strip that
/// starts at `c` are at `c * k`).
pub(super) struct Strips {
    k: usize,
    n: usize,
    width: usize,
    data: Vec<f32>,
}

impl Strips {
    pub(super) fn pack(src: &[f32], k: usize, n: usize, width: usize) -> Strips {
        let mut data = Vec::with_capacity(k * n);
        for c in (0..n).step_by(width) {
            append_strip(src, k, n, c, width.min(n - c), &mut data);
        }
        Strips { k, n, width, data }
    }

    /// The strip starting at column `c`, `k x width` tight (`width` as the tile takes it:
    /// the strip width, or what is left at the last strip).
    pub(super) fn at(&self, c: usize) -> *const f32 {
        debug_assert!(c.is_multiple_of(self.width) && c < self.n);
        self.data[c * self.k..].as_ptr()
    }

    pub(super) fn width(&self) -> usize {
        self.width
    }
}

/// Appends columns `c..c + width` of `src` (`k x n`, row-major, tight), every row of them, to
/// `out` (`k x width`, tight): one strip, as the kernels read it.
pub(super) fn append_strip(
    src: &[f32],
    k: usize,
    n: usize,
    c: usize,
    width: usize,
    out: &mut Vec<f32>,
) {
    out.reserve(k * width);
    for row in src.chunks_exact(n).take(k) {
        out.extend_from_slice(&row[c..c + width]);
    }
}

/// The strips of a held operand, found by address (the entry is shared so that the strips
/// outlive the scope if a product still runs on them when it ends).
pub(super) struct HeldStrips(Arc<Entry>);

impl HeldStrips {
    /// The strips ([`strips`] hands out only entries whose strips are packed).
    pub(super) fn get(&self) -> Option<&Strips> {
        self.0.strips.get()
    }
}

static HELD: RwLock<Vec<Arc<Entry>>> = RwLock::new(Vec::new());
/// How many operands are held (read without the lock: products outside any scope pay one
/// atomic load).
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Held operands; released when dropped.
#[must_use = "the operands are held only while this lives"]
pub struct ConstantOperands {
    entries: Vec<Arc<Entry>>,
}

impl Drop for ConstantOperands {
    fn drop(&mut self) {
        let mut held = HELD.write();
        held.retain(|e| !self.entries.iter().any(|mine| Arc::ptr_eq(e, mine)));
        COUNT.store(held.len(), Ordering::Release);
    }
}

/// Holds the float tensors among `snapshots` constant until the returned guard is dropped;
/// products that take one of them as the wide right-hand operand reuse its packed form. Other
/// types and empty tensors are ignored.
pub fn hold_constant(snapshots: impl IntoIterator<Item = Snapshot>) -> ConstantOperands {
    let entries: Vec<Arc<Entry>> = snapshots
        .into_iter()
        .filter(|s| s.dtype() == DataType::Float && s.numel() > 0)
        .map(|s| {
            Arc::new(Entry {
                addr: s.as_ptr() as usize,
                len: s.numel(),
                _held: s,
                strips: OnceLock::new(),
            })
        })
        .collect();
    if !entries.is_empty() {
        let mut held = HELD.write();
        held.extend(entries.iter().cloned());
        COUNT.store(held.len(), Ordering::Release);
    }
    ConstantOperands { entries }
}

/// The column strips of `b` (`k x n`, row-major, tight) in strips of `width`, if `b` is a held
/// operand: packed on the first call, shared afterwards. `None` when it is not held, or its
/// strips were packed for another shape or width.
pub(super) fn strips(b: &[f32], k: usize, n: usize, width: usize) -> Option<HeldStrips> {
    if COUNT.load(Ordering::Acquire) == 0 || k * n != b.len() {
        return None;
    }
    let entry = {
        let held = HELD.read();
        held.iter()
            .find(|e| e.addr == b.as_ptr() as usize && e.len == b.len())
            .cloned()?
    };
    let strips = entry.strips.get_or_init(|| Strips::pack(b, k, n, width));
    (strips.k == k && strips.n == n && strips.width == width).then(|| HeldStrips(entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn weight(k: usize, n: usize) -> Tensor {
        let v: Vec<f32> = (0..k * n).map(|i| i as f32).collect();
        Tensor::from_vec(&[k, n], v).unwrap()
    }

    #[test]
    fn strips_hold_the_columns_in_order() {
        let s = Strips::pack(&(0..15).map(|i| i as f32).collect::<Vec<_>>(), 3, 5, 2);
        // Columns 0-1, 2-3, then 4 alone, each over rows 0..3.
        assert_eq!(
            s.data,
            [0., 1., 5., 6., 10., 11., 2., 3., 7., 8., 12., 13., 4., 9., 14.]
        );
        // SAFETY: offsets inside `data`.
        unsafe {
            assert_eq!(*s.at(2), 2.0);
            assert_eq!(*s.at(4).add(2), 14.0);
        }
    }

    #[test]
    fn only_held_operands_of_the_packed_shape_are_found_and_only_while_held() {
        let mut w = weight(4, 6);
        let other = weight(4, 6);
        {
            let _held = hold_constant([w.snapshot()]);
            let b = w.as_slice::<f32>().unwrap();
            assert!(strips(other.as_slice::<f32>().unwrap(), 4, 6, 2).is_none());
            assert!(
                strips(&b[..12], 2, 6, 2).is_none(),
                "a prefix is another operand"
            );
            let held = strips(b, 4, 6, 2).expect("held");
            let s = held.get().expect("packed when handed out");
            // SAFETY: column 2's strip is 4 x 2.
            assert_eq!(unsafe { *s.at(2).add(1) }, 3.0);
            assert!(strips(b, 4, 6, 4).is_none(), "packed for width 2 already");
            assert!(strips(b, 6, 4, 2).is_none(), "packed for 4 x 6 already");
        }
        assert!(strips(w.as_slice::<f32>().unwrap(), 4, 6, 2).is_none());
        // A write while held goes to a copy: the new data is not mistaken for the held one.
        let _held = hold_constant([w.snapshot()]);
        let before = w.as_slice::<f32>().unwrap().as_ptr();
        w.as_mut_slice::<f32>().unwrap()[0] = -1.0;
        let after = w.as_slice::<f32>().unwrap();
        assert_ne!(before, after.as_ptr());
        assert!(strips(after, 4, 6, 2).is_none());
    }

    #[test]
    fn products_on_a_held_operand_read_its_strips_and_give_the_same_bits() {
        // An LSTM step's dX = dY W.
        let (m, k, n) = (32, 1024, 256);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = Tensor::from_vec(&[k, n], w).unwrap();
        let b = w.as_slice::<f32>().unwrap();
        let mut plain = vec![0.0; m * n];
        crate::blas::sgemm(false, false, m, n, k, 1.0, &a, b, 0.0, &mut plain);
        let _held = hold_constant([w.snapshot()]);
        let mut held = vec![f32::NAN; m * n];
        crate::blas::sgemm(false, false, m, n, k, 1.0, &a, b, 0.0, &mut held);
        assert_eq!(plain, held);
        #[cfg(target_arch = "x86_64")]
        if super::super::small::applies(false, false, m, n, k).is_some() {
            let packed = HELD
                .read()
                .iter()
                .any(|e| e.addr == b.as_ptr() as usize && e.strips.get().is_some());
            assert!(packed, "the product did not cut the held weight in strips");
        }
    }
}
