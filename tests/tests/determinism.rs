//! Determinism: CPU logits are bit-identical whatever the thread count (1, 2, 3, 8) and the
//! batch size (the prompt in one batch, in chunks of 7 or 3, or one token at a time), on
//! every instruction set this CPU runs, with the weights repacked or not (each its own
//! reference: the interleaved F16 and Q8_0 kernels sum in the scalar kernels' order, the file
//! layout's in eight-lane runs; I2_S and TQ sums are exact either way); GPU logits are
//! identical run to run.

use hesper_cpu::{CpuBackend, Isa};
use hesper_engine::model::{LoadOptions, Logits, Model};
use hesper_tests::{gpu_model, Golden, ALL};

/// Every position's logits of the golden model's longest sequence, prompt in `batch`-token
/// steps.
fn logits<B: hesper_engine::backend::Backend>(
    model: &Model<B>,
    tokens: &[u32],
    batch: usize,
) -> Vec<u32> {
    let mut s = model.new_session(tokens.len(), batch).expect("session");
    let out = model.eval(&mut s, tokens, Logits::All).expect("eval");
    out.iter().map(|v| v.to_bits()).collect()
}

fn longest(g: &Golden) -> &[u32] {
    g.sequences
        .iter()
        .map(|s| s.tokens.as_slice())
        .max_by_key(|t| t.len())
        .expect("a sequence")
}

#[test]
fn cpu_logits_do_not_depend_on_threads_or_batch_size() {
    for stem in ALL {
        let g = Golden::load(stem);
        let file = g.file();
        let tokens = longest(&g);
        for isa in Isa::supported() {
            for repack in [true, false] {
                let mut reference: Option<Vec<u32>> = None;
                for threads in [1, 2, 3, 8] {
                    let backend = CpuBackend::with_isa(threads, isa)
                        .unwrap_or_else(|e| panic!("{e}"))
                        .with_repack(repack);
                    let model = Model::load(backend, file.clone(), LoadOptions::default())
                        .unwrap_or_else(|e| panic!("{stem}: {e}"));
                    for batch in [tokens.len(), 7, 3, 1] {
                        let got = logits(&model, tokens, batch);
                        let want = reference.get_or_insert_with(|| got.clone());
                        assert!(
                            got == *want,
                            "{stem} {isa:?}: logits differ with {threads} threads, batch {batch}, repack {repack}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_logits_are_the_same_run_to_run() {
    for stem in ["tiny-i2s", "tiny-tq2_0"] {
        let g = Golden::load(stem);
        let file = g.file();
        let tokens = longest(&g);
        for batch in [tokens.len(), 1] {
            let first = logits(&gpu_model(&file, None), tokens, batch);
            let again = logits(&gpu_model(&file, None), tokens, batch);
            assert!(
                again == first,
                "{stem}: GPU logits changed run to run (batch {batch})"
            );
        }
    }
}
