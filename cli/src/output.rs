//! Output files written whole or not at all: the data goes to a temporary file beside the
//! destination, renamed over it once complete, so a run that fails or is interrupted leaves
//! whatever was there as it was; and a destination that is one of the run's own inputs (the
//! model, say, through any path or link) is refused before anything is written. A destination
//! that exists and is not a regular file (`/dev/null`, `/dev/stdout`, a pipe) is written
//! directly.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// A file being written to a temporary name; [`OutputFile::commit`] puts it in place, and
/// dropping it uncommitted removes it.
pub struct OutputFile {
    dest: PathBuf,
    /// The temporary file (`None`: the destination itself, a device or a pipe).
    tmp: Option<PathBuf>,
    writer: Option<BufWriter<File>>,
}

impl OutputFile {
    /// Standard output (`-o -`), written directly.
    #[cfg(unix)]
    fn stdout() -> Result<Self> {
        use std::os::fd::AsFd;
        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .context("cannot write to standard output")?;
        Ok(Self {
            dest: PathBuf::from("-"),
            tmp: None,
            writer: Some(BufWriter::with_capacity(1 << 20, File::from(fd))),
        })
    }

    /// Standard output (`-o -`): not on this platform.
    #[cfg(not(unix))]
    fn stdout() -> Result<Self> {
        bail!("-o -: writing to standard output needs a Unix system here; name a file")
    }

    /// Starts writing `dest` (refused where it is the same file as one of `inputs`, or a
    /// folder).
    pub fn create(dest: &Path, inputs: &[&Path]) -> Result<Self> {
        if dest == Path::new("-") {
            return Self::stdout();
        }
        if let Some(input) = inputs.iter().find(|i| same_file(dest, i)) {
            if *input == dest {
                bail!("refusing to write {}: this run reads it", dest.display());
            }
            bail!(
                "refusing to write {}: it is the same file as {}, which this run reads",
                dest.display(),
                input.display()
            );
        }
        if dest.is_dir() {
            bail!("cannot write {}: it is a folder", dest.display());
        }
        if std::fs::metadata(dest).is_ok_and(|m| !m.is_file()) {
            let file = OpenOptions::new()
                .write(true)
                .open(dest)
                .with_context(|| format!("cannot create {}", dest.display()))?;
            return Ok(Self {
                dest: dest.to_path_buf(),
                tmp: None,
                writer: Some(BufWriter::with_capacity(1 << 20, file)),
            });
        }
        let Some(name) = dest.file_name() else {
            bail!("cannot write {}: it names no file", dest.display());
        };
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", dest.display()))?;
        Ok(Self {
            dest: dest.to_path_buf(),
            tmp: Some(tmp),
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// Flushes the data and renames the temporary file over the destination.
    pub fn commit(mut self) -> Result<()> {
        let Some(writer) = self.writer.take() else {
            unreachable!("only commit takes the writer");
        };
        let failed = || format!("cannot write {}", self.dest.display());
        let file = writer
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(failed)?;
        if let Some(tmp) = &self.tmp {
            file.sync_all().with_context(failed)?;
            std::fs::rename(tmp, &self.dest).with_context(failed)?;
        }
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.as_mut().map_or(Ok(0), |w| w.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.as_mut().map_or(Ok(()), |w| w.flush())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let (Some(_), Some(tmp)) = (self.writer.take(), &self.tmp) {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Whether `a` and `b` are the same existing file (followed through links).
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
        false
    }
    #[cfg(not(unix))]
    {
        match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}
