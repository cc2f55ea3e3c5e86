//! The description of a DSL kernel the runtime needs.

/// How a binding is declared in WGSL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindingKind {
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
    /// `var<uniform>`.
    Uniform,
}

impl BindingKind {
    /// Parses the kind string the `#[kernel]` macro emits.
    pub fn from_dsl(kind: &str) -> Option<Self> {
        match kind {
            "read" => Some(Self::Read),
            "read_write" => Some(Self::ReadWrite),
            "uniform" => Some(Self::Uniform),
            _ => None,
        }
    }
}

/// A compute kernel: WGSL module, entry point, workgroup size and group-0 bindings.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Name shown in errors and statistics.
    pub name: &'static str,
    /// WGSL text.
    pub wgsl: &'static str,
    /// Entry point.
    pub entry_point: &'static str,
    /// Invocations per workgroup.
    pub workgroup_size: u32,
    /// `(binding, parameter, kind)` as the macro emits them.
    pub bindings: &'static [(u32, &'static str, &'static str)],
}

/// Builds a [`KernelSource`] from a `#[kernel]` module path, e.g.
/// `kernel_source!(hesper_shaders::add)`.
#[macro_export]
macro_rules! kernel_source {
    ($($m:ident)::+) => {
        $crate::KernelSource {
            name: stringify!($($m)::+),
            wgsl: $($m)::+::WGSL,
            entry_point: $($m)::+::ENTRY_POINT,
            workgroup_size: $($m)::+::WORKGROUP_SIZE,
            bindings: $($m)::+::BINDINGS,
        }
    };
}
