//! The frame decoder on hostile input: arbitrary bytes and mutated frames are refused with a
//! reason or decoded, never a panic, and a declared length past the limit is refused from
//! the header alone (nothing is allocated for it).

use hesper_ring::frame::{Dtype, Frame, Header, Kind, HEADER_LEN};
use hesper_ring::wire;
use proptest::prelude::*;

const MAX: u32 = 1 << 16;

fn valid_frame() -> impl Strategy<Value = Frame> {
    (
        prop::sample::select(vec![
            Kind::Hello,
            Kind::Forward,
            Kind::Prediction,
            Kind::Fault,
        ]),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..512),
    )
        .prop_map(|(kind, session, seq, pos0, payload)| {
            let mut h = Header::new(kind);
            (h.session, h.seq, h.pos0) = (session, seq, pos0);
            Frame::new(h, payload)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Frame::decode(&bytes, MAX);
        if let Ok(head) = <[u8; HEADER_LEN]>::try_from(&bytes[..bytes.len().min(HEADER_LEN)]) {
            if let Ok(h) = Header::decode(&head, MAX) {
                prop_assert!(h.len <= MAX);
            }
        }
    }

    #[test]
    fn mutated_frames_decode_to_themselves_or_are_refused(
        f in valid_frame(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let good = f.encode();
        prop_assert_eq!(Frame::decode(&good, MAX), Ok(f.clone()));
        let mut bad = good.clone();
        for (at, v) in flips {
            let i = at.index(bad.len());
            bad[i] ^= v;
        }
        if let Ok(g) = Frame::decode(&bad, MAX) {
            // A flip that still decodes changed a field it is allowed to, nothing else.
            prop_assert_eq!(g.encode(), bad);
        }
        let short = &good[..cut.index(good.len())];
        prop_assert!(Frame::decode(short, MAX).is_err());
    }

    #[test]
    fn wire_payloads_of_any_size_are_checked(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        n in 0usize..200,
        dtype in prop::sample::select(vec![Dtype::None, Dtype::F32, Dtype::F16, Dtype::Q8_0]),
    ) {
        match wire::decode(dtype, &bytes, n) {
            Ok(v) => prop_assert_eq!(v.len(), n),
            Err(e) => prop_assert_eq!(e.got, bytes.len()),
        }
    }
}

#[test]
fn a_length_past_the_limit_is_refused_from_the_header() {
    let mut h = Header::new(Kind::Forward);
    h.len = u32::MAX;
    let head = h.encode();
    assert!(Header::decode(&head, MAX).is_err());
    h.len = MAX;
    assert_eq!(Header::decode(&h.encode(), MAX), Ok(h));
}
