//! Which CPU kernels a model gets and which of its weight types are repacked for them at load:
//! told by `info` and under `bench`'s table.

use hesper_cpu::Isa;
use hesper_engine::gguf::{GgmlType, Gguf};

use crate::args::KernelArgs;

/// The CPU kernels `args` would run on the model `g` and the layout each of its weight types
/// gets: "avx2 kernels, F16 repacked sixteen rows deep at load (Q8_0 as in the file)", with
/// ", TQ1_0 rewritten as TQ2_0 at load" where its TQ1_0 matrices are;
/// `head_as_stored`: no `--lm-head` re-quantizes the head.
pub fn describe(args: &KernelArgs, g: &Gguf, head_as_stored: bool) -> String {
    let isa = args.cpu_kernels.unwrap_or_else(Isa::detect);
    // The matrices' types: an F16 embedding table that is only looked up stays as stored; one
    // that is also the LM head (tied, not re-quantized) is repacked with the products.
    let tied_head = head_as_stored && g.tensor("output.weight").is_none();
    let mut types: Vec<GgmlType> = g
        .tensors()
        .iter()
        .filter(|t| {
            t.n_dims >= 2 && (t.name != "token_embd.weight" || t.ty != GgmlType::F16 || tied_head)
        })
        .map(|t| t.ty)
        .collect();
    types.sort_by_key(|ty| ty.to_string());
    types.dedup();
    let rewrites_tq1_0 =
        !args.no_repack && isa.rewrites_tq1_0() && types.contains(&GgmlType::TQ1_0);
    let (repacked, kept): (Vec<GgmlType>, Vec<GgmlType>) = types
        .into_iter()
        .filter(|&ty| !(rewrites_tq1_0 && ty == GgmlType::TQ1_0))
        .partition(|&ty| !args.no_repack && repacks(isa, ty));
    let names = |types: &[GgmlType]| {
        let names: Vec<String> = types.iter().map(GgmlType::to_string).collect();
        names.join(", ")
    };
    let mut changed = Vec::new();
    if !repacked.is_empty() {
        changed.push(format!(
            "{} repacked sixteen rows deep at load",
            names(&repacked)
        ));
    }
    if rewrites_tq1_0 {
        changed.push("TQ1_0 rewritten as TQ2_0 at load".to_string());
    }
    let layout = match (changed.is_empty(), kept.is_empty()) {
        (true, _) => "weights as in the file".to_string(),
        (false, true) => changed.join(", "),
        (false, false) => format!("{} ({} as in the file)", changed.join(", "), names(&kept)),
    };
    let runs = if isa.is_supported() {
        ""
    } else {
        " (this CPU cannot run them)"
    };
    format!("{} kernels{runs}, {layout}", isa.name())
}

/// Whether `isa`'s kernels read matrices of type `ty` from a copy interleaved at load.
fn repacks(isa: Isa, ty: GgmlType) -> bool {
    match ty {
        GgmlType::I2S => isa.interleaves_i2s(),
        GgmlType::Q8_0 => isa.interleaves_q8_0(),
        GgmlType::Q4_0 => isa.interleaves_q4_0(),
        GgmlType::MXFP4 => isa.interleaves_mxfp4(),
        GgmlType::Q4K | GgmlType::Q5K => isa.interleaves_q4_k(),
        GgmlType::Q6K => isa.interleaves_q6_k(),
        GgmlType::F16 => isa.interleaves_f16(),
        _ => false,
    }
}
