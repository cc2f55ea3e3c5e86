//! JSON as Python writes it, for templates: transformers gives templates a `tojson` filter that
//! is `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`, and templates
//! print tool definitions and call arguments through it, so the text a model reads depends on
//! Python's spacing (`", "` and `": "`, or `","` with an indent), its escapes and its float
//! spelling (`1.0`, `1e-05`, `1e+16`). minijinja's own `tojson` writes compact, HTML-escaped JSON.
//!
//! Also here: request JSON (`serde_json`) turned into template values, keeping the order of
//! object keys as Python's dicts keep it.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The widest indent `tojson` takes (templates use 2 or 4): each line repeats it once per level.
pub const MAX_INDENT: usize = 64;

/// The most text one `tojson` writes: a hostile template's indent or separators, repeated over
/// a request's values, end here instead of exhausting memory.
pub const MAX_OUTPUT: usize = 64 << 20;

/// `x | tojson(indent=…, separators=(item, key), sort_keys=…, ensure_ascii=…)` as transformers
/// defines it.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.clamp(0, MAX_INDENT as i64 + 1) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(invalid("tojson: indent is a number or a string")),
        },
    };
    if indent.as_ref().is_some_and(|i| i.len() > MAX_INDENT) {
        return Err(invalid(&format!(
            "tojson: an indent of more than {MAX_INDENT} characters"
        )));
    }
    let (item, key) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => return Err(invalid("tojson: separators is (item, key)")),
        // Python's defaults: no space before a line break when indenting.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = Style {
        indent,
        item,
        key,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from(out))
}

/// `v` as a template value: objects keep their keys' order.
pub fn value_from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (None, None, f) => Value::from(f.unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(value_from_json).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), value_from_json(v)))),
    }
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

/// `json.dumps`'s options.
struct Style {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Style {
    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        if out.len() > MAX_OUTPUT {
            return Err(invalid(&format!(
                "tojson: more than {} MiB of JSON",
                MAX_OUTPUT >> 20
            )));
        }
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => {
                let n = i128::try_from(v.clone())?;
                out.push_str(&n.to_string());
            }
            ValueKind::Number => out.push_str(&float_repr(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '[', ']', depth, &items, |item, out| {
                    self.write(item, depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.container(out, '{', '}', depth, &keys, |k, out| {
                    match k.as_str() {
                        Some(s) => self.string(s, out),
                        // Python writes a number key as its string.
                        None => self.string(&k.to_string(), out),
                    }
                    out.push_str(&self.key);
                    self.write(&v.get_item(k)?, depth + 1, out)
                })?;
            }
            kind => {
                return Err(invalid(&format!(
                    "tojson: a value of type {kind} is not JSON serializable"
                )))
            }
        }
        Ok(())
    }

    /// `items` between `open` and `close`, one per line when indenting.
    fn container<T>(
        &self,
        out: &mut String,
        open: char,
        close: char,
        depth: usize,
        items: &[T],
        mut each: impl FnMut(&T, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, depth: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                for _ in 0..depth {
                    out.push_str(indent);
                }
            }
        };
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item);
            }
            newline(out, depth + 1);
            each(item, out)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }

    /// A string with Python's escapes: `"`, `\`, the named controls, other controls as
    /// `\u00XX`, and with `ensure_ascii` everything past ASCII as UTF-16 `\uXXXX`.
    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A float as Python's `repr` writes it (what `json.dumps` uses): the shortest digits that
/// read back, positional from 1e-4 up to 1e16 with at least one decimal (`1.0`), scientific
/// outside it with a signed exponent of at least two digits (`1e-05`, `1.5e+16`); `NaN` and
/// `Infinity` as `json.dumps` allows them.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Where the decimal point falls after the first digit.
    let point = exp + 1;
    if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{fraction}e{exp_sign}{:02}", exp.abs());
    }
    let text = if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_python_writes_them() {
        // Each pair is Python 3's repr.
        for (f, python) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456.789, "123456.789"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-1.5e-7, "-1.5e-07"),
            (1e300, "1e+300"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(float_repr(f), python, "{f:e}");
        }
    }

    /// `json` through the `tojson` filter with `args`.
    fn render(json: &str, args: &str) -> Result<String, minijinja::Error> {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let v = value_from_json(&serde_json::from_str(json).unwrap());
        env.render_str(
            &format!("{{{{ v | tojson({args}) }}}}"),
            minijinja::context! { v },
        )
    }

    fn dumps(json: &str, args: &str) -> String {
        render(json, args).unwrap()
    }

    #[test]
    fn json_is_spaced_and_escaped_as_python_does() {
        // Python: json.dumps(x, ensure_ascii=False, ...), the templates' filter.
        let x = r#"{"b": [1, 2.5, {"c": null}], "a": "é<\"\n\u0001", "e": [], "f": {}}"#;
        assert_eq!(
            dumps(x, ""),
            r#"{"b": [1, 2.5, {"c": null}], "a": "é<\"\n\u0001", "e": [], "f": {}}"#
        );
        assert_eq!(
            dumps(x, "indent=2"),
            "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"c\": null\n    }\n  ],\n  \"a\": \"é<\\\"\\n\\u0001\",\n  \"e\": [],\n  \"f\": {}\n}"
        );
        assert_eq!(
            dumps(x, "separators=(',', ':'), sort_keys=true"),
            r#"{"a":"é<\"\n\u0001","b":[1,2.5,{"c":null}],"e":[],"f":{}}"#
        );
        assert_eq!(
            dumps(r#""😀é""#, "ensure_ascii=true"),
            r#""\ud83d\ude00\u00e9""#
        );
    }

    fn dumps_err(json: &str, args: &str) -> String {
        render(json, args).expect_err("refused").to_string()
    }

    #[test]
    fn a_hostile_indent_or_separator_is_refused_not_allocated() {
        assert!(dumps_err("[1]", "indent=1000000000").contains("indent of more than 64"));
        let wide = "x".repeat(65);
        assert!(dumps_err("[1]", &format!("indent='{wide}'")).contains("indent of more than 64"));
        // A separator of 1 MiB between 100 items would be 100 MiB of text.
        let items = format!("[{}]", vec!["0"; 100].join(","));
        let sep = "x".repeat(1 << 20);
        assert!(dumps_err(&items, &format!("separators=('{sep}', ':')")).contains("MiB of JSON"));
        // The widest indent allowed still writes.
        assert_eq!(
            dumps("[1]", "indent=64"),
            format!("[\n{}1\n]", " ".repeat(64))
        );
    }
}
