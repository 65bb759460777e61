//! Workspaces: named blobs and created nets, with an optional parent.
//!
//! # Locking
//!
//! * Each blob is a [`BlobHandle`] = `Arc<RwLock<Blob>>`. Operators resolve their handles once,
//!   when they are instantiated; while an op runs, the net holds read locks on its inputs and
//!   write locks on its outputs (taken in address order, so concurrent ops cannot deadlock).
//!   A blob can therefore be fed, fetched or written by several threads safely; two nets that
//!   write the same blob concurrently are serialized op by op (their interleaving is up to the
//!   caller, as in Caffe2).
//! * The name → handle map is behind its own `RwLock`, taken only to create, look up, list or
//!   remove blobs (never while a kernel runs).
//! * Created nets live in a map of `Arc<Mutex<dyn CreatedNet>>` (the executors, in
//!   [`crate::net`], are a layer above): one net runs on one thread at a time, and
//!   different nets run in parallel (the Python binding releases the GIL around every run).
//!
//! Lookups fall through to the parent workspace (and to blobs forwarded from another workspace
//! under another name, as `Do` binds them); creation stays local unless the name is visible.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::ops::registry::Registry;
use crate::tensor::Tensor;

/// A net instantiated in a workspace. The executors live above this layer ([`crate::net`]);
/// the workspace keeps created nets through this trait so that it does not depend on them.
pub trait CreatedNet: Send {
    /// The net's name.
    fn name(&self) -> &str;
    /// Runs every op of the net once.
    fn run(&mut self) -> Result<()>;
}

/// A created net, shared: one run at a time.
pub type SharedNet = Arc<Mutex<dyn CreatedNet>>;

/// A shared, lockable blob.
pub type BlobHandle = Arc<RwLock<Blob>>;

/// A stack of child workspaces kept in a blob: the scopes of `Do` (forward pushes, gradient
/// pops) and the per-timestep workspaces of recurrent networks.
#[derive(Default)]
pub struct WorkspaceStack {
    /// The workspaces, oldest first.
    pub workspaces: Vec<Arc<Workspace>>,
    /// Index one past the current top (gradient ops walk it back down).
    pub top: usize,
}

impl WorkspaceStack {
    /// Whether no workspace has been pushed (or all have been popped).
    pub fn is_empty(&self) -> bool {
        self.top == 0
    }
}

/// A value of another kind kept in a blob ([`Blob::Other`]).
pub trait OtherBlob: std::any::Any + Send + Sync {
    /// The C++ type name Caffe2 reported for such a blob (e.g.
    /// `std::shared_ptr<caffe2::BlobsQueue>`), used in messages and by `FetchBlob`.
    fn type_name(&self) -> &'static str;
    /// For downcasting to the concrete type.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What a blob holds.
#[derive(Default)]
pub enum Blob {
    /// Nothing (a created or freed blob).
    #[default]
    Empty,
    /// A tensor.
    Tensor(Tensor),
    /// A byte string (Caffe2's `std::string` blobs).
    Bytes(Vec<u8>),
    /// Child workspaces (scopes, RNN step workspaces).
    Workspaces(Arc<Mutex<WorkspaceStack>>),
    /// A mutex (`CreateMutex`).
    Mutex(Arc<Mutex<()>>),
    /// An atomic bool (`CreateAtomicBool`).
    AtomicBool(Arc<AtomicBool>),
    /// A counter (`CreateCounter`).
    Counter(Arc<AtomicI64>),
    /// Anything else (queues, RNN scratch state, ...).
    Other(Box<dyn OtherBlob>),
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blob::Tensor(t) => write!(f, "{t:?}"),
            other => f.write_str(other.type_name()),
        }
    }
}

impl Blob {
    /// A short name of what the blob holds (for messages).
    pub fn type_name(&self) -> &'static str {
        match self {
            Blob::Empty => "nothing",
            Blob::Tensor(_) => "Tensor",
            Blob::Bytes(_) => "std::string",
            Blob::Workspaces(_) => "workspace stack",
            Blob::Mutex(_) => "mutex",
            Blob::AtomicBool(_) => "atomic bool",
            Blob::Counter(_) => "counter",
            Blob::Other(o) => o.type_name(),
        }
    }

    /// The C++ type name Caffe2 reported for such a blob (`FetchBlob` of a non-tensor blob
    /// returns `"<name>, a C++ native class of type <this>."`).
    pub fn caffe2_type_name(&self) -> &'static str {
        match self {
            Blob::Empty => "nullptr (uninitialized)",
            Blob::Tensor(_) => "caffe2::Tensor",
            Blob::Bytes(_) => "std::string",
            Blob::Workspaces(_) => "caffe2::detail::WorkspaceStack",
            Blob::Mutex(_) => "std::unique_ptr<std::mutex, std::default_delete<std::mutex> >",
            Blob::AtomicBool(_) => {
                "std::unique_ptr<std::atomic<bool>, std::default_delete<std::atomic<bool> > >"
            }
            Blob::Counter(_) => {
                "std::unique_ptr<caffe2::Counter<long>, std::default_delete<caffe2::Counter<long> > >"
            }
            Blob::Other(o) => o.type_name(),
        }
    }

    /// The tensor, if the blob holds one.
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Blob::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The tensor for writing; a blob holding anything else becomes an empty float tensor
    /// (Caffe2's `BlobGetMutableTensor`).
    pub fn tensor_mut(&mut self) -> &mut Tensor {
        if !matches!(self, Blob::Tensor(_)) {
            *self = Blob::Tensor(Tensor::default());
        }
        match self {
            Blob::Tensor(t) => t,
            _ => unreachable_tensor(),
        }
    }

    /// Whether the blob holds a tensor.
    pub fn is_tensor(&self) -> bool {
        matches!(self, Blob::Tensor(_))
    }
}

#[cold]
fn unreachable_tensor() -> ! {
    panic!("blob was just made a tensor")
}

/// Named blobs and nets.
pub struct Workspace {
    blobs: RwLock<HashMap<String, BlobHandle>>,
    nets: Mutex<HashMap<String, SharedNet>>,
    parent: Option<Arc<Workspace>>,
    forwarded: RwLock<HashMap<String, (Arc<Workspace>, String)>>,
    root_folder: RwLock<String>,
    registry: Arc<Registry>,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Workspace({} blobs)", self.blobs.read().len())
    }
}

impl Workspace {
    /// A new root workspace that creates its operators from `registry`.
    /// ([`Workspace::new`], in [`crate::runtime`], uses the registry of every built-in kernel.)
    pub fn with_registry(registry: Arc<Registry>) -> Arc<Workspace> {
        Self::build(None, HashMap::new(), ".".to_string(), registry)
    }

    fn build(
        parent: Option<Arc<Workspace>>,
        forwarded: HashMap<String, (Arc<Workspace>, String)>,
        root: String,
        registry: Arc<Registry>,
    ) -> Arc<Workspace> {
        Arc::new(Workspace {
            blobs: RwLock::new(HashMap::new()),
            nets: Mutex::new(HashMap::new()),
            parent,
            forwarded: RwLock::new(forwarded),
            root_folder: RwLock::new(root),
            registry,
        })
    }

    /// The operator registry ops of this workspace are created from (children share their
    /// parent's).
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A child whose lookups fall through to `parent`.
    pub fn new_child(parent: &Arc<Workspace>) -> Arc<Workspace> {
        Self::build(
            Some(parent.clone()),
            HashMap::new(),
            parent.root_folder(),
            parent.registry.clone(),
        )
    }

    /// A workspace that sees only the given blobs of `parent`, each under an inner name
    /// (`(inner, outer)` pairs), as `Do` creates them.
    pub fn new_forwarding(
        parent: &Arc<Workspace>,
        bindings: &[(String, String)],
    ) -> Result<Arc<Workspace>> {
        let mut fwd = HashMap::new();
        for (inner, outer) in bindings {
            if !parent.has_blob(outer) {
                return Err(Error::MissingBlob(format!(
                    "Invalid parent workspace blob: {outer}"
                )));
            }
            fwd.insert(inner.clone(), (parent.clone(), outer.clone()));
        }
        Ok(Self::build(
            None,
            fwd,
            parent.root_folder(),
            parent.registry.clone(),
        ))
    }

    /// Forwards more blobs of `parent` under inner names (`(inner, outer)` pairs). A name that is
    /// already forwarded must point to the same blob; with `skip_defined`, names that exist here
    /// are left alone, otherwise they are an error.
    pub fn add_blob_mapping(
        &self,
        parent: &Arc<Workspace>,
        bindings: &[(String, String)],
        skip_defined: bool,
    ) -> Result<()> {
        for (inner, outer) in bindings {
            if !parent.has_blob(outer) {
                return Err(Error::MissingBlob(format!(
                    "Invalid parent workspace blob {outer}"
                )));
            }
            let existing = self.forwarded.read().get(inner).cloned();
            match existing {
                Some((ws, o)) => {
                    if !Arc::ptr_eq(&ws, parent) || &o != outer {
                        return Err(Error::BadArgument(format!("Redefinition of blob {inner}")));
                    }
                }
                None => {
                    if self.has_blob(inner) {
                        if skip_defined {
                            continue;
                        }
                        return Err(Error::BadArgument(format!("Redefinition of blob {inner}")));
                    }
                    self.forwarded
                        .write()
                        .insert(inner.clone(), (parent.clone(), outer.clone()));
                }
            }
        }
        Ok(())
    }

    /// Replaces each forwarded blob in `names` by a local copy of its tensor (the forwarding is
    /// dropped), as `Do` with `copy_external_blobs` does after its net ran.
    pub fn copy_forwarded_tensors(&self, names: &[String]) -> Result<()> {
        for name in names {
            let fwd = self.forwarded.write().remove(name);
            let Some((ws, outer)) = fwd else { continue };
            let h = ws.blob(&outer)?;
            let t = match &*h.read() {
                Blob::Tensor(t) => t.deep_copy(),
                other => {
                    return Err(Error::DtypeMismatch(format!(
                        "Expected blob with tensor value {outer}, found {}",
                        other.type_name()
                    )))
                }
            };
            self.feed(name, t);
        }
        Ok(())
    }

    /// The parent workspace, if any.
    pub fn parent(&self) -> Option<&Arc<Workspace>> {
        self.parent.as_ref()
    }

    /// The folder relative paths (DB files) are resolved against.
    pub fn root_folder(&self) -> String {
        self.root_folder.read().clone()
    }

    /// Sets the root folder.
    pub fn set_root_folder(&self, root: &str) {
        *self.root_folder.write() = root.to_string();
    }

    /// Whether `name` is visible here (locally, forwarded or in a parent).
    pub fn has_blob(&self, name: &str) -> bool {
        self.get_blob(name).is_some()
    }

    /// The handle of a visible blob.
    pub fn get_blob(&self, name: &str) -> Option<BlobHandle> {
        if let Some(h) = self.blobs.read().get(name) {
            return Some(h.clone());
        }
        let fwd = self.forwarded.read().get(name).cloned();
        if let Some((ws, outer)) = fwd {
            return ws.get_blob(&outer);
        }
        self.parent.as_ref().and_then(|p| p.get_blob(name))
    }

    /// The handle of `name`, creating an empty local blob when none is visible.
    pub fn create_blob(&self, name: &str) -> BlobHandle {
        if let Some(h) = self.get_blob(name) {
            return h;
        }
        self.blobs
            .write()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(RwLock::new(Blob::Empty)))
            .clone()
    }

    /// The handle of `name` in this workspace's own blobs, created empty when absent: it
    /// shadows a blob of that name in the parent.
    pub fn create_local_blob(&self, name: &str) -> BlobHandle {
        self.blobs
            .write()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(RwLock::new(Blob::Empty)))
            .clone()
    }

    /// A blob that must exist, with a Caffe2-style error otherwise.
    pub fn blob(&self, name: &str) -> Result<BlobHandle> {
        self.get_blob(name)
            .ok_or_else(|| Error::MissingBlob(format!("Can't find blob: {name}")))
    }

    /// Removes a local blob; returns whether it existed.
    pub fn remove_blob(&self, name: &str) -> bool {
        self.blobs.write().remove(name).is_some()
    }

    /// Names of the blobs of this workspace only.
    pub fn local_blob_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.blobs.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// Names of every visible blob (local, forwarded and the parent's), sorted.
    pub fn blob_names(&self) -> Vec<String> {
        let mut set: BTreeSet<String> = self.blobs.read().keys().cloned().collect();
        set.extend(self.forwarded.read().keys().cloned());
        if let Some(p) = &self.parent {
            set.extend(p.blob_names());
        }
        set.into_iter().collect()
    }

    /// Puts a tensor into blob `name` (created if needed).
    pub fn feed(&self, name: &str, tensor: Tensor) {
        *self.create_blob(name).write() = Blob::Tensor(tensor);
    }

    /// A copy-on-write copy of the tensor in blob `name`.
    pub fn fetch(&self, name: &str) -> Result<Tensor> {
        let h = self.blob(name)?;
        let b = h.read();
        match &*b {
            Blob::Tensor(t) => Ok(t.clone()),
            other => Err(Error::DtypeMismatch(format!(
                "blob {name} holds {}, not a tensor",
                other.type_name()
            ))),
        }
    }

    /// Forgets every blob and net.
    pub fn reset(&self) {
        self.nets.lock().clear();
        self.blobs.write().clear();
    }

    /// Makes room for a net called `name`: without `overwrite`, an existing net of that name
    /// is an error (Caffe2 refuses before it builds anything); with it, the old net goes.
    pub fn check_net_name_free(&self, name: &str, overwrite: bool) -> Result<()> {
        let mut nets = self.nets.lock();
        if nets.contains_key(name) {
            if !overwrite {
                return Err(Error::BadArgument(format!(
                    "I respectfully refuse to overwrite an existing net of the same name \"{name}\", unless you explicitly specify overwrite=true."
                )));
            }
            nets.remove(name);
        }
        Ok(())
    }

    /// Keeps `net` under `name`, replacing any net of that name. (Nets are instantiated by
    /// [`crate::net`]; `Workspace::create_net` there checks the name first.)
    pub fn insert_net(&self, name: &str, net: SharedNet) {
        self.nets.lock().insert(name.to_string(), net);
    }

    /// A created net.
    pub fn get_net(&self, name: &str) -> Option<SharedNet> {
        self.nets.lock().get(name).cloned()
    }

    /// Names of the created nets, sorted.
    pub fn net_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.nets.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Forgets a created net; returns whether it existed.
    pub fn delete_net(&self, name: &str) -> bool {
        self.nets.lock().remove(name).is_some()
    }

    /// Runs a created net `num_iter` times.
    pub fn run_net(&self, name: &str, num_iter: usize) -> Result<()> {
        let net = self
            .get_net(name)
            .ok_or_else(|| Error::MissingBlob(format!("Can't find net {name}")))?;
        let mut net = net.lock();
        for _ in 0..num_iter {
            net.run()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_fall_through_and_creation_stays_local() {
        let root = Workspace::new();
        root.feed("a", Tensor::scalar(1.0f32));
        let child = Workspace::new_child(&root);
        assert!(child.has_blob("a"));
        let h = child.create_blob("a");
        assert!(Arc::ptr_eq(&h, &root.blob("a").unwrap()));
        child.create_blob("local");
        assert!(child.has_blob("local"));
        assert!(!root.has_blob("local"));
        assert_eq!(child.blob_names(), vec!["a", "local"]);
        assert_eq!(child.local_blob_names(), vec!["local"]);
    }

    #[test]
    fn forwarding_binds_inner_names() {
        let root = Workspace::new();
        root.feed("outer", Tensor::scalar(2i64));
        let ws = Workspace::new_forwarding(&root, &[("inner".into(), "outer".into())]).unwrap();
        assert!(ws.has_blob("inner"));
        assert!(!ws.has_blob("outer"));
        ws.feed("inner", Tensor::scalar(5i64));
        assert_eq!(
            root.fetch("outer").unwrap().as_slice::<i64>().unwrap(),
            &[5]
        );
        let err = Workspace::new_forwarding(&root, &[("x".into(), "nope".into())]).unwrap_err();
        assert!(err
            .to_string()
            .contains("Invalid parent workspace blob: nope"));
    }

    #[test]
    fn fetch_missing_blob_names_it() {
        let ws = Workspace::new();
        let e = ws.fetch("does_not_exist").unwrap_err().to_string();
        assert_eq!(e, "Can't find blob: does_not_exist");
        assert!(!ws.remove_blob("x"));
    }
}
