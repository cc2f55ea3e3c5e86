//! Links over each transport on 127.0.0.1 carry frames whole and in order, from empty ones to
//! a 5 MB prefill (thousands of UDP datagrams, more than one io_uring receive buffer), with
//! and without a ring key, and over UDP with datagrams dropped, duplicated and reordered.

use std::time::Duration;

use hesper_ring::{
    Chaos, Frame, Header, Incoming, Kind, Net, NetConfig, RingKey, Timing, TransportKind,
};

fn config(transport: TransportKind, chaos: Option<Chaos>, key: Option<RingKey>) -> NetConfig {
    NetConfig {
        transport,
        timing: Timing::default(),
        max_payload: 8 << 20,
        chaos,
        key,
    }
}

fn frames() -> Vec<Frame> {
    [0usize, 1, 1399, 1400 * 3 + 7, 5 << 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut h = Header::new(Kind::Forward);
            h.seq = i as u64;
            Frame::new(h, (0..n).map(|j| (j * 31 + i) as u8).collect())
        })
        .collect()
}

/// The next frame `net` receives (heartbeats are never handed on).
fn next_frame(net: &mut Net) -> Frame {
    loop {
        match net.recv(Duration::from_secs(20)) {
            Some(Incoming::Frame(_, f)) => return f,
            Some(Incoming::Note(n)) => panic!("note: {n}"),
            Some(Incoming::Lost(_, why)) => panic!("lost: {why}"),
            Some(Incoming::Joined(_)) => {}
            None => panic!("no frame within 20 s"),
        }
    }
}

#[test]
fn frames_cross_every_transport_whole_and_in_order() {
    let chaos = Chaos {
        drop: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
    };
    let key = || Some(RingKey::new(b"k"));
    let cases = [
        (TransportKind::Tcp, None, None),
        (TransportKind::Tcp, None, key()),
        (TransportKind::Udp, None, None),
        (TransportKind::Udp, Some(chaos), key()),
        (TransportKind::Uring, None, None),
        (TransportKind::Uring, None, key()),
    ];
    for (transport, chaos, key) in cases {
        let what = format!(
            "{transport:?} chaos {} key {}",
            chaos.is_some(),
            key.is_some()
        );
        let mut a = Net::new(config(transport, chaos, key.clone())).unwrap();
        let mut b = Net::new(config(transport, chaos, key)).unwrap();
        let addr = a.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let to_a = b.connect(addr, Duration::from_secs(5)).unwrap();
        let to_b = a.accept(Duration::from_secs(5)).unwrap();
        for f in frames() {
            assert!(to_a.send(f.clone()), "{what}");
            assert_eq!(next_frame(&mut a), f, "{what}: b → a");
            assert!(to_b.send(f.clone()), "{what}");
            assert_eq!(next_frame(&mut b), f, "{what}: a → b");
        }
        if chaos.is_some() {
            let resent = |l: &hesper_ring::Link| {
                l.stats()
                    .retransmits
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            assert!(
                resent(&to_a) + resent(&to_b) > 0,
                "{what}: nothing was sent again"
            );
        }
    }
}
