//! The Rust twin of a kernel or helper: the same function, its DSL-only parameter attributes
//! dropped and its buffers and workgroup arrays typed as `hesper_gpu::twin`'s stand-ins, so
//! rustc type-checks the body with the spans of the source. Never called.

use proc_macro2::TokenStream;
use quote::quote;
use syn::visit_mut::VisitMut;
use syn::{Expr, FnArg, ItemFn, Type};

/// `fn twin(..)` for a kernel (inside its module) or, for a helper, a function with the
/// helper's name beside its module (so kernel twins calling the helper resolve to it).
pub fn twin(func: &ItemFn, helper: bool) -> TokenStream {
    let mut f = func.clone();
    f.attrs.clear();
    for input in f.sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = input {
            pt.attrs.clear();
            *pt.ty = stand_in(&pt.ty);
        }
    }
    let mut body = func.block.clone();
    StepByUsize.visit_block_mut(&mut body);
    let inputs = &f.sig.inputs;
    let output = &f.sig.output;
    let generics = &f.sig.generics;
    let where_clause = &f.sig.generics.where_clause;
    let lints = quote! {
        #[allow(dead_code, unused_variables, unused_mut, unused_assignments, unused_imports,
                unreachable_code, clippy::all)]
    };
    if helper {
        let name = &f.sig.ident;
        let vis = &f.vis;
        let doc = format!("The Rust twin of `{name}` (type-checked, never run).");
        quote! {
            #[doc = #doc]
            #[doc(hidden)]
            #lints
            #vis fn #name #generics (#inputs) #output #where_clause {
                use ::hesper_gpu::twin::*;
                #body
            }
        }
    } else {
        quote! {
            /// The kernel as Rust, for rustc to type-check (never run).
            #lints
            fn twin #generics (#inputs) #output #where_clause {
                use super::*;
                use ::hesper_gpu::twin::*;
                #body
            }
        }
    }
}

/// `&[T]` → `&Buffer<T>`, `&mut [T]` → `&mut Buffer<T>`, `&mut [T; N]` → `&mut Workgroup<T>`;
/// scalars unchanged.
fn stand_in(ty: &Type) -> Type {
    let Type::Reference(r) = ty else {
        return ty.clone();
    };
    let m = &r.mutability;
    match &*r.elem {
        Type::Slice(s) => {
            let e = &s.elem;
            syn::parse_quote!(& #m ::hesper_gpu::twin::Buffer<#e>)
        }
        Type::Array(a) => {
            // `f16` is no Rust type: the twin's half stands in.
            let e: Type = match &*a.elem {
                Type::Path(p) if p.path.is_ident("f16") => {
                    syn::parse_quote!(::hesper_gpu::twin::f16)
                }
                e => e.clone(),
            };
            syn::parse_quote!(& #m ::hesper_gpu::twin::Workgroup<#e>)
        }
        _ => ty.clone(),
    }
}

/// Loops step by a `u32` in the DSL (WGSL's `i += step`); Rust's `step_by` takes a `usize`.
/// Local arrays `[x; N]` become `Local::splat(x, N)` (indexed by `u32`; `N` may be a kernel
/// constant, which a Rust array length cannot be).
struct StepByUsize;

impl VisitMut for StepByUsize {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        syn::visit_mut::visit_expr_mut(self, e);
        if let Expr::Repeat(r) = e {
            let (x, n) = (&r.expr, &r.len);
            *e = syn::parse_quote!(::hesper_gpu::twin::Local::splat(#x, (#n) as u32));
        }
    }

    fn visit_expr_method_call_mut(&mut self, m: &mut syn::ExprMethodCall) {
        syn::visit_mut::visit_expr_method_call_mut(self, m);
        if m.method == "step_by" && m.args.len() == 1 {
            let step: &Expr = &m.args[0];
            let cast: Expr = syn::parse_quote!((#step) as usize);
            m.args[0] = cast;
        }
    }
}
