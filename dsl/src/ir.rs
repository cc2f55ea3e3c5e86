//! The typed intermediate form of a kernel or helper body: what `lower.rs` builds from the
//! Rust syntax (after every DSL check, helper instantiation and unrolling) and `wgsl.rs`
//! prints. A second printer (a CPU interpreter for tests, SPIR-V) would read the same tree.

/// A WGSL scalar type, where the lowering knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// `f32`.
    F32,
    /// `f16` (workgroup arrays of a cooperative-matrix kernel, [`Expr::Cast`] by `to_f16(x)`).
    F16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `bool`.
    Bool,
    /// An integer literal without a suffix (WGSL's abstract int: takes the other side's type).
    AnyInt,
    /// Not known to the lowering (a helper's result, a generic element); rustc checks it on
    /// the twin.
    Unknown,
}

impl Ty {
    /// The WGSL spelling of a concrete type.
    pub fn wgsl(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::F16 => "f16",
            Ty::U32 => "u32",
            Ty::I32 => "i32",
            Ty::Bool => "bool",
            Ty::AnyInt | Ty::Unknown => unreachable!("only concrete types are printed"),
        }
    }

    /// The type from a WGSL scalar name (`f32`, `u32`, `i32`, `bool`).
    pub fn from_wgsl(name: &str) -> Self {
        match name {
            "f32" => Ty::F32,
            "f16" => Ty::F16,
            "u32" => Ty::U32,
            "i32" => Ty::I32,
            "bool" => Ty::Bool,
            _ => Ty::Unknown,
        }
    }

    /// The type of `a op b` for arithmetic: the known side's.
    pub fn join(self, other: Self) -> Self {
        match (self, other) {
            (Ty::AnyInt | Ty::Unknown, t) if !matches!(t, Ty::Unknown) => t,
            (t, _) => t,
        }
    }
}

/// A sequence of statements.
pub type Block = Vec<Stmt>;

/// A statement.
#[derive(Clone)]
pub enum Stmt {
    /// `let name[: ty] = init;` or `var name[: ty][ = init];`.
    Let {
        /// Its name.
        name: String,
        /// `var` (else `let`).
        mutable: bool,
        /// The written type, if any.
        ty: Option<Ty>,
        /// The value, if any.
        init: Option<Expr>,
    },
    /// `var name: array<elem, len>;` (zeroed).
    LocalArray {
        /// Its name.
        name: String,
        /// Element type.
        elem: Ty,
        /// Length.
        len: u32,
    },
    /// An expression statement (`x = y`, `x += y`, a call).
    Expr(Expr),
    /// A helper's result.
    Return(Option<Expr>),
    /// `if cond { then } else ..`.
    If {
        /// The condition.
        cond: Expr,
        /// Taken when it holds.
        then: Block,
        /// `else { .. }` or `else if ..` (one `If` statement).
        otherwise: Option<Else>,
    },
    /// `for (var var: u32 = start; var <|<= end; var += step) { body }`.
    For {
        /// The counter.
        var: String,
        /// First value.
        start: Expr,
        /// Bound.
        end: Expr,
        /// `..=`.
        inclusive: bool,
        /// Increment (`1u` when absent).
        step: Option<Expr>,
        /// The body.
        body: Block,
    },
    /// `while cond { body }`.
    While {
        /// The condition.
        cond: Expr,
        /// The body.
        body: Block,
    },
    /// `{ .. }`: a plain block, or one iteration of an unrolled loop (its counter a `let`).
    Scope(Block),
    /// A loop over a kernel constant, unrolled: its iterations (scopes), one after another.
    Unrolled(Block),
}

/// What follows `else`.
#[derive(Clone)]
pub enum Else {
    /// `else { .. }`.
    Block(Block),
    /// `else if ..`.
    If(Box<Stmt>),
}

/// An expression.
#[derive(Clone)]
pub enum Expr {
    /// A literal, already in WGSL spelling.
    Lit(String, Ty),
    /// A local, a parameter, a buffer, an array or a constant, by name.
    Name(String, Ty),
    /// A uniform: `params.name`.
    Uniform(String, Ty),
    /// A helper's buffer or array parameter `i`, filled in by each kernel instantiating it.
    Placeholder(usize),
    /// `(e)`.
    Paren(Box<Expr>),
    /// `-e`, `!e`.
    Unary(&'static str, Box<Expr>),
    /// `a op b`, including assignments (`=`, `+=`, ..).
    Binary(&'static str, Box<Expr>, Box<Expr>, Ty),
    /// `a[i]`.
    Index(Box<Expr>, Box<Expr>, Ty),
    /// `T(e)`.
    Cast(Ty, Box<Expr>),
    /// A WGSL function, built-in or helper instance, with its arguments.
    Call(String, Vec<Expr>, Ty),
    /// A value with no call syntax (`gid.x`, `sg_size`).
    Builtin(&'static str, Ty),
    /// `e.x`: a component of a built-in's vector result.
    Member(Box<Expr>, &'static str, Ty),
    /// `arrayLength(&e)`.
    ArrayLength(Box<Expr>),
    /// `break`, `continue` or `return` as an expression statement.
    Jump(&'static str),
    /// A cooperative-matrix operation; its array operand, where it has one, first.
    Coop(CoopOp, Vec<Expr>),
}

/// The cooperative-matrix operations (16×16 tiles, `f16` operands, `f32` accumulators), each
/// printed as WGSL's built-in natively and as a function of the stand-in
/// (`crate::coop`) otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopOp {
    /// `coop_zero()`: an accumulator of zeros.
    Zero,
    /// `coop_load_a_rows(array, offset, stride)`: the left operand, stored row by row.
    LoadARows,
    /// `coop_load_b_columns(array, offset, stride)`: the right operand, column by column.
    LoadBColumns,
    /// `coop_multiply_add(a, b, c)`.
    MultiplyAdd,
    /// `coop_store_columns(c, array, offset, stride)`: an accumulator, column by column.
    StoreColumns,
}

impl Expr {
    /// Its type, where known.
    pub fn ty(&self) -> Ty {
        match self {
            Expr::Lit(_, t)
            | Expr::Name(_, t)
            | Expr::Uniform(_, t)
            | Expr::Binary(_, _, _, t)
            | Expr::Index(_, _, t)
            | Expr::Call(_, _, t)
            | Expr::Builtin(_, t)
            | Expr::Member(_, _, t) => *t,
            Expr::Cast(t, _) => *t,
            Expr::Paren(e) | Expr::Unary(_, e) => e.ty(),
            Expr::ArrayLength(_) => Ty::U32,
            Expr::Placeholder(_) | Expr::Jump(_) | Expr::Coop(..) => Ty::Unknown,
        }
    }
}
