//! `BlobName`: the native base of `core.BlobReference`, a blob name that hashes and compares
//! like its string (Caffe2's `BlobReference.__hash__`/`__eq__`) without a Python call, so that
//! dicts keyed by references (a gradient map holds thousands) are built and searched at the
//! speed of string keys. Everything else of `BlobReference` is Python.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

#[pyclass(subclass, module = "ferrocaffe._native")]
pub struct BlobName {
    name: Py<PyString>,
}

/// `b.decode("utf-8")`, with Python's error for bytes that are not UTF-8.
fn decoded<'py>(b: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyString>> {
    Ok(b.call_method1("decode", ("utf-8",))?
        .cast_into::<PyString>()?)
}

/// The name of `BlobReference(name)`: a str as is, bytes decoded as UTF-8, anything else
/// `str(name)` (a `BlobName` gives its own name).
fn name_of<'py>(name: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    if let Ok(s) = name.cast::<PyString>() {
        return Ok(s.clone());
    }
    if let Ok(b) = name.cast::<PyBytes>() {
        return decoded(b);
    }
    name.str()
}

#[pymethods]
impl BlobName {
    /// `BlobName(name, *args, **kwargs)`: the extra arguments belong to the subclass's
    /// `__init__` (`BlobReference(name, net)`).
    #[new]
    #[pyo3(signature = (name, *_args, **_kwargs))]
    fn new(
        name: &Bound<'_, PyAny>,
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(BlobName {
            name: name_of(name)?.unbind(),
        })
    }

    #[getter(_name)]
    fn get_name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    #[setter(_name)]
    fn set_name(&mut self, name: &Bound<'_, PyAny>) -> PyResult<()> {
        self.name = name_of(name)?.unbind();
        Ok(())
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self.name.bind(py).hash()
    }

    /// Equal to a str or bytes holding the same name, or to another reference with it;
    /// anything else is unequal.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = other.py();
        let mine = self.name.bind(py);
        if let Ok(s) = other.cast::<PyString>() {
            return mine.as_any().eq(s);
        }
        if let Ok(b) = other.cast::<PyBytes>() {
            return mine.as_any().eq(decoded(b)?);
        }
        if let Ok(r) = other.cast::<BlobName>() {
            return mine.as_any().eq(r.borrow().name.bind(py));
        }
        Ok(false)
    }

    fn __ne__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(!self.__eq__(other)?)
    }

    fn __str__(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    /// Copies and pickles rebuild the reference from its name (the instance dict, `_from_net`
    /// and `meta`, follows as state).
    fn __getnewargs__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, [self.name.bind(py)])
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlobName>()
}
