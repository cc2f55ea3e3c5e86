//! The WGSL printer: the IR of `ir.rs` as text, one statement a line, four spaces a level.

use crate::coop::Target;
use crate::ir::{Block, Else, Expr, Stmt};

/// Where a helper template's function name goes (`hesper_gpu::wgsl_text::NAME`).
const NAME_MARK: char = '\u{2}';
/// Brackets the index of a helper template's array parameter (`hesper_gpu::wgsl_text::PARAM`).
const PARAM_MARK: char = '\u{1}';

/// The statements of `b`, each line indented `depth` levels, for `target` (which only
/// cooperative-matrix operations tell apart).
pub fn block(b: &Block, depth: usize, target: Target) -> String {
    b.iter().map(|s| stmt(s, depth, target)).collect()
}

fn stmt(s: &Stmt, depth: usize, target: Target) -> String {
    let block = |b: &Block, depth: usize| block(b, depth, target);
    let expr = |e: &Expr| expr(e, target);
    let pad = "    ".repeat(depth);
    match s {
        Stmt::Let {
            name,
            mutable,
            ty,
            init,
        } => {
            let keyword = if *mutable { "var" } else { "let" };
            let ty = ty.map(|t| format!(": {}", t.wgsl())).unwrap_or_default();
            let init = init
                .as_ref()
                .map(|e| format!(" = {}", expr(e)))
                .unwrap_or_default();
            format!("{pad}{keyword} {name}{ty}{init};\n")
        }
        Stmt::LocalArray { name, elem, len } => {
            // The zero value written out, so that an array declared in a loop starts at zero on
            // every iteration in browsers too: Chromium 156's WGSL compiler (SwiftShader)
            // zeroed `var s: array<i32, 4>;` in a loop only once, and the TQ and Q8_0 products,
            // which declare their block sums there, came out wrong in the page.
            let ty = format!("array<{}, {len}>", elem.wgsl());
            format!("{pad}var {name} = {ty}();\n")
        }
        Stmt::Expr(e) => format!("{pad}{};\n", expr(e)),
        Stmt::Return(Some(e)) => format!("{pad}return {};\n", expr(e)),
        Stmt::Return(None) => format!("{pad}return;\n"),
        Stmt::If { .. } => format!("{pad}{}\n", if_chain(s, depth, target)),
        Stmt::For {
            var,
            start,
            end,
            inclusive,
            step,
            body,
        } => {
            let cmp = if *inclusive { "<=" } else { "<" };
            let step = step.as_ref().map_or_else(|| "1u".to_string(), &expr);
            format!(
                "{pad}for (var {var}: u32 = {}; {var} {cmp} {}; {var} += {step}) {{\n{}{pad}}}\n",
                expr(start),
                expr(end),
                block(body, depth + 1)
            )
        }
        Stmt::While { cond, body } => format!(
            "{pad}while {} {{\n{}{pad}}}\n",
            expr(cond),
            block(body, depth + 1)
        ),
        Stmt::Scope(b) => format!("{pad}{{\n{}{pad}}}\n", block(b, depth + 1)),
        Stmt::Unrolled(iterations) => block(iterations, depth),
    }
}

/// `if .. { .. } else if .. { .. } else { .. }` without its indent and final newline.
fn if_chain(s: &Stmt, depth: usize, target: Target) -> String {
    let Stmt::If {
        cond,
        then,
        otherwise,
    } = s
    else {
        unreachable!("if_chain prints `if` statements")
    };
    let pad = "    ".repeat(depth);
    let then = block(then, depth + 1, target);
    let mut out = format!("if {} {{\n{then}{pad}}}", expr(cond, target));
    match otherwise {
        None => {}
        Some(Else::Block(b)) => out += &format!(" else {{\n{}{pad}}}", block(b, depth + 1, target)),
        Some(Else::If(nested)) => out += &format!(" else {}", if_chain(nested, depth, target)),
    }
    out
}

/// An expression.
fn expr(e: &Expr, target: Target) -> String {
    let expr = |e: &Expr| expr(e, target);
    match e {
        Expr::Lit(text, _) | Expr::Name(text, _) => text.clone(),
        Expr::Uniform(name, _) => format!("params.{name}"),
        Expr::Placeholder(i) => format!("{PARAM_MARK}{i}{PARAM_MARK}"),
        Expr::Paren(e) => format!("({})", expr(e)),
        Expr::Unary(op, e) => format!("{op}{}", expr(e)),
        Expr::Binary(op, a, b, _) => format!("{} {op} {}", expr(a), expr(b)),
        Expr::Index(a, i, _) => format!("{}[{}]", expr(a), expr(i)),
        Expr::Cast(t, e) => format!("{}({})", t.wgsl(), expr(e)),
        Expr::Call(name, args, _) => {
            let args: Vec<String> = args.iter().map(expr).collect();
            format!("{name}({})", args.join(", "))
        }
        Expr::Builtin(name, _) => (*name).to_string(),
        Expr::Member(e, field, _) => format!("{}.{field}", expr(e)),
        Expr::ArrayLength(e) => format!("arrayLength(&{})", expr(e)),
        Expr::Jump(word) => (*word).to_string(),
        Expr::Coop(op, args) => {
            let args: Vec<String> = args.iter().map(expr).collect();
            target.coop(*op, &args)
        }
    }
}

/// A helper's function header: its name left as the placeholder each kernel fills in.
pub fn helper(params: &str, ret: Option<&str>, body: &Block) -> String {
    let ret = ret.map(|t| format!(" -> {t}")).unwrap_or_default();
    let body = block(body, 1, Target::Native);
    format!("fn {NAME_MARK}({params}){ret} {{\n{body}}}\n")
}
