//! Bindings of `ferrocaffe::graph`: SSA (`core.get_ssa` and friends), graph surgery and the
//! memonger (`memonger_*`, Caffe2's `C.memonger_*`).
//!
//! Nets cross as serialized `NetDef` bytes; results come back as the Python lists, tuples,
//! sets and dicts Caffe2 returned. The algorithms run with the GIL released.

use std::collections::{HashMap, HashSet};

use ferrocaffe::graph::{memonger, Graph, Ssa, ValueId, Version};
use ferrocaffe::proto::NetDef;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::errors::{detach_guarded, guard, IntoPy};

/// Caches one Python string per blob and one `(name, version)` tuple per value, so that a
/// name or versioned blob that occurs many times is one shared (immutable) object.
struct Objects<'py, 's> {
    py: Python<'py>,
    ssa: &'s Ssa,
    names: Vec<Option<Bound<'py, PyString>>>,
    values: Vec<Option<Bound<'py, PyTuple>>>,
}

impl<'py, 's> Objects<'py, 's> {
    fn new(py: Python<'py>, ssa: &'s Ssa) -> Self {
        Objects {
            py,
            ssa,
            names: vec![None; ssa.names().len()],
            values: vec![None; ssa.num_values()],
        }
    }

    fn name(&mut self, b: ferrocaffe::graph::BlobId) -> Bound<'py, PyString> {
        let slot = &mut self.names[b.index()];
        match slot {
            Some(s) => s.clone(),
            None => {
                let s = PyString::new(self.py, self.ssa.name(b));
                *slot = Some(s.clone());
                s
            }
        }
    }

    fn value(&mut self, v: ferrocaffe::graph::ValueId) -> PyResult<Bound<'py, PyTuple>> {
        if let Some(t) = &self.values[v.index()] {
            return Ok(t.clone());
        }
        let (b, version) = self.ssa.value(v);
        let t = PyTuple::new(
            self.py,
            [
                self.name(b).into_any(),
                version.into_pyobject(self.py)?.into_any(),
            ],
        )?;
        // SAFETY: `t` is a live tuple holding a str and an int, which can never be part of a
        // reference cycle; CPython's collector untracks such tuples itself when it meets them,
        // this only spares it the visits. Untracking an untracked object is a no-op.
        unsafe { pyo3::ffi::PyObject_GC_UnTrack(t.as_ptr().cast()) };
        self.values[v.index()] = Some(t.clone());
        Ok(t)
    }
}

/// A `str` from a Python object (`str(obj)` for non-strings, e.g. BlobReferences).
fn text(obj: &Bound<'_, PyAny>, buf: &mut String) -> PyResult<()> {
    buf.clear();
    match obj.cast::<PyString>() {
        Ok(s) => buf.push_str(s.to_str()?),
        Err(_) => buf.push_str(obj.str()?.to_str()?),
    }
    Ok(())
}

/// A small direct-mapped cache keyed by object identity. Entries hold a reference to their
/// object, so an address cannot be reused by another object while it is cached.
struct IdentityCache<'py, T: Copy> {
    entries: Vec<Option<(Bound<'py, PyAny>, T)>>,
}

impl<'py, T: Copy> IdentityCache<'py, T> {
    const SIZE: usize = 4096;

    fn new() -> Self {
        IdentityCache {
            entries: (0..Self::SIZE).map(|_| None).collect(),
        }
    }

    fn slot(obj: &Bound<'py, PyAny>) -> usize {
        let p = obj.as_ptr() as usize;
        (p >> 4 ^ p >> 16) & (Self::SIZE - 1)
    }

    fn get(&self, obj: &Bound<'py, PyAny>) -> Option<T> {
        match &self.entries[Self::slot(obj)] {
            Some((o, t)) if o.is(obj) => Some(*t),
            _ => None,
        }
    }

    fn put(&mut self, obj: &Bound<'py, PyAny>, t: T) {
        self.entries[Self::slot(obj)] = Some((obj.clone(), t));
    }
}

/// Converts a Caffe2 `ssa` list (`[(inputs, outputs), ...]` of `(name, version)` pairs).
///
/// `get_ssa` returns one shared tuple per versioned blob and one shared string per name, so
/// identity caches skip re-reading most of them.
struct SsaReader<'py> {
    builder: ferrocaffe::graph::SsaBuilder,
    names: IdentityCache<'py, ferrocaffe::graph::BlobId>,
    values: IdentityCache<'py, ValueId>,
    buf: String,
}

impl<'py> SsaReader<'py> {
    fn read(ssa: &Bound<'py, PyAny>) -> PyResult<Ssa> {
        let hint = ssa.len().unwrap_or(0);
        let mut r = SsaReader {
            builder: Ssa::builder_with_capacity(hint),
            names: IdentityCache::new(),
            values: IdentityCache::new(),
            buf: String::new(),
        };
        for op in ssa.try_iter()? {
            let op = op?;
            let (ins, outs) = match op.cast::<PyTuple>() {
                Ok(t) if t.len() == 2 => (t.get_item(0)?, t.get_item(1)?),
                _ => {
                    let mut parts = op.try_iter()?;
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(i), Some(o), None) => (i?, o?),
                        _ => {
                            return Err(pyo3::exceptions::PyValueError::new_err(
                                "each ssa entry must be an (inputs, outputs) pair",
                            ))
                        }
                    }
                }
            };
            r.side(&ins, true)?;
            r.side(&outs, false)?;
            r.builder.end_op();
        }
        Ok(r.builder.build())
    }

    fn side(&mut self, items: &Bound<'py, PyAny>, inputs: bool) -> PyResult<()> {
        let push = |r: &mut Self, item: &Bound<'py, PyAny>| -> PyResult<()> {
            let v = r.value(item)?;
            if inputs {
                r.builder.input_value(v);
            } else {
                r.builder.output_value(v);
            }
            Ok(())
        };
        if let Ok(list) = items.cast::<PyList>() {
            for item in list.iter() {
                push(self, &item)?;
            }
        } else {
            for item in items.try_iter()? {
                push(self, &item?)?;
            }
        }
        Ok(())
    }

    fn value(&mut self, item: &Bound<'py, PyAny>) -> PyResult<ValueId> {
        if let Some(v) = self.values.get(item) {
            return Ok(v);
        }
        let (name, version) = match item.cast::<PyTuple>() {
            Ok(t) if t.len() == 2 => (t.get_item(0)?, t.get_item(1)?),
            _ => {
                let mut it = item.try_iter()?;
                match (it.next(), it.next(), it.next()) {
                    (Some(n), Some(v), None) => (n?, v?),
                    _ => {
                        return Err(pyo3::exceptions::PyValueError::new_err(
                            "a versioned blob must be a (name, version) pair",
                        ))
                    }
                }
            }
        };
        // Only immutable objects (exact str, exact tuple of str and int) are cached.
        let exact_name = name.is_exact_instance_of::<PyString>();
        let blob = match self.names.get(&name) {
            Some(b) => b,
            None => {
                text(&name, &mut self.buf)?;
                let b = self.builder.blob(&self.buf);
                if exact_name {
                    self.names.put(&name, b);
                }
                b
            }
        };
        let exact_version = version.is_exact_instance_of::<pyo3::types::PyInt>();
        let v = self.builder.value(blob, version.extract::<Version>()?);
        if exact_name && exact_version && item.is_exact_instance_of::<PyTuple>() {
            self.values.put(item, v);
        }
        Ok(v)
    }
}

fn ssa_from_py(ssa: &Bound<'_, PyAny>) -> PyResult<Ssa> {
    SsaReader::read(ssa)
}

/// Owned references to Python objects, released when dropped (null entries are skipped).
struct OwnedRefs(Vec<*mut pyo3::ffi::PyObject>);

impl Drop for OwnedRefs {
    fn drop(&mut self) {
        for &p in &self.0 {
            if !p.is_null() {
                // SAFETY: each non-null entry is a reference this struct owns; the GIL is held
                // (the struct never leaves the function that holds it).
                unsafe { pyo3::ffi::Py_DecRef(p) };
            }
        }
    }
}

/// Builds Caffe2's `get_ssa` result from an [`Ssa`]: one string per blob name and one
/// `(name, version)` tuple per value, shared by every op that reads or writes it, lists built
/// at their final size, and no reference count traffic beyond one reference per list slot.
struct SsaObjects<'py, 's> {
    py: Python<'py>,
    ssa: &'s Ssa,
    names: OwnedRefs,
    values: OwnedRefs,
}

impl<'py, 's> SsaObjects<'py, 's> {
    fn new(py: Python<'py>, ssa: &'s Ssa) -> Self {
        SsaObjects {
            py,
            ssa,
            names: OwnedRefs(vec![std::ptr::null_mut(); ssa.names().len()]),
            values: OwnedRefs(vec![std::ptr::null_mut(); ssa.num_values()]),
        }
    }

    /// The string of blob `b` (a borrowed reference, owned by `self`).
    fn name(&mut self, b: ferrocaffe::graph::BlobId) -> PyResult<*mut pyo3::ffi::PyObject> {
        let slot = &mut self.names.0[b.index()];
        if slot.is_null() {
            let text = self.ssa.name(b);
            // SAFETY: a valid UTF-8 buffer and its length; the GIL is held.
            let s = unsafe {
                pyo3::ffi::PyUnicode_FromStringAndSize(text.as_ptr().cast(), text.len() as isize)
            };
            if s.is_null() {
                return Err(PyErr::fetch(self.py));
            }
            *slot = s;
        }
        Ok(*slot)
    }

    /// The `(name, version)` tuple of value `v` (a borrowed reference, owned by `self`).
    fn value(&mut self, v: ValueId) -> PyResult<*mut pyo3::ffi::PyObject> {
        let cached = self.values.0[v.index()];
        if !cached.is_null() {
            return Ok(cached);
        }
        let (b, version) = self.ssa.value(v);
        let name = self.name(b)?;
        // SAFETY: the GIL is held; `PyTuple_SetItem` steals the references it is given (and
        // releases them itself on failure), and the tuple is filled before anyone sees it.
        unsafe {
            let number = pyo3::ffi::PyLong_FromLongLong(version);
            if number.is_null() {
                return Err(PyErr::fetch(self.py));
            }
            let t = pyo3::ffi::PyTuple_New(2);
            if t.is_null() {
                pyo3::ffi::Py_DecRef(number);
                return Err(PyErr::fetch(self.py));
            }
            pyo3::ffi::Py_IncRef(name);
            pyo3::ffi::PyTuple_SetItem(t, 0, name);
            pyo3::ffi::PyTuple_SetItem(t, 1, number);
            // A tuple of a str and an int can never be part of a reference cycle; CPython's
            // collector untracks such tuples itself when it meets them, this spares it the
            // visits.
            pyo3::ffi::PyObject_GC_UnTrack(t.cast());
            self.values.0[v.index()] = t;
            Ok(t)
        }
    }

    /// A new list of the tuples of `slots`.
    fn list(&mut self, slots: &[ferrocaffe::graph::Slot]) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the GIL is held; the list is created at its final size and every slot is
        // set (with a new reference) before it is returned.
        unsafe {
            let list = pyo3::ffi::PyList_New(slots.len() as isize);
            let list = Bound::from_owned_ptr_or_err(self.py, list)?;
            for (i, s) in slots.iter().enumerate() {
                let t = self.value(s.value)?;
                pyo3::ffi::Py_IncRef(t);
                pyo3::ffi::PyList_SetItem(list.as_ptr(), i as isize, t);
            }
            Ok(list)
        }
    }

    /// The `ssa` list: per op, `(inputs, outputs)`.
    fn ops(&mut self) -> PyResult<Bound<'py, PyList>> {
        let n = self.ssa.len();
        // All names first, then all `(name, version)` tuples, then the lists: objects of a
        // kind end up together in memory, which makes building the lists, and the garbage
        // collector's later passes over them, markedly faster than creating each object where
        // it is first needed. (Names in id order, i.e. in order of first use: the tuples
        // then touch them in about the order they were made.)
        for b in 0..self.ssa.names().len() {
            self.name(ferrocaffe::graph::BlobId(b as u32))?;
        }
        for v in 0..self.ssa.num_values() {
            self.value(ValueId(v as u32))?;
        }
        // SAFETY: the GIL is held; every slot of the list is set before it is returned, and
        // `PyTuple_SetItem` / `PyList_SetItem` steal the references they are given.
        unsafe {
            let outer = Bound::from_owned_ptr_or_err(self.py, pyo3::ffi::PyList_New(n as isize))?;
            for op in 0..n {
                let ins = self.list(self.ssa.inputs(op))?;
                let outs = self.list(self.ssa.outputs(op))?;
                let pair = pyo3::ffi::PyTuple_New(2);
                let pair = Bound::from_owned_ptr_or_err(self.py, pair)?;
                pyo3::ffi::PyTuple_SetItem(pair.as_ptr(), 0, ins.into_ptr());
                pyo3::ffi::PyTuple_SetItem(pair.as_ptr(), 1, outs.into_ptr());
                pyo3::ffi::PyList_SetItem(outer.as_ptr(), op as isize, pair.into_ptr());
            }
            Ok(outer.cast_into_unchecked())
        }
    }

    /// `blob_versions`. (A dict presized with CPython's private `_PyDict_NewPresized` saved
    /// 7-8 ms of 125 at 100k ops; we stay on the stable ABI instead.)
    fn versions(&mut self) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(self.py);
        for (b, v) in self.ssa.blob_version_ids() {
            let key = self.name(b)?;
            // SAFETY: the GIL is held; `key` is a live string owned by `self`, `number` a new
            // reference released after `PyDict_SetItem` took its own.
            unsafe {
                let number = pyo3::ffi::PyLong_FromLongLong(v);
                if number.is_null() {
                    return Err(PyErr::fetch(self.py));
                }
                let rc = pyo3::ffi::PyDict_SetItem(d.as_ptr(), key, number);
                pyo3::ffi::Py_DecRef(number);
                if rc != 0 {
                    return Err(PyErr::fetch(self.py));
                }
            }
        }
        Ok(d)
    }
}

/// `core.get_ssa` on serialized NetDef bytes: `(ssa, blob_versions)`, with `start` the
/// starting `blob_versions` items (the returned dict holds them too, updated, in order).
#[pyfunction]
#[pyo3(signature = (net, start=None))]
fn ssa_get_ssa<'py>(
    py: Python<'py>,
    net: &[u8],
    start: Option<Vec<(String, Version)>>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyDict>)> {
    guard("ssa_get_ssa", || {
        let start = start.unwrap_or_default();
        let ssa = detach_guarded(py, "ssa_get_ssa", || {
            Ssa::from_bytes(net, start.iter().map(|(n, v)| (n.as_str(), *v)))
        })
        .py()?;
        let mut objs = SsaObjects::new(py, &ssa);
        let ops = objs.ops()?;
        let versions = objs.versions()?;
        Ok((ops, versions))
    })
}

/// `core.get_op_ids_in_path(ssa, ...)` with the versions of `inputs` and `outputs` resolved.
#[pyfunction]
fn ssa_get_op_ids_in_path(
    py: Python<'_>,
    ssa: &Bound<'_, PyAny>,
    inputs: Vec<(String, Version)>,
    outputs: Vec<(String, Version)>,
) -> PyResult<Vec<usize>> {
    guard("ssa_get_op_ids_in_path", || {
        let ssa = ssa_from_py(ssa)?;
        detach_guarded(py, "ssa_get_op_ids_in_path", || {
            let ins: Vec<(&str, Version)> = inputs.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            let outs: Vec<(&str, Version)> =
                outputs.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            ssa.op_ids_in_path(&ins, &outs)
        })
    })
}

/// `{(name, version): (op, output_index)}` over the ops of `net`.
#[pyfunction]
fn graph_producer_map<'py>(py: Python<'py>, net: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    guard("graph_producer_map", || {
        let (graph, map) = detach_guarded(py, "graph_producer_map", || {
            Graph::from_bytes(net).map(|g| {
                let map = g.producer_map_by_value();
                (g, map)
            })
        })
        .py()?;
        let out = PyDict::new(py);
        let mut objs = Objects::new(py, graph.ssa());
        for (v, p) in map {
            out.set_item(objs.value(v)?, (p.op, p.index))?;
        }
        Ok(out)
    })
}

/// `{(name, version): [(op, input_index), ...]}` over the ops of `net`.
#[pyfunction]
fn graph_consumer_map<'py>(py: Python<'py>, net: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    guard("graph_consumer_map", || {
        let graph = detach_guarded(py, "graph_consumer_map", || Graph::from_bytes(net)).py()?;
        let out = PyDict::new(py);
        let mut objs = Objects::new(py, graph.ssa());
        for (v, consumers) in graph.consumer_map_by_value() {
            let list = PyList::new(py, consumers.iter().map(|c| (c.op, c.index)))?;
            out.set_item(objs.value(v)?, list)?;
        }
        Ok(out)
    })
}

/// Renames an op input (see `Graph::rename_op_input`): `(net_bytes, init_net_bytes or None)`.
#[pyfunction]
#[pyo3(signature = (net, init_net, op, input, new_name, at_producer))]
#[allow(clippy::type_complexity)]
fn graph_rename_op_input<'py>(
    py: Python<'py>,
    net: &[u8],
    init_net: Option<&[u8]>,
    op: usize,
    input: usize,
    new_name: &str,
    at_producer: bool,
) -> PyResult<(Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)> {
    guard("graph_rename_op_input", || {
        let (net, init) = detach_guarded(
            py,
            "graph_rename_op_input",
            || -> ferrocaffe::Result<(Vec<u8>, Option<Vec<u8>>)> {
                let mut g = Graph::from_bytes(net)?;
                if let Some(init) = init_net {
                    g = g.with_init_net_bytes(init)?;
                }
                g.rename_op_input(op, input, new_name, at_producer)?;
                let init = g.init_net().map(|n| n.to_bytes()).transpose()?;
                Ok((g.net().to_bytes()?, init))
            },
        )
        .py()?;
        Ok((PyBytes::new(py, &net), init.map(|b| PyBytes::new(py, &b))))
    })
}

/// Renames an op output (see `Graph::rename_op_output`); returns the net bytes.
#[pyfunction]
fn graph_rename_op_output<'py>(
    py: Python<'py>,
    net: &[u8],
    op: usize,
    output: usize,
    new_name: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    guard("graph_rename_op_output", || {
        let out = detach_guarded(
            py,
            "graph_rename_op_output",
            || -> ferrocaffe::Result<Vec<u8>> {
                let mut g = Graph::from_bytes(net)?;
                g.rename_op_output(op, output, new_name)?;
                g.net().to_bytes()
            },
        )
        .py()?;
        Ok(PyBytes::new(py, &out))
    })
}

/// Removes dead-end ops: `(net_bytes, removed op indices)`.
#[pyfunction]
fn graph_remove_dead_end_ops<'py>(
    py: Python<'py>,
    net: &[u8],
) -> PyResult<(Bound<'py, PyBytes>, Vec<usize>)> {
    guard("graph_remove_dead_end_ops", || {
        let (out, removed) = detach_guarded(
            py,
            "graph_remove_dead_end_ops",
            || -> ferrocaffe::Result<(Vec<u8>, Vec<usize>)> {
                let mut g = Graph::from_bytes(net)?;
                let removed = g.remove_dead_end_ops();
                Ok((g.net().to_bytes()?, removed))
            },
        )
        .py()?;
        Ok((PyBytes::new(py, &out), removed))
    })
}

/// Removes the given ops; returns the net bytes.
#[pyfunction]
fn graph_remove_ops<'py>(
    py: Python<'py>,
    net: &[u8],
    ops: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    guard("graph_remove_ops", || {
        let out = detach_guarded(py, "graph_remove_ops", || -> ferrocaffe::Result<Vec<u8>> {
            let mut g = Graph::from_bytes(net)?;
            g.remove_ops(&ops)?;
            g.net().to_bytes()
        })
        .py()?;
        Ok(PyBytes::new(py, &out))
    })
}

/// The external inputs and outputs of a sub-graph, as lists of `(name, version)` tuples.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn graph_sub_graph_io(
    py: Python<'_>,
    net: &[u8],
    ops: Vec<usize>,
) -> PyResult<(Vec<(String, Version)>, Vec<(String, Version)>)> {
    guard("graph_sub_graph_io", || {
        let io = detach_guarded(py, "graph_sub_graph_io", || {
            Graph::from_bytes(net).and_then(|g| g.sub_graph_io(&ops))
        })
        .py()?;
        Ok((io.inputs, io.outputs))
    })
}

/// Chains of ops of one type (see `Graph::find_chains`).
#[pyfunction]
fn graph_find_chains(
    py: Python<'_>,
    net: &[u8],
    op_type: &str,
    min_length: usize,
) -> PyResult<Vec<Vec<usize>>> {
    guard("graph_find_chains", || {
        detach_guarded(py, "graph_find_chains", || {
            Graph::from_bytes(net).map(|g| g.find_chains(op_type, min_length))
        })
        .py()
    })
}

/// The final version of each external output.
#[pyfunction]
fn graph_versioned_external_outputs(
    py: Python<'_>,
    net: &[u8],
) -> PyResult<Vec<(String, Version)>> {
    guard("graph_versioned_external_outputs", || {
        detach_guarded(py, "graph_versioned_external_outputs", || {
            Graph::from_bytes(net).map(|g| {
                g.versioned_external_outputs()
                    .into_iter()
                    .map(|(n, v)| (n.to_string(), v))
                    .collect()
            })
        })
        .py()
    })
}

/// Caffe2's `memonger_optimize_inference_net`: the net with its blobs recycled (see
/// `ferrocaffe::graph::memonger::optimize_inference_net`), as bytes.
#[pyfunction]
fn memonger_optimize_inference_net<'py>(
    py: Python<'py>,
    net: &[u8],
    static_blobs: Vec<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    guard("memonger_optimize_inference_net", || {
        let out = detach_guarded(
            py,
            "memonger_optimize_inference_net",
            || -> ferrocaffe::Result<Vec<u8>> {
                let net = ferrocaffe::proto::decode::<NetDef>(net)?;
                let out = memonger::optimize_inference_net(&net, &static_blobs)?;
                Ok(ferrocaffe::proto::encode(&out))
            },
        )
        .py()?;
        Ok(PyBytes::new(py, &out))
    })
}

/// Caffe2's `memonger_compute_blob_recycling_for_dag`: the net with its shareable blobs
/// recycled (see `ferrocaffe::graph::memonger::compute_blob_recycling_for_dag`), as bytes.
#[pyfunction]
#[pyo3(signature = (net, heads, op_indices, shareable_blobs, namescope, dont_share_blobs, blob_shapes))]
#[allow(clippy::too_many_arguments)]
fn memonger_compute_blob_recycling_for_dag<'py>(
    py: Python<'py>,
    net: &[u8],
    heads: Vec<String>,
    op_indices: Vec<usize>,
    shareable_blobs: HashSet<String>,
    namescope: String,
    dont_share_blobs: HashSet<String>,
    blob_shapes: HashMap<String, Vec<i64>>,
) -> PyResult<Bound<'py, PyBytes>> {
    guard("memonger_compute_blob_recycling_for_dag", || {
        let opts = memonger::DagRecycling {
            heads,
            op_indices,
            shareable: shareable_blobs,
            namescope,
            dont_share: dont_share_blobs,
            blob_shapes,
        };
        let out = detach_guarded(
            py,
            "memonger_compute_blob_recycling_for_dag",
            || -> ferrocaffe::Result<Vec<u8>> {
                let net = ferrocaffe::proto::decode::<NetDef>(net)?;
                let out = memonger::compute_blob_recycling_for_dag(&net, &opts)?;
                Ok(ferrocaffe::proto::encode(&out))
            },
        )
        .py()?;
        Ok(PyBytes::new(py, &out))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ssa_get_ssa, m)?)?;
    m.add_function(wrap_pyfunction!(ssa_get_op_ids_in_path, m)?)?;
    m.add_function(wrap_pyfunction!(graph_producer_map, m)?)?;
    m.add_function(wrap_pyfunction!(graph_consumer_map, m)?)?;
    m.add_function(wrap_pyfunction!(graph_rename_op_input, m)?)?;
    m.add_function(wrap_pyfunction!(graph_rename_op_output, m)?)?;
    m.add_function(wrap_pyfunction!(graph_remove_dead_end_ops, m)?)?;
    m.add_function(wrap_pyfunction!(graph_remove_ops, m)?)?;
    m.add_function(wrap_pyfunction!(graph_sub_graph_io, m)?)?;
    m.add_function(wrap_pyfunction!(graph_find_chains, m)?)?;
    m.add_function(wrap_pyfunction!(graph_versioned_external_outputs, m)?)?;
    m.add_function(wrap_pyfunction!(memonger_optimize_inference_net, m)?)?;
    m.add_function(wrap_pyfunction!(
        memonger_compute_blob_recycling_for_dag,
        m
    )?)?;
    Ok(())
}
