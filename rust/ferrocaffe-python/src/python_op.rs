//! The host side of Caffe2's `Python` and `PythonGradient` operators: the core runs them
//! through [`ferrocaffe::ops::host`]; this module installs a provider that hands each op
//! instance to a Python factory and calls the kernel it returns, taking the GIL only for that
//! call (every run releases it).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use ferrocaffe::ops::host::{self, HostCall, HostKernel, HostOpProvider, HOST_OP_TYPES};
use ferrocaffe::proto::{self, OperatorDef};
use ferrocaffe::workspace::Workspace as CoreWorkspace;
use ferrocaffe::Error;

use crate::errors::guard;
use crate::workspace::PyWorkspace;

/// An exception raised by Python code an operator called; the binding raises it again, as
/// Caffe2 did, when the run that met it returns to Python.
#[derive(Debug)]
pub struct PythonOpError {
    pub err: PyErr,
    text: String,
}

impl std::fmt::Display for PythonOpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for PythonOpError {}

/// `err` as a core error naming what the engine was doing; its text is taken now, with the
/// GIL held, so that formatting the error later never needs the GIL.
fn external(py: Python<'_>, context: String, err: PyErr) -> Error {
    let text = err
        .value(py)
        .str()
        .map(|s| {
            format!(
                "{}: {}",
                err.get_type(py)
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string()),
                s
            )
        })
        .unwrap_or_else(|_| "an exception that cannot be printed".into());
    Error::External {
        context,
        source: Box::new(PythonOpError { err, text }),
    }
}

/// The kernel of one op instance: a Python callable taking the workspace the op runs in.
struct PyKernel {
    run: Py<PyAny>,
}

impl HostKernel for PyKernel {
    fn run(&self, call: &HostCall<'_>) -> ferrocaffe::Result<()> {
        Python::attach(|py| {
            let ws = Bound::new(py, PyWorkspace::from_core(call.ws.clone()))
                .map_err(|e| external(py, "handing the workspace to Python".into(), e))?;
            self.run
                .call1(py, (ws,))
                .map(|_| ())
                .map_err(|e| external(py, format!("{} operator function", call.def.r#type()), e))
        })
    }
}

/// Builds kernels by calling `factory(op_type, serialized OperatorDef)`.
struct PyProvider {
    factory: Py<PyAny>,
}

impl HostOpProvider for PyProvider {
    fn instantiate(
        &self,
        def: &OperatorDef,
        _ws: &Arc<CoreWorkspace>,
    ) -> ferrocaffe::Result<Arc<dyn HostKernel>> {
        let bytes = proto::encode(def);
        Python::attach(|py| {
            let op_type = def.r#type();
            let run = self
                .factory
                .call1(py, (op_type, PyBytes::new(py, &bytes)))
                .map_err(|e| external(py, format!("creating the {op_type} operator"), e))?;
            Ok(Arc::new(PyKernel { run }) as Arc<dyn HostKernel>)
        })
    }
}

/// Installs `factory` as the maker of `Python` and `PythonGradient` kernels:
/// `factory(op_type, op_def_bytes)` returns a callable that the op calls with the
/// `_native.Workspace` it runs in, each time it runs.
#[pyfunction]
fn set_python_op_factory(factory: Py<PyAny>) -> PyResult<()> {
    guard("set_python_op_factory", || {
        Python::attach(|py| {
            for op_type in HOST_OP_TYPES {
                host::install_provider(
                    op_type,
                    Arc::new(PyProvider {
                        factory: factory.clone_ref(py),
                    }),
                );
            }
        });
        Ok(())
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_python_op_factory, m)?)
}
