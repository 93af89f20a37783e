//! Prompts for the speculative comparison (`bench --workload`), phrased for base models such as the
//! embedded testbed (plain continuation, no chat template), covering where copying from the context pays
//! and where it cannot:
//! - `copy-edit`: a source file, then its first lines again, so a faithful model continues by reproducing
//!   the file (editing code the prompt already holds);
//! - `grounded`: a document, then one of its sentences begun again (answering with quotes);
//! - `free`: an open prompt with nothing to copy (the mix of drafters must not lose there).
//!
//! Also the default prompt and `--prompt`, encoded by the checkpoint's tokenizer.

use anyhow::{bail, Result};

use turbospark::families::Backend;

use super::{Bench, BenchArgs};

/// Used when the checkpoint has a tokenizer and no `--prompt` is given: text in the testbed's
/// training domains (code and prose), so acceptance reflects real use rather than random ids.
const DEFAULT_PROMPT: &str = "def read_config(path):\n    \"\"\"Read a JSON configuration file and return it as a dict.\"\"\"\n    import json\n    with open(path) as f:\n";

/// `--prompt` text, else the built-in text when there is a tokenizer, else the random ids.
pub(super) fn speculative_prompt(
    bench: &Bench,
    args: &BenchArgs,
    random: Vec<u32>,
) -> Result<Vec<u32>> {
    let has_tokenizer = bench.checkpoint.has_tokenizer();
    let text = match (&args.prompt, has_tokenizer) {
        (Some(text), true) => text.as_str(),
        (Some(_), false) => bail!(
            "--prompt needs the checkpoint's tokenizer (tokenizer.json or a GGUF vocabulary), which {} does not have",
            bench.checkpoint.dir.display()
        ),
        (None, true) => DEFAULT_PROMPT,
        (None, false) => return Ok(random),
    };
    encode_prompt(bench, args, text, "--prompt")
}

/// `text` as the checkpoint's tokenizer encodes it; `option` names where it came from in errors.
pub(super) fn encode_prompt(
    bench: &Bench,
    args: &BenchArgs,
    text: &str,
    option: &str,
) -> Result<Vec<u32>> {
    if !bench.checkpoint.has_tokenizer() {
        bail!(
            "{option} needs the checkpoint's tokenizer (tokenizer.json or a GGUF vocabulary), which {} does not have",
            bench.checkpoint.dir.display()
        );
    }
    let tokenizer = bench.checkpoint.tokenizer()?;
    let ids = tokenizer
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("{option}: the tokenizer could not encode it: {e}"))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        bail!("{option} is empty after tokenization");
    }
    if ids.len() + args.gen_tokens > bench.model.context() {
        bail!(
            "{option} has {} tokens; with --gen-tokens {} that exceeds the context of {}",
            ids.len(),
            args.gen_tokens,
            bench.model.context()
        );
    }
    Ok(ids)
}

/// A shipped workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    CopyEdit,
    Grounded,
    Free,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::CopyEdit => "copy-edit",
            Workload::Grounded => "grounded",
            Workload::Free => "free",
        }
    }

    /// The prompt text.
    pub fn text(self) -> String {
        match self {
            Workload::CopyEdit => {
                let head: String = SOURCE.lines().take(4).map(|l| format!("{l}\n")).collect();
                format!("# inventory.py\n{SOURCE}\n\n# inventory.py, unchanged\n{head}")
            }
            Workload::Grounded => {
                let start = DOCUMENT
                    .find(QUOTED)
                    .expect("the quoted sentence is in the document");
                let begun = &DOCUMENT[start..start + QUOTED.len() / 2];
                format!("{DOCUMENT}\n\nAs the report puts it: \"{begun}")
            }
            Workload::Free => FREE.to_string(),
        }
    }
}

/// A small Python module (written for this benchmark).
const SOURCE: &str = r#"import json
from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    quantity: int = 0
    tags: list = field(default_factory=list)

    def restock(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.quantity += amount
        return self.quantity

    def take(self, amount):
        if amount > self.quantity:
            raise ValueError(f"only {self.quantity} of {self.name} left")
        self.quantity -= amount
        return self.quantity


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity=0, tags=None):
        item = Item(name, quantity, list(tags or []))
        self.items[name] = item
        return item

    def find(self, tag):
        return [item for item in self.items.values() if tag in item.tags]

    def total(self):
        return sum(item.quantity for item in self.items.values())

    def save(self, path):
        data = {name: vars(item) for name, item in self.items.items()}
        with open(path, "w") as f:
            json.dump(data, f, indent=2)

    @classmethod
    def load(cls, path):
        inventory = cls()
        with open(path) as f:
            for name, fields in json.load(f).items():
                inventory.add(name, fields["quantity"], fields["tags"])
        return inventory
"#;

/// A short report (written for this benchmark).
const DOCUMENT: &str = "The river survey of the spring season covered forty kilometres of the lower \
valley, from the old mill at Harwick down to the estuary. Water levels were higher than in any of the \
previous five years, and the teams recorded flooding along three stretches of the western bank. The \
survey found that the new reed beds planted below the mill had held the bank in place during the \
March storms, while the unplanted stretch further south lost nearly two metres of soil in a single \
week. Fish counts were mixed: trout returned to the upper pools in good numbers, but the eel \
population near the estuary fell for the third year running. The report recommends extending the \
planting programme to the southern stretch before the autumn rains and repeating the eel count each \
month until the cause of the decline is understood.";

/// The sentence of [`DOCUMENT`] the grounded prompt begins again.
const QUOTED: &str = "The survey found that the new reed beds planted below the mill had held the bank \
in place during the March storms, while the unplanted stretch further south lost nearly two metres of \
soil in a single week.";

/// An open prompt with nothing in it to copy.
const FREE: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_edit_ends_with_the_files_beginning_and_grounded_with_half_a_quoted_sentence() {
        let text = Workload::CopyEdit.text();
        assert!(text.ends_with("import json\nfrom dataclasses import dataclass, field\n\n\n"));
        assert_eq!(text.matches("class Inventory").count(), 1);
        let text = Workload::Grounded.text();
        assert!(text.ends_with(&format!("\"{}", &QUOTED[..QUOTED.len() / 2])));
        assert!(!Workload::Free.text().contains("survey"));
    }
}
