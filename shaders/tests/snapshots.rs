//! The WGSL of every kernel, pinned by insta snapshots (`tests/snapshots/`): a change to the
//! DSL printer or to a kernel shows up as a reviewable diff of the generated shader. After an
//! intended change: `INSTA_UPDATE=always cargo test -p hesper-shaders --test snapshots`.

macro_rules! snapshots {
    ($($k:ident),* $(,)?) => {
        $(insta::assert_snapshot!(stringify!($k), hesper_shaders::$k::WGSL);)*
    };
}

#[test]
fn generated_wgsl_is_unchanged() {
    snapshots!(
        add_assign,
        add_bias,
        add_qkv_bias,
        silu_mul,
        relu2_mul,
        gelu_mul,
        swiglu_clamped_mul,
        scale_assign,
        softcap_assign,
        interleave_rows,
        moe_combine,
        moe_route,
        gate_grids,
        moe_combine_routed,
        rms_norm,
        rms_norm_sg,
        rms_norm_heads_sg,
        rms_norm_quantize_i8_packed_sg,
        rms_norm_pack_f16_sg,
        rms_norm_quantize_q8_0_sg,
        rms_norm_quantize_q8k_sg,
        argmax_partial,
        argmax_final,
        take_top,
        rope_neox,
        rope_norm,
        kv_write,
        rope_neox_kv_write,
        rope_attention,
        kv_shift,
        landmark_update,
        quantize_i8,
        quantize_i8_packed,
        quantize_q8k,
        quantize_q8_0,
        pack_f16,
        bitlinear_i2s,
        bitlinear_i2s_wide,
        bitlinear_i2s_dp4,
        bitlinear_i2s_dp4_wide,
        bitlinear_i2s_gemm,
        bitlinear_tq_gemm,
        matvec_kq_gemm,
        matvec_q8_0_gemm,
        matvec_f16_gemm,
        matvec_f32_gemm,
        matvec_bf16_gemm,
        bitlinear_tq,
        bitlinear_tq_wide,
        matvec_f32,
        matvec_f32_wide,
        matvec_f16,
        matvec_f16_wide,
        matvec_q8_0,
        matvec_q8_0_wide,
        matvec_q8_0_dp4,
        matvec_q8_0_dp4_wide,
        matvec_bf16,
        matvec_bf16_wide,
        matvec_kq,
        matvec_kq_wide,
        embed_f32,
        embed_f16,
        attention,
    );
}
