//! Bindings of `ferrocaffe::graph`: SSA (`core.get_ssa` and friends) and graph surgery.
//!
//! Nets cross as serialized `NetDef` bytes; results come back as the Python lists, tuples,
//! sets and dicts Caffe2 returned. The algorithms run with the GIL released.

use ferrocaffe::graph::{Graph, Ssa, ValueId, Version};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PySet, PyString, PyTuple};

use crate::errors::IntoPy;

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
    /// The first Python object seen for each blob and each value (results reuse them, as
    /// Caffe2's functions returned the objects of the given `ssa`).
    name_objs: Vec<Bound<'py, PyAny>>,
    value_objs: Vec<Bound<'py, PyAny>>,
}

/// A converted `ssa` and the Python objects it was read from.
struct ReadSsa<'py> {
    ssa: Ssa,
    name_objs: Vec<Bound<'py, PyAny>>,
    value_objs: Vec<Bound<'py, PyAny>>,
}

impl<'py> SsaReader<'py> {
    fn read(ssa: &Bound<'py, PyAny>) -> PyResult<ReadSsa<'py>> {
        let hint = ssa.len().unwrap_or(0);
        let mut r = SsaReader {
            builder: Ssa::builder_with_capacity(hint),
            names: IdentityCache::new(),
            values: IdentityCache::new(),
            buf: String::new(),
            name_objs: Vec::with_capacity(hint * 2),
            value_objs: Vec::with_capacity(hint * 2),
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
        Ok(ReadSsa {
            ssa: r.builder.build(),
            name_objs: r.name_objs,
            value_objs: r.value_objs,
        })
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
                if b.index() == self.name_objs.len() {
                    self.name_objs.push(name.clone());
                }
                if exact_name {
                    self.names.put(&name, b);
                }
                b
            }
        };
        let exact_version = version.is_exact_instance_of::<pyo3::types::PyInt>();
        let v = self.builder.value(blob, version.extract::<Version>()?);
        if v.index() == self.value_objs.len() {
            self.value_objs.push(item.clone());
        }
        if exact_name && exact_version && item.is_exact_instance_of::<PyTuple>() {
            self.values.put(item, v);
        }
        Ok(v)
    }
}

fn ssa_from_py(ssa: &Bound<'_, PyAny>) -> PyResult<Ssa> {
    Ok(SsaReader::read(ssa)?.ssa)
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
    let start = start.unwrap_or_default();
    let ssa = py
        .detach(|| Ssa::from_bytes(net, start.iter().map(|(n, v)| (n.as_str(), *v))))
        .py()?;
    let mut objs = Objects::new(py, &ssa);
    // One `(name, version)` tuple per value, shared by every op that reads or writes it.
    let values = (0..ssa.num_values())
        .map(|v| objs.value(ValueId(v as u32)))
        .collect::<PyResult<Vec<_>>>()?;
    let side = |slots: &[ferrocaffe::graph::Slot]| {
        PyList::new(py, slots.iter().map(|s| &values[s.value.index()]))
    };
    let ops = (0..ssa.len())
        .map(|op| {
            let ins = side(ssa.inputs(op))?;
            let outs = side(ssa.outputs(op))?;
            PyTuple::new(py, [ins, outs])
        })
        .collect::<PyResult<Vec<_>>>()?;
    let versions = PyDict::new(py);
    for (b, v) in ssa.blob_version_ids() {
        versions.set_item(objs.name(b), v)?;
    }
    Ok((PyList::new(py, ops)?, versions))
}

/// `core.get_undefined_blobs(ssa)`: the name objects of the given `ssa`.
#[pyfunction]
fn ssa_get_undefined_blobs<'py>(
    py: Python<'py>,
    ssa: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PySet>> {
    let read = SsaReader::read(ssa)?;
    let ssa = &read.ssa;
    let undefined = py.detach(|| ssa.undefined_blobs());
    PySet::new(py, undefined.iter().map(|&b| &read.name_objs[b.index()]))
}

/// `core.get_output_producers(ssa)`: keyed by the versioned-blob objects of the given `ssa`.
#[pyfunction]
fn ssa_get_output_producers<'py>(
    py: Python<'py>,
    ssa: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let read = SsaReader::read(ssa)?;
    let ssa = &read.ssa;
    let producers = py.detach(|| ssa.output_producers());
    let out = PyDict::new(py);
    for (v, op) in producers {
        out.set_item(&read.value_objs[v.index()], op)?;
    }
    Ok(out)
}

/// `core.get_op_ids_in_path(ssa, ...)` with the versions of `inputs` and `outputs` resolved.
#[pyfunction]
fn ssa_get_op_ids_in_path(
    py: Python<'_>,
    ssa: &Bound<'_, PyAny>,
    inputs: Vec<(String, Version)>,
    outputs: Vec<(String, Version)>,
) -> PyResult<Vec<usize>> {
    let ssa = ssa_from_py(ssa)?;
    Ok(py.detach(|| {
        let ins: Vec<(&str, Version)> = inputs.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let outs: Vec<(&str, Version)> = outputs.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        ssa.op_ids_in_path(&ins, &outs)
    }))
}

/// `{(name, version): (op, output_index)}` over the ops of `net`.
#[pyfunction]
fn graph_producer_map<'py>(py: Python<'py>, net: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    let (graph, map) = py
        .detach(|| {
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
}

/// `{(name, version): [(op, input_index), ...]}` over the ops of `net`.
#[pyfunction]
fn graph_consumer_map<'py>(py: Python<'py>, net: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    let graph = py.detach(|| Graph::from_bytes(net)).py()?;
    let out = PyDict::new(py);
    let mut objs = Objects::new(py, graph.ssa());
    for (v, consumers) in graph.consumer_map_by_value() {
        let list = PyList::new(py, consumers.iter().map(|c| (c.op, c.index)))?;
        out.set_item(objs.value(v)?, list)?;
    }
    Ok(out)
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
    let (net, init) = py
        .detach(|| -> ferrocaffe::Result<(Vec<u8>, Option<Vec<u8>>)> {
            let mut g = Graph::from_bytes(net)?;
            if let Some(init) = init_net {
                g = g.with_init_net_bytes(init)?;
            }
            g.rename_op_input(op, input, new_name, at_producer)?;
            let init = g.init_net().map(|n| n.to_bytes()).transpose()?;
            Ok((g.net().to_bytes()?, init))
        })
        .py()?;
    Ok((PyBytes::new(py, &net), init.map(|b| PyBytes::new(py, &b))))
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
    let out = py
        .detach(|| -> ferrocaffe::Result<Vec<u8>> {
            let mut g = Graph::from_bytes(net)?;
            g.rename_op_output(op, output, new_name)?;
            g.net().to_bytes()
        })
        .py()?;
    Ok(PyBytes::new(py, &out))
}

/// Removes dead-end ops: `(net_bytes, removed op indices)`.
#[pyfunction]
fn graph_remove_dead_end_ops<'py>(
    py: Python<'py>,
    net: &[u8],
) -> PyResult<(Bound<'py, PyBytes>, Vec<usize>)> {
    let (out, removed) = py
        .detach(|| -> ferrocaffe::Result<(Vec<u8>, Vec<usize>)> {
            let mut g = Graph::from_bytes(net)?;
            let removed = g.remove_dead_end_ops();
            Ok((g.net().to_bytes()?, removed))
        })
        .py()?;
    Ok((PyBytes::new(py, &out), removed))
}

/// Removes the given ops; returns the net bytes.
#[pyfunction]
fn graph_remove_ops<'py>(
    py: Python<'py>,
    net: &[u8],
    ops: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let out = py
        .detach(|| -> ferrocaffe::Result<Vec<u8>> {
            let mut g = Graph::from_bytes(net)?;
            g.remove_ops(&ops)?;
            g.net().to_bytes()
        })
        .py()?;
    Ok(PyBytes::new(py, &out))
}

/// The external inputs and outputs of a sub-graph, as lists of `(name, version)` tuples.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn graph_sub_graph_io(
    py: Python<'_>,
    net: &[u8],
    ops: Vec<usize>,
) -> PyResult<(Vec<(String, Version)>, Vec<(String, Version)>)> {
    let io = py
        .detach(|| Graph::from_bytes(net).and_then(|g| g.sub_graph_io(&ops)))
        .py()?;
    Ok((io.inputs, io.outputs))
}

/// Chains of ops of one type (see `Graph::find_chains`).
#[pyfunction]
fn graph_find_chains(
    py: Python<'_>,
    net: &[u8],
    op_type: &str,
    min_length: usize,
) -> PyResult<Vec<Vec<usize>>> {
    py.detach(|| Graph::from_bytes(net).map(|g| g.find_chains(op_type, min_length)))
        .py()
}

/// The final version of each external output.
#[pyfunction]
fn graph_versioned_external_outputs(
    py: Python<'_>,
    net: &[u8],
) -> PyResult<Vec<(String, Version)>> {
    py.detach(|| {
        Graph::from_bytes(net).map(|g| {
            g.versioned_external_outputs()
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect()
        })
    })
    .py()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ssa_get_ssa, m)?)?;
    m.add_function(wrap_pyfunction!(ssa_get_undefined_blobs, m)?)?;
    m.add_function(wrap_pyfunction!(ssa_get_output_producers, m)?)?;
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
    Ok(())
}
