//! A bounds-checked little-endian cursor over the file bytes.

use super::error::GgufError;

/// Reads fields front to back; every read checks the remaining length first.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    pub(crate) fn take(
        &mut self,
        n: u64,
        what: &dyn Fn() -> String,
    ) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos(),
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` elements of at least `min_size` bytes each can still fit, so a
    /// corrupt count never triggers a huge allocation.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let remaining = self.remaining();
        match count.checked_mul(min_size) {
            Some(bytes) if bytes <= remaining => Ok(count as usize),
            _ => Err(GgufError::AbsurdCount {
                what: what(),
                count,
                remaining,
            }),
        }
    }

    pub(crate) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let len = self.check_count(len, 1, &|| format!("length of {}", what()))?;
        let raw = self.take(len as u64, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| GgufError::BadUtf8 { what: what() })
    }
}
