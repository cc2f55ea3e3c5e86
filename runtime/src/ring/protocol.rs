//! What Forward and Prediction frames mean: a Forward's `aux` says what the last node hands
//! back ([`Readout`] or nothing, for a prefill chunk that is not the last), a Prediction's
//! payload holds it.

use hesper_engine::model::{Prediction, Readout};

/// `aux` of a Forward frame whose prediction nobody waits for.
const NONE: u32 = 0;
const ARGMAX: u32 = 1;
const LOGITS: u32 = 2;
const TOP: u32 = 3;

/// A readout as a Forward frame's `aux`.
pub fn readout_code(r: Option<Readout>) -> u32 {
    match r {
        None => NONE,
        Some(Readout::Argmax) => ARGMAX,
        Some(Readout::Logits) => LOGITS,
        Some(Readout::Top(k)) => TOP | (k.min(0xff_ffff) as u32) << 8,
    }
}

/// The readout a Forward frame's `aux` asks for.
pub fn readout_of(aux: u32) -> Result<Option<Readout>, String> {
    match (aux & 0xff, aux >> 8) {
        (NONE, 0) => Ok(None),
        (ARGMAX, 0) => Ok(Some(Readout::Argmax)),
        (LOGITS, 0) => Ok(Some(Readout::Logits)),
        (TOP, k) if k > 0 => Ok(Some(Readout::Top(k as usize))),
        _ => Err(format!(
            "a Forward frame asks for readout {aux:#x}, which means nothing"
        )),
    }
}

/// A prediction as a Prediction frame's payload.
pub fn encode_prediction(p: &Prediction) -> Vec<u8> {
    match p {
        Prediction::Token(t) => t.to_le_bytes().to_vec(),
        Prediction::Top(top) => top
            .iter()
            .flat_map(|(id, logit)| id.to_le_bytes().into_iter().chain(logit.to_le_bytes()))
            .collect(),
        Prediction::Logits(row) => row.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The prediction a Prediction frame holds for `readout`, checked against the vocabulary.
pub fn decode_prediction(readout: Readout, b: &[u8], n_vocab: usize) -> Result<Prediction, String> {
    let words: Vec<[u8; 4]> = b
        .chunks_exact(4)
        .map(|w| [w[0], w[1], w[2], w[3]])
        .collect();
    let bad = || format!("a {readout:?} prediction of {} bytes", b.len());
    let token = |w: [u8; 4]| {
        let t = u32::from_le_bytes(w);
        ((t as usize) < n_vocab)
            .then_some(t)
            .ok_or_else(|| format!("a predicted token {t} outside the vocabulary ({n_vocab})"))
    };
    if !b.len().is_multiple_of(4) {
        return Err(bad());
    }
    match readout {
        Readout::Argmax if words.len() == 1 => Ok(Prediction::Token(token(words[0])?)),
        Readout::Top(k) if words.len() == 2 * k.min(n_vocab) => Ok(Prediction::Top(
            words
                .chunks_exact(2)
                .map(|p| Ok((token(p[0])?, f32::from_le_bytes(p[1]))))
                .collect::<Result<_, String>>()?,
        )),
        Readout::Logits if words.len() == n_vocab => Ok(Prediction::Logits(
            words.into_iter().map(f32::from_le_bytes).collect(),
        )),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readouts_and_predictions_round_trip() {
        for r in [
            None,
            Some(Readout::Argmax),
            Some(Readout::Logits),
            Some(Readout::Top(40)),
        ] {
            assert_eq!(readout_of(readout_code(r)), Ok(r));
        }
        assert!(readout_of(7).is_err() && readout_of(TOP).is_err() && readout_of(1 << 8).is_err());
        let cases = [
            (Readout::Argmax, Prediction::Token(5)),
            (Readout::Top(2), Prediction::Top(vec![(3, 1.5), (0, -2.0)])),
            (Readout::Logits, Prediction::Logits(vec![0.25; 8])),
        ];
        for (r, p) in cases {
            assert_eq!(decode_prediction(r, &encode_prediction(&p), 8), Ok(p));
        }
        assert!(decode_prediction(Readout::Argmax, &9u32.to_le_bytes(), 8).is_err());
        assert!(decode_prediction(Readout::Logits, &[0; 12], 8).is_err());
    }
}
