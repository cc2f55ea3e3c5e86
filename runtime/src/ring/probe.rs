//! What a node measures of itself for `--layers auto`: the time one layer and the LM head of
//! the model take for one token on its own hardware, timed on an instance of the model (a
//! node that has no layers yet loads the last layer and the head: every layer has one shape).

use std::time::Instant;

use hesper_engine::backend::Backend;
use hesper_engine::model::{Model, ModelError, Readout};

/// Timed passes of each measurement (after one to warm up); the median is taken.
const PASSES: usize = 5;

/// Milliseconds of one of `model`'s layers for one token (its layers' time over their count),
/// and of the final norm and LM head where it holds them (0 where it does not).
pub fn measure<B: Backend>(model: &Model<B>) -> Result<(f64, f64), ModelError> {
    let c = &model.config;
    let row: Vec<f32> = (0..c.n_embd)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.1)
        .collect();
    let mut s = model.new_session(PASSES + 2, 1)?;
    let mut time = |head: bool| -> Result<f64, ModelError> {
        let mut ms = Vec::with_capacity(PASSES);
        for pass in 0..=PASSES {
            let start = Instant::now();
            if head {
                model.predict_from_hidden(&mut s, 0, &row, Readout::Argmax)?;
            } else {
                model.forward_hidden_at(&mut s, 0, &row)?;
            }
            if pass > 0 {
                ms.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        ms.sort_by(f64::total_cmp);
        Ok(ms[ms.len() / 2])
    };
    let layers = time(false)?;
    let head = if model.runs_head() {
        (time(true)? - layers).max(0.0)
    } else {
        0.0
    };
    Ok((layers / model.layer_range().len().max(1) as f64, head))
}
