//! The operator registry: factories keyed by (op type, device type, engine).
//!
//! Lookup tries each engine named in the op's `engine` field (comma separated, in order), then
//! the default engine `""`. CPU factories also serve ops whose device type has no kernel of its
//! own only when the device is CPU-like (CPU, MKLDNN, IDEEP); a CUDA op without a CUDA kernel is
//! an error. At creation the op is checked against its schema (`crate::schema`), when it has one.

use std::collections::HashMap;
use std::sync::Arc;

use super::operator::{OpInit, Operator};
use crate::device::DeviceType;
use crate::error::{Error, Result};
use crate::schema;

/// Builds an operator instance from its definition.
pub type Factory = fn(&OpInit<'_>) -> Result<Box<dyn Operator>>;

/// Factories by (type, device, engine), optionally layered over a parent registry: a lookup
/// that finds no factory for an op type here falls through to the parent (as the gradient
/// registry does), so a workspace can hold its own operators over the built-in ones.
#[derive(Default)]
pub struct Registry {
    map: HashMap<String, HashMap<(DeviceType, String), Factory>>,
    parent: Option<Arc<Registry>>,
    /// Keys registered more than once, in order (the built-in registry has none: a test checks
    /// it, as a second registration silently replaces the first).
    replaced: Vec<(String, DeviceType, String)>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose lookups fall through to `parent` for op types it lacks.
    pub fn layered(parent: Arc<Registry>) -> Self {
        Registry {
            parent: Some(parent),
            ..Registry::default()
        }
    }

    /// Registers `factory` for `op_type` on `device` with `engine` (`""` = default engine).
    /// A later registration of the same key replaces the earlier one.
    pub fn register(&mut self, op_type: &str, device: DeviceType, engine: &str, factory: Factory) {
        let old = self
            .map
            .entry(op_type.to_string())
            .or_default()
            .insert((device, engine.to_string()), factory);
        if old.is_some() {
            self.replaced
                .push((op_type.to_string(), device, engine.to_string()));
        }
    }

    /// The (op type, device, engine) keys registered more than once, in order.
    pub fn replaced(&self) -> &[(String, DeviceType, String)] {
        &self.replaced
    }

    /// Registers a default-engine CPU factory.
    pub fn cpu(&mut self, op_type: &str, factory: Factory) {
        self.register(op_type, DeviceType::Cpu, "", factory);
    }

    /// Registers one default-engine CPU factory under several op types.
    pub fn cpu_many(&mut self, op_types: &[&str], factory: Factory) {
        for t in op_types {
            self.cpu(t, factory);
        }
    }

    /// The factory for (type, device, engine list), with engine and CPU-like fallbacks.
    pub fn lookup(&self, op_type: &str, device: DeviceType, engine: &str) -> Option<Factory> {
        let Some(by_key) = self.map.get(op_type) else {
            return self.parent.as_ref()?.lookup(op_type, device, engine);
        };
        let fallback = [device, DeviceType::Cpu];
        let devices: &[DeviceType] = if device.runs_cpu_kernels() && device != DeviceType::Cpu {
            &fallback
        } else {
            &fallback[..1]
        };
        for &d in devices {
            for e in engine.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if let Some(f) = by_key.get(&(d, e.to_string())) {
                    return Some(*f);
                }
            }
            if let Some(f) = by_key.get(&(d, String::new())) {
                return Some(*f);
            }
        }
        None
    }

    /// Whether any kernel is registered for `op_type` (here or in a parent).
    pub fn has_type(&self, op_type: &str) -> bool {
        self.map.contains_key(op_type) || self.parent.as_ref().is_some_and(|p| p.has_type(op_type))
    }

    /// Every op type with a kernel (here or in a parent), sorted.
    pub fn types(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.map.keys().map(String::as_str).collect();
        if let Some(p) = &self.parent {
            v.extend(p.types());
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Checks the op against its schema and instantiates it.
    pub fn create(&self, init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
        self.resolve(init.def)?(init)
    }

    /// The factory for `def`, after checking `def` against its schema.
    pub fn resolve(&self, def: &crate::proto::OperatorDef) -> Result<Factory> {
        let op_type = def.r#type();
        let dev = DeviceType::of_option(def.device_option.as_ref());
        let factory = self.lookup(op_type, dev, def.engine()).ok_or_else(|| {
            Error::Device(format!(
                "Cannot create operator of type '{op_type}' on the device '{}'. Verify that implementation for the corresponding device exist.",
                dev.name()
            ))
        })?;
        if let Some(s) = schema::lookup(op_type) {
            s.verify(def).map_err(|e| {
                Error::Schema(format!("Operator def did not pass schema checking: {e}"))
            })?;
        }
        Ok(factory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::operator::{FnOp, OpContext};
    use crate::proto::{DeviceOption, OperatorDef};
    use crate::workspace::Workspace;

    fn noop(_: &OpInit<'_>) -> Result<Box<dyn Operator>> {
        Ok(Box::new(FnOp(|_: &mut OpContext<'_>| Ok(()))))
    }

    fn failing(init: &OpInit<'_>) -> Result<Box<dyn Operator>> {
        Err(init.err("engine X chosen"))
    }

    #[test]
    fn engine_falls_back_to_default() {
        let mut r = Registry::new();
        r.cpu("Relu", noop);
        r.register("Relu", DeviceType::Cpu, "X", failing);
        assert!(r.lookup("Relu", DeviceType::Cpu, "CUDNN").is_some());
        assert!(r.lookup("Relu", DeviceType::Cuda, "").is_none());
        assert!(r.lookup("Relu", DeviceType::Ideep, "").is_some());
        let ws = Workspace::new();
        let mut def = OperatorDef::new("Relu", ["x"], ["y"]);
        def.engine = Some("X".into());
        let e = r.create(&OpInit::new(&def, &ws)).err().unwrap().to_string();
        assert!(e.contains("engine X chosen"), "{e}");
        def.engine = Some("CUDNN".into());
        assert!(r.create(&OpInit::new(&def, &ws)).is_ok());
    }

    #[test]
    fn unknown_device_or_type_and_schema_errors() {
        let mut r = Registry::new();
        r.cpu("Relu", noop);
        let ws = Workspace::new();
        let mut def = OperatorDef::new("Relu", ["x"], ["y"]);
        def.device_option = Some(DeviceOption {
            device_type: Some(1),
            ..Default::default()
        });
        let e = r.create(&OpInit::new(&def, &ws)).err().unwrap().to_string();
        assert!(e.contains("'Relu' on the device 'CUDA'"), "{e}");
        let bad = OperatorDef::new("Relu", ["x", "z"], ["y"]);
        let e = r.create(&OpInit::new(&bad, &ws)).err().unwrap().to_string();
        assert!(e.contains("2 inputs given"), "{e}");
        assert_eq!(r.types(), vec!["Relu"]);
    }
}
