//! Devices: where an operator runs and where a tensor's memory lives.
//!
//! Two types, because Caffe2 has two notions:
//! - [`DeviceType`], the `caffe2.DeviceTypeProto` value of a `DeviceOption` (which kernel
//!   family an op asks for: CPU, CUDA, MKLDNN, IDEEP, HIP, ...);
//! - [`Device`], a place memory can live in and kernels can run on: the host, or one CUDA
//!   device by ordinal.
//!
//! Device memory is reached through [`DeviceMemory`], implemented by a device backend (none is
//! built into this crate yet). Host code cannot slice such memory: the typed accessors of
//! [`crate::tensor::Tensor`] refuse a tensor whose storage is on a device, naming the device.
//!
//! A layer of its own, below the tensor and the runtime; it depends only on [`crate::proto`]
//! and [`crate::error`].

use std::fmt;

use crate::error::{Error, Result};
use crate::proto::DeviceOption;

/// The device type of a `DeviceOption` (`caffe2.DeviceTypeProto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    /// `PROTO_CPU` (0).
    Cpu,
    /// `PROTO_CUDA` (1).
    Cuda,
    /// `PROTO_MKLDNN` (2); runs CPU kernels here.
    Mkldnn,
    /// `PROTO_OPENGL` (3).
    OpenGl,
    /// `PROTO_OPENCL` (4).
    OpenCl,
    /// `PROTO_IDEEP` (5); runs CPU kernels here.
    Ideep,
    /// `PROTO_HIP` (6).
    Hip,
    /// `PROTO_FPGA` (7).
    Fpga,
    /// `PROTO_ORT` (8).
    Ort,
    /// `PROTO_XLA` (9).
    Xla,
    /// `PROTO_MLC` (10).
    Mlc,
    /// A number the proto does not define.
    Other(i32),
}

impl DeviceType {
    /// The type of a `device_type` field value.
    pub fn from_proto(v: i32) -> DeviceType {
        match v {
            0 => DeviceType::Cpu,
            1 => DeviceType::Cuda,
            2 => DeviceType::Mkldnn,
            3 => DeviceType::OpenGl,
            4 => DeviceType::OpenCl,
            5 => DeviceType::Ideep,
            6 => DeviceType::Hip,
            7 => DeviceType::Fpga,
            8 => DeviceType::Ort,
            9 => DeviceType::Xla,
            10 => DeviceType::Mlc,
            other => DeviceType::Other(other),
        }
    }

    /// The `device_type` field value.
    pub fn to_proto(self) -> i32 {
        match self {
            DeviceType::Cpu => 0,
            DeviceType::Cuda => 1,
            DeviceType::Mkldnn => 2,
            DeviceType::OpenGl => 3,
            DeviceType::OpenCl => 4,
            DeviceType::Ideep => 5,
            DeviceType::Hip => 6,
            DeviceType::Fpga => 7,
            DeviceType::Ort => 8,
            DeviceType::Xla => 9,
            DeviceType::Mlc => 10,
            DeviceType::Other(v) => v,
        }
    }

    /// The device type an op's (or net's) device option names; CPU when unset.
    pub fn of_option(option: Option<&DeviceOption>) -> DeviceType {
        DeviceType::from_proto(option.and_then(|d| d.device_type).unwrap_or(0))
    }

    /// Whether ops of this type run CPU kernels when they have none of their own (Caffe2
    /// falls back for MKLDNN and IDEEP, never for CUDA or HIP).
    pub fn runs_cpu_kernels(self) -> bool {
        matches!(
            self,
            DeviceType::Cpu | DeviceType::Mkldnn | DeviceType::Ideep
        )
    }

    /// Caffe2's name for the type, as its messages print it (`CPU`, `CUDA`, ...).
    pub fn name(self) -> String {
        match self {
            DeviceType::Cpu => "CPU".into(),
            DeviceType::Cuda => "CUDA".into(),
            DeviceType::Mkldnn => "MKLDNN".into(),
            DeviceType::OpenGl => "OPENGL".into(),
            DeviceType::OpenCl => "OPENCL".into(),
            DeviceType::Ideep => "IDEEP".into(),
            DeviceType::Hip => "HIP".into(),
            DeviceType::Fpga => "FPGA".into(),
            DeviceType::Ort => "ORT".into(),
            DeviceType::Xla => "XLA".into(),
            DeviceType::Mlc => "MLC".into(),
            DeviceType::Other(v) => format!("device type {v}"),
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A place where memory lives and kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory; CPU kernels (and the CPU-like device types).
    #[default]
    Cpu,
    /// The CUDA device of this ordinal.
    Cuda(u32),
}

impl Device {
    /// The device an op with this device option runs on: `Cuda(device_id)` for CUDA, the host
    /// for the CPU-like types.
    ///
    /// # Errors
    /// A device type that has no place to run here (OpenGL, HIP, ...), or a negative CUDA id.
    pub fn of_option(option: Option<&DeviceOption>) -> Result<Device> {
        let ty = DeviceType::of_option(option);
        match ty {
            t if t.runs_cpu_kernels() => Ok(Device::Cpu),
            DeviceType::Cuda => {
                let id = option.and_then(|d| d.device_id).unwrap_or(0);
                let id = u32::try_from(id).map_err(|_| {
                    Error::InvalidArgument(format!("invalid CUDA device id {id} in DeviceOption"))
                })?;
                Ok(Device::Cuda(id))
            }
            other => Err(Error::Device(format!(
                "device type {other} is not supported by this build"
            ))),
        }
    }

    /// Whether host code can read and write this device's memory directly.
    pub fn is_host(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// The device type ops placed here carry.
    pub fn device_type(self) -> DeviceType {
        match self {
            Device::Cpu => DeviceType::Cpu,
            Device::Cuda(_) => DeviceType::Cuda,
        }
    }

    /// The `DeviceOption` that places an op here.
    pub fn to_option(self) -> DeviceOption {
        match self {
            Device::Cpu => DeviceOption {
                device_type: Some(0),
                ..Default::default()
            },
            Device::Cuda(id) => DeviceOption {
                device_type: Some(1),
                device_id: i32::try_from(id).ok(),
                ..Default::default()
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("CPU"),
            Device::Cuda(id) => write!(f, "CUDA:{id}"),
        }
    }
}

/// Memory owned by a device backend, holding a tensor's elements in row-major order. The
/// tensor keeps it behind the same copy-on-write sharing as host memory; it is never written
/// through host code.
pub trait DeviceMemory: Send + Sync + 'static {
    /// The device the memory is on.
    fn device(&self) -> Device;
    /// Its size in bytes.
    fn byte_len(&self) -> usize;
    /// Copies `dst.len()` bytes starting `offset` bytes in to the host.
    ///
    /// # Errors
    /// A range outside the memory, or the backend's own failure.
    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// The memory as `Any`, so its backend can reach its own type (a device pointer).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The error host code gets for memory on another device.
pub fn not_on_host(device: Device, what: &str) -> Error {
    Error::Device(format!(
        "{what} lives on {device}: host code cannot read it; copy it to the CPU first \
         (CopyGPUToCPU, EnsureCPUOutput, or FetchBlob)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_types_round_trip_and_name_as_caffe2() {
        for v in -1..12 {
            assert_eq!(DeviceType::from_proto(v).to_proto(), v);
        }
        assert_eq!(DeviceType::from_proto(1).name(), "CUDA");
        assert_eq!(DeviceType::from_proto(42).name(), "device type 42");
        assert!(DeviceType::Ideep.runs_cpu_kernels() && !DeviceType::Cuda.runs_cpu_kernels());
    }

    #[test]
    fn device_of_an_option() {
        assert_eq!(Device::of_option(None).unwrap(), Device::Cpu);
        let cuda = DeviceOption {
            device_type: Some(1),
            device_id: Some(3),
            ..Default::default()
        };
        assert_eq!(Device::of_option(Some(&cuda)).unwrap(), Device::Cuda(3));
        assert_eq!(Device::Cuda(3).to_string(), "CUDA:3");
        assert_eq!(Device::Cuda(3).to_option(), cuda);
        let bad = DeviceOption {
            device_type: Some(1),
            device_id: Some(-2),
            ..Default::default()
        };
        assert!(Device::of_option(Some(&bad)).is_err());
        let hip = DeviceOption {
            device_type: Some(6),
            ..Default::default()
        };
        assert!(Device::of_option(Some(&hip))
            .unwrap_err()
            .to_string()
            .contains("HIP"));
    }
}
