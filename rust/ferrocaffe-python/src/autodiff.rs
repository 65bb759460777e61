//! Autodiff bindings: `backward_pass`, `gradient_for_op` and `ir_state` take serialized
//! operators and plain names; gradient functions registered from Python become gradient
//! makers that call back into Python. Conversions only; the logic is in
//! `ferrocaffe::autodiff`.

use std::sync::Arc;

use ferrocaffe::autodiff::net_bytes::{
    backward_pass_net_bytes, backward_pass_op_bytes, encode_ops_as_net, Extras,
};
use ferrocaffe::autodiff::{
    gradient_for_op as core_gradient_for_op, BackwardOptions, Generator, GradMap, GradName,
    GradRef, GradientContext, GradientMaker, GradientOutput, Ir, IrState, NetNames, Registry,
    UsedNetNames,
};
use ferrocaffe::proto::{self, DeviceOption, OperatorDef};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyList, PySet, PyString, PyTuple, PyType};

use crate::errors::{detach_guarded, guard, guard_ok, IntoPy};

/// A gradient from Python: `None`, a name, or an `(indices, values)` pair.
fn grad_from_py(obj: &Bound<'_, PyAny>) -> PyResult<GradRef> {
    if obj.is_none() {
        return Ok(GradRef::None);
    }
    if let Ok(s) = obj.extract::<String>() {
        return Ok(GradRef::Dense(s));
    }
    if let Ok((indices, values)) = obj.extract::<(String, String)>() {
        return Ok(GradRef::Sparse { indices, values });
    }
    Err(PyTypeError::new_err(format!(
        "a gradient must be None, a blob name or an (indices, values) pair of names, not {}",
        obj.repr()?
    )))
}

fn grad_to_py<'py>(py: Python<'py>, g: &GradRef) -> PyResult<Bound<'py, PyAny>> {
    Ok(match g {
        GradRef::None => py.None().into_bound(py),
        GradRef::Dense(n) => n.into_pyobject(py)?.into_any(),
        GradRef::Sparse { indices, values } => (indices, values).into_pyobject(py)?.into_any(),
    })
}

fn grads_to_py<'py>(py: Python<'py>, gs: &[GradRef]) -> PyResult<Bound<'py, PyList>> {
    let items = gs
        .iter()
        .map(|g| grad_to_py(py, g))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// A gradient function registered from Python, called through `adapter(func, op_bytes,
/// g_output)` which returns `(list of serialized gradient ops, input gradients)`.
struct PyGradientFunction {
    op_type: String,
    func: Py<PyAny>,
    adapter: Py<PyAny>,
}

impl PyGradientFunction {
    fn call(&self, op: &OperatorDef, g_output: &[GradRef]) -> PyResult<GradientOutput> {
        Python::attach(|py| {
            let op_bytes = PyBytes::new(py, &proto::encode(op));
            let g = grads_to_py(py, g_output)?;
            let res = self
                .adapter
                .call1(py, (self.func.clone_ref(py), op_bytes, g))?;
            let (ops, grads): (Vec<Vec<u8>>, Vec<Bound<'_, PyAny>>) = res.extract(py)?;
            let ops = ops
                .iter()
                .map(|b| proto::decode::<OperatorDef>(b).py())
                .collect::<PyResult<Vec<_>>>()?;
            let input_grads = grads
                .iter()
                .map(grad_from_py)
                .collect::<PyResult<Vec<_>>>()?;
            Ok(GradientOutput { ops, input_grads })
        })
    }
}

impl GradientMaker for PyGradientFunction {
    fn make(&self, op: &OperatorDef, g_output: &[GradRef]) -> ferrocaffe::Result<GradientOutput> {
        self.call(op, g_output)
            .map_err(|e| ferrocaffe::Error::External {
                context: format!(
                    "Exception when creating gradient for [{}] with the gradient function \
                     registered in Python ({} op '{}')",
                    self.op_type,
                    op.r#type(),
                    op.name()
                ),
                source: Box::new(e),
            })
    }
}

/// Net names handed out by a Python callable (`core.Net`'s name registry).
struct PyNetNames(Py<PyAny>);

impl NetNames for PyNetNames {
    fn next_net_name(&mut self, base: &str) -> ferrocaffe::Result<String> {
        Python::attach(|py| self.0.call1(py, (base,))?.extract::<String>(py)).map_err(|e| {
            ferrocaffe::Error::External {
                context: format!("cannot get a unique net name for '{base}'"),
                source: Box::new(e),
            }
        })
    }
}

/// Everything a call needs besides the ops, converted under the GIL.
struct Setup {
    registry: Registry,
    names: Box<dyn NetNames + Send>,
    options: BackwardOptions,
}

fn setup(
    py: Python<'_>,
    functions: Vec<(String, Py<PyAny>)>,
    adapter: Option<Py<PyAny>>,
    next_net_name: Option<Py<PyAny>>,
    name_scope: String,
    device_scope: Option<PyBackedBytes>,
) -> PyResult<Setup> {
    let mut registry = Registry::layered(Registry::builtin());
    if !functions.is_empty() && adapter.is_none() {
        return Err(PyTypeError::new_err(
            "gradient functions need an adapter: adapter(func, op_bytes, g_output) -> \
             (list of serialized gradient ops, input gradients)",
        ));
    }
    for (op_type, func) in functions {
        let Some(adapter) = adapter.as_ref() else {
            break;
        };
        let f = PyGradientFunction {
            op_type: op_type.clone(),
            func,
            adapter: adapter.clone_ref(py),
        };
        registry.register_function(&op_type, Arc::new(f));
    }
    let names: Box<dyn NetNames + Send> = match next_net_name {
        Some(f) => Box::new(PyNetNames(f)),
        None => Box::new(UsedNetNames::new()),
    };
    let device_scope = device_scope
        .map(|b| proto::decode::<DeviceOption>(&b).py())
        .transpose()?;
    Ok(Setup {
        registry,
        names,
        options: BackwardOptions {
            name_scope,
            device_scope,
        },
    })
}

fn decode_ops(ops: &[PyBackedBytes]) -> ferrocaffe::Result<Vec<OperatorDef>> {
    let mut out = Vec::with_capacity(ops.len());
    for (k, b) in ops.iter().enumerate() {
        out.push(proto::decode::<OperatorDef>(b).map_err(|e| match e {
            ferrocaffe::Error::Decode { message, reason } => ferrocaffe::Error::Decode {
                message,
                reason: format!("operator {k} of the list: {reason}"),
            },
            other => other,
        })?);
    }
    Ok(out)
}

fn net_bytes(ops: Vec<OperatorDef>) -> Vec<u8> {
    encode_ops_as_net(&ops)
}

fn generator_to_py<'py>(py: Python<'py>, g: &Generator) -> PyResult<Bound<'py, PyTuple>> {
    let dev = |d: &DeviceOption| PyBytes::new(py, &proto::encode(d));
    let slot = |s: &Option<(usize, usize)>| (s.map(|x| x.0), s.map_or(0, |x| x.1));
    match g {
        Generator::Dense {
            op,
            gradient,
            device_option,
        } => {
            let (k, i) = slot(op);
            ("dense", k, i, gradient, dev(device_option)).into_pyobject(py)
        }
        Generator::Sparse {
            indices_op,
            values_op,
            indices,
            values,
            device_option,
        } => {
            let (ki, ii) = slot(indices_op);
            let (kv, iv) = slot(values_op);
            let items: Vec<Bound<'py, PyAny>> = vec![
                "sparse".into_pyobject(py)?.into_any(),
                ki.into_pyobject(py)?.into_any(),
                ii.into_pyobject(py)?.into_any(),
                kv.into_pyobject(py)?.into_any(),
                iv.into_pyobject(py)?.into_any(),
                indices.into_pyobject(py)?.into_any(),
                values.into_pyobject(py)?.into_any(),
                dev(device_option).into_any(),
            ];
            PyTuple::new(py, items)
        }
    }
}

fn state_to_py<'py>(py: Python<'py>, s: IrState) -> PyResult<Bound<'py, PyAny>> {
    let gens = s
        .gradient_generators
        .iter()
        .map(|(name, v, gs)| {
            let list = gs
                .iter()
                .map(|g| generator_to_py(py, g))
                .collect::<PyResult<Vec<_>>>()?;
            (name, v, list).into_pyobject(py)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let d = pyo3::types::PyDict::new(py);
    d.set_item("ssa", s.ssa)?;
    d.set_item("frontier", s.frontier)?;
    d.set_item("input_usages", s.input_usages)?;
    d.set_item("gradient_frontier", s.gradient_frontier)?;
    d.set_item("gradient_generators", gens)?;
    d.set_item("in_version_history", s.in_version_history)?;
    d.set_item("out_version_history", s.out_version_history)?;
    Ok(d.into_any())
}

/// The serialized gradient ops, the gradient map, the IR state if asked for, and the output
/// names of the gradient ops if asked for.
type BackwardResult = (Vec<u8>, GradMap, Option<IrState>, Option<OutputNames>);

/// Where the forward ops come from: one serialized OperatorDef each, or a serialized NetDef
/// whose ops from `skip` on are used.
enum Forward {
    Ops(Vec<PyBackedBytes>),
    Net(PyBackedBytes, usize),
}

/// Runs a backward pass with the GIL released.
fn run_backward(
    py: Python<'_>,
    what: &str,
    forward: Forward,
    ys: Vec<(String, GradRef)>,
    mut s: Setup,
    with_state: bool,
    with_outputs: bool,
) -> PyResult<BackwardResult> {
    let result = detach_guarded(py, what, || -> ferrocaffe::Result<BackwardResult> {
        let mut cx = GradientContext {
            registry: &s.registry,
            net_names: s.names.as_mut(),
            options: &s.options,
        };
        let extras = Extras {
            state: with_state,
            output_names: with_outputs,
        };
        let out = match &forward {
            Forward::Ops(ops) => backward_pass_op_bytes(ops, &ys, &mut cx, extras)?,
            Forward::Net(bytes, skip) => {
                backward_pass_net_bytes(bytes, *skip, &ys, &mut cx, extras)?
            }
        };
        let outputs = out
            .output_names
            .map(|(text, ends)| OutputNames { text, ends });
        Ok((out.net, out.grads, out.state, outputs))
    });
    result.py()
}

fn ys_from_py(ys: &[(String, Bound<'_, PyAny>)]) -> PyResult<Vec<(String, GradRef)>> {
    ys.iter()
        .map(|(y, g)| Ok((y.clone(), grad_from_py(g)?)))
        .collect()
}

/// Names concatenated, with the end of each.
struct OutputNames {
    text: String,
    ends: Vec<usize>,
}

impl OutputNames {
    fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.ends.len()).map(|k| {
            let start = if k == 0 { 0 } else { self.ends[k - 1] };
            &self.text[start..self.ends[k]]
        })
    }
}

/// Builds `BlobReference(name)` objects by calling the class's `tp_new` (`BlobName`'s, which
/// stores the name) without its `__init__`, which for a plain name does nothing more. Any
/// class deriving from `BlobName` is accepted.
struct BlobRefs<'py> {
    py: Python<'py>,
    cls: Bound<'py, PyType>,
    new: pyo3::ffi::newfunc,
}

impl<'py> BlobRefs<'py> {
    fn new(cls: &Bound<'py, PyType>) -> PyResult<Self> {
        let py = cls.py();
        if !cls.is_subclass_of::<crate::blob::BlobName>()? {
            return Err(PyTypeError::new_err(format!(
                "{} does not derive from BlobName",
                cls.name()?
            )));
        }
        // SAFETY: `cls` is a live type object; `PyType_GetSlot` returns its `tp_new` (or null).
        let slot = unsafe { pyo3::ffi::PyType_GetSlot(cls.as_type_ptr(), pyo3::ffi::Py_tp_new) };
        if slot.is_null() {
            return Err(PyTypeError::new_err(format!(
                "{} cannot be instantiated",
                cls.name()?
            )));
        }
        // SAFETY: the `Py_tp_new` slot holds a `newfunc`.
        let new: pyo3::ffi::newfunc = unsafe { std::mem::transmute(slot) };
        Ok(BlobRefs {
            py,
            cls: cls.clone(),
            new,
        })
    }

    fn make(&self, name: Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
        let args = PyTuple::new(self.py, [name])?;
        // SAFETY: calling the type's own `tp_new` with a live argument tuple and no keywords
        // is what `cls.__new__(cls, name)` does; the result is a new reference or null with an
        // exception set.
        unsafe {
            let ptr = (self.new)(self.cls.as_type_ptr(), args.as_ptr(), std::ptr::null_mut());
            Bound::from_owned_ptr_or_err(self.py, ptr)
        }
    }
}

/// The gradient map as a dict: names, and `slice_type(indices, values)` for sparse gradients
/// (`(indices, values)` tuples without `slice_type`); with `blob_ref`, every name (keys
/// included) is a `BlobReference` of that class.
fn grad_map_to_py<'py>(
    py: Python<'py>,
    grad_map: &GradMap,
    slice_type: Option<&Bound<'py, PyAny>>,
    blob_ref: Option<&Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    fill_dict(&d, grad_map, slice_type, blob_ref)?;
    Ok(d)
}

/// Sets the entries of [`grad_map_to_py`]'s dict in `d` (with the dict's own storage
/// functions: a dict subclass's methods are not called).
fn fill_dict<'py>(
    d: &Bound<'py, PyDict>,
    grad_map: &GradMap,
    slice_type: Option<&Bound<'py, PyAny>>,
    blob_ref: Option<&Bound<'py, PyType>>,
) -> PyResult<()> {
    let py = d.py();
    let refs = blob_ref.map(BlobRefs::new).transpose()?;
    let name = |n: &str| -> PyResult<Bound<'py, PyAny>> {
        let s = PyString::new(py, n);
        match &refs {
            Some(r) => r.make(s),
            None => Ok(s.into_any()),
        }
    };
    for (b, g) in grad_map.iter() {
        let key = name(b)?;
        let value = match g {
            GradName::None => py.None().into_bound(py),
            GradName::Dense(n) => name(n)?,
            GradName::Sparse(indices, values) => {
                let (i, v) = (name(indices)?, name(values)?);
                match slice_type {
                    Some(t) => t.call1((i, v))?,
                    None => PyTuple::new(py, [i, v])?.into_any(),
                }
            }
        };
        d.set_item(key, value)?;
    }
    Ok(())
}

/// The backward pass of serialized forward ops: `(serialized NetDef of the gradient ops,
/// {blob: gradient}, IR state or None)`.
#[pyfunction]
#[pyo3(signature = (ops, ys, functions=Vec::new(), adapter=None, next_net_name=None,
                    name_scope=String::new(), device_scope=None, with_state=false,
                    slice_type=None, blob_ref=None))]
#[allow(clippy::too_many_arguments)]
fn backward_pass<'py>(
    py: Python<'py>,
    ops: Vec<PyBackedBytes>,
    ys: Vec<(String, Bound<'py, PyAny>)>,
    functions: Vec<(String, Py<PyAny>)>,
    adapter: Option<Py<PyAny>>,
    next_net_name: Option<Py<PyAny>>,
    name_scope: String,
    device_scope: Option<PyBackedBytes>,
    with_state: bool,
    slice_type: Option<Bound<'py, PyAny>>,
    blob_ref: Option<Bound<'py, PyType>>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyDict>, Bound<'py, PyAny>)> {
    guard("backward_pass", || {
        let ys = ys_from_py(&ys)?;
        let s = setup(
            py,
            functions,
            adapter,
            next_net_name,
            name_scope,
            device_scope,
        )?;
        let (bytes, grad_map, state, _) = run_backward(
            py,
            "backward_pass",
            Forward::Ops(ops),
            ys,
            s,
            with_state,
            false,
        )?;
        let state = match state {
            Some(st) => state_to_py(py, st)?,
            None => py.None().into_bound(py),
        };
        Ok((
            PyBytes::new(py, &bytes),
            grad_map_to_py(py, &grad_map, slice_type.as_ref(), blob_ref.as_ref())?,
            state,
        ))
    })
}

/// The backward pass of the ops of a serialized NetDef from `skip` on: `(serialized NetDef
/// holding only the gradient ops, {blob: gradient})`. With `blob_ref`, the names of the map are
/// `BlobReference`s of that class. With `outputs`, the output names of the gradient ops: a set
/// has every one added to it; a list has them appended as one `(names, ends)` pair (the names
/// concatenated, and where each ends, see [`add_names`]), for a set to take later. With
/// `lazy`, the map comes back as a [`GradientMap`] holding it natively, with the slice type
/// and reference class, for its `fill` to set the entries in a dict when they are first
/// needed.
#[pyfunction]
#[pyo3(signature = (net, skip, ys, functions=Vec::new(), adapter=None, next_net_name=None,
                    name_scope=String::new(), device_scope=None, slice_type=None,
                    blob_ref=None, outputs=None, lazy=false))]
#[allow(clippy::too_many_arguments)]
fn backward_pass_net<'py>(
    py: Python<'py>,
    net: PyBackedBytes,
    skip: usize,
    ys: Vec<(String, Bound<'py, PyAny>)>,
    functions: Vec<(String, Py<PyAny>)>,
    adapter: Option<Py<PyAny>>,
    next_net_name: Option<Py<PyAny>>,
    name_scope: String,
    device_scope: Option<PyBackedBytes>,
    slice_type: Option<Bound<'py, PyAny>>,
    blob_ref: Option<Bound<'py, PyType>>,
    outputs: Option<Bound<'py, PyAny>>,
    lazy: bool,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyAny>)> {
    guard("backward_pass_net", || {
        let ys = ys_from_py(&ys)?;
        let s = setup(
            py,
            functions,
            adapter,
            next_net_name,
            name_scope,
            device_scope,
        )?;
        let with_outputs = outputs.is_some();
        let (bytes, grad_map, _, names) = run_backward(
            py,
            "backward_pass_net",
            Forward::Net(net, skip),
            ys,
            s,
            false,
            with_outputs,
        )?;
        if let (Some(target), Some(names)) = (&outputs, &names) {
            if let Ok(set) = target.cast::<PySet>() {
                for name in names.iter() {
                    set.add(PyString::new(py, name))?;
                }
            } else if let Ok(list) = target.cast::<PyList>() {
                let ends: Vec<u8> = names
                    .ends
                    .iter()
                    .flat_map(|&e| (e as u64).to_le_bytes())
                    .collect();
                list.append((PyString::new(py, &names.text), PyBytes::new(py, &ends)))?;
            } else {
                return Err(PyTypeError::new_err(format!(
                    "outputs must be a set or a list, not {}",
                    target.get_type().name()?
                )));
            }
        }
        let map = if lazy {
            let held = GradientMap {
                map: grad_map,
                slice_type: slice_type.map(Bound::unbind),
                blob_ref: blob_ref.map(Bound::unbind),
            };
            Bound::new(py, held)?.into_any()
        } else {
            grad_map_to_py(py, &grad_map, slice_type.as_ref(), blob_ref.as_ref())?.into_any()
        };
        Ok((PyBytes::new(py, &bytes), map))
    })
}

/// The gradient of one serialized operator: `(serialized NetDef of the gradient ops, input
/// gradients)`.
#[pyfunction]
#[pyo3(signature = (op, g_output, functions=Vec::new(), adapter=None, next_net_name=None,
                    name_scope=String::new(), device_scope=None))]
#[allow(clippy::too_many_arguments)]
fn gradient_for_op<'py>(
    py: Python<'py>,
    op: PyBackedBytes,
    g_output: Vec<Bound<'py, PyAny>>,
    functions: Vec<(String, Py<PyAny>)>,
    adapter: Option<Py<PyAny>>,
    next_net_name: Option<Py<PyAny>>,
    name_scope: String,
    device_scope: Option<PyBackedBytes>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyList>)> {
    guard("gradient_for_op", || {
        let g_output = g_output
            .iter()
            .map(grad_from_py)
            .collect::<PyResult<Vec<_>>>()?;
        let mut s = setup(
            py,
            functions,
            adapter,
            next_net_name,
            name_scope,
            device_scope,
        )?;
        let result = detach_guarded(
            py,
            "gradient_for_op",
            || -> ferrocaffe::Result<(Vec<u8>, Vec<GradRef>)> {
                let op = proto::decode::<OperatorDef>(&op)?;
                let mut cx = GradientContext {
                    registry: &s.registry,
                    net_names: s.names.as_mut(),
                    options: &s.options,
                };
                let out = core_gradient_for_op(&op, &g_output, &mut cx)?;
                Ok((net_bytes(out.ops), out.input_grads))
            },
        );
        let (bytes, g_input) = result.py()?;
        Ok((PyBytes::new(py, &bytes), grads_to_py(py, &g_input)?))
    })
}

/// The best time in seconds, over `repeat` runs, of the Rust side alone of
/// `backward_pass_net(net, skip, ys)` (the native backward pass from the serialized net to the
/// serialized gradient ops and the gradient map, no Python object made), with the built-in
/// makers and no scopes: what `benchmarks/bench_gradients.py` prints beside the Python API.
#[pyfunction]
#[pyo3(signature = (net, skip, ys, repeat=1))]
fn time_backward_pass_net(
    py: Python<'_>,
    net: PyBackedBytes,
    skip: usize,
    ys: Vec<String>,
    repeat: usize,
) -> PyResult<f64> {
    guard("time_backward_pass_net", || {
        let ys: Vec<(String, GradRef)> = ys.into_iter().map(|y| (y, GradRef::None)).collect();
        let registry = Registry::layered(Registry::builtin());
        let options = BackwardOptions::default();
        let best = detach_guarded(
            py,
            "time_backward_pass_net",
            || -> ferrocaffe::Result<f64> {
                let mut best = f64::INFINITY;
                for _ in 0..repeat.max(1) {
                    let mut names = UsedNetNames::new();
                    let mut cx = GradientContext {
                        registry: &registry,
                        net_names: &mut names,
                        options: &options,
                    };
                    let t = std::time::Instant::now();
                    let out = backward_pass_net_bytes(&net, skip, &ys, &mut cx, Extras::default())?;
                    best = best.min(t.elapsed().as_secs_f64());
                    drop(std::hint::black_box(out));
                }
                Ok(best)
            },
        );
        best.py()
    })
}

/// Adds to `set` the names of a `(names, ends)` pair that `backward_pass_net` appended to its
/// `outputs` list: `names` concatenated, `ends` the UTF-8 byte offset where each one ends
/// (unsigned 64-bit little-endian integers).
#[pyfunction]
fn add_names(set: &Bound<'_, PySet>, names: &str, ends: &[u8]) -> PyResult<()> {
    guard("add_names", || {
        if !ends.len().is_multiple_of(8) {
            return Err(PyTypeError::new_err("ends must hold 8-byte offsets"));
        }
        let py = set.py();
        let mut start = 0usize;
        for chunk in ends.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            let end = usize::try_from(u64::from_le_bytes(b)).unwrap_or(usize::MAX);
            let name = names.get(start..end).ok_or_else(|| {
                PyTypeError::new_err(format!("name end {end} is not within the names"))
            })?;
            set.add(PyString::new(py, name))?;
            start = end;
        }
        Ok(())
    })
}

/// The IR state after playing serialized forward ops; with `check`, an orphan `StopGradient`
/// output raises.
#[pyfunction]
#[pyo3(signature = (ops, check=true))]
fn ir_state<'py>(
    py: Python<'py>,
    ops: Vec<PyBackedBytes>,
    check: bool,
) -> PyResult<Bound<'py, PyAny>> {
    guard("ir_state", || {
        let state = detach_guarded(py, "ir_state", || -> ferrocaffe::Result<IrState> {
            let ops = decode_ops(&ops)?;
            let ir = Ir::unchecked(&ops);
            if check {
                ir.sanity_check()?;
            }
            Ok(ir.state())
        });
        state_to_py(py, state.py()?)
    })
}

/// A gradient map held natively, converted to a dict on demand by the same code as
/// `backward_pass_net`'s result: what `backward_pass_net(..., lazy=True)` returns (with its
/// slice type and reference class), and, made from names, the conversion alone for the result
/// floor that `benchmarks/bench_gradients.py` reports.
#[pyclass(module = "ferrocaffe._native")]
struct GradientMap {
    map: GradMap,
    slice_type: Option<Py<PyAny>>,
    blob_ref: Option<Py<PyType>>,
}

#[pymethods]
impl GradientMap {
    /// `entries`: `(blob, dense gradient)` name pairs.
    #[new]
    fn new(entries: Vec<(String, String)>) -> PyResult<Self> {
        guard_ok("GradientMap", || GradientMap {
            map: GradMap::from_entries(
                entries
                    .into_iter()
                    .map(|(b, g)| (b, GradRef::Dense(g)))
                    .collect(),
            ),
            slice_type: None,
            blob_ref: None,
        })
    }

    fn __len__(&self) -> PyResult<usize> {
        guard_ok("GradientMap.__len__", || self.map.len())
    }

    /// Sets the entries in the dict `d` (a dict subclass's own methods are not called), as
    /// `backward_pass_net` would have returned them.
    fn fill(&self, d: &Bound<'_, PyDict>) -> PyResult<()> {
        guard("GradientMap.fill", || {
            let py = d.py();
            let slice_type = self.slice_type.as_ref().map(|t| t.bind(py).clone());
            let blob_ref = self.blob_ref.as_ref().map(|t| t.bind(py).clone());
            fill_dict(d, &self.map, slice_type.as_ref(), blob_ref.as_ref())
        })
    }

    /// The dict `backward_pass_net` would return for this map.
    #[pyo3(signature = (slice_type=None, blob_ref=None))]
    fn to_dict<'py>(
        &self,
        py: Python<'py>,
        slice_type: Option<Bound<'py, PyAny>>,
        blob_ref: Option<Bound<'py, PyType>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        guard("GradientMap.to_dict", || {
            grad_map_to_py(py, &self.map, slice_type.as_ref(), blob_ref.as_ref())
        })
    }
}

/// Adds the autodiff functions and classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GradientMap>()?;
    m.add_function(wrap_pyfunction!(backward_pass, m)?)?;
    m.add_function(wrap_pyfunction!(backward_pass_net, m)?)?;
    m.add_function(wrap_pyfunction!(gradient_for_op, m)?)?;
    m.add_function(wrap_pyfunction!(ir_state, m)?)?;
    m.add_function(wrap_pyfunction!(add_names, m)?)?;
    m.add_function(wrap_pyfunction!(time_backward_pass_net, m)?)?;
    Ok(())
}
