//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), rebuilt as a `tokenizers` BPE.
//!
//! Keys: `tokenizer.ggml.model` (`gpt2` = byte-level BPE, the only kind read), `.tokens` (strings,
//! by id), `.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte),
//! `.merges` (`"a b"` strings, by rank), `.pre` (the pre-tokenizer's name), `.bos_token_id`,
//! `.eos_token_id`, `.add_bos_token`. `tokenizer.chat_template` holds the Jinja chat template.
//!
//! Algorithm: write the tokenizer.json that Hugging Face's tokenizer for the same model has —
//! NFC normalizer, the split regex the `pre` name stands for (llama.cpp's `llama-vocab.cpp` table;
//! the regex written in tokenizer.json form) then byte-level without its own regex, byte-level BPE
//! over the normal tokens and the merges, control tokens as special added tokens and user-defined
//! ones as non-special added tokens, a BOS template when `add_bos_token` is set — and let the
//! `tokenizers` crate parse it. llama.cpp itself does not NFC-normalize; we follow the original
//! tokenizer.json (Qwen's has the NFC normalizer), so ids equal the original model's.
//!
//! Invariant: a vocabulary this module cannot reproduce (another tokenizer model, an unknown `pre`)
//! is an error naming the file and key, never a tokenizer that silently splits differently.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::{GgufSet, MetaValue};
use crate::LoadError;

/// Qwen2 / Qwen3's split regex (llama.cpp `qwen2`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's (llama.cpp `qwen35`): letters with their combining marks.
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;

/// The vocabulary of a GGUF file, read at open; [`GgufVocab::tokenizer`] builds the tokenizer.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    path: PathBuf,
    tokens: Vec<String>,
    token_types: Vec<i64>,
    merges: Vec<String>,
    pre: String,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

impl GgufVocab {
    /// The vocabulary of `set`, or `None` when it has no `tokenizer.ggml.model`.
    pub fn read(set: &GgufSet) -> Result<Option<Self>, LoadError> {
        let path = set.path().to_path_buf();
        let Some(model) = set.get("tokenizer.ggml.model") else {
            return Ok(None);
        };
        let bad = |key: &str, reason: String| LoadError::InvalidValue {
            path: path.clone(),
            field: key.to_string(),
            reason,
        };
        if model.as_str() != Some("gpt2") {
            return Err(LoadError::Unsupported {
                path: path.clone(),
                field: "tokenizer.ggml.model".into(),
                reason: format!("tokenizer model {model:?} (only `gpt2`, byte-level BPE, is read)"),
            });
        }
        let strings = |key: &str| -> Result<Vec<String>, LoadError> {
            let v = set.get(key).ok_or_else(|| LoadError::MissingField {
                path: path.clone(),
                field: key.to_string(),
            })?;
            v.as_array()
                .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect())
                .ok_or_else(|| bad(key, "should be an array of strings".into()))
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let token_types = match set.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(MetaValue::as_i64).collect::<Option<Vec<_>>>())
                .filter(|t| t.len() == tokens.len())
                .ok_or_else(|| {
                    bad(
                        "tokenizer.ggml.token_type",
                        format!("should be {} integers, one per token", tokens.len()),
                    )
                })?,
        };
        let pre = match set.get("tokenizer.ggml.pre") {
            None => "default".to_string(),
            Some(v) => v
                .as_str()
                .ok_or_else(|| bad("tokenizer.ggml.pre", "should be a string".into()))?
                .to_string(),
        };
        let id = |key: &str| -> Result<Option<u32>, LoadError> {
            match set.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| (n as usize) < tokens.len())
                    .map(Some)
                    .ok_or_else(|| bad(key, format!("{v:?} is not a token id"))),
            }
        };
        let add_bos = match set.get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| bad("tokenizer.ggml.add_bos_token", "should be a bool".into()))?,
        };
        Ok(Some(GgufVocab {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            path,
            tokens,
            token_types,
            merges,
            pre,
            add_bos,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `bos_token` / `eos_token` strings, the variables chat templates reference.
    pub fn special_tokens(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (name, id) in [("bos_token", self.bos), ("eos_token", self.eos)] {
            if let Some(t) = id.and_then(|i| self.tokens.get(i as usize)) {
                out.push((name.to_string(), t.clone()));
            }
        }
        out
    }

    /// Stop tokens: `eos_token_id`, then the tokens llama.cpp also ends generation on by their text
    /// (`llama-vocab.cpp`'s end-of-generation list, the entries Qwen vocabularies have), in id order.
    /// A GGUF has no generation_config.json; Qwen's lists `<|im_end|>` and `<|endoftext|>`.
    pub fn end_of_generation_ids(&self) -> Vec<u32> {
        const EOG: [&str; 5] = [
            "<|im_end|>",
            "<|endoftext|>",
            "<|eot_id|>",
            "<|end|>",
            "<|eom_id|>",
        ];
        let mut ids: Vec<u32> = self.eos.into_iter().collect();
        for (id, token) in self.tokens.iter().enumerate() {
            let id = id as u32;
            if EOG.contains(&token.as_str()) && !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// The tokenizer.json text equivalent to this vocabulary.
    pub fn tokenizer_json(&self) -> Result<String, LoadError> {
        let regex = match self.pre.as_str() {
            "qwen2" | "deepseek-r1-qwen" => QWEN2_REGEX,
            "qwen35" => QWEN35_REGEX,
            other => {
                return Err(LoadError::Unsupported {
                    path: self.path.clone(),
                    field: "tokenizer.ggml.pre".into(),
                    reason: format!(
                        "pre-tokenizer `{other}` (read: qwen2, deepseek-r1-qwen, qwen35)"
                    ),
                })
            }
        };
        let mut vocab = Map::new();
        let mut added = Vec::new();
        for (id, (token, &ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            match ty {
                UNUSED => continue,
                CONTROL | USER_DEFINED => added.push(json!({
                    "id": id, "content": token, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": ty == CONTROL,
                })),
                _ => {}
            }
            vocab.insert(token.clone(), json!(id));
        }
        let post_processor = match (self.add_bos, self.bos) {
            (true, Some(bos)) => {
                let t = &self.tokens[bos as usize];
                json!({
                    "type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {t.clone(): {"id": t, "ids": [bos], "tokens": [t]}},
                })
            }
            _ => Value::Null,
        };
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            ]},
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": self.merges,
            },
        });
        Ok(tokenizer.to_string())
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer, LoadError> {
        let json = self.tokenizer_json()?;
        json.parse::<tokenizers::Tokenizer>()
            .map_err(|e| LoadError::Tokenizer {
                path: self.path.clone(),
                reason: format!("from tokenizer.ggml.*: {e}"),
            })
    }
}
