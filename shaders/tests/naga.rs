//! Every kernel's WGSL parses and validates in naga 30 — with all capabilities (native) and
//! with the set a browser guarantees (no subgroups, no `f16` type), and every `#[comptime]`
//! specialisation after substitution — and naga's reflection of the module agrees with the
//! binding table the macro generated.

use naga::valid::{Capabilities, ValidationFlags, Validator};
use naga::{AddressSpace, StorageAccess};

struct Kernel {
    name: &'static str,
    wgsl: &'static str,
    workgroup: u32,
    bindings: &'static [(u32, &'static str, &'static str)],
    features: &'static [&'static str],
}

macro_rules! kernels {
    ($($k:ident),*) => {
        vec![$(Kernel { name: stringify!($k), wgsl: hesper_shaders::$k::WGSL, workgroup: hesper_shaders::$k::WORKGROUP_SIZE, bindings: hesper_shaders::$k::BINDINGS, features: hesper_shaders::$k::FEATURES }),*]
    };
}

fn all() -> Vec<Kernel> {
    kernels!(
        add_assign,
        add_bias,
        add_qkv_bias,
        silu_mul,
        relu2_mul,
        gelu_mul,
        scale_assign,
        softcap_assign,
        interleave_rows,
        moe_combine,
        moe_route,
        moe_group,
        gate_grids,
        moe_combine_routed,
        biased_glu_by_id,
        rms_norm,
        rms_norm_sg,
        rms_norm_heads,
        rms_norm_quantize_i8_packed_sg,
        rms_norm_pack_f16_sg,
        rms_norm_add_norm_sg,
        rms_norm_quantize_q8_0_sg,
        rms_norm_quantize_q8k_sg,
        argmax_partial,
        argmax_final,
        take_top,
        rope_neox,
        rope_norm,
        kv_write,
        rope_neox_kv_write,
        rope_attention,
        kv_shift,
        landmark_update,
        quantize_i8,
        quantize_q8k,
        bitlinear_i2s,
        bitlinear_i2s_wide,
        bitlinear_i2s_dp4,
        bitlinear_i2s_dp4_wide,
        bitlinear_i2s_coop,
        bitlinear_i2s_coop_stand_in,
        matvec_q8_0_coop,
        matvec_q8_0_coop_stand_in,
        matvec_kq_coop,
        matvec_kq_coop_stand_in,
        bitlinear_tq_coop,
        bitlinear_tq_coop_stand_in,
        bitlinear_i2s_gemm,
        bitlinear_tq_gemm,
        matvec_kq_gemm,
        matvec_kq_gemm_id,
        matvec_q8_0_gemm,
        matvec_q8_0_gemm_id,
        matvec_f16_gemm,
        matvec_f16_gemm_id,
        matvec_f32_gemm,
        matvec_bf16_gemm,
        matvec_bf16_gemm_id,
        quantize_i8_packed,
        bitlinear_tq,
        bitlinear_tq_wide,
        matvec_f32,
        matvec_f32_wide,
        matvec_f16,
        matvec_f16_wide,
        matvec_f16_id,
        matvec_q8_0,
        matvec_q8_0_wide,
        matvec_q8_0_dp4,
        matvec_q8_0_dp4_wide,
        matvec_q8_0_id,
        matvec_q8_0_dp4_id,
        matvec_bf16,
        matvec_bf16_wide,
        matvec_bf16_id,
        matvec_kq,
        matvec_kq_wide,
        matvec_kq_id,
        quantize_q8_0,
        pack_f16,
        embed_f32,
        embed_f16,
        attention
    )
}

/// What every WebGPU implementation offers: naga's default set plus
/// `SHADER_FLOAT16_IN_FLOAT32` (`unpack2x16float` is core WGSL; naga
/// gates them only for old GL targets). No subgroups, no `f16` type.
fn web() -> Capabilities {
    Capabilities::default() | Capabilities::SHADER_FLOAT16_IN_FLOAT32
}

fn validate(k: &Kernel, caps: Capabilities) -> naga::Module {
    validate_with_info(k, caps).0
}

fn validate_with_info(k: &Kernel, caps: Capabilities) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(k.wgsl)
        .unwrap_or_else(|e| panic!("{}: {}\n{}", k.name, e.emit_to_string(k.wgsl), k.wgsl));
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}\n{}", k.name, e.emit_to_string(k.wgsl), k.wgsl));
    (module, info)
}

/// The values every `#[comptime]` constant is launched with (`lanes`: threads per matrix row,
/// a power of two up to the workgroup; `high`: a K-quant code's bits above its nibble).
fn specialisations(name: &str) -> Vec<f64> {
    match name {
        "lanes" => [1, 2, 4, 8, 16, 32, 64].map(f64::from).to_vec(),
        "high" => [0, 1, 2].map(f64::from).to_vec(),
        other => panic!("no specialisations listed for the constant {other}"),
    }
}

/// Every combination of the values of the constants `names` (one value each).
fn combinations(names: &[String]) -> Vec<naga::back::PipelineConstants> {
    names.iter().fold(vec![Default::default()], |sets, name| {
        sets.iter()
            .flat_map(|set| {
                specialisations(name).into_iter().map(move |value| {
                    let mut set: naga::back::PipelineConstants = set.clone();
                    set.insert(name.clone(), value);
                    set
                })
            })
            .collect()
    })
}

/// Each specialisation of `module` (every combination of its `#[comptime]` constants' values;
/// the module itself where it has none) as a backend compiles it: the values substituted, the
/// module re-validated, and SPIR-V (what Vulkan and lavapipe run) written from it.
fn spirv_of_each_specialisation(
    name: &str,
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
) -> Vec<Vec<u32>> {
    let names: Vec<String> = module
        .overrides
        .iter()
        .map(|(_, o)| o.name.clone().unwrap_or_default())
        .collect();
    combinations(&names)
        .into_iter()
        .map(|constants| {
            let (m, i) = naga::back::pipeline_constants::process_overrides(
                module,
                info,
                Some((naga::ShaderStage::Compute, "main")),
                &constants,
            )
            .unwrap_or_else(|e| panic!("{name} with {constants:?}: {e}"));
            naga::back::spv::write_vec(&m, &i, &Default::default(), None)
                .unwrap_or_else(|e| panic!("{name} with {constants:?}: {e}"))
        })
        .collect()
}

#[test]
fn every_kernel_and_specialisation_validates_native_and_web() {
    let mut specialised = 0;
    for k in all() {
        // A kernel that declares subgroups must need them (it fails without) and must validate
        // with them on the browser's set plus subgroups.
        // Halves are an optional feature of the browser too (`shader-f16`); matrix cores are
        // native only, so their kernels validate with every capability alone.
        let halves = if k.features.contains(&"f16") {
            Capabilities::SHADER_FLOAT16
        } else {
            Capabilities::empty()
        };
        let web = if k.features.contains(&"subgroups") {
            let module = naga::front::wgsl::parse_str(k.wgsl).expect("parses");
            assert!(
                Validator::new(ValidationFlags::all(), web())
                    .validate(&module)
                    .is_err(),
                "{} declares subgroups but validates without them",
                k.name
            );
            web() | Capabilities::SUBGROUP | halves
        } else {
            web() | halves
        };
        let sets = if k.features.contains(&"cooperative_matrix") {
            vec![Capabilities::all()]
        } else {
            vec![Capabilities::all(), web]
        };
        for caps in sets {
            let (module, info) = validate_with_info(&k, caps);
            if !module.overrides.is_empty() {
                specialised += spirv_of_each_specialisation(k.name, &module, &info).len();
            }
        }
    }
    // Eight matrix kernels, each in its decode and wide instance (Q8_0 also in both of its
    // dot4I8Packed ones), and the `_id` instances of F16, BF16, Q8_0 (both) and the K-quants,
    // × seven lane counts (the K-quant ones × three code widths) × two capability sets; the
    // K-quants' tiled kernel and its `_id` instance (lanes a uniform) × three code widths × two
    // capability sets; their matrix-core kernel × three code widths on the native set, and its
    // stand-in on both.
    assert_eq!(
        specialised,
        ((7 + 3 + 1) * 2 + 4 + 3) * 7 * 2 + 2 * 3 * 2 + 3 + 3 * 2
    );
}

/// The matrix-core kernels need the capability (they fail without it) and SPIR-V is written
/// for them, as a Vulkan device with `VK_KHR_cooperative_matrix` takes it; their stand-ins
/// need halves and subgroups only, and no matrix operation is left in them.
#[test]
fn matrix_core_kernels_need_the_capability_and_their_stand_ins_do_not() {
    for (k, stand_in) in [
        (
            hesper_shaders::bitlinear_i2s_coop::WGSL,
            hesper_shaders::bitlinear_i2s_coop_stand_in::WGSL,
        ),
        (
            hesper_shaders::matvec_q8_0_coop::WGSL,
            hesper_shaders::matvec_q8_0_coop_stand_in::WGSL,
        ),
        (
            hesper_shaders::matvec_kq_coop::WGSL,
            hesper_shaders::matvec_kq_coop_stand_in::WGSL,
        ),
        (
            hesper_shaders::bitlinear_tq_coop::WGSL,
            hesper_shaders::bitlinear_tq_coop_stand_in::WGSL,
        ),
    ] {
        let module = naga::front::wgsl::parse_str(k).expect("parses");
        let without = Capabilities::all() - Capabilities::COOPERATIVE_MATRIX;
        assert!(Validator::new(ValidationFlags::all(), without)
            .validate(&module)
            .is_err());
        let info = Validator::new(ValidationFlags::all(), Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}\n{k}", e.emit_to_string(k)));
        // Each specialisation (the K-quant kernel's code widths) as a backend compiles it.
        for spirv in spirv_of_each_specialisation("a matrix-core kernel", &module, &info) {
            // OpCooperativeMatrixMulAddKHR (4459) is in the module.
            assert!(
                spirv.iter().any(|w| w & 0xffff == 4459 && w >> 16 >= 6),
                "no multiply-add in the SPIR-V"
            );
        }
        let plain = naga::front::wgsl::parse_str(stand_in).expect("parses");
        let caps = web() | Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16;
        Validator::new(ValidationFlags::all(), caps)
            .validate(&plain)
            .unwrap_or_else(|e| panic!("{}\n{stand_in}", e.emit_to_string(stand_in)));
        assert!(!stand_in.contains("coop_mat") && !stand_in.contains("cooperative"));
    }
}

#[test]
fn reflection_matches_the_generated_binding_table() {
    for k in all() {
        let module = validate(&k, Capabilities::all());
        let ep = module
            .entry_points
            .iter()
            .find(|e| e.name == "main")
            .unwrap_or_else(|| panic!("{}: no main", k.name));
        assert_eq!(ep.workgroup_size, [k.workgroup, 1, 1], "{}", k.name);
        let mut found: Vec<(u32, String, &str)> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                let b = g.binding.as_ref()?;
                assert_eq!(b.group, 0, "{}", k.name);
                let kind = match g.space {
                    AddressSpace::Storage { access } if access.contains(StorageAccess::STORE) => {
                        "read_write"
                    }
                    AddressSpace::Storage { .. } => "read",
                    AddressSpace::Uniform => "uniform",
                    other => panic!("{}: unexpected address space {other:?}", k.name),
                };
                Some((b.binding, g.name.clone().unwrap_or_default(), kind))
            })
            .collect();
        found.sort();
        let expected: Vec<(u32, String, &str)> = k
            .bindings
            .iter()
            .map(|&(b, n, kind)| (b, n.to_string(), kind))
            .collect();
        assert_eq!(found, expected, "{}", k.name);
    }
}

#[test]
fn typed_grids_follow_the_workgroup_size() {
    assert_eq!(hesper_shaders::add_assign::grid_for(257), [2, 1, 1]);
    assert_eq!(hesper_shaders::rope_neox::grid_for(257), [5, 1, 1]);
    assert_eq!(hesper_shaders::add_assign::grid_for(0), [1, 1, 1]);
}

#[test]
fn workgroup_memory_is_declared_and_counted() {
    assert_eq!(hesper_shaders::rms_norm::SHARED_BYTES, 1024);
    assert_eq!(hesper_shaders::argmax_partial::SHARED_BYTES, 2048);
    assert!(hesper_shaders::rms_norm::WGSL.contains("var<workgroup> acc: array<f32, 256>;"));
    assert!(hesper_shaders::rms_norm::WGSL.contains("params.eps"));
}

#[test]
fn a_broken_module_is_rejected() {
    // The checks have teeth: an f16 module fails without SHADER_FLOAT16.
    let k = Kernel {
        name: "f16",
        wgsl: "enable f16;\n@compute @workgroup_size(1) fn main() { let x: f16 = 1.0h; }",
        workgroup: 1,
        bindings: &[],
        features: &[],
    };
    let module = naga::front::wgsl::parse_str(k.wgsl).expect("parses");
    assert!(Validator::new(ValidationFlags::all(), web())
        .validate(&module)
        .is_err());
}

#[test]
fn add_assign_emits_readable_wgsl() {
    let expected = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
struct Params {
    n: u32,
}
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    if i < params.n {
        x[i] = x[i] + y[i];
    }
}
";
    assert_eq!(hesper_shaders::add_assign::WGSL, expected);
}
