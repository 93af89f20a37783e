//! The same greedy request decoded sequentially and speculatively (the checkpoint's MTP head, block 3):
//! the texts are equal, token for token, and the speculative run reports its acceptance.
//!
//! ```sh
//! cargo run --release -p turbospark --example speculative -- [MODEL_DIR]
//! ```

use turbospark::{GenerationConfig, Model, Speculation};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| turbospark::EMBEDDED_MODEL.to_string());
    let model = Model::open(&dir)?;
    let prompt = "def quicksort(items):\n";
    let config = GenerationConfig::greedy(96);

    let mut sequential = model.session_with(Speculation::Off, Default::default())?;
    let plain = sequential.generate(prompt, &config, |_| {})?;

    let mut speculative = model.session_with(Speculation::Block(3), Default::default())?;
    let fast = speculative.generate(prompt, &config, |_| {})?;

    assert_eq!(
        plain.token_ids, fast.token_ids,
        "speculation changed the output"
    );
    println!("{}", fast.text);
    println!(
        "sequential {:.1} tok/s, {} {:.1} tok/s ({:.2}x)",
        plain.decode_tokens_per_second(),
        speculative.mode(),
        fast.decode_tokens_per_second(),
        fast.decode_tokens_per_second() / plain.decode_tokens_per_second()
    );
    if let Some(stats) = &fast.spec {
        println!("{stats}");
    }
    Ok(())
}
