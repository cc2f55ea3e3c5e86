//! Deterministic pseudo-random test data (xorshift64), the same on every machine.

/// A xorshift64 stream.
pub struct Rng(u64);

impl Rng {
    /// The stream for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next value in `[-1, 1)`, a multiple of 2⁻²³.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `n` values in `[-1, 1)` from the stream for `seed`.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.unit()).collect()
}
