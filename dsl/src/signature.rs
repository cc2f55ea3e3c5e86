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

/// The element of a workgroup array: a [`scalar`], or `f16` (the operands of a
/// cooperative-matrix kernel; `features(cooperative_matrix)` enables it).
fn shared_scalar(ty: &Type) -> syn::Result<&'static str> {
    match ty {
        Type::Path(p) if p.path.is_ident("f16") => Ok("f16"),
        _ => scalar(ty),
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
    /// A helper's buffer (`&[T]`, `&mut [T]`) or workgroup-array (`&mut [T; N]`) parameter:
    /// the kernel's own array, substituted by name where the kernel instantiates the helper.
    Ref,
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

/// A kernel's parameters, in signature order, and its compile-time constants.
pub struct Signature {
    params: Vec<Param>,
    /// `const NAME: u32` generics with the values `#[kernel(.., consts(NAME = v))]` gives them.
    consts: Vec<(String, u32)>,
}

impl Signature {
    /// Reads and checks the parameters of `func`; `consts` are the values of its
    /// `const NAME: u32` generics, from the attribute.
    pub fn parse(func: &ItemFn, consts: &[(syn::Ident, u32)]) -> syn::Result<Self> {
        let sig = &func.sig;
        let mut values = Vec::new();
        for g in &sig.generics.params {
            let syn::GenericParam::Const(c) = g else {
                return Err(syn::Error::new_spanned(
                    g,
                    "kernels take only `const NAME: u32` generics (valued in `consts(NAME = ..)`)",
                ));
            };
            if wgsl_type(&c.ty) != Some("u32") {
                return Err(syn::Error::new_spanned(&c.ty, "kernel constants are u32"));
            }
            let Some((_, v)) = consts.iter().find(|(n, _)| *n == c.ident) else {
                return Err(syn::Error::new_spanned(
                    &c.ident,
                    format!(
                        "give `{}` a value: `#[kernel(.., consts({} = ..))]`",
                        c.ident, c.ident
                    ),
                ));
            };
            values.push((c.ident.to_string(), *v));
        }
        if let Some((n, _)) = consts
            .iter()
            .find(|(n, _)| !values.iter().any(|(v, _)| n == v))
        {
            return Err(syn::Error::new_spanned(
                n,
                format!("`{n}` is not a `const {n}: u32` generic of the kernel"),
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
            crate::lower::check_name(&id.ident)?;
            let name = id.ident.to_string();
            let uniform = pt.attrs.iter().any(|a| a.path().is_ident("uniform"));
            let shared = pt.attrs.iter().any(|a| a.path().is_ident("shared"));
            let comptime = pt.attrs.iter().any(|a| a.path().is_ident("comptime"));
            let kind = match (&*pt.ty, uniform, shared) {
                (ty, false, false) if comptime => Kind::Comptime { ty: scalar(ty)? },
                (ty, true, false) => Kind::Uniform { ty: scalar(ty)? },
                (Type::Reference(r), false, true) => match &*r.elem {
                    Type::Array(a) if r.mutability.is_some() => Kind::Shared {
                        elem: shared_scalar(&a.elem)?,
                        len: array_len(&a.len, &values)?,
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
        Ok(Self {
            params,
            consts: values,
        })
    }

    /// Reads and checks the parameters of a `#[kernel_fn]` helper: scalars by value, the
    /// kernel's buffers (`&[T]`, `&mut [T]`) and workgroup arrays (`&mut [T; N]`) by
    /// reference. Type generics (`<T: Scalar>`) may name the element types of those arrays.
    /// Returns them with the WGSL result type, if any.
    pub fn parse_helper(func: &ItemFn) -> syn::Result<(Self, Option<&'static str>)> {
        let sig = &func.sig;
        if let Some(g) = sig
            .generics
            .params
            .iter()
            .find(|g| !matches!(g, syn::GenericParam::Type(_)))
        {
            return Err(syn::Error::new_spanned(
                g,
                "helpers take only type generics (element types of the arrays they are passed)",
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
            crate::lower::check_name(&id.ident)?;
            let kind = match &*pt.ty {
                Type::Reference(r) => match &*r.elem {
                    Type::Array(_) if r.mutability.is_some() => Kind::Ref,
                    Type::Slice(_) => Kind::Ref,
                    _ => {
                        return Err(syn::Error::new_spanned(
                            &pt.ty,
                            "helpers take scalars, buffers (`&[T]`, `&mut [T]`) and workgroup arrays (`&mut [T; N]`)",
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
        Ok((
            Self {
                params,
                consts: Vec::new(),
            },
            ret,
        ))
    }

    /// A helper's WGSL parameter list: its scalars. (WGSL cannot pass buffers or workgroup
    /// arrays to functions, so the helper's text names them by placeholder and each kernel
    /// instantiates it with its own arrays; rustc checks their types on the twins.)
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

    /// The position of `name` among a helper's buffer and array parameters.
    pub fn ref_index(&self, name: &str) -> Option<usize> {
        self.params
            .iter()
            .filter(|p| matches!(p.kind, Kind::Ref))
            .position(|p| p.name == name)
    }

    /// The WGSL type of a parameter's value (a buffer's or array's elements) or of a constant,
    /// by name; `None` for a helper's array parameters (their type is the kernel's).
    pub fn type_of(&self, name: &str) -> Option<&'static str> {
        if self.constant(name).is_some() {
            return Some("u32");
        }
        self.params
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| match p.kind {
                Kind::Storage { elem, .. } | Kind::Shared { elem, .. } => Some(elem),
                Kind::Uniform { ty } | Kind::Value { ty } | Kind::Comptime { ty } => Some(ty),
                Kind::Ref => None,
            })
    }

    /// The value of the kernel constant `name`, if it is one.
    pub fn constant(&self, name: &str) -> Option<u32> {
        self.consts.iter().find(|(n, _)| n == name).map(|c| c.1)
    }

    /// The kernel's compile-time constants with their values.
    pub fn constants(&self) -> &[(String, u32)] {
        &self.consts
    }

    /// Whether `name` is a uniform scalar (read as `params.name`).
    pub fn is_uniform(&self, name: &str) -> bool {
        self.params
            .iter()
            .any(|p| p.name == name && matches!(p.kind, Kind::Uniform { .. }))
    }

    /// Whether `name` is one of the kernel's workgroup arrays.
    pub fn is_shared(&self, name: &str) -> bool {
        self.params
            .iter()
            .any(|p| p.name == name && matches!(p.kind, Kind::Shared { .. }))
    }

    /// Whether a workgroup array holds halves (`f16`): the kernel then needs `enable f16;`.
    pub fn has_halves(&self) -> bool {
        self.params
            .iter()
            .any(|p| matches!(p.kind, Kind::Shared { elem: "f16", .. }))
    }

    /// Whether `name` is a buffer or workgroup array (so `.len()` applies).
    pub fn is_array(&self, name: &str) -> bool {
        self.params.iter().any(|p| {
            p.name == name
                && matches!(
                    p.kind,
                    Kind::Storage { .. } | Kind::Shared { .. } | Kind::Ref
                )
        })
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
                Kind::Shared { .. } | Kind::Value { .. } | Kind::Ref => None,
            })
            .collect()
    }

    /// Bytes of workgroup memory.
    pub fn shared_bytes(&self) -> u32 {
        self.params
            .iter()
            .map(|p| {
                if let Kind::Shared { len, elem } = p.kind {
                    len * if elem == "f16" { 2 } else { 4 }
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
        let mut out: String = self
            .consts
            .iter()
            .map(|(name, v)| format!("const {name}: u32 = {v}u;\n"))
            .collect();
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
                Kind::Value { .. } | Kind::Ref => {}
            }
        }
        if !fields.is_empty() {
            out += &format!("struct Params {{\n{}}}\n@group(0) @binding({binding}) var<uniform> params: Params;\n", fields.concat());
        }
        out
    }
}

fn array_len(e: &Expr, consts: &[(String, u32)]) -> syn::Result<u32> {
    const_value(e, consts).ok_or_else(|| {
        syn::Error::new_spanned(
            e,
            "array lengths are integer literals and kernel constants joined by + - * /",
        )
    })
}

/// The value of `e` at compile time: integer literals and the kernel's constants joined by
/// `+ - * /` (what array lengths and unrolled loop bounds may be).
pub fn const_value(e: &Expr, consts: &[(String, u32)]) -> Option<u32> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse().ok(),
            _ => None,
        },
        Expr::Path(p) => {
            let name = p.path.get_ident()?.to_string();
            consts.iter().find(|(n, _)| *n == name).map(|c| c.1)
        }
        Expr::Paren(p) => const_value(&p.expr, consts),
        Expr::Binary(b) => {
            let (l, r) = (
                const_value(&b.left, consts)?,
                const_value(&b.right, consts)?,
            );
            match b.op {
                syn::BinOp::Add(_) => l.checked_add(r),
                syn::BinOp::Sub(_) => l.checked_sub(r),
                syn::BinOp::Mul(_) => l.checked_mul(r),
                syn::BinOp::Div(_) => l.checked_div(r),
                _ => None,
            }
        }
        _ => None,
    }
}
