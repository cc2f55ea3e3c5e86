//! A layer's pieces, named once. Each line of [`layer_pieces!`]'s table is one piece: the part
//! a load, a hot-swap and a ring node's paging know it by ([`LayerPart`]), the field of
//! [`Layer`] the forward pass reads, and the loader's method that prepares it (named as the
//! field). From it come the layer, the prepared piece ([`Piece`]), putting a piece in its place
//! ([`Layer::put`]) and preparing one piece or a whole layer ([`Loader::piece`],
//! [`Loader::layer`]). Which tensors make each piece is the tensor table's to say
//! (`tensors.rs`); a new piece is one line here, one method in `load.rs`, and its tensors there.

use super::load::{Fetch, Loader, Part};
use super::ModelError;
use crate::backend::{Backend, GateUp, Moe, Qkv};

/// Declares the pieces of a layer, in the order the forward pass reads them, as
/// `Part => field: Type` lines (see the module's documentation for what it derives).
macro_rules! layer_pieces {
    ($(
        $(#[doc = $doc:literal])*
        $part:ident => $field:ident: $ty:ty,
    )*) => {
        /// The pieces of a layer, each loaded and swapped as one: joined matrices (Q/K/V,
        /// gate/up) are one piece, so a change to either joins them again.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub(super) enum LayerPart {
            $($(#[doc = $doc])* $part,)*
        }

        /// A layer held on a backend: one field per piece.
        pub(super) struct Layer<B: Backend> {
            $($(#[doc = $doc])* pub $field: $ty,)*
        }

        /// One piece of a layer, prepared on a backend.
        #[cfg_attr(not(unix), allow(dead_code))]
        pub(super) enum Piece<B: Backend> {
            $($(#[doc = $doc])* $part($ty),)*
        }

        impl<B: Backend> Layer<B> {
            /// Puts `piece` in its place; what it replaces is dropped (its memory freed).
            #[cfg_attr(not(unix), allow(dead_code))]
            pub fn put(&mut self, piece: Piece<B>) {
                match piece {
                    $(Piece::$part(v) => self.$field = v,)*
                }
            }
        }

        impl<B: Backend, F: Fetch> Loader<'_, '_, B, F> {
            /// Prepares piece `part` of layer `il`.
            #[cfg_attr(not(unix), allow(dead_code))]
            pub async fn piece(&mut self, il: usize, part: LayerPart) -> Result<Piece<B>, ModelError> {
                self.start(Part::Layer(il, part));
                Ok(match part {
                    $(LayerPart::$part => Piece::$part(self.$field(il).await?),)*
                })
            }

            /// Layer `il`, whole.
            pub async fn layer(&mut self, il: usize) -> Result<Layer<B>, ModelError> {
                Ok(Layer {
                    $($field: {
                        self.start(Part::Layer(il, LayerPart::$part));
                        self.$field(il).await?
                    },)*
                })
            }
        }
    };
}

layer_pieces! {
    /// The norm before attention.
    AttnNorm => attn_norm: B::Vector,
    /// Q, K and V, joined.
    Qkv => qkv: Qkv<B::Matrix>,
    /// Q, K and V biases (`qwen2`), all or none.
    QkvBias => qkv_bias: Option<[B::Vector; 3]>,
    /// The gains of each head's query and key norms (`qwen3`), both or none.
    QkNorm => qk_norm: Option<[B::Vector; 2]>,
    /// BitNet's norm of the attention output (families with sub-norms).
    AttnSubNorm => attn_sub_norm: Option<B::Vector>,
    /// Each query head's attention sink (gpt-oss), kept on the host.
    Sinks => sinks: Option<Vec<f32>>,
    /// The attention's output matrix.
    Wo => wo: B::Matrix,
    /// The bias of the attention's output (gpt-oss).
    WoBias => wo_bias: Option<B::Vector>,
    /// The norm before the FFN.
    FfnNorm => ffn_norm: B::Vector,
    /// The FFN: one gated FFN, or the router and every expert.
    Ffn => ffn: Ffn<B::Matrix, B::Vector>,
    /// BitNet's norm of the FFN activation (families with sub-norms).
    FfnSubNorm => ffn_sub_norm: Option<B::Vector>,
    /// The gains of the norms of the attention's and the FFN's outputs (Gemma), both or none.
    PostNorms => post_norms: Option<[B::Vector; 2]>,
}

/// A layer's FFN: one gated FFN, or a mixture of experts.
pub(super) enum Ffn<M, V> {
    /// `down · act(gate · h) ⊙ (up · h)`.
    Dense {
        /// The gate and up projections.
        gate_up: GateUp<M>,
        /// The down projection.
        down: M,
    },
    /// The chosen experts' FFNs, weighted ([`crate::config::Experts`]).
    Experts(Moe<M, V>),
}

impl<M, V> Ffn<M, V> {
    /// The matrix whose reading of the FFN's input a norm before it may prepare
    /// ([`crate::backend::Backend::rms_norm_for`]): the first to read it, or a mixture's
    /// stacked gate and up where the backend stacked its experts (its router reads the norm's
    /// floats).
    pub fn first(&self) -> &M {
        match self {
            Ffn::Dense { gate_up, .. } => gate_up.first(),
            Ffn::Experts(moe) => match &moe.stacked {
                Some(stacked) => stacked.gate_up.first(),
                None => &moe.router,
            },
        }
    }
}
