//! Op-by-op teacher forcing, for any backend: every operation of every layer is fed the
//! reference's own input (llama.cpp's graph tensors, or our float64 reference for I2_S) and its
//! output compared with the reference's output of that op. Because each quantized matmul
//! quantizes exactly the reference's input, no int8 code can flip: only f32 rounding and
//! summation order differ.
//!
//! Bound: 1e-4 relative to the tensor's magnitude, `|Δ| ≤ 1e-4 · max(1, max|ref|)`. f32
//! rounding through 256–512-term sums is ~1e-6 of that; the bound is still tight enough that
//! a wrong activation quantization (Q8_K vs per-token vs none) fails by 100× (3.6e-2 measured
//! on q_proj-0 of tiny-tq2_0, golden-values/out/ops-validation.txt).

use hesper_engine::backend::{AttentionShape, Backend, MatrixUse, RopeShape};
use hesper_engine::config::Config;
use hesper_engine::model::{matrix_source, vector_source};

use crate::{max_abs_diff, Golden, Ops};

fn check(stem: &str, what: &str, ours: &[f32], reference: &[f32]) -> f32 {
    let scale = reference.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(ours, reference);
    assert!(
        diff <= 1e-4 * scale,
        "{stem} {what}: max |Δ| {diff} > 1e-4 × {scale}"
    );
    diff / scale
}

/// Runs every op of every layer of `stem` on `backend`, each fed the reference's own input,
/// and asserts each output within `1e-4 · max(1, max|ref|)` of the reference's; returns the
/// worst `|Δ| / scale`.
pub fn run_ops<B: Backend>(backend: &B, stem: &str) -> f32 {
    let g = Golden::load(stem);
    let ops = Ops::load(stem);
    let file = g.file();
    let c = Config::from_gguf(file.header(), Some(g.n_vocab)).expect("config");
    let n = ops.tokens.len();
    let (d, ff, kv) = (c.n_embd, c.n_ff, c.kv_dim());
    let buf = |data: &[f32]| {
        let mut b = backend.alloc(data.len()).expect("alloc");
        backend.write(&mut b, data).expect("write");
        b
    };
    let read = |b: &B::Buffer, len: usize| {
        let mut v = vec![0.0; len];
        pollster::block_on(backend.read(b, &mut v)).expect("read");
        v
    };
    let matrix = |name: &str, rows, cols| {
        let (desc, scale) = matrix_source(&file, name, rows, cols).expect("matrix");
        backend
            .load_matrix(&file, desc, scale, MatrixUse::Product)
            .expect("load")
    };
    let vector = |name: &str, len| {
        backend
            .load_vector(vector_source(&file, name, len).expect("vector"))
            .expect("load")
    };
    let mut worst = 0.0f32;
    let mut cmp = |what: String, ours: &[f32], reference: &[f32]| {
        worst = worst.max(check(stem, &what, ours, reference))
    };

    // Layer 0's input is the embedding (exact F16/F32 → f32); later layers take l_out.
    let embd = matrix("token_embd.weight", c.n_vocab, d);
    let mut x0 = backend.alloc(n * d).expect("alloc");
    backend.embed(&embd, &ops.tokens, &mut x0);
    let mut cache = backend
        .new_cache(&vec![n; c.n_layer], kv, &Default::default())
        .expect("cache");
    for l in 0..c.n_layer {
        let op = |name: &str| ops.get(&format!("{name}-{l}"));
        let input = if l == 0 {
            read(&x0, n * d)
        } else {
            ops.get(&format!("l_out-{}", l - 1)).to_vec()
        };
        let p = |name: &str| format!("blk.{l}.{name}");
        let mut out = backend.alloc(n * ff.max(d)).expect("alloc");

        let norm = |x: &[f32], w: &str, width: usize, out: &mut B::Buffer| {
            backend.rms_norm(&buf(x), &vector(&p(w), width), n, c.eps, out)
        };
        norm(&input, "attn_norm.weight", d, &mut out);
        cmp(
            format!("attn_norm-{l}"),
            &read(&out, n * d),
            op("attn_norm"),
        );
        for (name, rows, w) in [
            ("q_proj", d, "attn_q"),
            ("k_proj", kv, "attn_k"),
            ("v_proj", kv, "attn_v"),
        ] {
            backend.matmul(
                &matrix(&p(&format!("{w}.weight")), rows, d),
                &buf(op("attn_norm")),
                n,
                &mut out,
            );
            cmp(format!("{name}-{l}"), &read(&out, n * rows), op(name));
        }
        for (name, src, heads) in [
            ("q_rope", "q_proj", c.n_head),
            ("k_rope", "k_proj", c.n_head_kv),
        ] {
            let mut x = buf(op(src));
            backend.rope(
                &mut x,
                n,
                0,
                &RopeShape {
                    n_head: heads,
                    head_dim: c.head_dim,
                    rope_dim: c.rope_dim,
                    base: c.rope_base,
                    scale: c.rope_scale,
                    freq_factors: None,
                    attn_factor: 1.0,
                    yarn: None,
                },
            );
            cmp(
                format!("{name}-{l}"),
                &read(&x, n * heads * c.head_dim),
                op(name),
            );
        }
        let shape = AttentionShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            window: None,
            softcap: None,
            sinks: None,
        };
        backend.attention(
            &mut cache,
            l,
            &buf(op("q_rope")),
            &buf(op("k_rope")),
            &buf(op("v_proj")),
            n,
            0,
            &shape,
            &mut out,
        );
        cmp(format!("kqv_out-{l}"), &read(&out, n * d), op("kqv_out"));
        norm(op("kqv_out"), "attn_sub_norm.weight", d, &mut out);
        cmp(
            format!("attn_sub_norm-{l}"),
            &read(&out, n * d),
            op("attn_sub_norm"),
        );
        backend.matmul(
            &matrix(&p("attn_output.weight"), d, d),
            &buf(op("attn_sub_norm")),
            n,
            &mut out,
        );
        cmp(format!("attn_out-{l}"), &read(&out, n * d), op("attn_out"));
        let mut x = buf(&input);
        backend.add(&mut x, &buf(op("attn_out")), n * d);
        cmp(format!("ffn_inp-{l}"), &read(&x, n * d), op("ffn_inp"));
        norm(op("ffn_inp"), "ffn_norm.weight", d, &mut out);
        cmp(format!("ffn_norm-{l}"), &read(&out, n * d), op("ffn_norm"));
        for (name, w) in [("ffn_gate", "ffn_gate"), ("ffn_up", "ffn_up")] {
            backend.matmul(
                &matrix(&p(&format!("{w}.weight")), ff, d),
                &buf(op("ffn_norm")),
                n,
                &mut out,
            );
            cmp(format!("{name}-{l}"), &read(&out, n * ff), op(name));
        }
        backend.glu(
            &buf(op("ffn_gate")),
            &buf(op("ffn_up")),
            n * ff,
            c.activation,
            &mut out,
        );
        cmp(format!("ffn_act-{l}"), &read(&out, n * ff), op("ffn_act"));
        norm(op("ffn_act"), "ffn_sub_norm.weight", ff, &mut out);
        cmp(
            format!("ffn_sub_norm-{l}"),
            &read(&out, n * ff),
            op("ffn_sub_norm"),
        );
        backend.matmul(
            &matrix(&p("ffn_down.weight"), d, ff),
            &buf(op("ffn_sub_norm")),
            n,
            &mut out,
        );
        cmp(format!("ffn_down-{l}"), &read(&out, n * d), op("ffn_down"));
        let mut x = buf(op("ffn_inp"));
        backend.add(&mut x, &buf(op("ffn_down")), n * d);
        cmp(format!("l_out-{l}"), &read(&x, n * d), op("l_out"));
    }
    let mut out = backend.alloc(n * d).expect("alloc");
    backend.rms_norm(
        &buf(ops.get(&format!("l_out-{}", c.n_layer - 1))),
        &vector("output_norm.weight", d),
        n,
        c.eps,
        &mut out,
    );
    cmp(
        "result_norm".into(),
        &read(&out, n * d),
        ops.get("result_norm"),
    );
    worst
}
