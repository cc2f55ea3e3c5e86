//! GPT-2's byte-level alphabet: every byte is stored in the vocabulary as one printable
//! character (`Ġ` = 0x20, `Ċ` = 0x0A, …). Bytes that are already printable and not a space map
//! to themselves; the other 68 map to U+0100 upwards, in byte order.

/// True for the bytes GPT-2 keeps as themselves.
const fn is_kept(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Code point of the character for each byte.
const BYTE_TO_CP: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut next = 0x100;
    let mut b = 0;
    while b < 256 {
        if is_kept(b as u8) {
            t[b] = b as u32;
        } else {
            t[b] = next;
            next += 1;
        }
        b += 1;
    }
    t
};

/// Highest code point in the alphabet, plus one (0x100 + 68).
const CP_END: usize = 0x144;

/// Byte for each code point below [`CP_END`], or -1.
const CP_TO_BYTE: [i16; CP_END] = {
    let mut t = [-1i16; CP_END];
    let mut b = 0;
    while b < 256 {
        t[BYTE_TO_CP[b] as usize] = b as i16;
        b += 1;
    }
    t
};

/// The character that stands for byte `b` in byte-level vocabularies.
#[cfg(test)]
pub(crate) fn byte_to_char(b: u8) -> char {
    char::from_u32(BYTE_TO_CP[usize::from(b)]).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Inverse of `byte_to_char`: the byte a vocabulary character stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let b = *CP_TO_BYTE.get(u32::from(c) as usize)?;
    u8::try_from(b).ok()
}

/// Raw bytes of a byte-level token text. A character outside the alphabet (never in a
/// well-formed vocabulary) is kept as its own UTF-8 bytes.
pub(crate) fn decode_token(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_characters() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'!'), '!');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
    }

    #[test]
    fn round_trip_all_bytes() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b), "byte {b}");
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
