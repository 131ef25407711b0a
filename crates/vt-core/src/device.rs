//! Device kinds and device identities.

use std::fmt;

/// The kind of device a backend drives. The registry is keyed by this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    Cpu,
    Cuda,
    Hip,
}

impl DeviceType {
    pub const ALL: [DeviceType; 3] = [DeviceType::Cpu, DeviceType::Cuda, DeviceType::Hip];

    pub const fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
            DeviceType::Hip => "hip",
        }
    }

    /// Parses `cpu`, `cuda` or `hip` (case-insensitive).
    pub fn parse(s: &str) -> Option<DeviceType> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Some(DeviceType::Cpu),
            "cuda" => Some(DeviceType::Cuda),
            "hip" | "rocm" => Some(DeviceType::Hip),
            _ => None,
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One device: its kind and its ordinal among the devices of that kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    pub kind: DeviceType,
    pub ordinal: usize,
}

impl Device {
    pub const CPU: Device = Device { kind: DeviceType::Cpu, ordinal: 0 };

    pub const fn new(kind: DeviceType, ordinal: usize) -> Device {
        Device { kind, ordinal }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.ordinal)
    }
}
