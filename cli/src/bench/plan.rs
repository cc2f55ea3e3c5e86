//! Which tests a `bench` run holds: llama-bench's lists and ranges of sizes (`-p 128,512`,
//! `-n 16-64*2`, `-t 1-4`), its prompt-then-generation test (`-pg 512,128`), and defaults that
//! fit the model's context.

use crate::list::List;

/// `-pg PP,TG`: a prompt of PP tokens, then TG generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptGen {
    /// Prompt tokens.
    pub pp: usize,
    /// Generated tokens.
    pub tg: usize,
}

/// Reads `PP,TG`.
pub fn parse_prompt_gen(text: &str) -> Result<PromptGen, String> {
    let (pp, tg) = text
        .split_once(',')
        .ok_or_else(|| format!("{text:?}: expected PP,TG (prompt and generated tokens)"))?;
    let n = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|_| format!("{s:?} is not a count (expected PP,TG)"))
    };
    Ok(PromptGen {
        pp: n(pp)?,
        tg: n(tg)?,
    })
}

/// One test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// A prompt of this many tokens processed in batches (`ppN`).
    Prompt(usize),
    /// This many tokens generated one at a time (`tgN`).
    Gen(usize),
    /// A prompt, then tokens generated after it (`ppN+tgM`); its speed counts both.
    PromptGen(PromptGen),
}

impl Test {
    /// llama-bench's name: `pp512`, `tg128`, `pp512+tg128`.
    pub fn name(&self) -> String {
        match self {
            Self::Prompt(n) => format!("pp{n}"),
            Self::Gen(n) => format!("tg{n}"),
            Self::PromptGen(pg) => format!("pp{}+tg{}", pg.pp, pg.tg),
        }
    }

    /// Prompt tokens.
    pub fn n_prompt(&self) -> usize {
        match self {
            Self::Prompt(n) => *n,
            Self::Gen(_) => 0,
            Self::PromptGen(pg) => pg.pp,
        }
    }

    /// Generated tokens.
    pub fn n_gen(&self) -> usize {
        match self {
            Self::Prompt(_) => 0,
            Self::Gen(n) => *n,
            Self::PromptGen(pg) => pg.tg,
        }
    }

    /// Tokens a run evaluates (its speed is these over its time).
    pub fn tokens(&self) -> usize {
        self.n_prompt() + self.n_gen()
    }

    /// Whether the test generates: the one that weight traffic and the roofline describe.
    pub fn is_gen(&self) -> bool {
        matches!(self, Self::Gen(_))
    }
}

/// The tests of one run, in llama-bench's order (prompts, generations, then both): `prompts`
/// and `gens` default to 512 and 128, or the model's context when it is smaller.
pub fn tests(
    prompts: Option<&List>,
    gens: Option<&List>,
    prompt_gens: &[PromptGen],
    n_ctx_train: usize,
) -> Vec<Test> {
    let fit = |n: usize| n.min(n_ctx_train.max(1));
    let prompts = prompts.map_or_else(|| vec![fit(512)], |l| l.0.clone());
    let gens = gens.map_or_else(|| vec![fit(128)], |l| l.0.clone());
    let mut out: Vec<Test> = Vec::new();
    out.extend(prompts.into_iter().filter(|&n| n > 0).map(Test::Prompt));
    out.extend(gens.into_iter().filter(|&n| n > 0).map(Test::Gen));
    out.extend(
        prompt_gens
            .iter()
            .filter(|pg| pg.pp + pg.tg > 0)
            .map(|&pg| Test::PromptGen(pg)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_then_generation_reads_pp_comma_tg() {
        assert_eq!(
            parse_prompt_gen("512,128"),
            Ok(PromptGen { pp: 512, tg: 128 })
        );
        assert!(parse_prompt_gen("512").is_err());
    }

    #[test]
    fn defaults_fit_the_context_and_zeros_skip() {
        let names = |t: Vec<Test>| t.iter().map(Test::name).collect::<Vec<_>>();
        assert_eq!(names(tests(None, None, &[], 4096)), ["pp512", "tg128"]);
        assert_eq!(names(tests(None, None, &[], 256)), ["pp256", "tg128"]);
        let pg = [PromptGen { pp: 64, tg: 16 }];
        let zero = List(vec![0]);
        assert_eq!(
            names(tests(Some(&zero), Some(&List(vec![8, 16])), &pg, 256)),
            ["tg8", "tg16", "pp64+tg16"]
        );
    }
}
