use super::base_file::{self, BaseFileError, Header};
use super::kl::Divergence;
use super::{log_softmax, targets, Accumulator, Chunks, PerplexityError};

#[test]
fn chunks_follow_llama_perplexity() {
    let c = Chunks::new(1000, 256, None).unwrap();
    assert_eq!((c.n_chunk, c.first(), c.scored()), (3, 128, 127));
    assert_eq!(Chunks::new(1000, 256, Some(2)).unwrap().n_chunk, 2);
    assert_eq!(Chunks::new(1000, 256, Some(9)).unwrap().n_chunk, 3);
    assert_eq!(
        Chunks::new(255, 256, None),
        Err(PerplexityError::TooShort {
            tokens: 255,
            n_ctx: 256
        })
    );
    assert_eq!(
        Chunks::new(100, 3, None),
        Err(PerplexityError::ContextTooSmall(3))
    );
    // Odd context: positions 3, 4, 5 predict tokens 4, 5, 6.
    let c = Chunks::new(14, 7, None).unwrap();
    let tokens: Vec<u32> = (0..14).collect();
    assert_eq!(targets(&c, c.chunk(&tokens, 1)), [11, 12, 13]);
}

#[test]
fn log_softmax_normalizes() {
    let logits = [1.0f32, 2.0, 3.0, -40.0];
    let mut lp = [0f32; 4];
    log_softmax(&logits, &mut lp);
    let total: f64 = lp.iter().map(|&l| (l as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6, "{total}");
    // ln(e^3 / (e + e² + e³ + e^-40)).
    let want = 3.0 - (1f64.exp() + 2f64.exp() + 3f64.exp() + (-40f64).exp()).ln();
    assert!((lp[2] as f64 - want).abs() < 1e-6);
    // Large logits do not overflow.
    log_softmax(&[1000.0, 1000.0], &mut lp[..2]);
    assert!((lp[0] + std::f32::consts::LN_2).abs() < 1e-6);
}

#[test]
fn estimate_is_exp_mean_with_standard_error() {
    let mut a = Accumulator::default();
    for nll in [1.0, 2.0, 3.0] {
        a.add(nll);
    }
    let e = a.estimate();
    assert!((e.ppl - 2f64.exp()).abs() < 1e-12);
    // Population variance 2/3, standard error sqrt((2/3) / 2).
    assert!((e.err - (1.0f64 / 3.0).sqrt() * 2f64.exp()).abs() < 1e-12);
    assert_eq!(e.count, 3);
}

#[test]
fn divergence_of_known_distributions() {
    let ln = |p: [f64; 2]| p.map(|x| x.ln() as f32);
    let base = ln([0.75, 0.25]);
    let model = ln([0.4, 0.6]);
    let mut d = Divergence::default();
    d.add(&model, &base, 0);
    d.add(&base, &base, 1);
    let r = d.report();
    let kl = 0.75 * (0.75f64 / 0.4).ln() + 0.25 * (0.25f64 / 0.6).ln();
    assert!((r.kld.mean - kl / 2.0).abs() < 1e-6, "{:?}", r.kld);
    assert!((r.kld_spread.max - kl).abs() < 1e-6 && r.kld_spread.min.abs() < 1e-7);
    assert!((r.dp.mean - (-0.35 / 2.0)).abs() < 1e-6);
    assert_eq!(r.same_top.mean, 0.5);
    let same = {
        let mut d = Divergence::default();
        d.add(&base, &base, 0);
        d.add(&model, &model, 1);
        d.report()
    };
    assert_eq!(same.same_top.mean, 1.0);
    assert!(same.kld.mean.abs() < 1e-7 && same.ln_ppl_ratio.mean.abs() < 1e-7);
    assert!((same.cor_ln_p - 1.0).abs() < 1e-6);
}

#[test]
fn base_file_round_trip_and_bad_files() {
    let chunks = Chunks::new(16, 8, None).unwrap();
    let header = Header {
        chunks,
        n_vocab: 3,
        tokens: (0..16).collect(),
    };
    // Rows of three log-probabilities (log-softmax of 0, -1, -i).
    let logp: Vec<f32> = (0..chunks.scored())
        .flat_map(|i| {
            let x = [0.0f64, -1.0, -(i as f64)];
            let norm = x.iter().map(|v| v.exp()).sum::<f64>().ln();
            x.map(|v| (v - norm) as f32)
        })
        .collect();
    let mut file = Vec::new();
    header.write(&mut file).unwrap();
    for _ in 0..2 {
        base_file::write_chunk(&mut file, &logp).unwrap();
    }
    assert_eq!(file.len() as u64, header.file_len());
    let mut r = file.as_slice();
    assert_eq!(Header::read(&mut r).unwrap(), header);
    let mut back = vec![0f32; logp.len()];
    base_file::read_chunk(&mut r, &mut back, 3, 0).unwrap();
    assert_eq!(back, logp);

    let short = &file[..file.len() - 1];
    let mut r = short;
    Header::read(&mut r).unwrap();
    base_file::read_chunk(&mut r, &mut back, 3, 0).unwrap();
    assert!(matches!(
        base_file::read_chunk(&mut r, &mut back, 3, 0),
        Err(BaseFileError::Truncated)
    ));
    // Values that are not log-probabilities: refused, naming the scored token.
    for (at, value, why) in [
        (4, f32::NAN, "NaN is not finite"),
        (5, 5.0, "5 is above 0"),
        (3, -0.01, "sum to"),
    ] {
        let mut bad = logp.clone();
        bad[at] = value;
        let mut file = Vec::new();
        base_file::write_chunk(&mut file, &bad).unwrap();
        let e = base_file::read_chunk(&mut file.as_slice(), &mut back, 3, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("scored token {}", 10 + at / 3)), "{e}");
        assert!(e.contains(why), "{e}");
    }
    assert!(matches!(
        Header::read(&mut &b"GGUF\x03\0\0\0"[..]),
        Err(BaseFileError::NotBaseFile)
    ));
    assert!(matches!(
        Header::read(&mut &b"HSP"[..]),
        Err(BaseFileError::NotBaseFile)
    ));
    // A forged token count fails on the missing data, without allocating for it.
    let mut forged = base_file::MAGIC.to_vec();
    for v in [u32::MAX, 3, u32::MAX] {
        forged.extend(v.to_le_bytes());
    }
    assert!(matches!(
        Header::read(&mut forged.as_slice()),
        Err(BaseFileError::Truncated)
    ));
    let mut zero = base_file::MAGIC.to_vec();
    for v in [8u32, 0, 1] {
        zero.extend(v.to_le_bytes());
    }
    assert!(matches!(
        Header::read(&mut zero.as_slice()),
        Err(BaseFileError::BadHeader(_))
    ));
}
