//! `generation_config.json` -> [`GenerationDefaults`]: the sampling defaults and stop tokens the
//! checkpoint's authors ship.
//!
//! Invariant: a field that is absent or null is `None` (or empty for `eos_token_ids`); a field of the
//! wrong type is an error naming the file and field, never silently dropped. Values are reported as
//! given; judging them (e.g. `temperature < 0`) is the generation loop's admission check.

use std::path::Path;

use crate::json::{read_object, Fields};
use crate::LoadError;

/// Defaults from `generation_config.json`; `Default` when the file is absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `eos_token_id`: one id or a list.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub do_sample: Option<bool>,
    pub max_new_tokens: Option<usize>,
}

impl GenerationDefaults {
    /// Reads `path` (a generation_config.json).
    pub fn from_json_file(path: &Path) -> Result<Self, LoadError> {
        let root = read_object(path, "generation_config.json")?;
        let f = Fields::new(path, &root, "");
        let float = |field: &str| -> Result<Option<f32>, LoadError> {
            Ok(f.opt_f64(field)?.map(|v| v as f32))
        };
        Ok(GenerationDefaults {
            eos_token_ids: f.token_ids("eos_token_id")?,
            bos_token_id: f.opt_token_id("bos_token_id")?,
            pad_token_id: f.opt_token_id("pad_token_id")?,
            temperature: float("temperature")?,
            top_k: f.opt_usize("top_k")?,
            top_p: float("top_p")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            do_sample: f.opt_bool("do_sample")?,
            max_new_tokens: f.opt_usize("max_new_tokens")?,
        })
    }
}
