//! What a model holds, down to the bytes: the XXH3-128 of each tensor it was made from. Nodes
//! of a ring compare these with the master's file, so a node whose file has the same header
//! but other tensor data is found before it computes anything.

use xxhash_rust::xxh3::xxh3_128;

use super::load::Plan;
use super::reload::{hash_read, HASH_CHUNK};
use super::{HeadFormat, Model, ModelError};
use crate::backend::Backend;
use crate::source::{FileSource, HeaderError};
use crate::weights::WeightError;

impl<B: Backend> Model<B> {
    /// The tensors this model holds parts of: its layers', and the embedding table, output
    /// norm and LM head where it holds them; sorted by name.
    pub fn held_tensors(&self) -> Vec<String> {
        let g = self.file.header();
        // Which tensors a node holds does not depend on the head's format, only their parts.
        let plan = Plan::new(
            self.config.clone(),
            g,
            self.layer_range.clone(),
            HeadFormat::AsStored,
            self.output_norm.is_some(),
        );
        let mut names: Vec<String> = g
            .tensors()
            .iter()
            .filter(|t| !plan.parts_of(&t.name).is_empty())
            .map(|t| t.name.clone())
            .collect();
        names.sort();
        names
    }

    /// The XXH3-128 of the bytes of each tensor of `names` in this model's file: as loaded
    /// for a model loaded for hot-swap, hashed from the mapped file, or read from the file
    /// (a model loaded for hot-swap holds no map: the tensors of other nodes' layers).
    pub fn tensor_hashes(&self, names: &[String]) -> Result<Vec<u128>, ModelError> {
        let g = self.file.header();
        let mut reader: Option<(FileSource, Vec<u8>)> = None;
        let mut hashes = Vec::with_capacity(names.len());
        for name in names {
            if let Some(hash) = self.swap.as_ref().and_then(|s| s.hash_of(name)) {
                hashes.push(hash);
                continue;
            }
            let info = g
                .tensor(name)
                .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
            let swap = match self.file.tensor_bytes(info) {
                Ok(bytes) => {
                    hashes.push(xxh3_128(bytes));
                    continue;
                }
                Err(e) => self.swap.as_ref().ok_or(WeightError::from(e))?,
            };
            let (source, buf) = match &mut reader {
                Some(r) => r,
                None => reader.insert((
                    FileSource::open(swap.path()).map_err(HeaderError::File)?,
                    vec![0; HASH_CHUNK],
                )),
            };
            hashes.push(hash_read(source, info, buf)?);
        }
        Ok(hashes)
    }
}
