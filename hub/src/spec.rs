//! What a user names (`owner/name[:QUANT or FILE]`, llama.cpp's `-hf` spelling) and which of a
//! repository's files that picks.

use crate::HubError;

/// The quantization llama.cpp's `-hf` picks when a repository has several files and none is
/// named.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// A repository and which GGUF file of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// `owner/name`.
    pub repo: String,
    /// Which file.
    pub pick: Pick,
}

/// Which GGUF file of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// Its only GGUF file, else the [`DEFAULT_QUANT`] one.
    Default,
    /// The file whose name contains this quantization (`Q4_K_M`, `i2_s`), in any case.
    Quant(String),
    /// This file (a path in the repository).
    File(String),
}

impl ModelSpec {
    /// Reads `owner/name[:QUANT or FILE.gguf]`; `file` (llama.cpp's `--hf-file`) names the file
    /// instead.
    pub fn parse(spec: &str, file: Option<&str>) -> Result<Self, HubError> {
        let bad = |why| HubError::BadSpec {
            spec: spec.to_string(),
            why,
        };
        let (repo, tag) = match spec.split_once(':') {
            Some((r, t)) => (r, Some(t)),
            None => (spec, None),
        };
        let Some((owner, name)) = repo.split_once('/') else {
            return Err(bad("no '/' between owner and name"));
        };
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 96
                && !p.contains("--")
                && !p.contains("..")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !part_ok(owner) || !part_ok(name) {
            return Err(bad("owner and name are letters, digits, '-', '_' and '.'"));
        }
        let pick = match (file, tag) {
            (Some(_), Some(_)) => return Err(bad("give a :QUANT or --hf-file, not both")),
            (Some(f), None) => Pick::File(f.to_string()),
            (None, Some("")) => return Err(bad("nothing after ':'")),
            (None, Some(t)) if t.to_ascii_lowercase().ends_with(".gguf") => {
                Pick::File(t.to_string())
            }
            (None, Some(t)) => Pick::Quant(t.to_string()),
            (None, None) => Pick::Default,
        };
        if let Pick::File(f) = &pick {
            if !is_repo_path(f) {
                return Err(bad("the file is a relative path inside the repository"));
            }
        }
        Ok(Self {
            repo: repo.to_string(),
            pick,
        })
    }

    /// The file this names among `files` (paths in the repository).
    pub fn choose<'a>(&self, files: &[&'a str]) -> Result<&'a str, HubError> {
        let ggufs: Vec<&str> = files
            .iter()
            .copied()
            .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
            .collect();
        let models: Vec<&str> = ggufs
            .iter()
            .copied()
            .filter(|f| !base_name(f).to_ascii_lowercase().starts_with("mmproj"))
            .collect();
        let picked = match &self.pick {
            Pick::File(want) => files
                .iter()
                .copied()
                .find(|f| f == want)
                .ok_or_else(|| self.no_match(want, &ggufs))?,
            Pick::Quant(q) => self.by_quant(q, &models, &ggufs)?,
            Pick::Default => match models.as_slice() {
                [] => {
                    return Err(HubError::NoGguf {
                        repo: self.repo.clone(),
                    })
                }
                [only] => only,
                _ => match self.by_quant(DEFAULT_QUANT, &models, &ggufs) {
                    Ok(f) => f,
                    Err(_) => {
                        return Err(HubError::Ambiguous {
                            repo: self.repo.clone(),
                            matching: String::new(),
                            choices: models.join(", "),
                        })
                    }
                },
            },
        };
        if is_split_part(picked) {
            return Err(HubError::Split {
                repo: self.repo.clone(),
                file: picked.to_string(),
            });
        }
        Ok(picked)
    }

    /// The one model file whose name holds `quant` (or the first part of a split model).
    fn by_quant<'a>(
        &self,
        quant: &str,
        models: &[&'a str],
        ggufs: &[&str],
    ) -> Result<&'a str, HubError> {
        let q = quant.to_ascii_lowercase();
        let hits: Vec<&str> = models
            .iter()
            .copied()
            .filter(|f| holds_quant(&base_name(f).to_ascii_lowercase(), &q))
            .collect();
        match hits.as_slice() {
            [] => Err(self.no_match(quant, ggufs)),
            [one] => Ok(one),
            _ => {
                let whole: Vec<&str> = hits.iter().copied().filter(|f| !is_split_part(f)).collect();
                match whole.as_slice() {
                    [one] => Ok(one),
                    [] => Ok(hits[0]),
                    _ => Err(HubError::Ambiguous {
                        repo: self.repo.clone(),
                        matching: format!(" matching {quant:?}"),
                        choices: whole.join(", "),
                    }),
                }
            }
        }
    }

    fn no_match(&self, wanted: &str, ggufs: &[&str]) -> HubError {
        if ggufs.is_empty() {
            return HubError::NoGguf {
                repo: self.repo.clone(),
            };
        }
        HubError::NoMatch {
            repo: self.repo.clone(),
            wanted: wanted.to_string(),
            available: ggufs.join(", "),
        }
    }
}

/// Whether `path` can name a file inside a repository, and so inside the cache once joined to
/// a snapshot folder: relative, `/`-separated, no empty, `.` or `..` component, no backslash
/// and no control character. Every name that comes from the network is held to this.
pub(crate) fn is_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.chars().any(char::is_control)
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The last component of a repository path.
fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether `name` (lowercase) holds `quant` (lowercase) as a whole part: `q4_k` is in
/// `model-q4_k.gguf` but not in `model-q4_k_m.gguf`.
fn holds_quant(name: &str, quant: &str) -> bool {
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    stem.match_indices(quant).any(|(at, _)| {
        let before = stem[..at].chars().next_back();
        let after = stem[at + quant.len()..].chars().next();
        let edge = |c: Option<char>| c.is_none_or(|c| matches!(c, '-' | '.'));
        edge(before) && edge(after)
    })
}

/// Whether `path` is one part of a model split by llama-gguf-split (`…-00001-of-00003.gguf`).
fn is_split_part(path: &str) -> bool {
    let stem = path.to_ascii_lowercase();
    let stem = stem.strip_suffix(".gguf").unwrap_or(&stem).to_string();
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    matches!(parts.as_slice(), [total, "of", part, _]
        if total.len() == 5 && part.len() == 5
            && total.bytes().chain(part.bytes()).all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> ModelSpec {
        ModelSpec::parse(s, None).unwrap()
    }

    #[test]
    fn only_relative_paths_inside_the_repository_are_repository_paths() {
        for good in [
            "m.gguf",
            "sub/m-Q8_0.gguf",
            "a/b/c.gguf",
            "..m.gguf",
            "m..gguf",
        ] {
            assert!(is_repo_path(good), "{good}");
        }
        for bad in [
            "",
            "/m.gguf",
            "/abs/m.gguf",
            "../m.gguf",
            "a/../../m.gguf",
            "a/..",
            "./m.gguf",
            "a/./m.gguf",
            "a//m.gguf",
            "a/",
            "a\\..\\m.gguf",
            "m\u{0}.gguf",
            "m\n.gguf",
        ] {
            assert!(!is_repo_path(bad), "{bad:?}");
        }
    }

    #[test]
    fn names_parse_as_llama_cpp_reads_them() {
        assert_eq!(spec("a/b").pick, Pick::Default);
        assert_eq!(spec("a/b:q4_k_m").pick, Pick::Quant("q4_k_m".into()));
        assert_eq!(spec("a/b:sub/x.GGUF").pick, Pick::File("sub/x.GGUF".into()));
        let f = ModelSpec::parse("a/b", Some("x.gguf")).unwrap();
        assert_eq!(
            (f.repo.as_str(), f.pick),
            ("a/b", Pick::File("x.gguf".into()))
        );
        for bad in [
            "ab",
            "a/",
            "/b",
            "a/b/c",
            "a/b:",
            "a b/c",
            "a/b:../x.gguf",
            "a--b/c",
        ] {
            assert!(
                matches!(ModelSpec::parse(bad, None), Err(HubError::BadSpec { .. })),
                "{bad}"
            );
        }
        assert!(ModelSpec::parse("a/b:q8_0", Some("x.gguf")).is_err());
    }

    #[test]
    fn a_quantization_picks_the_file_that_holds_it() {
        let files = [
            "README.md",
            "m-Q4_K.gguf",
            "m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
            "mmproj-m-F16.gguf",
            "big/m-F16-00001-of-00002.gguf",
            "big/m-F16-00002-of-00002.gguf",
        ];
        assert_eq!(spec("a/b:q4_k").choose(&files).unwrap(), "m-Q4_K.gguf");
        assert_eq!(spec("a/b:Q4_K_M").choose(&files).unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(spec("a/b").choose(&files).unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(
            spec("a/b:m-Q8_0.gguf").choose(&files).unwrap(),
            "m-Q8_0.gguf"
        );
        assert!(matches!(
            spec("a/b:f16").choose(&files),
            Err(HubError::Split { .. })
        ));
        assert!(matches!(
            spec("a/b:q5_k").choose(&files),
            Err(HubError::NoMatch { .. })
        ));
        assert!(matches!(
            spec("a/b:x.gguf").choose(&files),
            Err(HubError::NoMatch { .. })
        ));
    }

    #[test]
    fn a_repository_with_one_model_needs_no_name_and_several_need_one() {
        let one = ["ggml-model-i2_s.gguf", "mmproj-x.gguf", "README.md"];
        assert_eq!(spec("a/b").choose(&one).unwrap(), "ggml-model-i2_s.gguf");
        let two = ["m-i2_s.gguf", "m-tq2_0.gguf"];
        assert!(matches!(
            spec("a/b").choose(&two),
            Err(HubError::Ambiguous { .. })
        ));
        assert!(matches!(
            spec("a/b").choose(&["README.md"]),
            Err(HubError::NoGguf { .. })
        ));
    }
}
