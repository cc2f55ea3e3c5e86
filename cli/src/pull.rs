//! `hesper-rs pull` and `-hf`: a GGUF file from the Hugging Face Hub (`hesper-hub`), with a
//! progress bar on a terminal and a few note lines elsewhere.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use hesper_hub::{fetch, Fetched, ModelSpec, Progress, Settings, Source};
use indicatif::{ProgressBar, ProgressStyle};

use crate::report::note;

/// `hesper-rs pull REPO[:QUANT]`.
#[derive(Args, Debug)]
pub struct PullArgs {
    /// The Hugging Face repository, and which GGUF file of it: `owner/name` (its only GGUF
    /// file, else the Q4_K_M one), `owner/name:QUANT` (the file whose name holds Q8_0, i2_s, …)
    /// or `owner/name:FILE.gguf`.
    #[arg(value_name = "REPO[:QUANT]")]
    repo: String,
    /// The file to download (llama.cpp's --hf-file), instead of :QUANT.
    #[arg(long = "hf-file", visible_alias = "file", value_name = "FILE")]
    hf_file: Option<String>,
}

/// Downloads the file and prints its path on stdout.
pub fn run(args: PullArgs) -> Result<()> {
    let fetched = fetch_model(&args.repo, args.hf_file.as_deref())?;
    println!("{}", fetched.path.display());
    Ok(())
}

/// The path of the file `repo` (and `file`) names, downloaded when the cache lacks it.
pub fn model_path(repo: &str, file: Option<&str>) -> Result<PathBuf> {
    Ok(fetch_model(repo, file)?.path)
}

/// The file `repo` and `file` name, in the cache, with notes on how it got there.
fn fetch_model(repo: &str, file: Option<&str>) -> Result<Fetched> {
    let spec = ModelSpec::parse(repo, file)?;
    let settings = Settings::from_env()?;
    let mut shown = Shown::new(&spec.repo, &settings.endpoint);
    let fetched = fetch(&spec, &settings, &mut |p| shown.show(p))?;
    let name = format!("{}/{}", fetched.repo, fetched.file);
    let mb = fetched.size as f64 / 1e6;
    match &fetched.source {
        Source::Downloaded => note!("hesper: {name}: {mb:.1} MB downloaded and checked"),
        Source::Cached => note!("hesper: {name}: downloaded before"),
        Source::Offline(None) => note!("hesper: HF_HUB_OFFLINE: using {name} downloaded before"),
        Source::Offline(Some(why)) => {
            note!("hesper: {why}; using {name} downloaded before")
        }
    }
    Ok(fetched)
}

/// A download's progress: a bar on a terminal, else a line at each quarter.
struct Shown {
    repo: String,
    endpoint: String,
    bar: Option<ProgressBar>,
    quarter: u64,
}

impl Shown {
    fn new(repo: &str, endpoint: &str) -> Self {
        Self {
            repo: repo.to_string(),
            endpoint: endpoint.to_string(),
            bar: None,
            quarter: 0,
        }
    }

    fn show(&mut self, p: Progress) {
        let mb = |b: u64| b as f64 / 1e6;
        match p {
            Progress::Started { size, resumed_from } => {
                if resumed_from > 0 {
                    note!(
                        "hesper: {}: resuming at {:.1} of {:.1} MB from {}",
                        self.repo,
                        mb(resumed_from),
                        mb(size),
                        self.endpoint
                    );
                } else {
                    note!(
                        "hesper: {}: downloading {:.1} MB from {}",
                        self.repo,
                        mb(size),
                        self.endpoint
                    );
                }
                self.quarter = resumed_from * 4 / size.max(1);
                if std::io::stderr().is_terminal()
                    && !crate::report::QUIET.load(std::sync::atomic::Ordering::Relaxed)
                {
                    let bar = ProgressBar::new(size);
                    bar.set_style(
                        ProgressStyle::with_template(
                            "[{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                    bar.set_position(resumed_from);
                    self.bar = Some(bar);
                }
            }
            Progress::Bytes { done, size } => match &self.bar {
                Some(bar) => bar.set_position(done),
                None => {
                    let quarter = done * 4 / size.max(1);
                    if quarter > self.quarter && quarter < 4 {
                        note!(
                            "hesper: {}: {}% ({:.1} of {:.1} MB)",
                            self.repo,
                            quarter * 25,
                            mb(done),
                            mb(size)
                        );
                    }
                    self.quarter = self.quarter.max(quarter);
                }
            },
            Progress::Retrying { done, cause } => {
                let line = format!(
                    "hesper: {}: the transfer stopped at {:.1} MB ({cause}); resuming",
                    self.repo,
                    mb(done)
                );
                match &self.bar {
                    Some(bar) => bar.println(line),
                    None => note!("{line}"),
                }
            }
            Progress::Checking => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                note!(
                    "hesper: {}: checking the SHA-256 the Hub publishes",
                    self.repo
                );
            }
            Progress::Done => {}
        }
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}
