//! Compute pipelines cached by the SHA-256 of everything that defines them, found again by
//! the address of their kernel's static text.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::kernel::{BindingKind, KernelSource};
use crate::GpuError;

/// A compiled kernel: its pipeline and the layout its bind groups must follow.
pub struct Pipeline {
    /// The pipeline.
    pub pipeline: wgpu::ComputePipeline,
    /// Group 0's layout.
    pub layout: wgpu::BindGroupLayout,
    /// The kernel it was built from.
    pub source: KernelSource,
    /// Its cache key.
    pub key: [u8; 32],
}

/// Hits and misses of a [`PipelineCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a pipeline.
    pub hits: u64,
    /// Lookups that compiled one.
    pub misses: u64,
}

/// Pipelines keyed by SHA-256(WGSL ‖ entry point ‖ binding layout ‖ constants), and found
/// again without hashing the text: a kernel's WGSL, entry point and bindings are `'static`,
/// so their addresses name it for the life of the process (a lookup per dispatch hashed
/// kilobytes of WGSL before, several microseconds of host time each).
#[derive(Default)]
pub struct PipelineCache {
    pipelines: HashMap<[u8; 32], Arc<Pipeline>>,
    by_address: HashMap<SourceAddress, Vec<Specialised>>,
    stats: CacheStats,
}

/// Where a kernel's static text lives: its WGSL (address, length), entry point and bindings.
#[derive(Hash, PartialEq, Eq)]
struct SourceAddress([usize; 4]);

impl SourceAddress {
    fn of(k: &KernelSource) -> Self {
        Self([
            k.wgsl.as_ptr() as usize,
            k.wgsl.len(),
            k.entry_point.as_ptr() as usize,
            k.bindings.as_ptr() as usize,
        ])
    }
}

/// A pipeline of one kernel and the constants it was specialised with (names, value bits).
struct Specialised {
    constants: Vec<(String, u64)>,
    pipeline: Arc<Pipeline>,
}

impl Specialised {
    fn matches(&self, constants: &[(&str, f64)]) -> bool {
        self.constants.len() == constants.len()
            && self
                .constants
                .iter()
                .zip(constants)
                .all(|((name, bits), (n, v))| name == n && *bits == v.to_bits())
    }
}

/// The cache key of `k` specialised with `constants`: SHA-256 of the WGSL, entry point,
/// binding layout and constant values.
pub fn cache_key(k: &KernelSource, constants: &[(&str, f64)]) -> Result<[u8; 32], GpuError> {
    let mut h = Sha256::new();
    h.update(k.wgsl.as_bytes());
    h.update([0]);
    h.update(k.entry_point.as_bytes());
    h.update([0]);
    for &(binding, _, kind) in k.bindings {
        let kind = BindingKind::from_dsl(kind).ok_or_else(|| GpuError::Kernel {
            kernel: k.name,
            why: format!("unknown binding kind {kind:?}"),
        })?;
        h.update(binding.to_le_bytes());
        h.update([kind as u8]);
    }
    for (name, value) in constants {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(value.to_bits().to_le_bytes());
    }
    Ok(h.finalize().into())
}

impl PipelineCache {
    /// The pipeline of `k`, compiled on first use.
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        k: &KernelSource,
        constants: &[(&str, f64)],
    ) -> Result<Arc<Pipeline>, GpuError> {
        let address = SourceAddress::of(k);
        if let Some(found) = self
            .by_address
            .get(&address)
            .and_then(|list| list.iter().find(|s| s.matches(constants)))
        {
            self.stats.hits += 1;
            return Ok(found.pipeline.clone());
        }
        let key = cache_key(k, constants)?;
        let pipeline = match self.pipelines.get(&key) {
            Some(p) => {
                self.stats.hits += 1;
                p.clone()
            }
            None => {
                self.stats.misses += 1;
                let p = Arc::new(compile(device, k, constants, key)?);
                self.pipelines.insert(key, p.clone());
                p
            }
        };
        self.by_address
            .entry(address)
            .or_default()
            .push(Specialised {
                constants: constants
                    .iter()
                    .map(|(name, value)| (name.to_string(), value.to_bits()))
                    .collect(),
                pipeline: pipeline.clone(),
            });
        Ok(pipeline)
    }

    /// Hit and miss counts so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

fn compile(
    device: &wgpu::Device,
    k: &KernelSource,
    constants: &[(&str, f64)],
    key: [u8; 32],
) -> Result<Pipeline, GpuError> {
    let entries = k
        .bindings
        .iter()
        .map(|&(binding, _, kind)| {
            let ty = match BindingKind::from_dsl(kind) {
                Some(BindingKind::Read) => wgpu::BufferBindingType::Storage { read_only: true },
                Some(BindingKind::ReadWrite) => {
                    wgpu::BufferBindingType::Storage { read_only: false }
                }
                Some(BindingKind::Uniform) => wgpu::BufferBindingType::Uniform,
                None => {
                    return Err(GpuError::Kernel {
                        kernel: k.name,
                        why: format!("unknown binding kind {kind:?}"),
                    })
                }
            };
            Ok(wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty,
                    // Uniforms live in one persistent buffer; each dispatch selects its
                    // slice with a dynamic offset, so bind groups are reused across tokens.
                    has_dynamic_offset: ty == wgpu::BufferBindingType::Uniform,
                    min_binding_size: None,
                },
                count: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(k.name),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(k.name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    // A browser compiles the WGSL itself and wants the `enable` directives; natively naga
    // takes the text as it is.
    let source: std::borrow::Cow<str> = if cfg!(target_arch = "wasm32") {
        format!("{}{}", k.web_header(), k.wgsl).into()
    } else {
        k.wgsl.into()
    };
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(k.name),
        source: wgpu::ShaderSource::Wgsl(source),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(k.name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(k.entry_point),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants,
            ..Default::default()
        },
        cache: None,
    });
    Ok(Pipeline {
        pipeline,
        layout,
        source: *k,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: KernelSource = KernelSource {
        name: "k",
        wgsl: "override lanes: u32; @compute @workgroup_size(1) fn main() {}",
        entry_point: "main",
        workgroup_size: 1,
        bindings: &[(0, "x", "read"), (1, "params", "uniform")],
        features: &[],
    };

    #[test]
    fn the_key_covers_source_layout_and_constants() {
        let base = cache_key(&K, &[("lanes", 4.0)]).unwrap();
        assert_eq!(base, cache_key(&K, &[("lanes", 4.0)]).unwrap());
        assert_ne!(base, cache_key(&K, &[("lanes", 8.0)]).unwrap());
        assert_ne!(base, cache_key(&K, &[]).unwrap());
        let other_layout = KernelSource {
            bindings: &[(0, "x", "read_write"), (1, "params", "uniform")],
            ..K
        };
        assert_ne!(base, cache_key(&other_layout, &[("lanes", 4.0)]).unwrap());
        let bad = KernelSource {
            bindings: &[(0, "x", "texture")],
            ..K
        };
        assert!(cache_key(&bad, &[]).is_err());
    }
}
