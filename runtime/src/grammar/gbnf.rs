//! llama.cpp's GBNF grammars (llama-server's `grammar` field, `--grammar-file`) rewritten as
//! the Lark grammars llguidance reads, rule for rule, read as llama.cpp's own parser reads
//! them: `name ::= …` on one line unless inside parentheses or after `|`, `root` the start,
//! `"…"` literals and `[…]` classes with their escapes, `.` any character, `( )`, `|`,
//! `* + ?` and `{m}`, `{m,}`, `{,n}`, `{m,n}` repetition, `#` comments.

use std::collections::HashMap;
use std::fmt::Write as _;

/// Parentheses nested deeper than this are refused: the reader recurses once per level (a
/// request of a million `(` would overflow its stack), and llguidance refuses Lark grammars
/// nested much less deep anyway.
const MAX_NESTING: usize = 64;

/// The Lark grammar of a GBNF grammar, or where and why it cannot be read.
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, String> {
    let mut p = Reader {
        src: gbnf.as_bytes(),
        pos: 0,
        names: HashMap::new(),
        depth: 0,
    };
    let mut rules = Vec::new();
    loop {
        p.skip_space(true);
        if p.pos >= p.src.len() {
            break;
        }
        let name = p.name()?;
        p.skip_space(false);
        if !p.src[p.pos..].starts_with(b"::=") {
            return Err(p.error("expected ::= after a rule's name"));
        }
        p.pos += 3;
        p.skip_space(true);
        let body = p.alternates(false)?;
        match p.peek() {
            None | Some(b'\n') | Some(b'\r') => {}
            Some(_) => return Err(p.error("expected the end of the line")),
        }
        rules.push((name, body));
    }
    if rules.is_empty() {
        return Err("the grammar has no rule".into());
    }
    let defined: Vec<&String> = rules.iter().map(|(n, _)| n).collect();
    if !defined.iter().any(|n| *n == "start") {
        return Err("the grammar has no root rule".into());
    }
    for (gbnf_name, lark) in &p.names {
        if !defined.contains(&lark) {
            return Err(format!("rule {gbnf_name:?} is used but not defined"));
        }
    }
    let mut out = String::new();
    for (name, body) in rules {
        let _ = writeln!(out, "{name}: {body}");
    }
    Ok(out)
}

/// A cursor over the GBNF text and the Lark names given to its rules.
struct Reader<'a> {
    src: &'a [u8],
    pos: usize,
    names: HashMap<String, String>,
    /// Parentheses open where the reader is.
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn error(&self, why: &str) -> String {
        let line = 1 + self.src[..self.pos.min(self.src.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        format!("line {line}: {why}")
    }

    /// Skips blanks and comments, and line ends where `newlines` (inside parentheses, after
    /// `::=` and `|`).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n' && b != b'\r') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    /// A rule name (letters, digits, `-`, `_`), as its Lark name: `root` is `start`, the
    /// others lowercase with `_` and a `g_` prefix (Lark's uppercase names are terminals),
    /// numbered if two would meet.
    fn name(&mut self) -> Result<String, String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expected a rule name"));
        }
        let gbnf = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
        if let Some(lark) = self.names.get(&gbnf) {
            return Ok(lark.clone());
        }
        let lark = if gbnf == "root" {
            "start".to_string()
        } else {
            let base = format!("g_{}", gbnf.to_ascii_lowercase().replace('-', "_"));
            let mut name = base.clone();
            let mut k = 2;
            while self.names.values().any(|v| *v == name) {
                name = format!("{base}_{k}");
                k += 1;
            }
            name
        };
        self.names.insert(gbnf, lark.clone());
        Ok(lark)
    }

    /// Sequences separated by `|`.
    fn alternates(&mut self, nested: bool) -> Result<String, String> {
        let mut out = self.sequence(nested)?;
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.skip_space(true);
            out.push_str(" | ");
            out.push_str(&self.sequence(nested)?);
        }
        Ok(out)
    }

    /// Items with their repetitions, up to `|`, `)` or (outside parentheses) the line's end.
    fn sequence(&mut self, nested: bool) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        loop {
            let item = match self.peek() {
                Some(b'"') => self.literal()?,
                Some(b'[') => self.class()?,
                Some(b'.') => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                Some(b'(') => {
                    if self.depth == MAX_NESTING {
                        return Err(
                            self.error(&format!("parentheses nested more than {MAX_NESTING} deep"))
                        );
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    self.depth += 1;
                    let inner = self.alternates(true);
                    self.depth -= 1;
                    let inner = inner?;
                    if self.peek() != Some(b')') {
                        return Err(self.error("expected )"));
                    }
                    self.pos += 1;
                    format!("({inner})")
                }
                Some(b) if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' => self.name()?,
                Some(b'<') | Some(b'!') => {
                    return Err(self.error("token references (<[id]>) are not supported"))
                }
                _ => break,
            };
            let item = self.repetition(item)?;
            items.push(item);
            self.skip_space(nested);
        }
        if items.is_empty() {
            return Ok("\"\"".into());
        }
        Ok(items.join(" "))
    }

    /// `item` with the `*`, `+`, `?` or `{…}` after it.
    fn repetition(&mut self, item: String) -> Result<String, String> {
        match self.peek() {
            Some(op @ (b'*' | b'+' | b'?')) => {
                self.pos += 1;
                Ok(format!("{item}{}", op as char))
            }
            Some(b'{') => {
                self.pos += 1;
                let close = self.src[self.pos..]
                    .iter()
                    .position(|&b| b == b'}')
                    .ok_or_else(|| self.error("expected }"))?;
                let inside = String::from_utf8_lossy(&self.src[self.pos..self.pos + close])
                    .replace([' ', '\t'], "");
                self.pos += close + 1;
                let number = |s: &str| -> Result<Option<u32>, String> {
                    if s.is_empty() {
                        return Ok(None);
                    }
                    s.parse()
                        .map(Some)
                        .map_err(|_| self.error(&format!("repetition {{{inside}}}")))
                };
                let (min, max) = match inside.split_once(',') {
                    None => {
                        let n =
                            number(&inside)?.ok_or_else(|| self.error("empty repetition {}"))?;
                        (n, Some(n))
                    }
                    Some((a, b)) => (number(a)?.unwrap_or(0), number(b)?),
                };
                Ok(match max {
                    Some(0) => "\"\"".to_string(),
                    Some(max) if max < min => {
                        return Err(self.error(&format!("repetition {{{inside}}}")))
                    }
                    Some(max) => format!("{item}{{{min},{max}}}"),
                    None => format!("{item}{{{min},}}"),
                })
            }
            _ => Ok(item),
        }
    }

    /// One character of a literal or class, with GBNF's escapes.
    fn char(&mut self) -> Result<char, String> {
        let rest = std::str::from_utf8(&self.src[self.pos..])
            .map_err(|_| self.error("the grammar is not UTF-8"))?;
        let mut chars = rest.chars();
        let c = chars.next().ok_or_else(|| self.error("unexpected end"))?;
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let e = chars
            .next()
            .ok_or_else(|| self.error("unexpected end after \\"))?;
        self.pos += 2;
        let hex = |r: &mut Self, digits: usize| -> Result<char, String> {
            let h = r
                .src
                .get(r.pos..r.pos + digits)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
                .ok_or_else(|| r.error("a bad \\x, \\u or \\U escape"))?;
            r.pos += digits;
            Ok(h)
        };
        match e {
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            'n' => Ok('\n'),
            '\\' | '"' | '[' | ']' => Ok(e),
            _ => Err(self.error(&format!("unknown escape \\{e}"))),
        }
    }

    /// A `"…"` literal as a Lark (JSON-escaped) string.
    fn literal(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("a literal is not closed")),
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => text.push(self.char()?),
            }
        }
        Ok(serde_json::to_string(&text).expect("a string"))
    }

    /// A `[…]` class as a Lark regular expression, every character escaped.
    fn class(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut out = String::from("/[");
        if self.peek() == Some(b'^') {
            self.pos += 1;
            out.push('^');
        }
        let mut empty = true;
        loop {
            match self.peek() {
                None => return Err(self.error("a character class is not closed")),
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let lo = self.char()?;
                    let _ = write!(out, "\\x{{{:x}}}", lo as u32);
                    if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                        self.pos += 1;
                        let hi = self.char()?;
                        if hi < lo {
                            return Err(self.error(&format!("the range {lo:?}-{hi:?} is empty")));
                        }
                        let _ = write!(out, "-\\x{{{:x}}}", hi as u32);
                    }
                    empty = false;
                }
            }
        }
        if empty {
            return Err(self.error("an empty character class"));
        }
        out.push_str("]/");
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn rules_literals_classes_and_repetitions() {
        let lark = gbnf_to_lark(
            "# a comment\nroot ::= answer (\", \" answer){0,2} # trailing\nanswer ::= (\"yes\" | \"no\") [a-z-]? .\n",
        )
        .expect("reads");
        assert_eq!(
            lark,
            "start: g_answer (\", \" g_answer){0,2}\n\
             g_answer: (\"yes\" | \"no\") /[\\x{61}-\\x{7a}\\x{2d}]/? /(?s:.)/\n"
        );
    }

    #[test]
    fn a_rule_goes_on_inside_parentheses_and_after_a_bar() {
        let lark = gbnf_to_lark("root ::= (\n  \"a\"\n  | \"b\"\n) |\n \"c\"\n").expect("reads");
        assert_eq!(lark, "start: (\"a\" | \"b\") | \"c\"\n");
    }

    #[test]
    fn escapes_become_json_strings() {
        let lark = gbnf_to_lark(r#"root ::= "\x41\n\"\u00e9" [^\]]"#).expect("reads");
        assert_eq!(lark, "start: \"A\\n\\\"é\" /[^\\x{5d}]/\n");
    }

    #[test]
    fn mistakes_are_named_with_their_line() {
        for (gbnf, why) in [
            ("root ::= \"a", "line 1: a literal is not closed"),
            ("root ::= x", "rule \"x\" is used but not defined"),
            ("item ::= \"a\"", "the grammar has no root rule"),
            (
                "root ::= \"a\"\nx = \"b\"",
                "line 2: expected ::= after a rule's name",
            ),
            ("root ::= [z-a]", "line 1: the range 'z'-'a' is empty"),
            ("root ::= \"a\"{3,1}", "line 1: repetition {3,1}"),
            (
                "root ::= <[42]>",
                "line 1: token references (<[id]>) are not supported",
            ),
            ("", "the grammar has no rule"),
        ] {
            assert_eq!(gbnf_to_lark(gbnf).unwrap_err(), why, "{gbnf:?}");
        }
        let deep = format!(
            "root ::= {}\"a\"{}",
            "(".repeat(100_000),
            ")".repeat(100_000)
        );
        assert_eq!(
            gbnf_to_lark(&deep).unwrap_err(),
            "line 1: parentheses nested more than 64 deep"
        );
        let fine = format!("root ::= {}\"a\"{}", "(".repeat(64), ")".repeat(64));
        assert!(gbnf_to_lark(&fine).is_ok());
    }
}
