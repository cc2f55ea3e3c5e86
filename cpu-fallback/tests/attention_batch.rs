//! Attention of a batch (the prefill path: four query heads of one kv head per task) equals the
//! same tokens attended one at a time (the decode path: one query head per task), bit for bit,
//! on every instruction set; for models whose query heads share kv heads in fours (2B4T) and
//! not (every golden model has two per kv head).

use hesper_cpu::attention::{attention, KvCache};
use hesper_cpu::Isa;
use hesper_engine::backend::AttentionShape;

/// `n` values from a fixed generator.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

#[test]
fn a_batch_attends_like_its_tokens_one_at_a_time() {
    // head width 72: four 16-lane steps and an 8-wide tail; two batches, the second one
    // starting at position 13.
    for (n_head, n_head_kv) in [(8, 2), (12, 3), (4, 2)] {
        let s = AttentionShape {
            n_head,
            n_head_kv,
            head_dim: 72,
            window: None,
            softcap: None,
            sinks: None,
        };
        let (width, kv_dim) = (n_head * 72, n_head_kv * 72);
        for isa in Isa::supported() {
            let mut batched = KvCache::new(1, 32, kv_dim);
            let mut single = KvCache::new(1, 32, kv_dim);
            for (pos0, n) in [(0usize, 13usize), (13, 6)] {
                let seed = pos0 as u64 + 1;
                let (q, k, v) = (
                    values(n * width, seed),
                    values(n * kv_dim, seed + 100),
                    values(n * kv_dim, seed + 200),
                );
                let mut want = vec![0.0f32; n * width];
                for t in 0..n {
                    attention(
                        isa,
                        &mut single,
                        0,
                        &q[t * width..][..width],
                        &k[t * kv_dim..][..kv_dim],
                        &v[t * kv_dim..][..kv_dim],
                        1,
                        pos0 + t,
                        &s,
                        &mut want[t * width..][..width],
                    );
                }
                let mut got = vec![0.0f32; n * width];
                attention(isa, &mut batched, 0, &q, &k, &v, n, pos0, &s, &mut got);
                assert!(
                    got == want,
                    "{isa:?}, {n_head}/{n_head_kv} heads, tokens {pos0}..{}",
                    pos0 + n
                );
            }
        }
    }
}
