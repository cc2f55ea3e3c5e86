use super::*;

fn sample() -> Vec<u8> {
    GgufBuilder::new()
        .kv("general.architecture", Value::String("bitnet".into()))
        .kv("bitnet.block_count", Value::U32(2))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec![
                "a".into(),
                "b".into(),
                "c".into(),
                "d".into(),
            ])),
        )
        .f32_tensor("w", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .tensor("i2", &[128, 1], 36, vec![0x55; 32 + 32])
        .tensor("mystery", &[4], 99, vec![7; 16])
        .build()
}

#[test]
fn parses_metadata_and_tensors() {
    let bytes = sample();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.get_str("general.architecture"), Some("bitnet"));
    assert_eq!(g.get_u64("bitnet.block_count"), Some(2));
    assert_eq!(
        g.get_array("tokenizer.ggml.tokens").map(Array::len),
        Some(4)
    );
    let w = g.tensor("w").unwrap();
    assert_eq!(w.dims(), &[3, 2]);
    assert_eq!(w.start % 32, 0);
    let data = g.tensor_bytes(&bytes, w).unwrap();
    assert_eq!(&data[4..8], &2.0f32.to_le_bytes());
    assert_eq!(g.tensor("i2").unwrap().nbytes, Some(64));
}

#[test]
fn unknown_type_fails_only_when_used() {
    let bytes = sample();
    let g = Gguf::parse(&bytes).unwrap();
    let t = g.tensor("mystery").unwrap();
    let err = g.tensor_bytes(&bytes, t).unwrap_err();
    assert_eq!(
        err,
        TensorError::UnknownType {
            name: "mystery".into(),
            id: 99
        }
    );
    assert!(err.to_string().contains("mystery") && err.to_string().contains("99"));
}

#[test]
fn bitnet_cpp_lookup_table_types_say_what_to_do() {
    let message = |id| {
        TensorError::UnknownType {
            name: "w".into(),
            id,
        }
        .to_string()
    };
    assert!(message(38).contains("TL1") && message(38).contains("convert the model to I2_S"));
    // 39 is llama.cpp's MXFP4 as well as bitnet.cpp's TL2.
    assert!(message(39).contains("MXFP4") && message(39).contains("TL2"));
    assert!(!message(99).contains("I2_S"));
}

#[test]
fn rejects_bad_magic_and_version() {
    let mut bytes = sample();
    bytes[0] = b'X';
    assert!(matches!(Gguf::parse(&bytes), Err(GgufError::BadMagic(_))));
    let mut bytes = sample();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(Gguf::parse(&bytes).unwrap_err(), GgufError::BadVersion(1));
    bytes[4..8].copy_from_slice(&0x0300_0000u32.to_le_bytes());
    assert!(matches!(Gguf::parse(&bytes), Err(GgufError::BadVersion(_))));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample();
    for len in 0..bytes.len() - 1 {
        // The last tensor's padding is not data, so only cut inside the payload.
        let cut = &bytes[..len];
        if let Ok(g) = Gguf::parse(cut) {
            // A cut inside the final padding can still hold every tensor.
            for t in g.tensors() {
                if let Some(n) = t.nbytes {
                    assert!(
                        t.start + n <= len as u64,
                        "tensor {} past a {len}-byte cut",
                        t.name
                    );
                }
            }
        }
    }
    assert!(matches!(
        Gguf::parse(&bytes[..100]),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn rejects_duplicates() {
    let dup_key = GgufBuilder::new()
        .kv("a", Value::U8(1))
        .kv("a", Value::U8(2))
        .build();
    assert_eq!(
        Gguf::parse(&dup_key).unwrap_err(),
        GgufError::DuplicateKey("a".into())
    );
    let dup_tensor = GgufBuilder::new()
        .f32_tensor("t", &[1], &[1.0])
        .f32_tensor("t", &[1], &[2.0])
        .build();
    assert_eq!(
        Gguf::parse(&dup_tensor).unwrap_err(),
        GgufError::DuplicateTensor("t".into())
    );
}

#[test]
fn rejects_absurd_counts_without_allocating() {
    let mut bytes = GgufBuilder::new()
        .kv("k", Value::Array(Array::U32(vec![1, 2])))
        .build();
    // Array length field: after magic(4)+version(4)+counts(16)+key(8+1)+type(4)+elem type(4).
    let at = 4 + 4 + 16 + 9 + 4 + 4;
    bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        Gguf::parse(&bytes),
        Err(GgufError::AbsurdCount { .. })
    ));
    let mut bytes = sample();
    bytes[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        Gguf::parse(&bytes),
        Err(GgufError::AbsurdCount { .. })
    ));
}

#[test]
fn rejects_out_of_bounds_and_misaligned_offsets() {
    let bytes = GgufBuilder::new().f32_tensor("t", &[8], &[0.0; 8]).build();
    // The tensor offset is the last u64 of the tensor-info record.
    let info_end = 4 + 4 + 16 + (8 + 1) + 4 + 8 + 4 + 8;
    let mut bad = bytes.clone();
    bad[info_end - 8..info_end].copy_from_slice(&4u64.to_le_bytes());
    assert!(matches!(
        Gguf::parse(&bad),
        Err(GgufError::Misaligned { .. })
    ));
    let mut bad = bytes.clone();
    bad[info_end - 8..info_end].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        Gguf::parse(&bad),
        Err(GgufError::OutOfBounds { .. })
    ));
    let mut bad = bytes;
    bad[info_end - 8..info_end].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(
        Gguf::parse(&bad),
        Err(GgufError::OutOfBounds { .. })
    ));
}

#[test]
fn rejects_bad_shapes_and_alignment() {
    let five_dims = GgufBuilder::new()
        .tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4])
        .build();
    assert!(matches!(
        Gguf::parse(&five_dims),
        Err(GgufError::BadShape { .. })
    ));
    let zero = GgufBuilder::new().tensor("t", &[0], 0, vec![]).build();
    assert!(matches!(
        Gguf::parse(&zero),
        Err(GgufError::BadShape { .. })
    ));
    let tq = GgufBuilder::new()
        .tensor("t", &[100], 35, vec![0; 66])
        .build();
    assert!(matches!(
        Gguf::parse(&tq),
        Err(GgufError::BadBlockShape { .. })
    ));
    let align = GgufBuilder::new()
        .kv("general.alignment", Value::U32(3))
        .build();
    assert!(matches!(
        Gguf::parse(&align),
        Err(GgufError::BadAlignment(_))
    ));
}

#[test]
fn tensor_bytes_rejects_ranges_outside_the_buffer() {
    let bytes = sample();
    let g = Gguf::parse(&bytes).unwrap();
    let w = g.tensor("w").unwrap();
    // The info's fields are public: a start near u64::MAX must not overflow.
    for start in [u64::MAX - 3, u64::MAX, bytes.len() as u64, w.start + 1] {
        let moved = TensorInfo { start, ..w.clone() };
        if start == w.start + 1 {
            // Still inside this buffer (the padding follows), so it is served.
            assert_eq!(g.tensor_bytes(&bytes, &moved).map(<[u8]>::len), Ok(24));
        } else {
            assert_eq!(
                g.tensor_bytes(&bytes, &moved),
                Err(TensorError::NotInBuffer { name: "w".into() })
            );
        }
    }
    let huge = TensorInfo {
        nbytes: Some(u64::MAX),
        ..w.clone()
    };
    assert!(g.tensor_bytes(&bytes, &huge).is_err());
    // A shorter buffer than the one parsed.
    assert!(g.tensor_bytes(&bytes[..w.start as usize], w).is_err());
}

#[test]
fn scalar_tensors_need_only_25_table_bytes() {
    // Three F16 scalars (no dims) with alignment 1: 26-byte records and 6 data bytes, less than
    // 33 bytes a tensor.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(17u64.to_le_bytes());
    b.extend(b"general.alignment");
    b.extend(4u32.to_le_bytes());
    b.extend(1u32.to_le_bytes());
    for i in 0..3u64 {
        b.extend(2u64.to_le_bytes());
        b.extend(format!("s{i}").as_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend((2 * i).to_le_bytes());
    }
    b.extend([0; 6]);
    let g = Gguf::parse(&b).unwrap();
    assert_eq!(g.tensors().len(), 3);
    assert_eq!(g.tensor("s2").unwrap().dims(), &[] as &[u64]);
    assert_eq!(
        g.tensor_bytes(&b, g.tensor("s2").unwrap()).unwrap().len(),
        2
    );
}

#[test]
fn overflowing_byte_size_is_a_bad_shape() {
    // 2^62 f32 elements: the element count fits, the byte size does not.
    let bytes = GgufBuilder::new()
        .tensor("t", &[1 << 62], 0, vec![0; 32])
        .build();
    assert!(matches!(
        Gguf::parse(&bytes),
        Err(GgufError::BadShape { .. })
    ));
    // A row that does not fill a block is still a block-shape error.
    let bytes = GgufBuilder::new()
        .tensor("t", &[33], 8, vec![0; 68])
        .build();
    assert!(matches!(
        Gguf::parse(&bytes),
        Err(GgufError::BadBlockShape { .. })
    ));
}

mod corruption {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Any byte flips and any truncation give Ok or Err, never a panic, and an Ok header
        /// only describes tensors that lie inside the buffer.
        #[test]
        fn corrupted_files_never_panic(flips in proptest::collection::vec((0usize..4096, any::<u8>()), 1..8), cut in 0usize..4096) {
            let mut bytes = sample();
            for (at, v) in flips {
                let n = bytes.len();
                bytes[at % n] = v;
            }
            bytes.truncate(cut.max(1).min(bytes.len()));
            if let Ok(g) = Gguf::parse(&bytes) {
                for t in g.tensors() {
                    if let Ok(data) = g.tensor_bytes(&bytes, t) {
                        prop_assert_eq!(data.len() as u64, t.nbytes.unwrap());
                    }
                }
            }
        }
    }
}
