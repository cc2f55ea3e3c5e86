//! The syn → WGSL printer for kernel bodies.

use syn::spanned::Spanned;
use syn::{BinOp, Block, Expr, Lit, Local, Pat, Stmt, Type, UnOp};

use crate::signature::{wgsl_type, Signature};

/// Prints statements and expressions of a kernel (or helper) body as WGSL.
pub struct Emitter<'a> {
    sig: &'a Signature,
    /// Helper functions (`#[kernel_fn]`) the body may call.
    helpers: &'a [String],
    /// Printing a helper: a trailing expression is its result, and the entry point's
    /// built-ins (`gid`, `lid`, `wid`) are out of reach.
    helper: bool,
    /// The kernel declared `features(subgroups)`.
    subgroups: bool,
    /// Workgroup arrays passed to helpers: `(helper, position among its arrays, "name: type")`.
    shared_args: std::cell::RefCell<Vec<(String, usize, String)>>,
}

fn unsupported(node: impl Spanned, what: &str) -> syn::Error {
    syn::Error::new(node.span(), format!("not supported in a kernel: {what}"))
}

impl<'a> Emitter<'a> {
    /// A printer for the body of the kernel with signature `sig`, which may call `helpers`
    /// (and use subgroup operations when `subgroups`).
    pub fn new(sig: &'a Signature, helpers: &'a [String], subgroups: bool) -> Self {
        Self {
            sig,
            helpers,
            helper: false,
            subgroups,
            shared_args: Default::default(),
        }
    }

    /// A printer for the body of a `#[kernel_fn]` helper with signature `sig`.
    pub fn for_helper(sig: &'a Signature) -> Self {
        Self {
            sig,
            helpers: &[],
            helper: true,
            subgroups: false,
            shared_args: Default::default(),
        }
    }

    /// The workgroup arrays the body passed to helpers (see [`Emitter::new`]).
    pub fn shared_args(&self) -> Vec<(String, usize, String)> {
        self.shared_args.borrow().clone()
    }

    /// A block's statements, each line indented `depth` levels.
    pub fn block(&self, b: &Block, depth: usize) -> syn::Result<String> {
        b.stmts.iter().map(|s| self.stmt(s, depth)).collect()
    }

    fn stmt(&self, s: &Stmt, depth: usize) -> syn::Result<String> {
        let pad = "    ".repeat(depth);
        Ok(match s {
            Stmt::Local(local) => format!("{pad}{}\n", self.local(local)?),
            Stmt::Expr(e, semi) => match e {
                Expr::If(_) | Expr::ForLoop(_) | Expr::While(_) | Expr::Block(_) => {
                    self.control(e, depth)?
                }
                _ if semi.is_some() => format!("{pad}{};\n", self.expr(e)?),
                _ if self.helper => format!("{pad}return {};\n", self.expr(e)?),
                _ => {
                    return Err(unsupported(
                        e,
                        "a trailing expression (kernels return nothing)",
                    ))
                }
            },
            Stmt::Item(i) => return Err(unsupported(i, "items inside a kernel")),
            Stmt::Macro(m) => return Err(unsupported(m, "macros")),
        })
    }

    fn local(&self, l: &Local) -> syn::Result<String> {
        let (pat, ty) = match &l.pat {
            Pat::Type(pt) => (&*pt.pat, Some(self.ty(&pt.ty)?)),
            p => (p, None),
        };
        let Pat::Ident(id) = pat else {
            return Err(unsupported(pat, "patterns other than a name"));
        };
        let keyword = if id.mutability.is_some() {
            "var"
        } else {
            "let"
        };
        let ty = ty.map(|t| format!(": {t}")).unwrap_or_default();
        let init = match &l.init {
            Some(init) if init.diverge.is_none() => format!(" = {}", self.expr(&init.expr)?),
            Some(init) => return Err(unsupported(&init.expr, "let-else")),
            None if keyword == "var" => String::new(),
            None => return Err(unsupported(l, "an immutable `let` without a value")),
        };
        Ok(format!("{keyword} {}{ty}{init};", id.ident))
    }

    fn ty(&self, t: &Type) -> syn::Result<&'static str> {
        wgsl_type(t).ok_or_else(|| unsupported(t, "types other than f32, u32, i32 and bool"))
    }

    fn control(&self, e: &Expr, depth: usize) -> syn::Result<String> {
        let pad = "    ".repeat(depth);
        Ok(match e {
            Expr::If(i) => {
                let mut out = format!(
                    "{pad}if {} {{\n{}{pad}}}",
                    self.expr(&i.cond)?,
                    self.block(&i.then_branch, depth + 1)?
                );
                match i.else_branch.as_ref().map(|(_, e)| &**e) {
                    None => {}
                    Some(Expr::Block(b)) => {
                        out += &format!(" else {{\n{}{pad}}}", self.block(&b.block, depth + 1)?)
                    }
                    Some(nested @ Expr::If(_)) => {
                        out += &format!(" else {}", self.control(nested, depth)?.trim_start())
                    }
                    Some(other) => return Err(unsupported(other, "this else branch")),
                }
                out + "\n"
            }
            Expr::ForLoop(f) => {
                let Pat::Ident(var) = &*f.pat else {
                    return Err(unsupported(&f.pat, "loop patterns other than a name"));
                };
                let (range, step) = match &*f.expr {
                    Expr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
                        (&*m.receiver, self.expr(&m.args[0])?)
                    }
                    other => (other, "1u".to_string()),
                };
                let Expr::Range(r) = strip_parens(range) else {
                    return Err(unsupported(&f.expr, "loops over anything but `a..b`"));
                };
                let (Some(start), Some(end)) = (&r.start, &r.end) else {
                    return Err(unsupported(r, "open ranges"));
                };
                let cmp = match r.limits {
                    syn::RangeLimits::HalfOpen(_) => "<",
                    syn::RangeLimits::Closed(_) => "<=",
                };
                let v = &var.ident;
                format!(
                    "{pad}for (var {v}: u32 = {}; {v} {cmp} {}; {v} += {step}) {{\n{}{pad}}}\n",
                    self.expr(start)?,
                    self.expr(end)?,
                    self.block(&f.body, depth + 1)?
                )
            }
            Expr::While(w) => format!(
                "{pad}while {} {{\n{}{pad}}}\n",
                self.expr(&w.cond)?,
                self.block(&w.body, depth + 1)?
            ),
            Expr::Block(b) => format!("{pad}{{\n{}{pad}}}\n", self.block(&b.block, depth + 1)?),
            _ => unreachable!("control() is only called on control flow"),
        })
    }

    fn expr(&self, e: &Expr) -> syn::Result<String> {
        Ok(match e {
            Expr::Lit(l) => literal(&l.lit)?,
            Expr::Path(p) => {
                let Some(id) = p.path.get_ident() else {
                    return Err(unsupported(p, "paths"));
                };
                let name = id.to_string();
                if self.sig.is_uniform(&name) {
                    format!("params.{name}")
                } else {
                    name
                }
            }
            Expr::Paren(p) => format!("({})", self.expr(&p.expr)?),
            Expr::Binary(b) => format!(
                "{} {} {}",
                self.expr(&b.left)?,
                binop(&b.op)?,
                self.expr(&b.right)?
            ),
            Expr::Unary(u) => match u.op {
                UnOp::Neg(_) => format!("-{}", self.expr(&u.expr)?),
                UnOp::Not(_) => format!("!{}", self.expr(&u.expr)?),
                _ => return Err(unsupported(u, "dereference")),
            },
            Expr::Assign(a) => format!("{} = {}", self.expr(&a.left)?, self.expr(&a.right)?),
            Expr::Index(i) => format!("{}[{}]", self.expr(&i.expr)?, self.expr(&i.index)?),
            Expr::Cast(c) => format!("{}({})", self.ty(&c.ty)?, self.expr(&c.expr)?),
            Expr::MethodCall(m) => self.method(m)?,
            Expr::Call(c) => self.call(c)?,
            Expr::Break(b) if b.expr.is_none() && b.label.is_none() => "break".into(),
            Expr::Continue(c) if c.label.is_none() => "continue".into(),
            Expr::Return(r) if r.expr.is_none() => "return".into(),
            other => return Err(unsupported(other, "this expression")),
        })
    }

    fn method(&self, m: &syn::ExprMethodCall) -> syn::Result<String> {
        let recv = self.expr(&m.receiver)?;
        let args = m
            .args
            .iter()
            .map(|a| self.expr(a))
            .collect::<syn::Result<Vec<_>>>()?;
        let name = m.method.to_string();
        Ok(match (name.as_str(), args.as_slice()) {
            ("sqrt" | "exp" | "abs" | "floor" | "round" | "trunc", []) => format!("{name}({recv})"),
            ("clamp", [lo, hi]) => format!("clamp({recv}, {lo}, {hi})"),
            ("max" | "min", [other]) => format!("{name}({recv}, {other})"),
            ("len", []) if self.sig.is_array(&recv) => format!("arrayLength(&{recv})"),
            _ => {
                return Err(unsupported(
                    m,
                    &format!("the method `{name}` with {} argument(s)", args.len()),
                ))
            }
        })
    }

    fn call(&self, c: &syn::ExprCall) -> syn::Result<String> {
        let Expr::Path(p) = &*c.func else {
            return Err(unsupported(&c.func, "calls through expressions"));
        };
        let Some(id) = p.path.get_ident() else {
            return Err(unsupported(p, "paths"));
        };
        let args = c
            .args
            .iter()
            .map(|a| self.expr(a))
            .collect::<syn::Result<Vec<_>>>()?;
        let name = id.to_string();
        if self.helpers.contains(&name) {
            // Workgroup arrays are not WGSL arguments (the helper names them directly); each
            // one passed is recorded so the kernel checks it matches the helper's at compile
            // time.
            let mut scalars = Vec::new();
            let mut shared = 0;
            for a in &c.args {
                let decl = match a {
                    Expr::Path(p) => p
                        .path
                        .get_ident()
                        .and_then(|i| self.sig.shared_decl(&i.to_string())),
                    _ => None,
                };
                match decl {
                    Some(decl) => {
                        self.shared_args
                            .borrow_mut()
                            .push((name.clone(), shared, decl));
                        shared += 1;
                    }
                    None => scalars.push(self.expr(a)?),
                }
            }
            return Ok(format!("{name}({})", scalars.join(", ")));
        }
        if self.helper && matches!(name.as_str(), "gid" | "lid" | "wid" | "wid_y") {
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
        Ok(match (name.as_str(), args.as_slice()) {
            ("subgroup_add", [x]) => format!("subgroupAdd({x})"),
            ("subgroup_max", [x]) => format!("subgroupMax({x})"),
            ("subgroup_invocation", []) => "sg_invocation".into(),
            ("subgroup_size", []) => "sg_size".into(),
            ("subgroup_index", []) => "sg_index".into(),
            ("subgroup_count", []) => "sg_count".into(),
            ("gid", []) => "gid.x".into(),
            ("lid", []) => "lid.x".into(),
            ("wid", []) => "wid.x".into(),
            ("wid_y", []) => "wid.y".into(),
            ("f32_from_bits", [w]) => format!("bitcast<f32>({w})"),
            ("dot4_i8_packed", [a, b]) => format!("dot4I8Packed({a}, {b})"),
            ("unpack_f16_lo", [w]) => format!("unpack2x16float({w}).x"),
            ("unpack_f16_hi", [w]) => format!("unpack2x16float({w}).y"),
            ("round_to_f16", [x]) => format!("quantizeToF16({x})"),
            ("f32_to_bits", [x]) => format!("bitcast<u32>({x})"),
            ("barrier", []) => "workgroupBarrier()".into(),
            ("select", [f, t, cond]) => format!("select({f}, {t}, {cond})"),
            (name, _) => {
                return Err(unsupported(
                    c,
                    &format!("the call `{name}` (intrinsics: gid, lid, wid, wid_y, barrier, select, f32_from_bits, dot4_i8_packed, unpack_f16_lo, unpack_f16_hi, round_to_f16, f32_to_bits, subgroup_add, subgroup_max, subgroup_invocation, subgroup_size, subgroup_index, subgroup_count; helpers are listed in `uses(..)`)"),
                ))
            }
        })
    }
}

fn strip_parens(e: &Expr) -> &Expr {
    match e {
        Expr::Paren(p) => strip_parens(&p.expr),
        other => other,
    }
}

fn literal(l: &Lit) -> syn::Result<String> {
    Ok(match l {
        Lit::Bool(b) => b.value.to_string(),
        Lit::Int(i) => match i.suffix() {
            "" => i.base10_digits().to_string(),
            "u32" => format!("{}u", i.base10_digits()),
            "i32" => format!("{}i", i.base10_digits()),
            "f32" => format!("{}.0f", i.base10_digits()),
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
            if f.suffix() == "f32" {
                format!("{exact}f")
            } else {
                exact
            }
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
