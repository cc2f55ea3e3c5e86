//! Compile-time assembly of a kernel's WGSL module from its helpers' templates (used by the code
//! `#[kernel]` generates; every function here is `const`).
//!
//! A `#[kernel_fn]` helper's WGSL is a template: its function name is written [`NAME`] and each
//! buffer or workgroup-array parameter `i` is written [`PARAM`], `i` as one decimal digit,
//! [`PARAM`]. A kernel instantiates it with its own names — the helper then reads and writes
//! the kernel's arrays, which WGSL cannot pass to functions — under a name of its own per
//! set of arrays, so one helper serves arrays of any name and element type.

/// Marks where a helper template's function name goes.
pub const NAME: u8 = 2;
/// Brackets the index of a helper template's array parameter.
pub const PARAM: u8 = 1;

/// The length of `template` instantiated with `name` and the array names `args`.
pub const fn instance_len(template: &str, name: &str, args: &[&str]) -> usize {
    let t = template.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < t.len() {
        if t[i] == NAME {
            n += name.len();
            i += 1;
        } else if t[i] == PARAM {
            n += args[(t[i + 1] - b'0') as usize].len();
            i += 3;
        } else {
            n += 1;
            i += 1;
        }
    }
    n
}

/// `template` instantiated with `name` and the array names `args`; `N` is [`instance_len`].
pub const fn instance<const N: usize>(template: &str, name: &str, args: &[&str]) -> [u8; N] {
    let t = template.as_bytes();
    let mut out = [0u8; N];
    let (mut i, mut o) = (0, 0);
    while i < t.len() {
        if t[i] == NAME {
            o = put(&mut out, o, name.as_bytes());
            i += 1;
        } else if t[i] == PARAM {
            o = put(&mut out, o, args[(t[i + 1] - b'0') as usize].as_bytes());
            i += 3;
        } else {
            out[o] = t[i];
            o += 1;
            i += 1;
        }
    }
    out
}

/// The total length of `parts`.
pub const fn total_len(parts: &[&[u8]]) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < parts.len() {
        n += parts[i].len();
        i += 1;
    }
    n
}

/// `parts` joined; `N` is [`total_len`].
pub const fn concat<const N: usize>(parts: &[&[u8]]) -> [u8; N] {
    let mut out = [0u8; N];
    let (mut i, mut o) = (0, 0);
    while i < parts.len() {
        o = put(&mut out, o, parts[i]);
        i += 1;
    }
    out
}

/// The bytes as text (every part is UTF-8, so the join is).
pub const fn text(bytes: &[u8]) -> &str {
    match core::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => panic!("kernel WGSL is not UTF-8"),
    }
}

const fn put<const N: usize>(out: &mut [u8; N], mut o: usize, src: &[u8]) -> usize {
    let mut j = 0;
    while j < src.len() {
        out[o] = src[j];
        o += 1;
        j += 1;
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_takes_the_kernels_names() {
        const T: &str = "fn \u{2}(t: u32) { \u{1}0\u{1}[t] += \u{1}1\u{1}[t]; }";
        const ARGS: &[&str] = &["acc", "sums"];
        const N: usize = instance_len(T, "sum_acc_sums", ARGS);
        const OUT: [u8; N] = instance(T, "sum_acc_sums", ARGS);
        assert_eq!(text(&OUT), "fn sum_acc_sums(t: u32) { acc[t] += sums[t]; }");
        const PARTS: &[&[u8]] = &[b"a", b"", b"bc"];
        const J: [u8; total_len(PARTS)] = concat(PARTS);
        assert_eq!(&J, b"abc");
    }
}
