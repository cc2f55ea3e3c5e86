//! Kernel parameters → WGSL declarations and the binding table.

use syn::{Expr, FnArg, ItemFn, Lit, Pat, Type};

/// The WGSL name of a Rust scalar type the DSL knows (`f32`, `u32`, `i32`, `bool`).
pub fn wgsl_type(ty: &Type) -> Option<&'static str> {
    let Type::Path(p) = ty else { return None };
    match p.path.get_ident()?.to_string().as_str() {
        "f32" => Some("f32"),
        "u32" => Some("u32"),
        "i32" => Some("i32"),
        "bool" => Some("bool"),
        _ => None,
    }
}

/// A WGSL scalar type a parameter may hold (no `bool`: it has no host layout).
fn scalar(ty: &Type) -> syn::Result<&'static str> {
    match wgsl_type(ty) {
        Some(t) if t != "bool" => Ok(t),
        _ => Err(syn::Error::new_spanned(
            ty,
            "kernel data must be f32, u32 or i32",
        )),
    }
}

/// What a parameter becomes in WGSL.
enum Kind {
    /// `&[T]` / `&mut [T]`: a storage buffer.
    Storage { elem: &'static str, write: bool },
    /// `#[uniform] x: T`: a field of the uniform struct.
    Uniform { ty: &'static str },
    /// `#[shared] x: &mut [T; N]`: workgroup memory.
    Shared { elem: &'static str, len: u32 },
    /// A helper's scalar parameter `x: T`.
    Value { ty: &'static str },
    /// A helper's workgroup-array parameter `x: &mut [T; N]` (a `ptr<workgroup, ..>`).
    SharedRef { elem: &'static str, len: u32 },
    /// `#[comptime] x: T`: a pipeline-overridable constant (`override x: T;`), fixed when the
    /// pipeline is built, so loops over it unroll and its value is part of the cache key.
    Comptime { ty: &'static str },
}

/// How a launch argument is passed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// `&GpuBuffer<T>`.
    Input,
    /// `&mut GpuBuffer<T>`.
    Output,
    /// A uniform scalar by value.
    Uniform,
    /// A pipeline constant by value.
    Comptime,
}

struct Param {
    name: String,
    kind: Kind,
}

/// A kernel's parameters, in signature order.
pub struct Signature {
    params: Vec<Param>,
}

impl Signature {
    /// Reads and checks the parameters of `func`.
    pub fn parse(func: &ItemFn) -> syn::Result<Self> {
        let sig = &func.sig;
        if !sig.generics.params.is_empty() {
            return Err(syn::Error::new_spanned(
                &sig.generics,
                "kernels take no generics",
            ));
        }
        if let syn::ReturnType::Type(_, ty) = &sig.output {
            return Err(syn::Error::new_spanned(
                ty,
                "kernels return nothing; write results to a `&mut [T]`",
            ));
        }
        let mut params = Vec::new();
        for arg in &sig.inputs {
            let FnArg::Typed(pt) = arg else {
                return Err(syn::Error::new_spanned(arg, "kernels are free functions"));
            };
            let Pat::Ident(id) = &*pt.pat else {
                return Err(syn::Error::new_spanned(
                    &pt.pat,
                    "parameters must be plain names",
                ));
            };
            let name = id.ident.to_string();
            let uniform = pt.attrs.iter().any(|a| a.path().is_ident("uniform"));
            let shared = pt.attrs.iter().any(|a| a.path().is_ident("shared"));
            let comptime = pt.attrs.iter().any(|a| a.path().is_ident("comptime"));
            let kind = match (&*pt.ty, uniform, shared) {
                (ty, false, false) if comptime => Kind::Comptime { ty: scalar(ty)? },
                (ty, true, false) => Kind::Uniform { ty: scalar(ty)? },
                (Type::Reference(r), false, true) => match &*r.elem {
                    Type::Array(a) if r.mutability.is_some() => Kind::Shared {
                        elem: scalar(&a.elem)?,
                        len: array_len(&a.len)?,
                    },
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &pt.ty,
                            "#[shared] parameters are `&mut [T; N]`",
                        ))
                    }
                },
                (Type::Reference(r), false, false) => match &*r.elem {
                    Type::Slice(s) => Kind::Storage {
                        elem: scalar(&s.elem)?,
                        write: r.mutability.is_some(),
                    },
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &pt.ty,
                            "buffers are `&[T]` or `&mut [T]`",
                        ))
                    }
                },
                _ => return Err(syn::Error::new_spanned(
                    pt,
                    "expected `&[T]`, `&mut [T]`, `#[uniform] x: T`, `#[comptime] x: T` or `#[shared] x: &mut [T; N]`",
                )),
            };
            params.push(Param { name, kind });
        }
        if !params
            .iter()
            .any(|p| matches!(p.kind, Kind::Storage { write: true, .. }))
        {
            return Err(syn::Error::new_spanned(
                &sig.inputs,
                "a kernel needs at least one output buffer (`&mut [T]`)",
            ));
        }
        Ok(Self { params })
    }

    /// Reads and checks the parameters of a `#[kernel_fn]` helper: scalars by value and
    /// workgroup arrays by `&mut [T; N]`. Returns them with the WGSL result type, if any.
    pub fn parse_helper(func: &ItemFn) -> syn::Result<(Self, Option<&'static str>)> {
        let sig = &func.sig;
        if !sig.generics.params.is_empty() {
            return Err(syn::Error::new_spanned(
                &sig.generics,
                "helpers take no generics",
            ));
        }
        let ret = match &sig.output {
            syn::ReturnType::Default => None,
            syn::ReturnType::Type(_, ty) => Some(scalar(ty)?),
        };
        let mut params = Vec::new();
        for arg in &sig.inputs {
            let FnArg::Typed(pt) = arg else {
                return Err(syn::Error::new_spanned(arg, "helpers are free functions"));
            };
            let Pat::Ident(id) = &*pt.pat else {
                return Err(syn::Error::new_spanned(
                    &pt.pat,
                    "parameters must be plain names",
                ));
            };
            let kind = match &*pt.ty {
                Type::Reference(r) => match &*r.elem {
                    Type::Array(a) if r.mutability.is_some() => Kind::SharedRef {
                        elem: scalar(&a.elem)?,
                        len: array_len(&a.len)?,
                    },
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &pt.ty,
                            "helpers take scalars and workgroup arrays (`&mut [T; N]`)",
                        ))
                    }
                },
                ty => Kind::Value { ty: scalar(ty)? },
            };
            params.push(Param {
                name: id.ident.to_string(),
                kind,
            });
        }
        Ok((Self { params }, ret))
    }

    /// A helper's WGSL parameter list: its scalars. (WGSL cannot pass workgroup pointers to
    /// functions, so a helper names the kernel's workgroup arrays directly; the kernel must
    /// pass arrays of the same name and type, which the generated code checks at compile time.)
    pub fn helper_params(&self) -> String {
        self.params
            .iter()
            .filter_map(|p| match p.kind {
                Kind::Value { ty } => Some(format!("{}: {ty}", p.name)),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A helper's workgroup-array parameters as `name: array<T, N>`, in order.
    pub fn helper_shared(&self) -> Vec<String> {
        self.params
            .iter()
            .filter_map(|p| match p.kind {
                Kind::SharedRef { elem, len } => Some(format!("{}: array<{elem}, {len}>", p.name)),
                _ => None,
            })
            .collect()
    }

    /// A kernel's workgroup array `name` as `name: array<T, N>`.
    pub fn shared_decl(&self, name: &str) -> Option<String> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| match p.kind {
                Kind::Shared { elem, len } => Some(format!("{name}: array<{elem}, {len}>")),
                _ => None,
            })
    }

    /// Whether `name` is a uniform scalar (read as `params.name`).
    pub fn is_uniform(&self, name: &str) -> bool {
        self.params
            .iter()
            .any(|p| p.name == name && matches!(p.kind, Kind::Uniform { .. }))
    }

    /// Whether `name` is a buffer or workgroup array (so `.len()` applies).
    pub fn is_array(&self, name: &str) -> bool {
        self.params
            .iter()
            .any(|p| p.name == name && matches!(p.kind, Kind::Storage { .. } | Kind::Shared { .. }))
    }

    /// The launch arguments: `(name, element or scalar type, kind)` for buffers and uniforms
    /// in signature order (workgroup arrays are not arguments).
    pub fn launch_args(&self) -> Vec<(String, &'static str, ArgKind)> {
        self.params
            .iter()
            .filter_map(|p| match p.kind {
                Kind::Storage { elem, write } => Some((
                    p.name.clone(),
                    elem,
                    if write {
                        ArgKind::Output
                    } else {
                        ArgKind::Input
                    },
                )),
                Kind::Uniform { ty } => Some((p.name.clone(), ty, ArgKind::Uniform)),
                Kind::Comptime { ty } => Some((p.name.clone(), ty, ArgKind::Comptime)),
                Kind::Shared { .. } | Kind::Value { .. } | Kind::SharedRef { .. } => None,
            })
            .collect()
    }

    /// Bytes of workgroup memory.
    pub fn shared_bytes(&self) -> u32 {
        self.params
            .iter()
            .map(|p| {
                if let Kind::Shared { len, .. } = p.kind {
                    len * 4
                } else {
                    0
                }
            })
            .sum()
    }

    /// `(binding, name, kind)` for each binding of group 0.
    pub fn bindings(&self) -> Vec<(u32, String, String)> {
        let mut out: Vec<(u32, String, String)> = self
            .params
            .iter()
            .filter_map(|p| match p.kind {
                Kind::Storage { write, .. } => {
                    Some((p.name.clone(), if write { "read_write" } else { "read" }))
                }
                _ => None,
            })
            .enumerate()
            .map(|(i, (name, kind))| (i as u32, name, kind.to_string()))
            .collect();
        if self
            .params
            .iter()
            .any(|p| matches!(p.kind, Kind::Uniform { .. }))
        {
            out.push((out.len() as u32, "params".into(), "uniform".into()));
        }
        out
    }

    /// The module-scope WGSL declarations.
    pub fn declarations(&self) -> String {
        let mut out = String::new();
        let mut fields = Vec::new();
        let mut binding = 0;
        for p in &self.params {
            match p.kind {
                Kind::Storage { elem, write } => {
                    let access = if write { "read_write" } else { "read" };
                    out += &format!(
                        "@group(0) @binding({binding}) var<storage, {access}> {}: array<{elem}>;\n",
                        p.name
                    );
                    binding += 1;
                }
                Kind::Uniform { ty } => fields.push(format!("    {}: {ty},\n", p.name)),
                Kind::Shared { elem, len } => {
                    out += &format!("var<workgroup> {}: array<{elem}, {len}>;\n", p.name)
                }
                Kind::Comptime { ty } => out += &format!("override {}: {ty};\n", p.name),
                Kind::Value { .. } | Kind::SharedRef { .. } => {}
            }
        }
        if !fields.is_empty() {
            out += &format!("struct Params {{\n{}}}\n@group(0) @binding({binding}) var<uniform> params: Params;\n", fields.concat());
        }
        out
    }
}

fn array_len(e: &Expr) -> syn::Result<u32> {
    if let Expr::Lit(l) = e {
        if let Lit::Int(i) = &l.lit {
            return i.base10_parse();
        }
    }
    Err(syn::Error::new_spanned(
        e,
        "workgroup array lengths are integer literals",
    ))
}
