//! Lowering: a kernel or helper body in the DSL's Rust subset → the typed IR of `ir.rs`, with
//! every check of the subset (a `compile_error!` at the offending span), helper calls resolved
//! to their instances, uniforms and helper arrays resolved, and loops over kernel constants
//! unrolled.

use std::cell::RefCell;
use std::collections::HashMap;

use syn::spanned::Spanned;
use syn::{BinOp, Expr as Syn, Lit, Local, Pat, Stmt as SynStmt, Type, UnOp};

use crate::ir::{Block, CoopOp, Else, Expr, Stmt, Ty};
use crate::signature::{const_value, wgsl_type, Signature};

/// A helper as one kernel calls it: with the kernel's arrays in place of its array parameters.
#[derive(Clone, PartialEq, Eq)]
pub struct Instance {
    /// The helper's name (its module holds the template).
    pub helper: String,
    /// The WGSL function name of this instance.
    pub name: String,
    /// The kernel's buffers and workgroup arrays, in the helper's parameter order.
    pub args: Vec<String>,
}

/// Builds the IR of one body.
pub struct Lowerer<'a> {
    sig: &'a Signature,
    /// Helper functions (`#[kernel_fn]`) the body may call.
    helpers: &'a [String],
    /// Lowering a helper: a trailing expression is its result, and the entry point's
    /// built-ins (`gid`, `lid`, `wid`) are out of reach.
    helper: bool,
    /// The kernel declared `features(subgroups)`.
    subgroups: bool,
    /// The kernel declared `features(cooperative_matrix)`.
    coop: bool,
    /// The cooperative-matrix loads and stores the body makes, by array (the stand-in's
    /// functions, `crate::coop`).
    coop_uses: RefCell<Vec<(CoopOp, String)>>,
    /// The helper instances the body calls, in order of first call.
    instances: RefCell<Vec<Instance>>,
    /// Types of the locals in scope, innermost block last.
    scopes: RefCell<Vec<HashMap<String, Ty>>>,
}

fn unsupported(node: impl Spanned, what: &str) -> syn::Error {
    syn::Error::new(node.span(), format!("not supported in a kernel: {what}"))
}

/// Names WGSL reserves (beyond Rust's own keywords, which cannot be names here anyway) and the
/// names the generated entry point declares: a kernel using one would not compile as WGSL.
const RESERVED: &[&str] = &[
    "NULL",
    "active",
    "alignas",
    "alignof",
    "alias",
    "array",
    "asm",
    "asm_fragment",
    "attribute",
    "auto",
    "binding_array",
    "case",
    "cast",
    "catch",
    "class",
    "co_await",
    "co_return",
    "co_yield",
    "coherent",
    "column_major",
    "common",
    "compile",
    "compile_fragment",
    "concept",
    "const_assert",
    "const_cast",
    "consteval",
    "constexpr",
    "constinit",
    "continuing",
    "debugger",
    "decltype",
    "default",
    "delete",
    "demote",
    "demote_to_helper",
    "diagnostic",
    "discard",
    "do",
    "dynamic_cast",
    "enable",
    "explicit",
    "export",
    "extends",
    "extern",
    "external",
    "fallthrough",
    "filter",
    "finally",
    "friend",
    "from",
    "fxgroup",
    "get",
    "goto",
    "groupshared",
    "highp",
    "implements",
    "import",
    "inline",
    "instanceof",
    "interface",
    "layout",
    "lowp",
    "mediump",
    "meta",
    "module",
    "noexcept",
    "noinline",
    "nointerpolation",
    "noperspective",
    "null",
    "nullptr",
    "of",
    "operator",
    "override",
    "package",
    "packoffset",
    "partition",
    "pass",
    "patch",
    "pixelfragment",
    "precise",
    "precision",
    "premerge",
    "private",
    "protected",
    "public",
    "readonly",
    "regardless",
    "register",
    "reinterpret_cast",
    "require",
    "requires",
    "resource",
    "restrict",
    "sampler",
    "set",
    "shared",
    "signed",
    "sizeof",
    "smooth",
    "snorm",
    "static_assert",
    "static_cast",
    "std",
    "storage",
    "subroutine",
    "switch",
    "target",
    "template",
    "this",
    "thread_local",
    "throw",
    "typedef",
    "typeid",
    "typename",
    "typeof",
    "uniform",
    "union",
    "unless",
    "unorm",
    "unsigned",
    "using",
    "varying",
    "vec2",
    "vec3",
    "vec4",
    "virtual",
    "volatile",
    "wgsl",
    "with",
    "workgroup",
    "writeonly", // WGSL
    "params",
    "Params",
    "gid",
    "lid",
    "wid",
    "main",
    "sg_invocation",
    "sg_size",
    "sg_index",
    "sg_count", // the generated entry point's
];

/// Refuses a name WGSL or the generated code reserves.
pub fn check_name(id: &syn::Ident) -> syn::Result<()> {
    let name = id.to_string();
    if RESERVED.contains(&name.as_str())
        || name.starts_with("__")
        || name.starts_with("coop_stand_in")
    {
        return Err(syn::Error::new(
            id.span(),
            format!("`{name}` is a reserved word in WGSL (or a name the generated shader uses); rename it"),
        ));
    }
    Ok(())
}

impl<'a> Lowerer<'a> {
    /// A lowering of the body of the kernel with signature `sig`, which may call `helpers`
    /// (and use subgroup operations when `subgroups`).
    pub fn new(sig: &'a Signature, helpers: &'a [String], subgroups: bool) -> Self {
        Self {
            sig,
            helpers,
            helper: false,
            subgroups,
            coop: false,
            coop_uses: Default::default(),
            instances: Default::default(),
            scopes: RefCell::new(vec![HashMap::new()]),
        }
    }

    /// A lowering of the body of a `#[kernel_fn]` helper with signature `sig` (which may use
    /// subgroup operations when `subgroups`).
    pub fn for_helper(sig: &'a Signature, subgroups: bool) -> Self {
        Self {
            helper: true,
            ..Self::new(sig, &[], subgroups)
        }
    }

    /// The same lowering with the cooperative-matrix operations and `to_f16` allowed (a kernel
    /// declaring `features(cooperative_matrix)`; helpers never are).
    pub fn with_cooperative_matrix(self, on: bool) -> Self {
        Self { coop: on, ..self }
    }

    /// The cooperative-matrix loads and stores the body made, each `(operation, array)` once.
    pub fn coop_uses(&self) -> Vec<(CoopOp, String)> {
        self.coop_uses.borrow().clone()
    }

    /// The helper instances the body called (see [`Instance`]).
    pub fn instances(&self) -> Vec<Instance> {
        self.instances.borrow().clone()
    }

    /// A block's statements.
    pub fn block(&self, b: &syn::Block) -> syn::Result<Block> {
        self.scopes.borrow_mut().push(HashMap::new());
        let out = b.stmts.iter().map(|s| self.stmt(s)).collect();
        self.scopes.borrow_mut().pop();
        out
    }

    fn bind(&self, name: &str, ty: Ty) {
        if let Some(scope) = self.scopes.borrow_mut().last_mut() {
            scope.insert(name.to_string(), ty);
        }
    }

    /// The type of a local, parameter or constant.
    fn type_of(&self, name: &str) -> Ty {
        let local = self
            .scopes
            .borrow()
            .iter()
            .rev()
            .find_map(|s| s.get(name).copied());
        local
            .or_else(|| self.sig.type_of(name).map(Ty::from_wgsl))
            .unwrap_or(Ty::Unknown)
    }

    fn stmt(&self, s: &SynStmt) -> syn::Result<Stmt> {
        Ok(match s {
            SynStmt::Local(local) => self.local(local)?,
            SynStmt::Expr(e, semi) => match e {
                Syn::If(_) | Syn::ForLoop(_) | Syn::While(_) | Syn::Block(_) => self.control(e)?,
                _ if semi.is_some() => Stmt::Expr(self.expr(e)?),
                _ if self.helper => Stmt::Return(Some(self.expr(e)?)),
                _ => {
                    return Err(unsupported(
                        e,
                        "a trailing expression (kernels return nothing)",
                    ))
                }
            },
            SynStmt::Item(i) => return Err(unsupported(i, "items inside a kernel")),
            SynStmt::Macro(m) => return Err(unsupported(m, "macros")),
        })
    }

    fn local(&self, l: &Local) -> syn::Result<Stmt> {
        let (pat, ty) = match &l.pat {
            Pat::Type(pt) => (&*pt.pat, Some(self.ty(&pt.ty)?)),
            p => (p, None),
        };
        let Pat::Ident(id) = pat else {
            return Err(unsupported(pat, "patterns other than a name"));
        };
        check_name(&id.ident)?;
        let name = id.ident.to_string();
        let mutable = id.mutability.is_some();
        if let Some(Syn::Repeat(r)) = l.init.as_ref().map(|i| &*i.expr) {
            return self.local_array(id, r);
        }
        let init = match &l.init {
            Some(init) if init.diverge.is_none() => Some(self.expr(&init.expr)?),
            Some(init) => return Err(unsupported(&init.expr, "let-else")),
            None if mutable => None,
            None => return Err(unsupported(l, "an immutable `let` without a value")),
        };
        let inferred = init.as_ref().map_or(Ty::Unknown, Expr::ty);
        self.bind(&name, ty.unwrap_or(inferred));
        Ok(Stmt::Let {
            name,
            mutable,
            ty,
            init,
        })
    }

    /// `let mut s = [0i32; N];` → a zeroed local array.
    fn local_array(&self, id: &syn::PatIdent, r: &syn::ExprRepeat) -> syn::Result<Stmt> {
        if id.mutability.is_none() {
            return Err(unsupported(
                id,
                "an immutable local array (write `let mut`)",
            ));
        }
        let elem = match &*r.expr {
            Syn::Lit(l) => match &l.lit {
                Lit::Int(i) if i.base10_digits() == "0" => match i.suffix() {
                    "" | "i32" => Ty::I32,
                    "u32" => Ty::U32,
                    "f32" => Ty::F32,
                    _ => return Err(unsupported(i, "this element type")),
                },
                Lit::Float(f) if f.base10_parse::<f32>().ok() == Some(0.0) => Ty::F32,
                _ => return Err(unsupported(l, "local arrays that do not start at zero")),
            },
            other => return Err(unsupported(other, "local arrays that do not start at zero")),
        };
        let len = const_value(&r.len, self.sig.constants()).ok_or_else(|| {
            syn::Error::new(
                r.len.span(),
                "array lengths are integer literals and kernel constants joined by + - * /",
            )
        })?;
        let name = id.ident.to_string();
        self.bind(&name, elem);
        Ok(Stmt::LocalArray { name, elem, len })
    }

    fn ty(&self, t: &Type) -> syn::Result<Ty> {
        wgsl_type(t)
            .map(Ty::from_wgsl)
            .ok_or_else(|| unsupported(t, "types other than f32, u32, i32 and bool"))
    }

    fn control(&self, e: &Syn) -> syn::Result<Stmt> {
        Ok(match e {
            Syn::If(i) => {
                let otherwise = match i.else_branch.as_ref().map(|(_, e)| &**e) {
                    None => None,
                    Some(Syn::Block(b)) => Some(Else::Block(self.block(&b.block)?)),
                    Some(nested @ Syn::If(_)) => Some(Else::If(Box::new(self.control(nested)?))),
                    Some(other) => return Err(unsupported(other, "this else branch")),
                };
                Stmt::If {
                    cond: self.expr(&i.cond)?,
                    then: self.block(&i.then_branch)?,
                    otherwise,
                }
            }
            Syn::ForLoop(f) => self.for_loop(f)?,
            Syn::While(w) => Stmt::While {
                cond: self.expr(&w.cond)?,
                body: self.block(&w.body)?,
            },
            Syn::Block(b) => Stmt::Scope(self.block(&b.block)?),
            _ => unreachable!("control() is only called on control flow"),
        })
    }

    fn for_loop(&self, f: &syn::ExprForLoop) -> syn::Result<Stmt> {
        let Pat::Ident(var) = &*f.pat else {
            return Err(unsupported(&f.pat, "loop patterns other than a name"));
        };
        check_name(&var.ident)?;
        let (range, step) = match &*f.expr {
            Syn::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
                (&*m.receiver, Some(self.expr(&m.args[0])?))
            }
            other => (other, None),
        };
        let Syn::Range(r) = strip_parens(range) else {
            return Err(unsupported(&f.expr, "loops over anything but `a..b`"));
        };
        let (Some(start), Some(end)) = (&r.start, &r.end) else {
            return Err(unsupported(r, "open ranges"));
        };
        let inclusive = matches!(r.limits, syn::RangeLimits::Closed(_));
        if step.is_none() && self.names_constant(end) {
            return self.unrolled(f, &var.ident, r, inclusive);
        }
        let (start, end) = (self.expr(start)?, self.expr(end)?);
        self.scopes.borrow_mut().push(HashMap::new());
        self.bind(&var.ident.to_string(), Ty::U32);
        let body = self.block(&f.body);
        self.scopes.borrow_mut().pop();
        Ok(Stmt::For {
            var: var.ident.to_string(),
            start,
            end,
            inclusive,
            step,
            body: body?,
        })
    }

    /// Whether `e` names a buffer or array (of the kernel, or a helper's parameter).
    fn is_array_expr(&self, e: &Syn) -> bool {
        matches!(e, Syn::Path(p) if p.path.get_ident().is_some_and(|i| self.sig.is_array(&i.to_string())))
    }

    /// Whether `e` mentions one of the kernel's constants (a loop to it is unrolled).
    fn names_constant(&self, e: &Syn) -> bool {
        match e {
            Syn::Path(p) => p
                .path
                .get_ident()
                .is_some_and(|i| self.sig.constant(&i.to_string()).is_some()),
            Syn::Paren(p) => self.names_constant(&p.expr),
            Syn::Binary(b) => self.names_constant(&b.left) || self.names_constant(&b.right),
            _ => false,
        }
    }

    /// `for j in a..N` over a kernel constant: one scope per value of `j`, which is a `let`.
    fn unrolled(
        &self,
        f: &syn::ExprForLoop,
        var: &syn::Ident,
        r: &syn::ExprRange,
        inclusive: bool,
    ) -> syn::Result<Stmt> {
        let consts = self.sig.constants();
        let bound = |e: &Option<Box<Syn>>| {
            e.as_deref()
                .and_then(|e| const_value(e, consts))
                .ok_or_else(|| {
                    unsupported(
                        r,
                        "a loop to a kernel constant from a bound not known at compile time",
                    )
                })
        };
        let (start, mut end) = (bound(&r.start)?, bound(&r.end)?);
        if inclusive {
            end += 1;
        }
        if let Some(jump) = loop_jump(&f.body) {
            return Err(unsupported(
                jump,
                "`break`/`continue` in a loop over a kernel constant (it is unrolled)",
            ));
        }
        let mut iterations = Vec::new();
        for k in start..end {
            self.scopes.borrow_mut().push(HashMap::new());
            self.bind(&var.to_string(), Ty::U32);
            let body = self.block(&f.body);
            self.scopes.borrow_mut().pop();
            let mut scope = vec![Stmt::Let {
                name: var.to_string(),
                mutable: false,
                ty: Some(Ty::U32),
                init: Some(Expr::Lit(format!("{k}u"), Ty::U32)),
            }];
            scope.extend(body?);
            iterations.push(Stmt::Scope(scope));
        }
        // The iterations, printed one after another at the loop's level.
        Ok(Stmt::Unrolled(iterations))
    }

    fn expr(&self, e: &Syn) -> syn::Result<Expr> {
        Ok(match e {
            Syn::Lit(l) => literal(&l.lit)?,
            Syn::Path(p) => {
                let Some(id) = p.path.get_ident() else {
                    return Err(unsupported(p, "paths"));
                };
                let name = id.to_string();
                let ty = self.type_of(&name);
                if self.sig.is_uniform(&name) {
                    Expr::Uniform(name, ty)
                } else if let Some(i) = self.sig.ref_index(&name).filter(|_| self.helper) {
                    Expr::Placeholder(i)
                } else {
                    Expr::Name(name, ty)
                }
            }
            Syn::Paren(p) => Expr::Paren(Box::new(self.expr(&p.expr)?)),
            Syn::Binary(b) => self.binary(b)?,
            Syn::Unary(u) => match u.op {
                UnOp::Neg(_) => Expr::Unary("-", Box::new(self.expr(&u.expr)?)),
                UnOp::Not(_) => Expr::Unary("!", Box::new(self.expr(&u.expr)?)),
                _ => return Err(unsupported(u, "dereference")),
            },
            Syn::Assign(a) => {
                let (left, right) = (self.expr(&a.left)?, self.expr(&a.right)?);
                let ty = left.ty();
                Expr::Binary("=", Box::new(left), Box::new(right), ty)
            }
            Syn::Index(i) => {
                let (base, index) = (self.expr(&i.expr)?, self.expr(&i.index)?);
                let ty = base.ty();
                Expr::Index(Box::new(base), Box::new(index), ty)
            }
            Syn::Cast(c) => Expr::Cast(self.ty(&c.ty)?, Box::new(self.expr(&c.expr)?)),
            Syn::MethodCall(m) => self.method(m)?,
            Syn::Call(c) => self.call(c)?,
            Syn::Break(b) if b.expr.is_none() && b.label.is_none() => Expr::Jump("break"),
            Syn::Continue(c) if c.label.is_none() => Expr::Jump("continue"),
            Syn::Return(r) if r.expr.is_none() => Expr::Jump("return"),
            other => return Err(unsupported(other, "this expression")),
        })
    }

    fn binary(&self, b: &syn::ExprBinary) -> syn::Result<Expr> {
        let (left, right) = (self.expr(&b.left)?, self.expr(&b.right)?);
        let op = binop(&b.op)?;
        // WGSL shifts by a `u32` whatever the shifted type (Rust takes any integer).
        if matches!(op, "<<" | ">>" | "<<=" | ">>=")
            && !matches!(right.ty(), Ty::U32 | Ty::AnyInt | Ty::Unknown)
        {
            return Err(syn::Error::new(
                b.right.span(),
                format!(
                    "WGSL shifts by a u32; this is {} (cast it: `as u32`)",
                    right.ty().wgsl()
                ),
            ));
        }
        let ty = match op {
            "==" | "!=" | "<" | "<=" | ">" | ">=" | "&&" | "||" => Ty::Bool,
            "<<" | ">>" => left.ty(),
            _ => left.ty().join(right.ty()),
        };
        Ok(Expr::Binary(op, Box::new(left), Box::new(right), ty))
    }

    fn method(&self, m: &syn::ExprMethodCall) -> syn::Result<Expr> {
        let recv = self.expr(&m.receiver)?;
        let mut args = m
            .args
            .iter()
            .map(|a| self.expr(a))
            .collect::<syn::Result<Vec<_>>>()?;
        let name = m.method.to_string();
        let ty = recv.ty();
        Ok(match (name.as_str(), args.len()) {
            ("sqrt" | "exp" | "tanh" | "abs" | "floor" | "round" | "trunc", 0)
            | ("clamp", 2)
            | ("max" | "min", 1) => {
                args.insert(0, recv);
                Expr::Call(name, args, ty)
            }
            ("len", 0) if self.is_array_expr(&m.receiver) => Expr::ArrayLength(Box::new(recv)),
            _ => {
                return Err(unsupported(
                    m,
                    &format!("the method `{name}` with {} argument(s)", args.len()),
                ))
            }
        })
    }

    fn call(&self, c: &syn::ExprCall) -> syn::Result<Expr> {
        let Syn::Path(p) = &*c.func else {
            return Err(unsupported(&c.func, "calls through expressions"));
        };
        // `helper::<T>(..)`: the element types follow from the arrays passed.
        let id = match p.path.segments.first() {
            Some(seg) if p.path.segments.len() == 1 && p.qself.is_none() => &seg.ident,
            _ => return Err(unsupported(p, "paths")),
        };
        let name = id.to_string();
        if !matches!(p.path.segments[0].arguments, syn::PathArguments::None)
            && !self.helpers.contains(&name)
        {
            return Err(unsupported(p, "generic arguments outside helper calls"));
        }
        if self.helpers.contains(&name) {
            return self.helper_call(name, c);
        }
        if name.starts_with("coop_") || name == "to_f16" {
            return self.coop_call(&name, c);
        }
        let args = c
            .args
            .iter()
            .map(|a| self.expr(a))
            .collect::<syn::Result<Vec<_>>>()?;
        let builtin = matches!(
            name.as_str(),
            "gid"
                | "lid"
                | "wid"
                | "wid_y"
                | "subgroup_invocation"
                | "subgroup_size"
                | "subgroup_index"
                | "subgroup_count"
        );
        if self.helper && builtin {
            return Err(unsupported(
                c,
                &format!("`{name}()` in a helper (pass it in as a parameter)"),
            ));
        }
        if name.starts_with("subgroup_") && !self.subgroups {
            return Err(unsupported(
                c,
                &format!("`{name}` without `#[kernel(.., features(subgroups))]`"),
            ));
        }
        let call = |f: &str, args: Vec<Expr>, ty: Ty| Ok(Expr::Call(f.to_string(), args, ty));
        let first_ty = args.first().map_or(Ty::Unknown, Expr::ty);
        match (name.as_str(), args.len()) {
            ("subgroup_add", 1) => call("subgroupAdd", args, first_ty),
            ("subgroup_max", 1) => call("subgroupMax", args, first_ty),
            ("subgroup_invocation", 0) => Ok(Expr::Builtin("sg_invocation", Ty::U32)),
            ("subgroup_size", 0) => Ok(Expr::Builtin("sg_size", Ty::U32)),
            ("subgroup_index", 0) => Ok(Expr::Builtin("sg_index", Ty::U32)),
            ("subgroup_count", 0) => Ok(Expr::Builtin("sg_count", Ty::U32)),
            ("gid", 0) => Ok(Expr::Builtin("gid.x", Ty::U32)),
            ("lid", 0) => Ok(Expr::Builtin("lid.x", Ty::U32)),
            ("wid", 0) => Ok(Expr::Builtin("wid.x", Ty::U32)),
            ("wid_y", 0) => Ok(Expr::Builtin("wid.y", Ty::U32)),
            ("f32_from_bits", 1) => call("bitcast<f32>", args, Ty::F32),
            ("dot4_i8_packed", 2) => call("dot4I8Packed", args, Ty::I32),
            ("unpack_f16_lo", 1) => Ok(Expr::Member(
                Box::new(Expr::Call("unpack2x16float".into(), args, Ty::Unknown)),
                "x",
                Ty::F32,
            )),
            ("unpack_f16_hi", 1) => Ok(Expr::Member(
                Box::new(Expr::Call("unpack2x16float".into(), args, Ty::Unknown)),
                "y",
                Ty::F32,
            )),
            ("f32_to_bits", 1) => call("bitcast<u32>", args, Ty::U32),
            ("barrier", 0) => call("workgroupBarrier", args, Ty::Unknown),
            ("storage_barrier", 0) => call("storageBarrier", args, Ty::Unknown),
            ("select", 3) => {
                let ty = args[1].ty();
                call("select", args, ty)
            }
            (name, _) => Err(unsupported(
                c,
                &format!("the call `{name}` (intrinsics: gid, lid, wid, wid_y, barrier, storage_barrier, select, f32_from_bits, dot4_i8_packed, unpack_f16_lo, unpack_f16_hi, f32_to_bits, subgroup_add, subgroup_max, subgroup_invocation, subgroup_size, subgroup_index, subgroup_count; helpers are listed in `uses(..)`)"),
            )),
        }
    }

    /// `to_f16(x)` and the cooperative-matrix operations (`features(cooperative_matrix)`):
    /// an operand array must be a workgroup array of the kernel, named.
    fn coop_call(&self, name: &str, c: &syn::ExprCall) -> syn::Result<Expr> {
        if !self.coop {
            return Err(unsupported(
                c,
                &format!("`{name}` without `#[kernel(.., features(cooperative_matrix))]`"),
            ));
        }
        let (op, array_at, arity) = match name {
            "to_f16" => (None, None, 1),
            "coop_zero" => (Some(CoopOp::Zero), None, 0),
            "coop_load_a_rows" => (Some(CoopOp::LoadARows), Some(0), 3),
            "coop_load_b_columns" => (Some(CoopOp::LoadBColumns), Some(0), 3),
            "coop_multiply_add" => (Some(CoopOp::MultiplyAdd), None, 3),
            "coop_store_columns" => (Some(CoopOp::StoreColumns), Some(1), 4),
            _ => return Err(unsupported(
                c,
                &format!("the call `{name}` (cooperative matrices: coop_zero, coop_load_a_rows, coop_load_b_columns, coop_multiply_add, coop_store_columns, to_f16)"),
            )),
        };
        if c.args.len() != arity {
            return Err(unsupported(
                c,
                &format!(
                    "`{name}` with {} argument(s) (it takes {arity})",
                    c.args.len()
                ),
            ));
        }
        let mut args = Vec::new();
        for (i, a) in c.args.iter().enumerate() {
            if Some(i) == array_at {
                let array = match a {
                    Syn::Path(p) => p.path.get_ident().map(ToString::to_string),
                    _ => None,
                }
                .filter(|n| self.sig.is_shared(n))
                .ok_or_else(|| unsupported(a, "a cooperative matrix outside a workgroup array"))?;
                let op = op.expect("array operands belong to operations");
                let mut uses = self.coop_uses.borrow_mut();
                // The stand-in's multiply-add reads its operands from one array each.
                if op != CoopOp::StoreColumns && uses.iter().any(|(o, n)| *o == op && *n != array) {
                    return Err(unsupported(
                        a,
                        "operands of one role loaded from two arrays (the stand-in reads each role from one)",
                    ));
                }
                if !uses.iter().any(|(o, n)| *o == op && *n == array) {
                    uses.push((op, array.clone()));
                }
                args.push(Expr::Name(array, Ty::Unknown));
            } else {
                args.push(self.expr(a)?);
            }
        }
        Ok(match op {
            None => Expr::Cast(Ty::F16, Box::new(args.remove(0))),
            Some(op) => Expr::Coop(op, args),
        })
    }

    /// A call of a listed helper: buffers and workgroup arrays are not WGSL arguments, so the
    /// helper is instantiated with the kernel's names in their place, one WGSL function per
    /// set of arrays.
    fn helper_call(&self, name: String, c: &syn::ExprCall) -> syn::Result<Expr> {
        let mut scalars = Vec::new();
        let mut arrays = Vec::new();
        for a in &c.args {
            match a {
                Syn::Path(p) if self.is_array_expr(a) => {
                    arrays.push(p.path.segments[0].ident.to_string())
                }
                _ => scalars.push(self.expr(a)?),
            }
        }
        let instance = Instance {
            name: std::iter::once(name.clone())
                .chain(arrays.iter().cloned())
                .collect::<Vec<_>>()
                .join("_"),
            helper: name,
            args: arrays,
        };
        let call = Expr::Call(instance.name.clone(), scalars, Ty::Unknown);
        let mut known = self.instances.borrow_mut();
        if !known.contains(&instance) {
            known.push(instance);
        }
        Ok(call)
    }
}

/// The first `break` or `continue` of `block` that would leave or skip its own loop (not one
/// inside a nested loop).
fn loop_jump(block: &syn::Block) -> Option<&Syn> {
    struct Find<'a>(Option<&'a Syn>);
    impl<'a> syn::visit::Visit<'a> for Find<'a> {
        fn visit_expr(&mut self, e: &'a Syn) {
            match e {
                Syn::Break(_) | Syn::Continue(_) if self.0.is_none() => self.0 = Some(e),
                Syn::ForLoop(_) | Syn::While(_) | Syn::Loop(_) => {}
                _ => syn::visit::visit_expr(self, e),
            }
        }
    }
    let mut find = Find(None);
    syn::visit::Visit::visit_block(&mut find, block);
    find.0
}

fn strip_parens(e: &Syn) -> &Syn {
    match e {
        Syn::Paren(p) => strip_parens(&p.expr),
        other => other,
    }
}

fn literal(l: &Lit) -> syn::Result<Expr> {
    Ok(match l {
        Lit::Bool(b) => Expr::Lit(b.value.to_string(), Ty::Bool),
        Lit::Int(i) => match i.suffix() {
            "" => Expr::Lit(i.base10_digits().to_string(), Ty::AnyInt),
            "u32" => Expr::Lit(format!("{}u", i.base10_digits()), Ty::U32),
            "i32" => Expr::Lit(format!("{}i", i.base10_digits()), Ty::I32),
            "f32" => Expr::Lit(format!("{}.0f", i.base10_digits()), Ty::F32),
            _ => return Err(unsupported(i, "integer types other than u32 and i32")),
        },
        Lit::Float(f) => {
            if !matches!(f.suffix(), "" | "f32") {
                return Err(unsupported(f, "float types other than f32"));
            }
            let value: f32 = f
                .base10_digits()
                .parse()
                .map_err(|_| syn::Error::new(f.span(), "not a number"))?;
            if !value.is_finite() {
                return Err(syn::Error::new(f.span(), "outside the range of f32"));
            }
            // The shortest decimal that rounds to the f32; where that decimal lies beyond
            // f32::MAX before rounding (`3.4028235e38`), the f32's exact value instead:
            // Chrome's WGSL compiler (Tint) rejects such a literal, naga rounds it.
            let shortest = format!("{value:?}");
            let exact = match shortest.parse::<f64>() {
                Ok(x) if x.abs() > f64::from(f32::MAX) => format!("{:?}", f64::from(value)),
                _ => shortest,
            };
            let text = if f.suffix() == "f32" {
                format!("{exact}f")
            } else {
                exact
            };
            Expr::Lit(text, Ty::F32)
        }
        other => return Err(unsupported(other, "this literal")),
    })
}

fn binop(op: &BinOp) -> syn::Result<&'static str> {
    Ok(match op {
        BinOp::Add(_) => "+",
        BinOp::Sub(_) => "-",
        BinOp::Mul(_) => "*",
        BinOp::Div(_) => "/",
        BinOp::Rem(_) => "%",
        BinOp::And(_) => "&&",
        BinOp::Or(_) => "||",
        BinOp::BitXor(_) => "^",
        BinOp::BitAnd(_) => "&",
        BinOp::BitOr(_) => "|",
        BinOp::Shl(_) => "<<",
        BinOp::Shr(_) => ">>",
        BinOp::Eq(_) => "==",
        BinOp::Lt(_) => "<",
        BinOp::Le(_) => "<=",
        BinOp::Ne(_) => "!=",
        BinOp::Ge(_) => ">=",
        BinOp::Gt(_) => ">",
        BinOp::AddAssign(_) => "+=",
        BinOp::SubAssign(_) => "-=",
        BinOp::MulAssign(_) => "*=",
        BinOp::DivAssign(_) => "/=",
        BinOp::RemAssign(_) => "%=",
        BinOp::BitXorAssign(_) => "^=",
        BinOp::BitAndAssign(_) => "&=",
        BinOp::BitOrAssign(_) => "|=",
        BinOp::ShlAssign(_) => "<<=",
        BinOp::ShrAssign(_) => ">>=",
        other => return Err(unsupported(other, "this operator")),
    })
}
