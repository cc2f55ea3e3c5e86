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

#[test]
fn a_flood_of_stray_datagrams_is_reported_once_a_second_with_a_count() {
    let mut net = Net::new(config(TransportKind::Udp, None, None)).unwrap();
    let addr = net.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..2000 {
        junk.send_to(b"not a ring datagram", addr).unwrap();
    }
    let mut notes = Vec::new();
    let mut collect = |net: &mut Net, wait: Duration| {
        while let Some(event) = net.recv(wait) {
            if let Incoming::Note(n) = event {
                notes.push(n);
            }
        }
    };
    // The first is reported when the node reads it; one more a second after that is too.
    collect(&mut net, Duration::from_millis(500));
    std::thread::sleep(Duration::from_millis(1200));
    junk.send_to(b"one more", addr).unwrap();
    collect(&mut net, Duration::from_millis(500));
    // The first datagram, then one line for everything since (a full socket buffer may drop
    // some of the 2000, never add any).
    assert_eq!(notes.len(), 2, "{notes:#?}");
    assert!(
        notes
            .iter()
            .all(|n| n.contains("not a hesper ring datagram")),
        "{notes:#?}"
    );
    let held: u64 = notes[1]
        .split(" (")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {:?}", notes[1]));
    assert!((1..=1999).contains(&held), "{held} held back: {notes:#?}");
}

#[test]
fn an_emulated_delay_holds_each_frame_back_alike_not_behind_one_another() {
    let delay = Duration::from_millis(80);
    let mut slow = config(TransportKind::Tcp, None, None);
    slow.timing.delay = delay;
    let mut a = Net::new(config(TransportKind::Tcp, None, None)).unwrap();
    let b = Net::new(slow).unwrap();
    let addr = a.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let to_a = b.connect(addr, Duration::from_secs(5)).unwrap();
    // Held: a link dropped is closed, and its peer finds it lost.
    let _to_b = a.accept(Duration::from_secs(5)).unwrap();
    let start = std::time::Instant::now();
    let sent = frames();
    for f in &sent {
        assert!(to_a.send(f.clone()));
    }
    for f in &sent {
        assert_eq!(&next_frame(&mut a), f);
    }
    let took = start.elapsed();
    // Each frame leaves `delay` after it was sent: all of them within about one delay, never
    // five delays in a row.
    assert!(took >= delay, "{took:?}");
    assert!(took < delay * 3, "{took:?}");
}

#[test]
fn a_flushed_frame_reaches_its_peer_after_the_sender_is_gone() {
    // A third of the datagrams lost each way: a UDP frame of 750 datagrams needs many
    // rounds of asking again, which only a living sender answers.
    let chaos = Chaos {
        drop: 0.3,
        duplicate: 0.05,
        reorder: 0.05,
    };
    let cases = [
        (TransportKind::Tcp, None),
        (TransportKind::Udp, Some(chaos)),
        (TransportKind::Uring, None),
    ];
    let last = Frame::new(
        Header::new(Kind::Shutdown),
        (0..1 << 20).map(|j| (j * 7) as u8).collect(),
    );
    for (transport, chaos) in cases {
        let mut a = Net::new(config(transport, chaos, None)).unwrap();
        let b = Net::new(config(transport, chaos, None)).unwrap();
        let addr = a.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let to_a = b.connect(addr, Duration::from_secs(5)).unwrap();
        let to_b = a.accept(Duration::from_secs(5)).unwrap();
        assert!(to_a.send(last.clone()));
        assert!(to_a.flush(Duration::from_secs(20)), "{transport:?}");
        // The sender's process ends: its links and their tasks with it.
        drop((to_a, b));
        assert_eq!(next_frame(&mut a), last, "{transport:?}");
        if transport == TransportKind::Udp {
            // Nothing listens at the peer's port now: the kernel's port-unreachable answer to
            // the next datagram makes the link lost at once (not after `dead_after` of silence),
            // and its writer stops, so a flush ends at once too.
            let start = std::time::Instant::now();
            assert!(to_b.send(Frame::empty(Kind::Forward)));
            loop {
                match a.recv(Duration::from_secs(10)) {
                    Some(Incoming::Lost(from, _)) if from.id == to_b.id() => break,
                    Some(_) => {}
                    None => panic!("the link to a peer that is gone was never lost"),
                }
            }
            let took = start.elapsed();
            assert!(took < Timing::default().dead_after / 2, "{took:?}");
            let start = std::time::Instant::now();
            assert!(!to_b.flush(Duration::from_secs(10)));
            let took = start.elapsed();
            assert!(took < Duration::from_millis(300), "{took:?}");
        }
    }
}
