//! The description of a DSL kernel the runtime needs, and its typed arguments.

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
    /// Optional WebGPU features it needs (`subgroups`, `f16`, `cooperative_matrix`).
    pub features: &'static [&'static str],
}

impl KernelSource {
    /// The `enable` directives a browser's WGSL compiler needs for this kernel besides those
    /// its text starts with (`f16`, `wgpu_cooperative_matrix`, which naga wants too). (naga,
    /// which compiles WGSL natively in wgpu 30, takes subgroup operations without a directive
    /// and rejects `enable subgroups;` as unimplemented, so native builds use no header.)
    pub fn web_header(&self) -> String {
        self.features
            .iter()
            .filter(|f| **f == "subgroups")
            .map(|f| format!("enable {f};\n"))
            .collect()
    }

    /// The device features it needs.
    pub fn device_features(&self) -> wgpu::Features {
        self.features
            .iter()
            .fold(wgpu::Features::empty(), |acc, f| match *f {
                "subgroups" => acc | wgpu::Features::SUBGROUP,
                "f16" => acc | wgpu::Features::SHADER_F16,
                "cooperative_matrix" => acc | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
                _ => acc,
            })
    }
}

/// The arguments of one launch of a kernel; the `#[kernel]` macro generates an `Args` struct
/// implementing this for every kernel (inputs `&GpuBuffer<T>`, outputs `&mut GpuBuffer<T>`,
/// uniforms by value).
pub trait KernelArgs {
    /// The kernel these arguments are for.
    const SOURCE: KernelSource;
    /// The storage buffers, in binding order.
    fn buffers(&self) -> Vec<crate::Bound>;
    /// The uniform fields (4 bytes each, little-endian) in declaration order; empty when the
    /// kernel has no uniforms.
    fn params(&self) -> Vec<[u8; 4]>;
    /// The values of the kernel's `#[comptime]` constants (WGSL `override`s), which specialise
    /// the pipeline and are part of its cache key.
    fn constants(&self) -> Vec<(&'static str, f64)>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_give_the_web_header_and_device_features() {
        let k = KernelSource {
            name: "k",
            wgsl: "",
            entry_point: "main",
            workgroup_size: 1,
            bindings: &[],
            features: &["subgroups"],
        };
        assert_eq!(k.web_header(), "enable subgroups;\n");
        assert_eq!(k.device_features(), wgpu::Features::SUBGROUP);
        // Halves and matrix cores are enabled by the kernel's text itself.
        let coop = KernelSource {
            features: &["subgroups", "f16", "cooperative_matrix"],
            ..k
        };
        assert_eq!(coop.web_header(), "enable subgroups;\n");
        assert_eq!(
            coop.device_features(),
            wgpu::Features::SUBGROUP
                | wgpu::Features::SHADER_F16
                | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        );
        let plain = KernelSource { features: &[], ..k };
        assert_eq!(plain.web_header(), "");
        assert!(plain.device_features().is_empty());
    }
}
