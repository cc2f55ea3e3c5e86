//! Stop strings matched across token boundaries: text that could still begin a stop string is
//! held back until it cannot, and a stop string is never sent.

/// Generated text checked against stop strings as it arrives.
#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    held: String,
    matched: Option<usize>,
}

impl StopText {
    /// A matcher for `stops` (non-empty strings).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
            matched: None,
        }
    }

    /// The stop string that ended the answer, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|k| self.stops[k].as_str())
    }

    /// Adds `piece`; returns the text that can be sent now, and whether a stop string ended
    /// the answer (what follows it is dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(k, s)| Some((self.held.find(s.as_str())?, k)))
            .min();
        if let Some((i, k)) = first {
            self.matched = Some(k);
            self.held.truncate(i);
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.held, s))
            .max()
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// The text held back, once no more comes.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The length of the longest end of `text` that begins `stop` (shorter than `stop`).
pub(crate) fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returning what was sent and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stopped) = s.push(p);
            out.push_str(&t);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_never_sends_the_stop() {
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(run(&["END"], &["xE", "N", "Dy"]), ("x".into(), true));
        assert_eq!(run(&["END"], &["xE", "N", "o"]), ("xENo".into(), false));
        // The stop string that begins first wins.
        assert_eq!(run(&["lo", "hello"], &["hel", "lo"]), ("".into(), true));
        assert_eq!(run(&["lo", "ell"], &["hel", "lo"]), ("h".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn names_the_stop_that_ended_the_text() {
        let mut s = StopText::new(vec!["ell".into(), "lo".into()]);
        assert_eq!(s.matched(), None);
        s.push("hel");
        assert_eq!(s.matched(), None);
        s.push("lo");
        assert_eq!(s.matched(), Some("ell"));
    }

    #[test]
    fn holds_back_only_a_possible_start_of_a_stop() {
        let mut s = StopText::new(vec!["ab".into()]);
        assert_eq!(s.push("xxa"), ("xx".into(), false));
        assert_eq!(s.push("c"), ("ac".into(), false));
        let mut s = StopText::new(vec!["é!".into()]);
        assert_eq!(s.push("café"), ("caf".into(), false));
        assert_eq!(s.finish(), "é");
    }
}
