//! A Hugging Face checkpoint directory as users have it: config.json, safetensors weights (one file
//! or an index + shards), generation_config.json, tokenizer.json, the chat template, and optional
//! drafters (`mtp.*` tensors, a `dflash/` sub-directory).
//!
//! Algorithm: parse config.json, open (mmap + validate) the weights, then fix the tensor prefix from
//! the tensors themselves: transformers loads `model.language_model.*` tensors into
//! `Qwen3_5ForCausalLM` too (its `PrefixChange` conversion), so whichever prefix holds
//! `embed_tokens.weight` wins. Optional files that are absent give defaults; optional files that are
//! present but broken are errors (a broken file is never silently ignored). The tokenizer is parsed
//! on demand by [`Checkpoint::tokenizer`].
//!
//! A GGUF model (`open` given a `.gguf` file, or the first part of a split set) fills the same
//! fields from the file: the config from its metadata (`gguf::config`), the tensors under their
//! Hugging Face names (`TensorStore::from_gguf`), the tokenizer from `tokenizer.ggml.*` and the
//! chat template from `tokenizer.chat_template`; `dir` is then the file's path.
//!
//! Invariant: an opened `Checkpoint` has a valid config, every shard header validated, and
//! `config.tensor_prefix` equal to the prefix its tensors use (when either candidate is present).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::gguf::tokenizer::GgufVocab;
use crate::gguf::{self, GgufSet};
use crate::json::{read_object, type_name, Fields};
use crate::{GenerationDefaults, LoadError, ModelConfig, TensorStore};

/// The tensor-name prefixes a text decoder may sit under.
const PREFIXES: [&str; 2] = ["model.", "model.language_model."];

/// An opened checkpoint directory.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub tensors: TensorStore,
    /// `Default` when generation_config.json is absent.
    pub generation: GenerationDefaults,
    /// chat_template.jinja, else tokenizer_config.json's `chat_template`, else chat_template.json.
    pub chat_template: Option<String>,
    /// Some tensor name starts with `mtp.` (detection only; the drafter checks its own tensors).
    pub has_mtp: bool,
    /// `dir/dflash/config.json` exists.
    pub has_dflash: bool,
    /// The vocabulary of a GGUF model (`None` for a directory: its tokenizer.json is used).
    pub gguf_vocab: Option<GgufVocab>,
}

impl Checkpoint {
    /// Opens a checkpoint directory, a `.gguf` file, or the first file of a split GGUF set.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        if gguf::is_gguf_path(dir) {
            return Self::open_gguf(dir);
        }
        if !dir.is_dir() {
            return Err(LoadError::MissingFile {
                path: dir.to_path_buf(),
                what: "checkpoint directory",
            });
        }
        let mut config = ModelConfig::from_json_file(&dir.join("config.json"))?;
        let mut tensors = TensorStore::open(dir)?;
        crate::fp8::apply(&dir.join("config.json"), &mut tensors)?;
        if let Some(prefix) = PREFIXES
            .iter()
            .find(|p| tensors.contains(&format!("{p}embed_tokens.weight")))
        {
            config.tensor_prefix = prefix.to_string();
        }
        let generation_path = dir.join("generation_config.json");
        let generation = if generation_path.is_file() {
            GenerationDefaults::from_json_file(&generation_path)?
        } else {
            GenerationDefaults::default()
        };
        let chat_template = read_chat_template(dir)?;
        let has_mtp = tensors.names().any(|n| n.starts_with("mtp."));
        let has_dflash = dir.join("dflash").join("config.json").is_file();
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            tensors,
            generation,
            chat_template,
            has_mtp,
            has_dflash,
            gguf_vocab: None,
        })
    }

    /// Opens a GGUF model (`path` a `.gguf` file or the first part of a split set).
    pub fn open_gguf(path: &Path) -> Result<Self, LoadError> {
        let set = GgufSet::open(path)?;
        let (config_json, layout) = gguf::config::hf_config(&set)?;
        let mut config = ModelConfig::from_json_str(&config_json, path)?;
        config.tensor_prefix = "model.".to_string();
        let gguf_vocab = GgufVocab::read(&set)?;
        let chat_template = match set.get("tokenizer.chat_template") {
            None => None,
            Some(v) => {
                Some(
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| LoadError::WrongType {
                            path: path.to_path_buf(),
                            field: "tokenizer.chat_template".into(),
                            expected: "a string",
                            found: v.type_name().to_string(),
                        })?,
                )
            }
        };
        let eos_token_ids = match &gguf_vocab {
            Some(vocab) => vocab.end_of_generation_ids(),
            None => config.eos_token_ids.clone(),
        };
        let generation = GenerationDefaults {
            eos_token_ids,
            ..GenerationDefaults::default()
        };
        let tensors = TensorStore::from_gguf(set, &layout)?;
        let has_mtp = tensors.names().any(|n| n.starts_with("mtp."));
        Ok(Checkpoint {
            dir: path.to_path_buf(),
            config,
            tensors,
            generation,
            chat_template,
            has_mtp,
            has_dflash: false,
            gguf_vocab,
        })
    }

    /// Whether [`Checkpoint::tokenizer`] has something to load.
    pub fn has_tokenizer(&self) -> bool {
        self.gguf_vocab.is_some() || self.dir.join("tokenizer.json").is_file()
    }

    /// Parses `dir/tokenizer.json`, or builds a GGUF model's tokenizer from its vocabulary.
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer, LoadError> {
        if let Some(vocab) = &self.gguf_vocab {
            return vocab.tokenizer();
        }
        if self.tensors.is_gguf() {
            return Err(LoadError::MissingField {
                path: self.dir.clone(),
                field: "tokenizer.ggml.model (the GGUF file carries no tokenizer)".into(),
            });
        }
        let path = self.dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(LoadError::MissingFile {
                path,
                what: "tokenizer.json of the checkpoint",
            });
        }
        tokenizers::Tokenizer::from_file(&path).map_err(|e| LoadError::Tokenizer {
            path,
            reason: e.to_string(),
        })
    }

    /// Stop tokens: generation_config.json's `eos_token_id` first, then config.json's, without
    /// duplicates.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let mut ids = Vec::new();
        for &id in self
            .generation
            .eos_token_ids
            .iter()
            .chain(&self.config.eos_token_ids)
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Elements over all stored tensors (including `mtp.*` and any vision tower).
    pub fn parameter_count(&self) -> usize {
        self.tensors
            .names()
            .filter_map(|n| self.tensors.numel(n).ok())
            .sum()
    }

    /// `tensor_prefix + suffix`, e.g. `name("layers.0.mlp.up_proj.weight")`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{}", self.config.tensor_prefix, suffix)
    }
}

/// transformers' order: a `chat_template.jinja` file overrides tokenizer_config.json's
/// `chat_template` (a string, or a list of `{name, template}` whose `default` entry is used);
/// the legacy processor file chat_template.json comes last.
fn read_chat_template(dir: &Path) -> Result<Option<String>, LoadError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| LoadError::Io {
                path: jinja,
                source: e,
            });
    }
    for file in ["tokenizer_config.json", "chat_template.json"] {
        let path = dir.join(file);
        if !path.is_file() {
            continue;
        }
        let root = read_object(&path, "tokenizer configuration")?;
        let fields = Fields::new(&path, &root, "");
        if let Some(template) = template_field(&fields)? {
            return Ok(Some(template));
        }
    }
    Ok(None)
}

fn template_field(f: &Fields<'_>) -> Result<Option<String>, LoadError> {
    let field = "chat_template";
    let Some(value) = f.get(field) else {
        return Ok(None);
    };
    let expected = "a string or a list of {name, template} objects";
    match value {
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(items) => {
            for item in items {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_string())),
                    (Some(_), Some(_)) => {}
                    _ => return Err(f.wrong_type(field, expected, item)),
                }
            }
            Ok(None)
        }
        other => Err(LoadError::WrongType {
            path: f.path_buf(),
            field: f.name(field),
            expected,
            found: type_name(other),
        }),
    }
}
