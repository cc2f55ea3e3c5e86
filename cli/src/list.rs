//! Counts as llama-bench spells them: one count, a list, or a range (`bench`'s -p, -n, -b and -t;
//! every other command takes one count).

/// Most values one list or range may hold.
const MAX_VALUES: usize = 256;

/// A list of sizes as llama-bench spells it: `512`, `128,512`, a range `FIRST-LAST` (step 1),
/// `FIRST-LAST+STEP` or `FIRST-LAST*FACTOR`, or several of these joined by commas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List(pub Vec<usize>);

/// Reads a [`List`].
pub fn parse_list(text: &str) -> Result<List, String> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        let number = |s: &str| {
            s.parse::<usize>().map_err(|_| {
                format!("{s:?} is not a count (a list is 128,512; a range 64-512*2 or 100-400+100)")
            })
        };
        match item.split_once('-') {
            None => out.push(number(item)?),
            Some((first, rest)) => {
                let first = number(first)?;
                let (last, next): (usize, Box<dyn Fn(usize) -> Option<usize>>) =
                    if let Some((last, step)) = rest.split_once('+') {
                        let step = number(step)?;
                        if step == 0 {
                            return Err(format!("{item}: a step of 0"));
                        }
                        (number(last)?, Box::new(move |v| v.checked_add(step)))
                    } else if let Some((last, factor)) = rest.split_once('*') {
                        let factor = number(factor)?;
                        if factor < 2 || first == 0 {
                            return Err(format!("{item}: a factor of 2 or more, from 1 or more"));
                        }
                        (number(last)?, Box::new(move |v| v.checked_mul(factor)))
                    } else {
                        (number(rest)?, Box::new(|v: usize| v.checked_add(1)))
                    };
                if last < first {
                    return Err(format!("{item}: the range ends before it starts"));
                }
                let mut v = Some(first);
                while let Some(x) = v.filter(|&x| x <= last) {
                    out.push(x);
                    if out.len() > MAX_VALUES {
                        break;
                    }
                    v = next(x);
                }
            }
        }
        if out.len() > MAX_VALUES {
            return Err(format!("more than {MAX_VALUES} values"));
        }
    }
    Ok(List(out))
}

impl List {
    /// The one count given; `None` for a list of several (only `bench` takes those).
    pub fn single(&self) -> Option<usize> {
        match self.0.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_read_as_llama_bench_reads_them() {
        let l = |s: &str| parse_list(s).map(|l| l.0);
        assert_eq!(l("512"), Ok(vec![512]));
        assert_eq!(l("128,512"), Ok(vec![128, 512]));
        assert_eq!(l("1-4"), Ok(vec![1, 2, 3, 4]));
        assert_eq!(l("100-400+100"), Ok(vec![100, 200, 300, 400]));
        assert_eq!(l("64-512*2"), Ok(vec![64, 128, 256, 512]));
        assert_eq!(l("1-3,8"), Ok(vec![1, 2, 3, 8]));
        for bad in [
            "", "x", "4-1", "1-8+0", "0-8*2", "1-8*1", "1-100000", "-1", "1,,2",
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }
}
