//! Blob queues: CreateBlobsQueue, EnqueueBlobs / SafeEnqueueBlobs, DequeueBlobs /
//! SafeDequeueBlobs, CloseBlobsQueue. A queue holds up to `capacity` entries of `num_blobs`
//! tensors; enqueue blocks while full and dequeue while empty, until the queue is closed.
//! The ops lock no blobs while they wait (the queue has its own lock).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use crate::error::Result;
use crate::ops::operator::{OpContext, OpInit, Operator};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;
use crate::workspace::{Blob, BlobHandle, OtherBlob};
use crate::{bail, err};

/// Registers the family.
pub fn register(r: &mut Registry) {
    r.cpu("CreateBlobsQueue", create);
    r.cpu("EnqueueBlobs", |_| {
        Ok(Box::new(QueueOp {
            kind: Kind::Enqueue,
            safe: false,
        }))
    });
    r.cpu("SafeEnqueueBlobs", |_| {
        Ok(Box::new(QueueOp {
            kind: Kind::Enqueue,
            safe: true,
        }))
    });
    r.cpu("DequeueBlobs", |_| {
        Ok(Box::new(QueueOp {
            kind: Kind::Dequeue,
            safe: false,
        }))
    });
    r.cpu("SafeDequeueBlobs", |_| {
        Ok(Box::new(QueueOp {
            kind: Kind::Dequeue,
            safe: true,
        }))
    });
    r.cpu("CloseBlobsQueue", |_| {
        Ok(Box::new(QueueOp {
            kind: Kind::Close,
            safe: false,
        }))
    });
}

struct State {
    items: VecDeque<Vec<Tensor>>,
    closed: bool,
}

/// A bounded queue of tensor tuples.
pub struct BlobsQueue {
    capacity: usize,
    num_blobs: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl OtherBlob for Arc<BlobsQueue> {
    fn type_name(&self) -> &'static str {
        "std::shared_ptr<caffe2::BlobsQueue>"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl BlobsQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an entry, waiting while full; false when the queue is closed.
    pub fn push(&self, item: Vec<Tensor>) -> bool {
        let mut st = self.lock();
        while st.items.len() >= self.capacity && !st.closed {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.closed {
            return false;
        }
        st.items.push_back(item);
        self.cv.notify_all();
        true
    }

    /// Takes an entry, waiting while empty; None when closed and drained.
    pub fn pop(&self) -> Option<Vec<Tensor>> {
        let mut st = self.lock();
        loop {
            if let Some(v) = st.items.pop_front() {
                self.cv.notify_all();
                return Some(v);
            }
            if st.closed {
                return None;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Closes the queue, waking every waiter.
    pub fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }
}

fn create(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let capacity = init.args.usize("capacity", 1)?.max(1);
    let num_blobs = init.args.usize("num_blobs", 1)?;
    Ok(Box::new(crate::ops::operator::FnOp(
        move |ctx: &mut OpContext<'_>| {
            let q = Arc::new(BlobsQueue {
                capacity,
                num_blobs,
                state: Mutex::new(State {
                    items: VecDeque::new(),
                    closed: false,
                }),
                cv: Condvar::new(),
            });
            *ctx.output_blob(0)? = Blob::Other(Box::new(q));
            Ok(())
        },
    )))
}

fn queue_of(h: &BlobHandle) -> Result<Arc<BlobsQueue>> {
    match &*h.read() {
        Blob::Other(o) => o
            .as_any()
            .downcast_ref::<Arc<BlobsQueue>>()
            .cloned()
            .ok_or_else(|| err!(DtypeMismatch: "expected a BlobsQueue, found {}", o.type_name())),
        other => Err(err!(DtypeMismatch: "expected a BlobsQueue, found {}", other.type_name())),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Enqueue,
    Dequeue,
    Close,
}

struct QueueOp {
    kind: Kind,
    safe: bool,
}

impl Operator for QueueOp {
    fn run(&mut self, ctx: &mut OpContext<'_>) -> Result<()> {
        let q = queue_of(ctx.input_handle(0))?;
        match self.kind {
            Kind::Close => {
                q.close();
                Ok(())
            }
            Kind::Enqueue => {
                let n = ctx.num_inputs() - 1;
                if n != q.num_blobs {
                    bail!(Schema: "the queue holds {} blobs, {n} given", q.num_blobs);
                }
                let mut item = Vec::with_capacity(n);
                for i in 1..=n {
                    let h = ctx.input_handle(i).clone();
                    let t = match &*h.read() {
                        Blob::Tensor(t) => t.clone(),
                        other => {
                            bail!(
                                DtypeMismatch: "cannot enqueue a blob holding {}",
                                other.type_name()
                            )
                        }
                    };
                    item.push(t);
                }
                let ok = q.push(item);
                if self.safe {
                    let st = ctx.output_handle(ctx.num_outputs() - 1).clone();
                    *st.write() = Blob::Tensor(Tensor::scalar(!ok));
                    return Ok(());
                }
                if ok {
                    Ok(())
                } else {
                    Err(err!(Runtime: "the queue is closed"))
                }
            }
            Kind::Dequeue => {
                let n = if self.safe {
                    ctx.num_outputs() - 1
                } else {
                    ctx.num_outputs()
                };
                let got = q.pop();
                if self.safe {
                    let st = ctx.output_handle(n).clone();
                    *st.write() = Blob::Tensor(Tensor::scalar(got.is_none()));
                }
                let Some(item) = got else {
                    return if self.safe {
                        Ok(())
                    } else {
                        Err(err!(Runtime: "the queue is closed and empty"))
                    };
                };
                if item.len() != n {
                    bail!(Schema: "the queue holds {} blobs, {n} outputs given", item.len());
                }
                for (j, t) in item.into_iter().enumerate() {
                    *ctx.output_handle(j).write() = Blob::Tensor(t);
                }
                Ok(())
            }
        }
    }

    fn locks_blobs(&self) -> bool {
        false
    }
}
