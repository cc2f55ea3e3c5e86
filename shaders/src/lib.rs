//! hesper-rs GPU kernels, written in the shader DSL. Each `#[kernel]` function becomes a module
//! holding its WGSL, binding table and typed launch arguments (`Args`, see the `hesper-dsl`
//! crate); the WebGPU backend launches them through `hesper-gpu`.

mod argmax;
mod bitlinear;
mod elementwise;
mod embed;
mod experts;
mod flash_attention;
mod gemm;
mod geometry;
mod half;
mod k_quants;
mod kv;
mod matrix_cores;
mod matvec;
mod norm;
mod quantize;
mod reduce;
mod rope;
mod tile;

pub use argmax::{argmax_final, argmax_partial, take_top, NON_FINITE};
pub use bitlinear::{
    bitlinear_i2s, bitlinear_i2s_dp4, bitlinear_i2s_dp4_wide, bitlinear_i2s_wide, bitlinear_tq,
    bitlinear_tq_wide,
};
pub use elementwise::{
    add_assign, add_bias, add_qkv_bias, gelu_mul, interleave_rows, moe_combine, relu2_mul,
    scale_assign, silu_mul, softcap_assign, swiglu_clamped_mul,
};
pub use embed::{embed_f16, embed_f32};
pub use experts::{
    biased_glu_by_id, gate_grids, moe_combine_routed, moe_group, moe_route, GROUPED_EXPERTS,
};
pub use flash_attention::{attention, rope_attention, OUT_F32, OUT_HALVES, OUT_Q8_0, OUT_Q8_K};
pub use gemm::{
    bitlinear_i2s_gemm, bitlinear_tq_gemm, matvec_bf16_gemm, matvec_bf16_gemm_id, matvec_f16_gemm,
    matvec_f16_gemm_id, matvec_f32_gemm, matvec_kq_gemm, matvec_kq_gemm_id, matvec_q8_0_gemm,
    matvec_q8_0_gemm_id,
};
pub use geometry::{
    attention_grid, gemm_grid, landmark_grid, lanes_per_row, matrix_grid, narrow_gemm_grid,
    q8_0_grid, row_grid, span_grid, GEMM_ROWS, GEMM_STEP, GEMM_TOKENS, MATRIX_WORKGROUP,
    NARROW_GEMM_TOKENS, Q8_0_BLOCKS_PER_WORKGROUP, TOKEN_TILE, WIDE_STEP,
};
pub use half::pack_f16;
pub use k_quants::{matvec_kq, matvec_kq_id, matvec_kq_wide};
pub use kv::{kv_shift, kv_write, landmark_update, rope_neox_kv_write};
pub use matrix_cores::{
    bitlinear_i2s_coop, bitlinear_i2s_coop_stand_in, bitlinear_tq_coop, bitlinear_tq_coop_stand_in,
    matvec_kq_coop, matvec_kq_coop_stand_in, matvec_q8_0_coop, matvec_q8_0_coop_stand_in,
};
pub use matvec::{
    matvec_bf16, matvec_bf16_id, matvec_bf16_wide, matvec_f16, matvec_f16_id, matvec_f16_wide,
    matvec_f32, matvec_f32_wide, matvec_q8_0, matvec_q8_0_dp4, matvec_q8_0_dp4_id,
    matvec_q8_0_dp4_wide, matvec_q8_0_id, matvec_q8_0_wide,
};
pub use norm::{
    rms_norm, rms_norm_add_norm_sg, rms_norm_heads, rms_norm_pack_f16_sg,
    rms_norm_quantize_i8_packed_sg, rms_norm_quantize_q8_0_sg, rms_norm_quantize_q8k_sg,
    rms_norm_sg,
};
pub use quantize::{quantize_i8, quantize_i8_packed, quantize_q8_0, quantize_q8k};
pub use rope::{rope_neox, rope_norm};
pub use tile::{store_rows, ADD, GLU_CLAMPED, GLU_GELU, GLU_RELU2, GLU_SILU, SPLIT_QKV, STORE};
