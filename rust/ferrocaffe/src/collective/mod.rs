//! Collective operators (Caffe2's `CreateCommonWorld`, `Allreduce`, `Broadcast`, ... with
//! `engine="MPI"`, and its `MPI*` names), so that distributed nets stay serializable NetDefs.
//!
//! The engine is MPI, loaded at run time ([`mpi`]); building, importing and running nets
//! without these ops needs no MPI, and the ops fail with an error saying how to provide one.
//!
//! A *common world* is a blob holding an MPI communicator of its own (a duplicate of
//! `MPI_COMM_WORLD`, or of another world for `CloneCommonWorld`), its rank and size, and the
//! timeout of the ops that use it. Each collective is started non-blocking and polled until
//! its deadline (the op's `timeout_ms` argument, else the world's, else
//! `FERROCAFFE_MPI_TIMEOUT_MS`, else 30 s): a rank that died or never reaches the op makes the
//! others fail with an error naming the op, the world and the timeout, instead of hanging.
//! After a timeout the world is unusable (MPI cannot cancel a collective) and the buffers of
//! the pending operation are kept alive for good.
//!
//! Semantics (all ranks must call the same ops on a world in the same order, with tensors of
//! the same dtype and shape, as in Caffe2):
//! * `Allreduce`: `[world, X1..Xn] -> [Y1..Yn]`; every `Yi` is the sum of all `Xj` of all ranks
//!   (several inputs are summed locally first, as Caffe2's multi-device all-reduce).
//! * `Broadcast`: `[world, X1..Xn] -> [X1..Xn]` in place; root's `X1` (dtype, shape and values)
//!   ends up in every `Xi` on every rank.
//! * `Reduce`: `[world, X] -> [Y]`; on `root`, `Y` is the sum over ranks; on other ranks `Y`
//!   is left as it was.
//! * `Allgather`: `[world, X1..Xn] -> [Y]`; the inputs of rank 0, then rank 1, ..., stacked
//!   along the first dimension (a scalar counts as one row).
//! * `ReduceScatter`: `[world, X1..Xn] -> [Y1..Yn]`; each `Xi` is summed over ranks, split in
//!   `size` contiguous blocks (the first `numel % size` blocks one element longer), and rank
//!   `r` keeps block `r`; `Yi` has `Xi`'s shape, with zeros outside the rank's block.
//! * `Barrier`: `[world] -> []`.
//! * `SendTensor` / `ReceiveTensor`: point to point, `dst`/`src` and `tag` from arguments or
//!   from int inputs 2 and 3; with `raw_buffer` the receiver's tensor must already have the
//!   sender's dtype and size, otherwise the dtype and shape travel first.
//!
//! Dtypes: float32, float64, int32 and int64 for the reductions; any fixed-size type for
//! broadcast, gather and point to point. Tensors must be on the host: CUDA tensors need NCCL,
//! which is not implemented.

pub mod mpi;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::device::DeviceType;
use crate::error::{Error, Result};
use crate::ops::operator::{FnOp, OpContext, OpInit, Operator};
use crate::ops::registry::{Factory, Registry};
use crate::proto::OperatorDef;
use crate::tensor::{DataType, Snapshot, Tensor};
use crate::workspace::{Blob, OtherBlob};
use crate::{bail, dispatch, err};

/// Environment variable overriding the default timeout of collectives, in milliseconds.
pub const TIMEOUT_ENV: &str = "FERROCAFFE_MPI_TIMEOUT_MS";
/// The timeout of collectives when neither the op, the world nor the environment sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The engine name under which the generic op types are registered.
pub const ENGINE: &str = "MPI";

/// Most dims a tensor may have when its shape travels in a message header.
const MAX_HEADER_DIMS: usize = 32;
const HEADER_LEN: usize = MAX_HEADER_DIMS + 2;

#[derive(Debug, Clone)]
enum WorldState {
    Usable,
    Destroyed,
    Broken(String),
}

/// One common world: an MPI communicator, this process's rank in it, and its size.
#[derive(Debug)]
pub struct World {
    comm: i64,
    /// This process's rank.
    pub rank: i32,
    /// Number of processes.
    pub size: i32,
    /// Timeout of the ops on this world (when the op sets none).
    pub timeout: Duration,
    /// The blob name it was created as (for messages).
    pub name: String,
    state: Mutex<WorldState>,
}

impl World {
    fn state(&self) -> WorldState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_state(&self, s: WorldState) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn check_usable(&self, op: &str) -> Result<()> {
        match self.state() {
            WorldState::Usable => Ok(()),
            WorldState::Destroyed => bail!(
                Runtime: "{op}: common world '{}' was destroyed by DestroyCommonWorld",
                self.name
            ),
            WorldState::Broken(why) => bail!(
                Runtime: "{op}: common world '{}' cannot be used after an earlier failure: {why}",
                self.name
            ),
        }
    }
}

/// The value a common-world blob holds.
#[derive(Debug, Clone)]
pub struct CommonWorld(pub Arc<World>);

impl OtherBlob for CommonWorld {
    fn type_name(&self) -> &'static str {
        "std::shared_ptr<caffe2::MPICommonWorldWrapper>"
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The default timeout: `FERROCAFFE_MPI_TIMEOUT_MS` when set to a positive integer, else
/// [`DEFAULT_TIMEOUT`].
pub fn default_timeout() -> Result<Duration> {
    match std::env::var(TIMEOUT_ENV) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => bail!(
                InvalidArgument: "{TIMEOUT_ENV}={v}: expected a positive number of milliseconds"
            ),
        },
        _ => Ok(DEFAULT_TIMEOUT),
    }
}

fn timeout_arg(init: &OpInit<'_>) -> Result<Option<Duration>> {
    if !init.args.has("timeout_ms") {
        return Ok(None);
    }
    let ms = init.args.int("timeout_ms", 0)?;
    match u64::try_from(ms) {
        Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
        _ => bail!(
            op = init,
            BadArgument: "timeout_ms must be a positive number of milliseconds, got {ms}"
        ),
    }
}

/// What every collective reads from its definition.
#[derive(Clone)]
struct Common {
    op: String,
    timeout: Option<Duration>,
}

impl Common {
    fn new(init: &OpInit<'_>) -> Result<Self> {
        Ok(Common {
            op: format!("{} (engine MPI)", init.def.r#type()),
            timeout: timeout_arg(init)?,
        })
    }
}

fn world_of(ctx: &OpContext<'_>, c: &Common) -> Result<Arc<World>> {
    let blob = ctx.input_blob(0)?;
    let found = match blob {
        Blob::Other(o) => o
            .as_any()
            .downcast_ref::<CommonWorld>()
            .map(|w| w.0.clone()),
        _ => None,
    };
    let world = found.ok_or_else(|| {
        err!(
            Type: "{}: input 0 ('{}') must be a common world made by CreateCommonWorld with \
             engine MPI; it holds {}",
            c.op,
            ctx.input_name(0),
            blob.type_name()
        )
    })?;
    world.check_usable(&c.op)?;
    Ok(world)
}

/// Polls `req` to completion; on timeout or failure marks the world unusable, keeps `keep`
/// (the buffers MPI may still touch) alive for good and returns the error.
fn finish(
    mpi: &mpi::Mpi,
    c: &Common,
    world: &World,
    req: mpi::Request,
    keep: Vec<Snapshot>,
    extra_keep: Vec<Vec<u8>>,
) -> Result<mpi::Status> {
    let timeout = c.timeout.unwrap_or(world.timeout);
    let deadline = Instant::now() + timeout;
    match mpi.wait(req, deadline) {
        Ok(st) => Ok(st),
        Err(mpi::WaitError::TimedOut(req)) => {
            // MPI may still read or write these buffers: they are never freed.
            std::mem::forget(keep);
            std::mem::forget(extra_keep);
            // The request handle itself is plain data; MPI keeps the operation.
            let _ = req;
            let why = format!(
                "{} on common world '{}' timed out after {} ms (rank {} of {}): another rank \
                 did not take part in time (it may have died, or run different ops)",
                c.op,
                world.name,
                timeout.as_millis(),
                world.rank,
                world.size
            );
            world.set_state(WorldState::Broken(why.clone()));
            Err(Error::Runtime(why))
        }
        Err(mpi::WaitError::Failed(msg)) => {
            std::mem::forget(keep);
            std::mem::forget(extra_keep);
            let why = format!("{} on common world '{}': {msg}", c.op, world.name);
            world.set_state(WorldState::Broken(why.clone()));
            Err(Error::Runtime(why))
        }
    }
}

fn host_tensor<'t>(c: &Common, name: &str, t: &'t Tensor) -> Result<&'t Tensor> {
    if !t.is_host() {
        bail!(
            Device: "{}: tensor '{name}' is on {}; the MPI engine takes host (CPU) tensors \
             only: CUDA collectives need NCCL, which ferrocaffe does not implement yet",
            c.op,
            t.device()
        );
    }
    if t.dtype() == DataType::String {
        bail!(DtypeMismatch: "{}: tensor '{name}' holds strings, which MPI cannot send", c.op);
    }
    Ok(t)
}

fn host_tensor_mut<'t>(c: &Common, name: &str, t: &'t mut Tensor) -> Result<&'t mut Tensor> {
    host_tensor(c, name, t)?;
    Ok(t)
}

fn reduce_type(mpi: &mpi::Mpi, c: &Common, name: &str, dtype: DataType) -> Result<i64> {
    mpi.consts.datatype(dtype).ok_or_else(|| {
        err!(
            DtypeMismatch: "{}: tensor '{name}' has type {dtype}; reductions support float, \
             double, int32 and int64",
            c.op
        )
    })
}

/// Empties the outputs after a failure that left MPI owning their old buffers.
fn drop_outputs(ctx: &mut OpContext<'_>) {
    for j in 0..ctx.num_outputs() {
        if let Ok(b) = ctx.output_blob(j) {
            *b = Blob::Empty;
        }
    }
}

/// Runs `body`; after a failure that broke the world, empties the outputs.
fn guarded(
    c: Common,
    body: impl Fn(&mut OpContext<'_>, &Common, &Arc<World>, &'static mpi::Mpi) -> Result<()>
        + Send
        + 'static,
) -> Box<dyn Operator> {
    Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let world = world_of(ctx, &c)?;
        let mpi = mpi::get()?;
        let r = body(ctx, &c, &world, mpi);
        if r.is_err() && !matches!(world.state(), WorldState::Usable) {
            drop_outputs(ctx);
        }
        r
    }))
}

/// Checks that output `j` is input `j + 1` for every output, when `enforce`, and that the
/// counts pair up.
fn check_pairs(init: &OpInit<'_>, enforce: bool) -> Result<()> {
    let (ni, no) = (init.num_inputs(), init.num_outputs());
    if ni < 2 || no + 1 != ni {
        bail!(
            op = init,
            Schema: "expects a common world and n >= 1 tensors in, n tensors out; got {ni} \
             inputs and {no} outputs"
        );
    }
    if enforce {
        for j in 0..no {
            if init.def.input[j + 1] != init.def.output[j] {
                bail!(
                    op = init,
                    Schema: "input {} ('{}') and output {j} ('{}') must be the same blob",
                    j + 1,
                    init.def.input[j + 1],
                    init.def.output[j]
                );
            }
        }
    }
    Ok(())
}

// ---- common worlds ----------------------------------------------------------------------

fn create_world(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let c = Common::new(init)?;
    let size = init
        .args
        .has("size")
        .then(|| init.args.int("size", 0))
        .transpose()?;
    let rank = init
        .args
        .has("rank")
        .then(|| init.args.int("rank", 0))
        .transpose()?;
    let name = init.def.output.first().cloned().unwrap_or_default();
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let mpi = mpi::get().map_err(|e| err!(Runtime: "{}: {e}", c.op))?;
        let (r, s) = mpi.rank_size(mpi.comm_world())?;
        if let Some(size) = size {
            if size != i64::from(s) {
                bail!(
                    BadArgument: "{}: size={size} was given but MPI runs {s} processes (start \
                     the job with `mpiexec -n {size}`)",
                    c.op
                );
            }
        }
        if let Some(rank) = rank {
            if rank != i64::from(r) {
                bail!(
                    BadArgument: "{}: rank={rank} was given but MPI says this process is rank \
                     {r} of {s}",
                    c.op
                );
            }
        }
        let timeout = match c.timeout {
            Some(t) => t,
            None => default_timeout()?,
        };
        let parent = World {
            comm: mpi.comm_world(),
            rank: r,
            size: s,
            timeout,
            name: name.clone(),
            state: Mutex::new(WorldState::Usable),
        };
        let world = dup_world(mpi, &c, &parent, &name)?;
        *ctx.output_blob(0)? = Blob::Other(Box::new(CommonWorld(Arc::new(world))));
        Ok(())
    })))
}

/// A new world over a duplicate of `parent`'s communicator.
fn dup_world(mpi: &mpi::Mpi, c: &Common, parent: &World, name: &str) -> Result<World> {
    let (newcomm, req) = mpi.comm_idup(parent.comm)?;
    let keep_comm = newcomm;
    match finish(mpi, c, parent, req, Vec::new(), Vec::new()) {
        Ok(_) => {}
        Err(e) => {
            std::mem::forget(keep_comm);
            return Err(e);
        }
    }
    let comm = *keep_comm;
    let (rank, size) = mpi.rank_size(comm)?;
    Ok(World {
        comm,
        rank,
        size,
        timeout: c.timeout.unwrap_or(parent.timeout),
        name: name.to_string(),
        state: Mutex::new(WorldState::Usable),
    })
}

fn clone_world(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let c = Common::new(init)?;
    let name = init.def.output.first().cloned().unwrap_or_default();
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let parent = world_of(ctx, &c)?;
        let mpi = mpi::get()?;
        let world = dup_world(mpi, &c, &parent, &name)?;
        *ctx.output_blob(0)? = Blob::Other(Box::new(CommonWorld(Arc::new(world))));
        Ok(())
    })))
}

fn destroy_world(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let c = Common::new(init)?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let world = world_of(ctx, &c)?;
        let mpi = mpi::get()?;
        world.set_state(WorldState::Destroyed);
        mpi.comm_free(world.comm)
    })))
}

// ---- collectives --------------------------------------------------------------------------

fn sum_into(acc: &mut Tensor, x: &Tensor) -> Result<()> {
    dispatch!(acc.dtype(), [Float => f32, Double => f64, Int32 => i32, Int64 => i64], |T| {
        let xs = x.as_slice::<T>()?;
        for (a, v) in acc.as_mut_slice::<T>()?.iter_mut().zip(xs) {
            *a = a.wrapping_or_add(*v);
        }
        Ok(())
    })
}

/// Addition that wraps for integers (as MPI_SUM does in C) and is plain for floats.
trait WrapAdd: Copy {
    fn wrapping_or_add(self, o: Self) -> Self;
}
impl WrapAdd for f32 {
    fn wrapping_or_add(self, o: Self) -> Self {
        self + o
    }
}
impl WrapAdd for f64 {
    fn wrapping_or_add(self, o: Self) -> Self {
        self + o
    }
}
impl WrapAdd for i32 {
    fn wrapping_or_add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
}
impl WrapAdd for i64 {
    fn wrapping_or_add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
}

/// The tensors of inputs `1..`, checked to share dtype and shape (read through the outputs
/// for in-place inputs), copied when there are several.
fn same_inputs(ctx: &OpContext<'_>, c: &Common) -> Result<(DataType, Vec<usize>)> {
    let first = host_tensor(c, ctx.input_name(1), ctx.input(1)?)?;
    let (dtype, dims) = (first.dtype(), first.dims().to_vec());
    for i in 2..ctx.num_inputs() {
        let t = host_tensor(c, ctx.input_name(i), ctx.input(i)?)?;
        if t.dtype() != dtype || t.dims() != dims.as_slice() {
            bail!(
                ShapeMismatch: "{}: input {i} ('{}') is {} {:?} but input 1 ('{}') is {dtype} \
                 {dims:?}; all tensors must have the same type and shape",
                c.op,
                ctx.input_name(i),
                t.dtype(),
                t.dims(),
                ctx.input_name(1)
            );
        }
    }
    Ok((dtype, dims))
}

fn allreduce_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
) -> Result<()> {
    let (dtype, dims) = same_inputs(ctx, c)?;
    let dt = reduce_type(mpi, c, ctx.input_name(1), dtype)?;
    let n = ctx.num_inputs() - 1;
    let numel = ctx.input(1)?.numel();
    let cnt = mpi::count(numel, &c.op)?;
    if n == 1 && ctx.is_inplace(1, 0) {
        let y = ctx.output(0)?;
        let ptr = y.bytes_mut().as_mut_ptr();
        let keep = vec![y.snapshot()];
        // SAFETY: `ptr` holds `numel` elements of `dt`, kept alive by `keep` until done.
        let req = unsafe { mpi.iallreduce(None, ptr, cnt, dt, world.comm)? };
        finish(mpi, c, world, req, keep, Vec::new())?;
        return Ok(());
    }
    if n == 1 {
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(1)?;
        let y = outs.tensor(0)?;
        y.try_reset(dtype, &dims)?;
        let recv = y.bytes_mut().as_mut_ptr();
        let send = x.bytes().as_ptr();
        let keep = vec![x.snapshot(), y.snapshot()];
        // SAFETY: both hold `numel` elements, kept alive by `keep` until done.
        let req = unsafe { mpi.iallreduce(Some(send), recv, cnt, dt, world.comm)? };
        finish(mpi, c, world, req, keep, Vec::new())?;
        return Ok(());
    }
    // Several inputs: their local sum is all-reduced, then copied to every output.
    let mut acc = ctx.input(1)?.deep_copy();
    for i in 2..ctx.num_inputs() {
        sum_into(&mut acc, ctx.input(i)?)?;
    }
    let ptr = acc.bytes_mut().as_mut_ptr();
    let keep = vec![acc.snapshot()];
    // SAFETY: `acc` holds `numel` elements, kept alive by `keep` until done.
    let req = unsafe { mpi.iallreduce(None, ptr, cnt, dt, world.comm)? };
    finish(mpi, c, world, req, keep, Vec::new())?;
    for j in 0..ctx.num_outputs() {
        ctx.output(j)?.copy_from(&acc);
    }
    Ok(())
}

fn broadcast_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
    root: i32,
) -> Result<()> {
    if root < 0 || root >= world.size {
        bail!(BadArgument: "{}: root {root} is not a rank of a world of size {}", c.op, world.size);
    }
    let name0 = ctx.output_name(0).to_string();
    let mut header = Box::new([0i64; HEADER_LEN]);
    if world.rank == root {
        *header = encode_header(c, host_tensor(c, &name0, ctx.output(0)?)?)?;
    }
    let hbytes = mpi::count(HEADER_LEN * 8, &c.op)?;
    // SAFETY: the boxed header holds HEADER_LEN i64s and is leaked on failure.
    let req = unsafe {
        mpi.ibcast(
            header.as_mut_ptr().cast(),
            hbytes,
            mpi.consts.byte(),
            root,
            world.comm,
        )?
    };
    if let Err(e) = finish(mpi, c, world, req, Vec::new(), Vec::new()) {
        std::mem::forget(header);
        return Err(e);
    }
    let (dtype, dims) = decode_header(c, &header)?;
    let y = ctx.output(0)?;
    if world.rank != root {
        y.try_reset(dtype, &dims)?;
    }
    let nbytes = mpi::count(y.numel().saturating_mul(dtype.item_size()), &c.op)?;
    let ptr = y.bytes_mut().as_mut_ptr();
    let keep = vec![y.snapshot()];
    // SAFETY: `ptr` holds `nbytes` bytes, kept alive by `keep` until done.
    let req = unsafe { mpi.ibcast(ptr, nbytes, mpi.consts.byte(), root, world.comm)? };
    finish(mpi, c, world, req, keep, Vec::new())?;
    let first = ctx.output(0)?.alias();
    for j in 1..ctx.num_outputs() {
        ctx.output(j)?.copy_from(&first);
    }
    Ok(())
}

fn encode_header(c: &Common, x: &Tensor) -> Result<[i64; HEADER_LEN]> {
    let mut h = [0i64; HEADER_LEN];
    if x.ndim() > MAX_HEADER_DIMS {
        bail!(
            ShapeMismatch: "{}: tensors of at most {MAX_HEADER_DIMS} dimensions can be sent \
             with their shape, got {}",
            c.op,
            x.ndim()
        );
    }
    h[0] = i64::from(x.dtype().to_proto());
    h[1] = x.ndim() as i64;
    for (k, &d) in x.dims().iter().enumerate() {
        h[2 + k] = i64::try_from(d).map_err(|_| err!(ShapeMismatch: "dimension {d} too large"))?;
    }
    Ok(h)
}

fn decode_header(c: &Common, h: &[i64; HEADER_LEN]) -> Result<(DataType, Vec<usize>)> {
    let bad = || err!(Runtime: "{}: received a malformed tensor header {:?}", c.op, &h[..2]);
    let dtype = DataType::from_proto(h[0]).map_err(|_| bad())?;
    let ndim = usize::try_from(h[1]).map_err(|_| bad())?;
    if ndim > MAX_HEADER_DIMS || dtype == DataType::String {
        return Err(bad());
    }
    let dims = h[2..2 + ndim]
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad()))
        .collect::<Result<Vec<usize>>>()?;
    Ok((dtype, dims))
}

fn reduce_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
    root: i32,
) -> Result<()> {
    if root < 0 || root >= world.size {
        bail!(BadArgument: "{}: root {root} is not a rank of a world of size {}", c.op, world.size);
    }
    let (dtype, dims) = same_inputs(ctx, c)?;
    let dt = reduce_type(mpi, c, ctx.input_name(1), dtype)?;
    let numel = ctx.input(1)?.numel();
    let cnt = mpi::count(numel, &c.op)?;
    let is_root = world.rank == root;
    let req;
    let keep;
    if ctx.is_inplace(1, 0) {
        let y = ctx.output(0)?;
        if is_root {
            let ptr = y.bytes_mut().as_mut_ptr();
            keep = vec![y.snapshot()];
            // SAFETY: `ptr` holds `numel` elements, kept alive until done.
            req = unsafe { mpi.ireduce(None, ptr, cnt, dt, root, world.comm)? };
        } else {
            let send = y.bytes().as_ptr();
            keep = vec![y.snapshot()];
            // SAFETY: as above; the receive buffer is not used off the root.
            req = unsafe {
                mpi.ireduce(Some(send), std::ptr::null_mut(), cnt, dt, root, world.comm)?
            };
        }
    } else {
        let (ins, mut outs) = ctx.split();
        let x = ins.tensor(1)?;
        let send = x.bytes().as_ptr();
        if is_root {
            let y = outs.tensor(0)?;
            y.try_reset(dtype, &dims)?;
            let recv = y.bytes_mut().as_mut_ptr();
            keep = vec![x.snapshot(), y.snapshot()];
            // SAFETY: both hold `numel` elements, kept alive until done.
            req = unsafe { mpi.ireduce(Some(send), recv, cnt, dt, root, world.comm)? };
        } else {
            keep = vec![x.snapshot()];
            // SAFETY: as above.
            req = unsafe {
                mpi.ireduce(Some(send), std::ptr::null_mut(), cnt, dt, root, world.comm)?
            };
        }
    }
    finish(mpi, c, world, req, keep, Vec::new())?;
    Ok(())
}

fn allgather_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
) -> Result<()> {
    let (dtype, dims) = same_inputs(ctx, c)?;
    let n = ctx.num_inputs() - 1;
    let rows = dims.first().copied().unwrap_or(1);
    let per_row: usize = dims.iter().skip(1).product();
    let size = usize::try_from(world.size).unwrap_or(1);
    let mut out_dims = dims.clone();
    let total_rows = rows
        .checked_mul(n)
        .and_then(|r| r.checked_mul(size))
        .ok_or_else(|| err!(ShapeMismatch: "{}: the gathered tensor is too large", c.op))?;
    if out_dims.is_empty() {
        out_dims.push(total_rows);
    } else {
        out_dims[0] = total_rows;
    }
    let item = dtype.item_size();
    let mine = rows
        .saturating_mul(per_row)
        .saturating_mul(item)
        .saturating_mul(n);
    let cnt = mpi::count(mine, &c.op)?;
    mpi::count(mine.saturating_mul(size), &c.op)?;
    // This rank's contribution: its inputs, in order, as one buffer.
    let mut send = Vec::with_capacity(mine);
    for i in 1..ctx.num_inputs() {
        send.extend_from_slice(ctx.input(i)?.bytes());
    }
    let y = ctx.output(0)?;
    y.try_reset(dtype, &out_dims)?;
    let recv = y.bytes_mut().as_mut_ptr();
    let keep = vec![y.snapshot()];
    // SAFETY: `send` holds `mine` bytes, `recv` `mine * size`; kept alive until done.
    let req = unsafe { mpi.iallgather(send.as_ptr(), recv, cnt, mpi.consts.byte(), world.comm)? };
    finish(mpi, c, world, req, keep, vec![send])?;
    Ok(())
}

/// Elements of each rank's block when `n` elements are split over `size` ranks.
pub fn block_counts(n: usize, size: usize) -> Vec<usize> {
    if size == 0 {
        return Vec::new();
    }
    (0..size)
        .map(|r| n / size + usize::from(r < n % size))
        .collect()
}

fn reduce_scatter_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
) -> Result<()> {
    let (dtype, dims) = same_inputs(ctx, c)?;
    let dt = reduce_type(mpi, c, ctx.input_name(1), dtype)?;
    let size = usize::try_from(world.size).unwrap_or(1);
    let rank = usize::try_from(world.rank).unwrap_or(0);
    let item = dtype.item_size();
    for i in 1..ctx.num_inputs() {
        let x = ctx.input(i)?.deep_copy();
        let counts = block_counts(x.numel(), size);
        let counts_c = counts
            .iter()
            .map(|&k| mpi::count(k, &c.op))
            .collect::<Result<Vec<_>>>()?;
        let start: usize = counts[..rank].iter().sum();
        let mine = counts[rank];
        let mut recv = vec![0u8; mine * item];
        let keep = vec![x.snapshot()];
        // SAFETY: `x` holds the sum of `counts`, `recv` this rank's; `counts_c` one per rank;
        // all kept alive until done.
        let req = unsafe {
            mpi.ireduce_scatter(
                x.bytes().as_ptr(),
                recv.as_mut_ptr(),
                counts_c.as_ptr(),
                dt,
                world.comm,
            )?
        };
        if let Err(e) = finish(mpi, c, world, req, keep, Vec::new()) {
            std::mem::forget(recv);
            std::mem::forget(counts_c);
            return Err(e);
        }
        let y = ctx.output(i - 1)?;
        y.try_reset(dtype, &dims)?;
        let out = y.bytes_mut();
        out.fill(0);
        out[start * item..(start + mine) * item].copy_from_slice(&recv);
    }
    Ok(())
}

fn barrier_run(
    _ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
) -> Result<()> {
    let req = mpi.ibarrier(world.comm)?;
    finish(mpi, c, world, req, Vec::new(), Vec::new())?;
    Ok(())
}

// ---- point to point -----------------------------------------------------------------------

#[derive(Clone, Copy)]
struct P2p {
    peer: Option<i32>,
    tag: Option<i32>,
    raw: bool,
}

fn int_arg(init: &OpInit<'_>, name: &str) -> Result<Option<i32>> {
    if !init.args.has(name) {
        return Ok(None);
    }
    let v = init.args.int(name, 0)?;
    let v = i32::try_from(v)
        .map_err(|_| err!(op = init, BadArgument: "{name}={v} does not fit an MPI int"))?;
    Ok((v >= 0).then_some(v))
}

fn p2p_args(init: &OpInit<'_>, peer: &str) -> Result<P2p> {
    Ok(P2p {
        peer: int_arg(init, peer)?,
        tag: int_arg(init, "tag")?,
        raw: init.args.bool("raw_buffer", false)?,
    })
}

/// `(peer, tag)` from inputs 2 and 3 when given, else from the arguments.
fn peer_and_tag(ctx: &OpContext<'_>, c: &Common, p: &P2p) -> Result<(Option<i32>, Option<i32>)> {
    if ctx.num_inputs() < 4 {
        return Ok((p.peer, p.tag));
    }
    let read = |i: usize| -> Result<Option<i32>> {
        let v = ctx.input(i)?.to_i64_vec()?;
        match v.as_slice() {
            [x] => {
                let x = i32::try_from(*x).map_err(|_| {
                    err!(BadArgument: "{}: input {i} ('{}') = {x} does not fit an MPI int", c.op,
                        ctx.input_name(i))
                })?;
                Ok((x >= 0).then_some(x))
            }
            _ => bail!(
                ShapeMismatch: "{}: input {i} ('{}') must hold one integer",
                c.op,
                ctx.input_name(i)
            ),
        }
    };
    Ok((read(2)?, read(3)?))
}

fn send_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
    p: P2p,
) -> Result<()> {
    let (dst, tag) = peer_and_tag(ctx, c, &p)?;
    let dst = dst.ok_or_else(
        || err!(BadArgument: "{}: no destination rank (argument 'dst' or input 2)", c.op),
    )?;
    if dst >= world.size {
        bail!(BadArgument: "{}: dst {dst} is not a rank of a world of size {}", c.op, world.size);
    }
    let tag = tag.unwrap_or(0);
    let x = host_tensor(c, ctx.input_name(1), ctx.input(1)?)?;
    let byte = mpi.consts.byte();
    if !p.raw {
        let header = Box::new(encode_header(c, x)?);
        let hcnt = mpi::count(HEADER_LEN * 8, &c.op)?;
        // SAFETY: the boxed header lives until done (leaked on failure).
        let req = unsafe { mpi.isend(header.as_ptr().cast(), hcnt, byte, dst, tag, world.comm)? };
        if let Err(e) = finish(mpi, c, world, req, Vec::new(), Vec::new()) {
            std::mem::forget(header);
            return Err(e);
        }
    }
    let cnt = mpi::count(x.bytes().len(), &c.op)?;
    let keep = vec![x.snapshot()];
    // SAFETY: the tensor's bytes, kept alive until done.
    let req = unsafe { mpi.isend(x.bytes().as_ptr(), cnt, byte, dst, tag, world.comm)? };
    finish(mpi, c, world, req, keep, Vec::new())?;
    Ok(())
}

fn receive_run(
    ctx: &mut OpContext<'_>,
    c: &Common,
    world: &Arc<World>,
    mpi: &'static mpi::Mpi,
    p: P2p,
) -> Result<()> {
    let (src, tag) = peer_and_tag(ctx, c, &p)?;
    if let Some(s) = src {
        if s >= world.size {
            bail!(BadArgument: "{}: src {s} is not a rank of a world of size {}", c.op, world.size);
        }
    }
    let mut src = src.unwrap_or(mpi.consts.any_source);
    let mut tag = tag.unwrap_or(mpi.consts.any_tag);
    let byte = mpi.consts.byte();
    if !p.raw {
        let mut header = Box::new([0i64; HEADER_LEN]);
        let hcnt = mpi::count(HEADER_LEN * 8, &c.op)?;
        // SAFETY: the boxed header lives until done (leaked on failure).
        let req =
            unsafe { mpi.irecv(header.as_mut_ptr().cast(), hcnt, byte, src, tag, world.comm)? };
        let st = match finish(mpi, c, world, req, Vec::new(), Vec::new()) {
            Ok(st) => st,
            Err(e) => {
                std::mem::forget(header);
                return Err(e);
            }
        };
        let got = mpi.get_count(&st, byte)?;
        if got != HEADER_LEN * 8 {
            bail!(
                Runtime: "{}: expected a tensor header from rank {} but got {got} bytes (was \
                 the tensor sent with raw_buffer?)",
                c.op,
                st.source
            );
        }
        let (dtype, dims) = decode_header(c, &header)?;
        ctx.output(0)?.try_reset(dtype, &dims)?;
        src = st.source;
        tag = st.tag;
    }
    let name0 = ctx.output_name(0).to_string();
    let y2 = host_tensor_mut(c, &name0, ctx.output(0)?)?;
    let want = y2.bytes().len();
    let cnt = mpi::count(want, &c.op)?;
    let ptr = y2.bytes_mut().as_mut_ptr();
    let keep = vec![y2.snapshot()];
    // SAFETY: the output's bytes, kept alive until done.
    let req = unsafe { mpi.irecv(ptr, cnt, byte, src, tag, world.comm)? };
    let st = finish(mpi, c, world, req, keep, Vec::new())?;
    let got = mpi.get_count(&st, byte)?;
    if got != want {
        bail!(
            ShapeMismatch: "{}: received {got} bytes from rank {} into '{}', which holds {want} \
             bytes (with raw_buffer the receiving tensor must match the sent one)",
            c.op,
            st.source,
            ctx.output_name(0)
        );
    }
    *ctx.output(1)? = Tensor::scalar(st.source);
    *ctx.output(2)? = Tensor::scalar(st.tag);
    Ok(())
}

// ---- registration -------------------------------------------------------------------------

fn root_arg(init: &OpInit<'_>) -> Result<i32> {
    let r = init.args.int("root", 0)?;
    i32::try_from(r).map_err(|_| err!(op = init, BadArgument: "root={r} does not fit an MPI int"))
}

fn create_allreduce(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    check_pairs(init, false)?;
    Ok(guarded(Common::new(init)?, allreduce_run))
}

fn create_reduce_scatter(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    check_pairs(init, false)?;
    Ok(guarded(Common::new(init)?, reduce_scatter_run))
}

fn create_allgather(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(guarded(Common::new(init)?, allgather_run))
}

fn create_barrier(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    Ok(guarded(Common::new(init)?, barrier_run))
}

fn create_broadcast(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    check_pairs(init, true)?;
    let c = Common::new(init)?;
    let root = root_arg(init)?;
    Ok(guarded(c, move |ctx, c, world, mpi| {
        broadcast_run(ctx, c, world, mpi, root)
    }))
}

fn create_reduce(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let c = Common::new(init)?;
    let root = root_arg(init)?;
    Ok(guarded(c, move |ctx, c, world, mpi| {
        reduce_run(ctx, c, world, mpi, root)
    }))
}

fn create_send(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let c = Common::new(init)?;
    let p = p2p_args(init, "dst")?;
    Ok(Box::new(FnOp(move |ctx: &mut OpContext<'_>| {
        let world = world_of(ctx, &c)?;
        let mpi = mpi::get()?;
        send_run(ctx, &c, &world, mpi, p)
    })))
}

fn create_receive(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let c = Common::new(init)?;
    let p = p2p_args(init, "src")?;
    Ok(guarded(c, move |ctx, c, world, mpi| {
        receive_run(ctx, c, world, mpi, p)
    }))
}

fn no_engine(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    let engine = init.def.engine();
    bail!(
        op = init,
        NotImplemented: "{} needs a communication engine: ferrocaffe implements engine='MPI' \
         (requested: '{engine}'; GLOO is not available)",
        init.def.r#type()
    )
}

fn on_cuda(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
    bail!(
        op = init,
        Device: "{} on CUDA: the MPI engine takes host (CPU) tensors only; CUDA collectives \
         need NCCL, which ferrocaffe does not implement yet (run the op with a CPU device \
         option)",
        init.def.r#type()
    )
}

/// `(generic name, Caffe2's MPI name, factory)` of every op.
const OPS: [(&str, Option<&str>, Factory); 10] = [
    (
        "CreateCommonWorld",
        Some("MPICreateCommonWorld"),
        create_world,
    ),
    ("CloneCommonWorld", None, clone_world),
    ("DestroyCommonWorld", None, destroy_world),
    ("Allreduce", Some("MPIAllreduce"), create_allreduce),
    ("Broadcast", Some("MPIBroadcast"), create_broadcast),
    ("Reduce", Some("MPIReduce"), create_reduce),
    ("Allgather", Some("MPIAllgather"), create_allgather),
    (
        "ReduceScatter",
        Some("MPIReduceScatter"),
        create_reduce_scatter,
    ),
    ("Barrier", None, create_barrier),
    ("SendTensor", Some("MPISendTensor"), create_send),
];

/// Registers the collective ops: generic names with engine `MPI` (any other engine gets an
/// error naming the one available), `MPI*` names on the default engine, and an error for
/// every type on CUDA.
pub fn register(r: &mut Registry) {
    let mut all: Vec<(&str, Option<&str>, Factory)> = OPS.to_vec();
    all.push(("ReceiveTensor", Some("MPIReceiveTensor"), create_receive));
    for (generic, mpi_name, f) in all {
        r.register(generic, DeviceType::Cpu, ENGINE, f);
        r.register(generic, DeviceType::Cpu, "", no_engine);
        r.register(generic, DeviceType::Cuda, "", on_cuda);
        if let Some(m) = mpi_name {
            r.register(m, DeviceType::Cpu, "", f);
            r.register(m, DeviceType::Cuda, "", on_cuda);
        }
    }
}

/// Whether `def` is one of the collective ops (generic or `MPI*` name).
pub fn is_collective(def: &OperatorDef) -> bool {
    let t = def.r#type();
    t == "ReceiveTensor"
        || t == "MPIReceiveTensor"
        || OPS.iter().any(|(g, m, _)| *g == t || *m == Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Argument, OperatorDef};
    use crate::workspace::Workspace;

    fn op(t: &str, ins: &[&str], outs: &[&str], engine: &str) -> OperatorDef {
        let mut d = OperatorDef::new(t, ins.iter().copied(), outs.iter().copied());
        if !engine.is_empty() {
            d.engine = Some(engine.into());
        }
        d
    }

    #[test]
    fn blocks_cover_every_element_once() {
        assert_eq!(block_counts(10, 3), vec![4, 3, 3]);
        assert_eq!(block_counts(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(block_counts(0, 2), vec![0, 0]);
        assert!(block_counts(5, 0).is_empty());
        for n in 0..20 {
            for s in 1..6 {
                assert_eq!(block_counts(n, s).iter().sum::<usize>(), n);
            }
        }
    }

    #[test]
    fn headers_round_trip_and_reject_garbage() {
        let c = Common {
            op: "X".into(),
            timeout: None,
        };
        let t = Tensor::from_vec(&[2, 3], vec![0i64; 6]).unwrap();
        let h = encode_header(&c, &t).unwrap();
        assert_eq!(
            decode_header(&c, &h).unwrap(),
            (DataType::Int64, vec![2, 3])
        );
        let mut bad = h;
        bad[1] = 99;
        assert!(decode_header(&c, &bad).is_err());
        bad[1] = -1;
        assert!(decode_header(&c, &bad).is_err());
    }

    #[test]
    fn ops_without_the_mpi_engine_or_on_cuda_say_so() {
        let ws = Workspace::new();
        ws.feed("cw", Tensor::scalar(1.0f32));
        ws.feed("x", Tensor::scalar(1.0f32));
        let e = ws
            .run_operator_once(&op("Allreduce", &["cw", "x"], &["x"], ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("engine='MPI'"), "{e}");
        let e = ws
            .run_operator_once(&op("Allreduce", &["cw", "x"], &["x"], "GLOO"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'GLOO'"), "{e}");
        let mut d = op("Allreduce", &["cw", "x"], &["x"], "MPI");
        d.device_option = Some(crate::proto::DeviceOption {
            device_type: Some(1),
            ..Default::default()
        });
        let e = ws.run_operator_once(&d).unwrap_err().to_string();
        assert!(e.contains("NCCL"), "{e}");
    }

    #[test]
    fn collectives_need_a_common_world_blob() {
        let ws = Workspace::new();
        ws.feed("cw", Tensor::scalar(1.0f32));
        ws.feed("x", Tensor::scalar(1.0f32));
        let e = ws
            .run_operator_once(&op("Allreduce", &["cw", "x"], &["x"], "MPI"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a common world"), "{e}");
        let e = ws
            .run_operator_once(&op("MPIAllreduce", &["cw", "x"], &["x"], ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a common world"), "{e}");
    }

    #[test]
    fn bad_arguments_are_refused_at_creation() {
        let ws = Workspace::new();
        ws.feed("cw", Tensor::scalar(1.0f32));
        ws.feed("a", Tensor::scalar(1.0f32));
        ws.feed("b", Tensor::scalar(1.0f32));
        ws.feed("x", Tensor::scalar(1.0f32));
        let mut d = op("CreateCommonWorld", &[], &["cw"], "MPI");
        d.arg.push(Argument::int("timeout_ms", -5));
        let e = ws.run_operator_once(&d).unwrap_err().to_string();
        assert!(e.contains("timeout_ms must be a positive"), "{e}");
        let e = ws
            .run_operator_once(&op("Broadcast", &["cw", "x"], &["y"], "MPI"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("same blob"), "{e}");
        let e = ws
            .run_operator_once(&op("Allreduce", &["cw", "a", "b"], &["a"], "MPI"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2 outputs") || e.contains("n tensors out"),
            "{e}"
        );
    }

    #[test]
    fn every_op_has_a_schema() {
        for (g, m, _) in OPS {
            assert!(crate::schema::lookup(g).is_some(), "{g}");
            if let Some(m) = m {
                assert!(crate::schema::lookup(m).is_some(), "{m}");
            }
        }
        assert!(crate::schema::lookup("MPIReceiveTensor").is_some());
        assert!(is_collective(&op("MPIReduce", &[], &[], "")));
        assert!(!is_collective(&op("Relu", &[], &[], "")));
    }
}
