//! The tensors a model file may hold, as one table: for each, the piece of the model it is
//! loaded into and which families read it. The unread-tensor check, the parts a hot-swap
//! prepares again, the tensors a ring node holds and the load's progress count are all read
//! from here, so a family's tensors are named once.

use super::layer::LayerPart;
use crate::config::Family;

/// What a tensor of the table is: the suffixes its name may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A matrix: `<name>.weight`, and `<name>.scale` where its format keeps the scale apart
    /// (BitNet's ternary tensors).
    Matrix,
    /// A vector of gains or factors: `<name>.weight`.
    Vector,
    /// A bias added to a product's output: `<name>.bias`.
    Bias,
}

impl Kind {
    /// Whether `suffix` names a tensor of this kind.
    fn takes(self, suffix: &str) -> bool {
        match self {
            Kind::Matrix => matches!(suffix, "weight" | "scale"),
            Kind::Vector => suffix == "weight",
            Kind::Bias => suffix == "bias",
        }
    }
}

/// Which families' graphs read a tensor of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadBy {
    /// Every family.
    All,
    /// Models whose FFN is one gated FFN.
    Dense,
    /// Models whose FFN is a mixture of experts ([`Family::moe`], by the file where the family
    /// leaves it to it).
    Moe,
    /// Families with BitNet's sub-norms ([`Family::sub_norms`]).
    SubNorms,
    /// Families with Q/K head norms ([`Family::qk_norm`]).
    QkNorm,
    /// Families with norms of the attention's and the FFN's outputs ([`Family::post_norms`]).
    PostNorms,
    /// Families whose norm before the FFN has the row's name ([`Family::ffn_norm`]).
    FfnNorm,
    /// Families with attention sinks ([`Family::sinks`]).
    Sinks,
    /// Families with biases on the attention's output and the experts ([`Family::biases`]).
    Biases,
}

impl ReadBy {
    fn includes(self, name: &str, f: &Family, moe: bool) -> bool {
        match self {
            ReadBy::All => true,
            ReadBy::Dense => !moe,
            ReadBy::Moe => moe,
            ReadBy::SubNorms => f.sub_norms,
            ReadBy::QkNorm => f.qk_norm,
            ReadBy::PostNorms => f.post_norms,
            ReadBy::FfnNorm => f.ffn_norm == name,
            ReadBy::Sinks => f.sinks,
            ReadBy::Biases => f.biases,
        }
    }
}

/// One tensor of a layer (`blk.<il>.<name>.<suffix>`).
struct LayerTensor {
    /// The name between the layer's prefix and the suffix.
    name: &'static str,
    kind: Kind,
    /// The piece of the layer it is loaded into.
    part: LayerPart,
    /// The families that read it. Which of them a file must hold is the loader's to say (a
    /// missing tensor is named there): Q/K/V biases are read where the file has them, and
    /// `attn_qkv` stands in for `attn_q`, `attn_k` and `attn_v` where present (Phi-3).
    read_by: ReadBy,
}

const fn t(name: &'static str, kind: Kind, part: LayerPart, read_by: ReadBy) -> LayerTensor {
    LayerTensor {
        name,
        kind,
        part,
        read_by,
    }
}

/// Every tensor a layer of any family may hold, in the order the forward pass reads them.
/// An `ffn_up` of twice the FFN's width with no `ffn_gate` holds both (Phi-3).
const LAYER_TENSORS: &[LayerTensor] = {
    use Kind::*;
    use LayerPart as P;
    use ReadBy::*;
    &[
        t("attn_norm", Vector, P::AttnNorm, All),
        t("attn_q", Matrix, P::Qkv, All),
        t("attn_k", Matrix, P::Qkv, All),
        t("attn_v", Matrix, P::Qkv, All),
        t("attn_qkv", Matrix, P::Qkv, All),
        t("attn_q", Bias, P::QkvBias, All),
        t("attn_k", Bias, P::QkvBias, All),
        t("attn_v", Bias, P::QkvBias, All),
        t("attn_q_norm", Vector, P::QkNorm, QkNorm),
        t("attn_k_norm", Vector, P::QkNorm, QkNorm),
        t("attn_sub_norm", Vector, P::AttnSubNorm, SubNorms),
        t("attn_sinks", Vector, P::Sinks, Sinks),
        t("attn_output", Matrix, P::Wo, All),
        t("attn_output", Bias, P::WoBias, Biases),
        t("post_attention_norm", Vector, P::PostNorms, PostNorms),
        t("ffn_norm", Vector, P::FfnNorm, FfnNorm),
        t("post_attention_norm", Vector, P::FfnNorm, FfnNorm),
        t("ffn_gate", Matrix, P::Ffn, Dense),
        t("ffn_up", Matrix, P::Ffn, Dense),
        t("ffn_sub_norm", Vector, P::FfnSubNorm, SubNorms),
        t("ffn_down", Matrix, P::Ffn, Dense),
        t("ffn_gate_inp", Matrix, P::Ffn, Moe),
        t("ffn_gate_exps", Matrix, P::Ffn, Moe),
        t("ffn_up_exps", Matrix, P::Ffn, Moe),
        t("ffn_down_exps", Matrix, P::Ffn, Moe),
        t("ffn_gate_inp", Bias, P::Ffn, Biases),
        t("ffn_gate_exps", Bias, P::Ffn, Biases),
        t("ffn_up_exps", Bias, P::Ffn, Biases),
        t("ffn_down_exps", Bias, P::Ffn, Biases),
        t("post_ffw_norm", Vector, P::PostNorms, PostNorms),
    ]
};

/// A tensor outside the layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Global {
    /// `token_embd`: the embedding table (and the LM head where no `output` is stored).
    Embedding,
    /// `output`: the LM head.
    Output,
    /// `output_norm`: the final norm.
    OutputNorm,
    /// `rope_freqs` (Llama 3.1) or `rope_factors_short`/`_long` (LongRoPE).
    RopeFactors,
}

/// The tensors outside the layers every family may hold.
const GLOBAL_TENSORS: &[(&str, Kind, Global)] = &[
    ("token_embd", Kind::Matrix, Global::Embedding),
    ("output", Kind::Matrix, Global::Output),
    ("output_norm", Kind::Vector, Global::OutputNorm),
    ("rope_freqs", Kind::Vector, Global::RopeFactors),
    ("rope_factors_short", Kind::Vector, Global::RopeFactors),
    ("rope_factors_long", Kind::Vector, Global::RopeFactors),
];

/// What a tensor name is to a family's graph.
pub(super) enum Role {
    /// A tensor of layer `.0`, loaded into its piece `.1`.
    Layer(usize, LayerPart),
    /// A tensor outside the layers.
    Global(Global),
}

/// What the tensor `name` is to the graph of `family` (with a mixture-of-experts FFN where
/// `moe`), or `None` where that graph does not read it (a tensor of another family, or one no
/// family has).
pub(super) fn role_of(name: &str, family: &Family, moe: bool) -> Option<Role> {
    let (base, suffix) = name.rsplit_once('.')?;
    if let Some(rest) = base.strip_prefix("blk.") {
        let (il, tensor) = rest.split_once('.')?;
        let il = il.parse::<usize>().ok()?;
        return LAYER_TENSORS
            .iter()
            .find(|t| {
                t.name == tensor && t.kind.takes(suffix) && t.read_by.includes(t.name, family, moe)
            })
            .map(|t| Role::Layer(il, t.part));
    }
    GLOBAL_TENSORS
        .iter()
        .find(|(n, kind, _)| *n == base && kind.takes(suffix))
        .map(|&(.., g)| Role::Global(g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mixture;

    fn family(arch: &str) -> Family {
        Family::of(arch).expect("a family hesper-rs runs")
    }

    fn part(name: &str, arch: &str) -> Option<LayerPart> {
        let moe = family(arch).moe == Mixture::Always;
        match role_of(name, &family(arch), moe)? {
            Role::Layer(_, part) => Some(part),
            Role::Global(_) => None,
        }
    }

    #[test]
    fn each_family_reads_its_own_ffn_and_norms_only() {
        assert_eq!(
            part("blk.3.ffn_gate_inp.weight", "qwen3moe"),
            Some(LayerPart::Ffn)
        );
        assert_eq!(part("blk.3.ffn_gate_inp.weight", "qwen3"), None);
        assert_eq!(part("blk.3.ffn_gate.weight", "qwen3moe"), None);
        // Llama's FFN is what its file says (Mixtral's experts).
        let llama = family("llama");
        let gate = |name: &str, moe| match role_of(name, &llama, moe) {
            Some(Role::Layer(_, part)) => Some(part),
            _ => None,
        };
        assert_eq!(
            gate("blk.0.ffn_gate_exps.weight", true),
            Some(LayerPart::Ffn)
        );
        assert_eq!(gate("blk.0.ffn_gate_exps.weight", false), None);
        assert_eq!(gate("blk.0.ffn_gate.weight", true), None);
        assert_eq!(part("blk.3.ffn_gate.weight", "qwen3"), Some(LayerPart::Ffn));
        assert_eq!(
            part("blk.0.attn_q_norm.weight", "gemma3"),
            Some(LayerPart::QkNorm)
        );
        assert_eq!(part("blk.0.attn_q_norm.weight", "gemma2"), None);
        assert_eq!(
            part("blk.0.post_ffw_norm.weight", "gemma2"),
            Some(LayerPart::PostNorms)
        );
        assert_eq!(part("blk.0.post_ffw_norm.weight", "llama"), None);
        assert_eq!(
            part("blk.0.ffn_sub_norm.weight", "bitnet-b1.58"),
            Some(LayerPart::FfnSubNorm)
        );
        assert_eq!(part("blk.0.ffn_sub_norm.weight", "qwen2"), None);
        // gpt-oss's norm before the FFN is named as Gemma's norm of the attention's output.
        assert_eq!(
            part("blk.0.post_attention_norm.weight", "gpt-oss"),
            Some(LayerPart::FfnNorm)
        );
        assert_eq!(
            part("blk.0.post_attention_norm.weight", "gemma3"),
            Some(LayerPart::PostNorms)
        );
        assert_eq!(part("blk.0.ffn_norm.weight", "gpt-oss"), None);
        assert_eq!(
            part("blk.0.attn_sinks.weight", "gpt-oss"),
            Some(LayerPart::Sinks)
        );
        assert_eq!(part("blk.0.attn_sinks.weight", "qwen3moe"), None);
        assert_eq!(
            part("blk.0.ffn_down_exps.bias", "gpt-oss"),
            Some(LayerPart::Ffn)
        );
        assert_eq!(part("blk.0.ffn_down_exps.bias", "qwen3moe"), None);
    }

    #[test]
    fn suffixes_name_the_kind_of_tensor() {
        // A matrix's scale kept apart belongs to the matrix; a bias only where the graph
        // adds one; a vector has no scale.
        assert_eq!(part("blk.1.attn_q.scale", "bitnet"), Some(LayerPart::Qkv));
        assert_eq!(part("blk.1.attn_q.bias", "qwen2"), Some(LayerPart::QkvBias));
        assert_eq!(part("blk.1.attn_output.bias", "qwen2"), None);
        assert_eq!(
            part("blk.1.attn_output.bias", "gpt-oss"),
            Some(LayerPart::WoBias)
        );
        assert_eq!(part("blk.1.attn_norm.scale", "llama"), None);
        assert_eq!(part("blk.x.attn_norm.weight", "llama"), None);
        assert!(matches!(
            role_of("token_embd.weight", &family("llama"), false),
            Some(Role::Global(Global::Embedding))
        ));
        assert!(matches!(
            role_of("rope_factors_long.weight", &family("phi3"), false),
            Some(Role::Global(Global::RopeFactors))
        ));
        assert!(role_of("output_norm.bias", &family("llama"), false).is_none());
        assert!(role_of("token_types.weight", &family("llama"), false).is_none());
    }
}
