//! `#[kernel]`: a restricted Rust function → a WGSL compute shader plus its binding table.
//! See the crate README for the accepted subset.

mod coop;
mod ir;
mod lower;
mod signature;
mod twin;
mod wgsl;

use coop::Target;
use proc_macro::TokenStream;
use quote::{format_ident, quote};
use signature::ArgKind;
use syn::{parse_macro_input, ItemFn, LitInt, LitStr};

/// The largest workgroup WebGPU guarantees (`maxComputeInvocationsPerWorkgroup`).
const MAX_WORKGROUP: u32 = 256;
/// The workgroup memory WebGPU guarantees (`maxComputeWorkgroupStorageSize`).
const MAX_SHARED_BYTES: u32 = 16 * 1024;

/// Turns `fn name(..) { .. }` into `pub mod name { WGSL, ENTRY_POINT, WORKGROUP_SIZE, BINDINGS }`.
/// Turns `fn name(..) -> T { .. }` into `pub mod name { WGSL }`: a WGSL function template
/// kernels may call after naming it in `#[kernel(.., uses(name))]`. Parameters are scalars by
/// value, the kernel's buffers (`&[T]`, `&mut [T]`) and workgroup arrays (`&mut [T; N]`) by
/// reference; WGSL cannot pass those, so each kernel instantiates the helper with its own
/// arrays in their place (see `hesper_gpu::wgsl_text`), and a helper generic over their
/// element type (`<T: Scalar>`) serves arrays of any. A trailing expression is the result.
/// The entry point's built-ins (`gid()`, `lid()`, `subgroup_index()`, ..) must be passed in.
/// `#[kernel_fn(features(subgroups))]` lets a helper use subgroup operations; only kernels that
/// declare the feature may call it.
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = parse_macro_input!(item as ItemFn);
    match parse_helper_attr(attr.into()).and_then(|subgroups| expand_helper(&func, subgroups)) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What `#[kernel_fn(..)]` says: nothing, or `features(subgroups)` (whether it is said).
fn parse_helper_attr(attr: proc_macro2::TokenStream) -> syn::Result<bool> {
    let mut subgroups = false;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("features") {
            return meta.parse_nested_meta(|f| {
                if f.path.is_ident("subgroups") {
                    subgroups = true;
                    Ok(())
                } else {
                    Err(f.error("known features: subgroups"))
                }
            });
        }
        Err(meta.error("`#[kernel_fn]` takes only `features(subgroups)`"))
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(subgroups)
}

fn expand_helper(func: &ItemFn, subgroups: bool) -> syn::Result<proc_macro2::TokenStream> {
    let (sig, ret) = signature::Signature::parse_helper(func)?;
    let body = lower::Lowerer::for_helper(&sig, subgroups).block(&func.block)?;
    let name = &func.sig.ident;
    let wgsl = wgsl::helper(&sig.helper_params(), ret, &body);
    let wgsl = LitStr::new(&wgsl, name.span());
    let vis = &func.vis;
    let doc =
        format!("The `{name}` helper: its WGSL function, for kernels that list it in `uses(..)`.");
    let twin = twin::twin(func, true);
    Ok(quote! {
        #[doc = #doc]
        #vis mod #name {
            /// The WGSL function as a template: its name and its array parameters are filled
            /// in by each kernel that calls it (`hesper_gpu::wgsl_text`).
            pub const WGSL: &str = #wgsl;
            /// Whether it uses subgroup operations (a kernel that calls it must declare them).
            pub const SUBGROUPS: bool = #subgroups;
        }
        #twin
    })
}

#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = parse_macro_input!(item as ItemFn);
    match expand(attr.into(), &func) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The kernel and each instance its `also(..)` names: the same body under another name with
/// some of its constants changed, one module each.
fn expand(attr: proc_macro2::TokenStream, func: &ItemFn) -> syn::Result<proc_macro2::TokenStream> {
    let attr = parse_attr(attr)?;
    let mut out = expand_one(&attr, func)?;
    for (name, changed) in &attr.also {
        let mut consts = attr.consts.clone();
        for (c, v) in changed {
            let Some(slot) = consts.iter_mut().find(|(k, _)| k == c) else {
                return Err(syn::Error::new_spanned(
                    c,
                    format!("`{c}` is not among the kernel's `consts(..)`"),
                ));
            };
            slot.1 = *v;
        }
        let mut instance = func.clone();
        instance.sig.ident = name.clone();
        let attr = KernelAttr {
            consts,
            also: Vec::new(),
            ..attr.clone()
        };
        out.extend(expand_one(&attr, &instance)?);
    }
    Ok(out)
}

fn expand_one(attr: &KernelAttr, func: &ItemFn) -> syn::Result<proc_macro2::TokenStream> {
    let KernelAttr {
        uses,
        features,
        consts,
        ..
    } = attr.clone();
    let subgroups = features.iter().any(|f| f == "subgroups");
    let helper_names: Vec<String> = uses.iter().map(ToString::to_string).collect();
    let sig = signature::Signature::parse(func, &consts)?;
    let shared_bytes = sig.shared_bytes();
    if shared_bytes > MAX_SHARED_BYTES {
        return Err(syn::Error::new_spanned(
            &func.sig.inputs,
            format!(
                "workgroup memory is {shared_bytes} bytes; WebGPU guarantees {MAX_SHARED_BYTES}"
            ),
        ));
    }
    let coop = features.iter().any(|f| f == "cooperative_matrix");
    if sig.has_halves() && !coop {
        return Err(syn::Error::new_spanned(
            &func.sig.inputs,
            "`f16` workgroup arrays need `#[kernel(.., features(cooperative_matrix))]`",
        ));
    }
    let lowerer = lower::Lowerer::new(&sig, &helper_names, subgroups).with_cooperative_matrix(coop);
    let body = lowerer.block(&func.block)?;
    let name = &func.sig.ident;
    let mut out = kernel_module(
        attr,
        func,
        &sig,
        &lowerer,
        wgsl::block(&body, 1, Target::Native),
        String::new(),
        name,
        &features,
    )?;
    // A cooperative-matrix kernel's stand-in: the same body as a kernel of its own, runnable
    // without matrix cores (`coop.rs`).
    if coop {
        let stand_in_features = ["subgroups".to_string(), "f16".to_string()];
        out.extend(kernel_module(
            attr,
            func,
            &sig,
            &lowerer,
            wgsl::block(&body, 1, Target::StandIn),
            coop::stand_in_functions(&lowerer.coop_uses()),
            &format_ident!("{name}_stand_in"),
            &stand_in_features,
        )?);
    }
    Ok(out)
}

/// The module of one kernel: its WGSL (the entry point's printed `body`, then the functions
/// `after` it), the helper instances it calls, bindings, launch arguments and twin.
#[allow(clippy::too_many_arguments)]
fn kernel_module(
    attr: &KernelAttr,
    func: &ItemFn,
    sig: &signature::Signature,
    lowerer: &lower::Lowerer,
    body: String,
    after: String,
    name: &syn::Ident,
    features: &[String],
) -> syn::Result<proc_macro2::TokenStream> {
    let workgroup = attr.workgroup;
    let shared_bytes = sig.shared_bytes();
    let subgroups = features.iter().any(|f| f == "subgroups");
    // `enable` directives come first in the module, before any helper instance.
    let enables: String = features
        .iter()
        .filter_map(|f| match f.as_str() {
            "f16" => Some("enable f16;\n"),
            "cooperative_matrix" => Some("enable wgpu_cooperative_matrix;\n"),
            _ => None,
        })
        .collect();
    let subgroup_inputs = if subgroups {
        ", @builtin(subgroup_invocation_id) sg_invocation: u32, @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_id) sg_index: u32, @builtin(num_subgroups) sg_count: u32"
    } else {
        ""
    };
    let wgsl = format!("{}\n@compute @workgroup_size({workgroup})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>{subgroup_inputs}) {{\n{body}}}\n{after}", sig.declarations());
    let module = format_ident!("{}", name);
    let wgsl = LitStr::new(&wgsl, name.span());
    // With helpers, the module text is each instance of their templates followed by the
    // kernel's text, joined at compile time into one `&'static str`.
    let instances = lowerer.instances();
    // A helper that uses subgroups needs a kernel that declares them (its WGSL would not
    // compile otherwise): checked when the kernel's module is compiled.
    let feature_checks = instances.iter().map(|inst| {
        let helper = format_ident!("{}", inst.helper);
        let message = format!(
            "`{name}` calls `{}`, which uses subgroups: declare `#[kernel(.., features(subgroups))]`",
            inst.helper,
            name = func.sig.ident
        );
        quote! { const _: () = assert!(#subgroups || !super::#helper::SUBGROUPS, #message); }
    });
    let enables = LitStr::new(&enables, name.span());
    let wgsl_const = if instances.is_empty() {
        quote! { pub const WGSL: &str = ::std::concat!(#enables, #wgsl); }
    } else {
        let parts = instances.iter().map(|inst| {
            let helper = format_ident!("{}", inst.helper);
            let (name, args) = (&inst.name, &inst.args);
            quote! {
                &::hesper_gpu::wgsl_text::instance::<{
                    ::hesper_gpu::wgsl_text::instance_len(super::#helper::WGSL, #name, &[#(#args),*])
                }>(super::#helper::WGSL, #name, &[#(#args),*])
            }
        });
        quote! {
            pub const WGSL: &str = {
                const PARTS: &[&[u8]] = &[#enables.as_bytes(), #(#parts,)* #wgsl.as_bytes()];
                const BYTES: [u8; ::hesper_gpu::wgsl_text::total_len(PARTS)] =
                    ::hesper_gpu::wgsl_text::concat(PARTS);
                ::hesper_gpu::wgsl_text::text(&BYTES)
            };
        }
    };
    let bindings = sig
        .bindings()
        .into_iter()
        .map(|(binding, param, kind)| quote! { (#binding, #param, #kind) });
    let args = sig.launch_args();
    let fields = args.iter().map(|(name, ty, kind)| {
        let name = format_ident!("{}", name);
        let ty = format_ident!("{}", ty);
        match kind {
            ArgKind::Input => quote! { pub #name: &'a ::hesper_gpu::GpuBuffer<#ty> },
            ArgKind::Output => quote! { pub #name: &'a mut ::hesper_gpu::GpuBuffer<#ty> },
            ArgKind::Uniform | ArgKind::Comptime => quote! { pub #name: #ty },
        }
    });
    let buffers = args
        .iter()
        .filter(|a| matches!(a.2, ArgKind::Input | ArgKind::Output))
        .map(|(name, ..)| {
            let name = format_ident!("{}", name);
            quote! { self.#name.bound() }
        });
    let uniforms = args
        .iter()
        .filter(|a| a.2 == ArgKind::Uniform)
        .map(|(name, ..)| {
            let name = format_ident!("{}", name);
            quote! { self.#name.to_le_bytes() }
        });
    let name_str = name.to_string();
    let constants = args
        .iter()
        .filter(|a| a.2 == ArgKind::Comptime)
        .map(|(name, ..)| {
            let field = format_ident!("{}", name);
            quote! { (#name, f64::from(self.#field)) }
        });
    let vis = &func.vis;
    // The twin once, in the device's module (a stand-in has the same body).
    let twin = if name == &func.sig.ident {
        twin::twin(func, false)
    } else {
        quote! {}
    };
    let const_items = sig.constants().iter().map(|(c, v)| {
        let ident = format_ident!("{}", c);
        let doc = format!("The kernel's compile-time constant `{c}`.");
        quote! {
            #[doc = #doc]
            pub const #ident: u32 = #v;
        }
    });
    let doc =
        format!("The `{name}` kernel: WGSL source, entry point, workgroup size and bindings.");
    Ok(quote! {
        #[doc = #doc]
        #vis mod #module {
            /// The WGSL module.
            #wgsl_const
            #(#feature_checks)*
            /// Entry point name.
            pub const ENTRY_POINT: &str = "main";
            /// Invocations per workgroup (x; y and z are 1).
            pub const WORKGROUP_SIZE: u32 = #workgroup;
            /// `(binding, parameter, kind)` in group 0; kind is `read`, `read_write` or `uniform`.
            pub const BINDINGS: &[(u32, &str, &str)] = &[#(#bindings),*];
            /// Bytes of workgroup memory the kernel declares.
            pub const SHARED_BYTES: u32 = #shared_bytes;
            /// The grid covering `invocations` threads along x with this kernel's workgroup size
            /// (for kernels indexed by `gid()`), so host code never repeats the size.
            pub const fn grid_for(invocations: u32) -> [u32; 3] {
                let groups = invocations.div_ceil(WORKGROUP_SIZE);
                [if groups == 0 { 1 } else { groups }, 1, 1]
            }
            /// Optional WebGPU features the kernel needs (`subgroups`); the runtime runs it only
            /// on devices that have them and adds the `enable` header where the target wants one.
            pub const FEATURES: &[&str] = &[#(#features),*];
            #(#const_items)*
            #twin

            /// The arguments of one launch: inputs `&GpuBuffer<T>`, outputs
            /// `&mut GpuBuffer<T>` (so one buffer cannot be both), uniforms and compile-time
            /// constants by value.
            pub struct Args<'a> {
                #(#fields,)*
            }

            impl ::hesper_gpu::KernelArgs for Args<'_> {
                const SOURCE: ::hesper_gpu::KernelSource = ::hesper_gpu::KernelSource {
                    name: #name_str,
                    wgsl: WGSL,
                    entry_point: ENTRY_POINT,
                    workgroup_size: WORKGROUP_SIZE,
                    bindings: BINDINGS,
                    features: FEATURES,
                };
                fn buffers(&self) -> ::std::vec::Vec<::hesper_gpu::Bound> {
                    ::std::vec![#(#buffers),*]
                }
                fn params(&self) -> ::std::vec::Vec<[u8; 4]> {
                    ::std::vec![#(#uniforms),*]
                }
                fn constants(&self) -> ::std::vec::Vec<(&'static str, f64)> {
                    ::std::vec![#(#constants),*]
                }
            }
        }
    })
}

/// What `#[kernel(..)]` says besides the body.
#[derive(Clone)]
struct KernelAttr {
    workgroup: u32,
    uses: Vec<syn::Ident>,
    /// Optional WebGPU features the kernel needs (`subgroups`).
    features: Vec<String>,
    /// Values of the kernel's `const NAME: u32` generics.
    consts: Vec<(syn::Ident, u32)>,
    /// `also(name(NAME = v, ..), ..)`: further kernels of the same body, each under its own
    /// name with the constants it names changed.
    also: Vec<(syn::Ident, Vec<(syn::Ident, u32)>)>,
}

/// `NAME = v, ..` inside `consts(..)` or an instance of `also(..)`.
fn parse_consts(
    meta: &syn::meta::ParseNestedMeta,
    into: &mut Vec<(syn::Ident, u32)>,
) -> syn::Result<()> {
    meta.parse_nested_meta(|c| {
        let id = c
            .path
            .get_ident()
            .ok_or_else(|| c.error("name a `const` generic, e.g. `consts(TILE = 4)`"))?
            .clone();
        let lit: LitInt = c.value()?.parse()?;
        into.push((id, lit.base10_parse()?));
        Ok(())
    })
}

/// `workgroup = N`, the optional `uses(helper, ..)`, `features(subgroups)` and
/// `consts(NAME = v, ..)` and `also(name(NAME = v, ..), ..)`.
fn parse_attr(attr: proc_macro2::TokenStream) -> syn::Result<KernelAttr> {
    let mut size = None;
    let mut uses = Vec::new();
    let mut features = Vec::new();
    let mut consts = Vec::new();
    let mut also = Vec::new();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("consts") {
            return parse_consts(&meta, &mut consts);
        }
        if meta.path.is_ident("also") {
            return meta.parse_nested_meta(|instance| {
                let name = instance
                    .path
                    .get_ident()
                    .ok_or_else(|| {
                        instance.error("name the instance, e.g. `also(k_wide(TILE = 16))`")
                    })?
                    .clone();
                let mut changed = Vec::new();
                parse_consts(&instance, &mut changed)?;
                also.push((name, changed));
                Ok(())
            });
        }
        if meta.path.is_ident("features") {
            return meta.parse_nested_meta(|f| {
                if f.path.is_ident("subgroups") {
                    if !features.iter().any(|f| f == "subgroups") {
                        features.push("subgroups".to_string());
                    }
                    Ok(())
                } else if f.path.is_ident("cooperative_matrix") {
                    // Its kernels address subgroups and hold halves.
                    for implied in ["subgroups", "f16", "cooperative_matrix"] {
                        if !features.iter().any(|f| f == implied) {
                            features.push(implied.to_string());
                        }
                    }
                    Ok(())
                } else {
                    Err(f.error("known features: subgroups, cooperative_matrix"))
                }
            });
        }
        if meta.path.is_ident("uses") {
            return meta.parse_nested_meta(|helper| {
                let id = helper
                    .path
                    .get_ident()
                    .ok_or_else(|| helper.error("name a helper in scope, e.g. `uses(tree_sum)`"))?;
                uses.push(id.clone());
                Ok(())
            });
        }
        if meta.path.is_ident("workgroup") {
            let lit: LitInt = meta.value()?.parse()?;
            let n: u32 = lit.base10_parse()?;
            if n == 0 || n > MAX_WORKGROUP {
                return Err(syn::Error::new_spanned(
                    lit,
                    format!("workgroup size must be 1..={MAX_WORKGROUP}"),
                ));
            }
            size = Some(n);
            Ok(())
        } else {
            Err(meta.error(
                "expected `workgroup = N`, `uses(..)`, `features(..)`, `consts(..)` or `also(..)`",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    let workgroup = size.ok_or_else(|| {
        syn::Error::new(proc_macro2::Span::call_site(), "missing `workgroup = N`")
    })?;
    Ok(KernelAttr {
        workgroup,
        uses,
        features,
        consts,
        also,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: &str, item: &str) -> Result<String, String> {
        let func: ItemFn = syn::parse_str(item).map_err(|e| e.to_string())?;
        expand(attr.parse().map_err(|_| "attr".to_string())?, &func)
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn helpers_print_as_wgsl_functions() {
        let func: ItemFn =
            syn::parse_str("fn relu2(x: f32) -> f32 { let r = x.max(0.0); r * r }").unwrap();
        let out = expand_helper(&func, false).unwrap().to_string();
        // The name is a placeholder each kernel fills in (`hesper_gpu::wgsl_text::NAME`).
        assert!(out.contains(r"fn \u{2}(x: f32) -> f32"), "{out}");
        assert!(out.contains("return r * r;"), "{out}");
        // So are the arrays it is handed (`PARAM`, the index, `PARAM`).
        let arrays: ItemFn =
            syn::parse_str("fn f(a: &mut [f32; _], b: &[u32], t: u32) { a[t] = b.len() as f32; }")
                .unwrap();
        let out = expand_helper(&arrays, false).unwrap().to_string();
        assert!(out.contains(r"fn \u{2}(t: u32)"), "{out}");
        assert!(
            out.contains(r"\u{1}0\u{1}[t] = f32(arrayLength(&\u{1}1\u{1}))"),
            "{out}"
        );
        let uses_lid: ItemFn =
            syn::parse_str("fn f(acc: &mut [f32; 4]) { acc[lid()] = 1.0; }").unwrap();
        let err = expand_helper(&uses_lid, false).unwrap_err().to_string();
        assert!(err.contains("pass it in as a parameter"), "{err}");
        // A kernel calls only the helpers it lists.
        let k = "fn k(y: &mut [f32]) { y[0] = relu2(1.0); }";
        assert!(expand_str("workgroup = 1, uses(relu2)", k).is_ok());
        assert!(expand_str("workgroup = 1", k)
            .unwrap_err()
            .contains("helpers are listed in `uses(..)`"));
    }

    #[test]
    fn cooperative_matrix_kernels_print_natively_and_as_a_stand_in() {
        let k = "fn k(y: &mut [f32], #[shared] a: &mut [f16; 256], #[shared] b: &mut [f16; 256],
                      #[shared] c: &mut [f32; 256]) {
            a[lid()] = to_f16(1u32);
            b[lid()] = to_f16(2i32);
            barrier();
            let mut acc = coop_zero();
            acc = coop_multiply_add(coop_load_a_rows(a, 0u32, 16u32),
                                    coop_load_b_columns(b, 0u32, 16u32), acc);
            coop_store_columns(acc, c, 0u32, 16u32);
            barrier();
            y[lid()] = c[lid()];
        }";
        let out = expand_str("workgroup = 32, features(cooperative_matrix)", k).unwrap();
        // The device's module: the enables first, WGSL's built-ins, halves of two bytes.
        assert!(
            out.contains(r"enable f16;\nenable wgpu_cooperative_matrix;\n"),
            "{out}"
        );
        assert!(out.contains("var<workgroup> a: array<f16, 256>;"), "{out}");
        assert!(out.contains("a[lid.x] = f16(1u);"), "{out}");
        assert!(out.contains("var acc = coop_mat16x16<f32, C>();"), "{out}");
        assert!(
            out.contains("acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&a[0u], 16u), coopLoad<coop_mat16x16<f16, B>>(&b[0u], 16u), acc);"),
            "{out}"
        );
        assert!(out.contains("coopStore(acc, &c[0u], 16u);"), "{out}");
        assert!(
            out.contains("pub const SHARED_BYTES : u32 = 2048u32"),
            "{out}"
        );
        assert!(
            out.contains(
                r#"FEATURES : & [& str] = & ["subgroups" , "f16" , "cooperative_matrix"]"#
            ),
            "{out}"
        );
        // Its stand-in: a kernel of its own, with the operations as functions of its arrays.
        assert!(out.contains("mod k_stand_in"), "{out}");
        assert!(
            out.contains(r#"FEATURES : & [& str] = & ["subgroups" , "f16"]"#),
            "{out}"
        );
        assert!(out.contains("var acc = array<f32, 64>();"), "{out}");
        assert!(
            out.contains("acc = coop_stand_in_multiply_add(vec2<u32>(0u, 16u), vec2<u32>(0u, 16u), acc, sg_invocation, sg_size);"),
            "{out}"
        );
        assert!(
            out.contains("f32(a[coop_stand_in_row + coop_stand_in_k])"),
            "{out}"
        );
        assert!(
            out.contains("f32(b[coop_stand_in_column + coop_stand_in_k])"),
            "{out}"
        );
        assert!(
            out.contains("coop_stand_in_store_columns_c(acc, 0u, 16u, sg_invocation, sg_size);"),
            "{out}"
        );
        // Without the feature, neither halves nor matrices; operands from one array a role;
        // matrices live in workgroup arrays.
        let err = expand_str("workgroup = 32", k).unwrap_err();
        assert!(err.contains("features(cooperative_matrix)"), "{err}");
        let plain = "fn k(y: &mut [f32]) { y[0] = 1.0; let h = to_f16(1.0); }";
        let err = expand_str("workgroup = 32", plain).unwrap_err();
        assert!(err.contains("features(cooperative_matrix)"), "{err}");
        let two = k.replace("coop_load_b_columns(b,", "coop_load_b_columns(b, 0u32, 16u32), acc);\n acc = coop_multiply_add(coop_load_a_rows(b, 0u32, 16u32), coop_load_b_columns(b,");
        let err = expand_str("workgroup = 32, features(cooperative_matrix)", &two).unwrap_err();
        assert!(err.contains("loaded from two arrays"), "{err}");
        let from_buffer = k.replace("coop_store_columns(acc, c,", "coop_store_columns(acc, y,");
        let err =
            expand_str("workgroup = 32, features(cooperative_matrix)", &from_buffer).unwrap_err();
        assert!(err.contains("outside a workgroup array"), "{err}");
    }

    #[test]
    fn a_helper_uses_subgroups_only_when_it_declares_them() {
        let total: ItemFn = syn::parse_str(
            "fn total(part: f32, acc: &mut [f32; _], invocation: u32, index: u32) -> f32 {
                let sum = subgroup_add(part);
                if invocation == 0u32 { acc[index] = sum; }
                barrier();
                acc[0]
            }",
        )
        .unwrap();
        let out = expand_helper(&total, true).unwrap().to_string();
        assert!(out.contains("subgroupAdd(part)"), "{out}");
        assert!(out.contains("pub const SUBGROUPS : bool = true"), "{out}");
        let err = expand_helper(&total, false).unwrap_err().to_string();
        assert!(err.contains("features(subgroups)"), "{err}");
        // The subgroup built-ins belong to the entry point, as `lid()` does.
        let index: ItemFn =
            syn::parse_str("fn f(acc: &mut [f32; 4]) { acc[subgroup_index()] = 1.0; }").unwrap();
        let err = expand_helper(&index, true).unwrap_err().to_string();
        assert!(err.contains("pass it in as a parameter"), "{err}");
        // A kernel that calls a helper is checked against the helper's `SUBGROUPS` when its
        // module compiles.
        let k = "fn k(y: &mut [f32], #[shared] acc: &mut [f32; 8]) { y[0] = total(1.0, acc, 0u32, 0u32); }";
        let out = expand_str("workgroup = 8, uses(total)", k).unwrap();
        assert!(
            out.contains("assert ! (false || ! super :: total :: SUBGROUPS"),
            "{out}"
        );
        let out = expand_str("workgroup = 8, uses(total), features(subgroups)", k).unwrap();
        assert!(
            out.contains("assert ! (true || ! super :: total :: SUBGROUPS"),
            "{out}"
        );
        let parse = |attr: &str| parse_helper_attr(attr.parse().unwrap());
        assert!(!parse("").unwrap() && parse("features(subgroups)").unwrap());
        assert!(parse("features(f16)").is_err() && parse("workgroup = 1").is_err());
    }

    #[test]
    fn kernel_constants_size_arrays_and_unroll_loops() {
        let k = "fn k<const TILE: u32>(y: &mut [f32], #[shared] acc: &mut [f32; 64 * TILE]) {
            let mut s = [0.0f32; TILE];
            for j in 0..TILE { s[j] += 1.0; }
            for i in 0..TILE { if i > 0u32 { y[i] = s[i]; } }
        }";
        let out = expand_str("workgroup = 64, consts(TILE = 3)", k).unwrap();
        for needle in [
            r"const TILE: u32 = 3u;\n",
            "var<workgroup> acc: array<f32, 192>;",
            "var s = array<f32, 3>();",
            "let j: u32 = 2u;",
            "let i: u32 = 0u;",
            "pub const TILE : u32 = 3u32",
        ] {
            assert!(out.contains(needle), "{needle} in {out}");
        }
        assert!(!out.contains("let j: u32 = 3u;"), "{out}");
        // Loops to literal bounds stay loops.
        let plain = "fn k(y: &mut [f32]) { for j in 0..4u32 { y[j] = 0.0; } }";
        let out = expand_str("workgroup = 64", plain).unwrap();
        assert!(out.contains("for (var j: u32 = 0; j < 4u;"), "{out}");
        for (attr, item, needle) in [
            (
                "workgroup = 64, consts(N = 2)",
                "fn k(y: &mut [f32]) {}",
                "is not a `const N: u32`",
            ),
            (
                "workgroup = 64",
                "fn k<T>(y: &mut [T]) {}",
                "only `const NAME: u32` generics",
            ),
            (
                "workgroup = 64, consts(N = 2)",
                "fn k<const N: u32>(y: &mut [f32]) { let mut s = [1.0f32; N]; }",
                "do not start at zero",
            ),
        ] {
            let err = expand_str(attr, item).expect_err(item);
            assert!(err.contains(needle), "{item}: {err}");
        }
    }

    #[test]
    fn also_adds_the_same_kernel_under_another_name_with_other_constants() {
        let k = "fn k<const TILE: u32, const ROWS: u32>(y: &mut [f32]) {
            let mut s = [0.0f32; TILE * ROWS];
            for j in 0..TILE * ROWS { y[j] = s[j]; }
        }";
        let out = expand_str(
            "workgroup = 64, consts(TILE = 4, ROWS = 1), also(k_wide(TILE = 16, ROWS = 2))",
            k,
        )
        .unwrap();
        for needle in [
            "mod k {",
            "mod k_wide {",
            "var s = array<f32, 4>();",
            "var s = array<f32, 32>();",
            "pub const ROWS : u32 = 1u32",
            "pub const ROWS : u32 = 2u32",
        ] {
            assert!(out.contains(needle), "{needle} in {out}");
        }
        let one = "fn k<const TILE: u32>(y: &mut [f32]) {}";
        let err = expand_str(
            "workgroup = 64, consts(TILE = 4), also(k_wide(ROWS = 2))",
            one,
        )
        .unwrap_err();
        assert!(
            err.contains("`ROWS` is not among the kernel's `consts(..)`"),
            "{err}"
        );
    }

    #[test]
    fn float_literals_print_as_every_wgsl_compiler_reads_them() {
        let print = |body: &str| {
            let func: ItemFn = syn::parse_str(&format!("fn f() -> f32 {{ {body} }}")).unwrap();
            expand_helper(&func, false).map(|t| t.to_string())
        };
        // f32::MAX's shortest decimal lies beyond it before rounding: printed exactly.
        assert!(print("-3.4028235e38")
            .unwrap()
            .contains("-3.4028234663852886e38"));
        // Others keep their shortest form.
        assert!(print("0.00001").unwrap().contains("1e-5"));
        assert!(print("0.5f32").unwrap().contains("0.5f"));
        let err = print("1e39").unwrap_err().to_string();
        assert!(err.contains("outside the range of f32"), "{err}");
    }

    #[test]
    fn misuse_is_a_compile_error_naming_the_problem() {
        let ok = "fn k(x: &[f32], y: &mut [f32]) { let i = gid(); y[i] = x[i]; }";
        assert!(expand_str("workgroup = 64", ok).is_ok());
        let cases = [
            ("workgroup = 512", ok, "workgroup size must be 1..=256"),
            ("", ok, "missing `workgroup = N`"),
            ("workgroup = 64", "fn k(x: &[f64]) {}", "f32, u32 or i32"),
            (
                "workgroup = 64",
                "fn k(x: &[f32]) {}",
                "at least one output buffer",
            ),
            ("workgroup = 64", "fn k(x: Vec<f32>) {}", "expected `&[T]`"),
            (
                "workgroup = 64",
                "fn k(y: &mut [f32]) -> f32 { 1.0 }",
                "kernels return nothing",
            ),
            (
                "workgroup = 64",
                "fn k(y: &mut [f32]) { let f = |a: f32| a; }",
                "not supported in a kernel",
            ),
            (
                "workgroup = 64",
                "fn k(y: &mut [f32]) { y[0] = foo(1.0); }",
                "the call `foo`",
            ),
            (
                "workgroup = 64",
                "fn k(y: &mut [f32], #[shared] a: &mut [f32; 8192]) {}",
                "workgroup memory is 32768 bytes",
            ),
            // Names WGSL reserves, or the generated shader declares, pass rustc but not naga.
            (
                "workgroup = 64",
                "fn k(y: &mut [f32]) { let from = 1.0; y[0] = from; }",
                "`from` is a reserved word in WGSL",
            ),
            (
                "workgroup = 64",
                "fn k(params: &mut [f32]) {}",
                "`params` is a reserved word",
            ),
            (
                "workgroup = 64",
                "fn k(y: &mut [u32]) { for target in 0..4u32 { y[target] = 0u32; } }",
                "`target` is a reserved word",
            ),
            // The typed IR knows the shift amount is an i32; Rust allows it, WGSL does not.
            (
                "workgroup = 64",
                "fn k(y: &mut [u32]) { let s = 2i32; y[0] = y[1] >> s; }",
                "WGSL shifts by a u32; this is i32",
            ),
        ];
        for (attr, item, needle) in cases {
            let err = expand_str(attr, item).expect_err(item);
            assert!(err.contains(needle), "{item}: {err}");
        }
    }
}
