//! Generates a continuation of a prompt, streaming the text as it comes.
//!
//! ```sh
//! cargo run --release -p turbospark --example generate -- [MODEL_DIR] "def fibonacci(n):"
//! ```

use std::io::Write;

use turbospark::{Event, GenerationConfig, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| turbospark::EMBEDDED_MODEL.to_string());
    let prompt = args.next().unwrap_or_else(|| "def fibonacci(n):".into());

    let model = Model::open(&dir)?;
    let mut session = model.session()?;
    let config = GenerationConfig::greedy(64);
    let result = session.generate(&prompt, &config, |event| {
        if let Event::Delta(text) = event {
            print!("{text}");
            let _ = std::io::stdout().flush();
        }
    })?;
    println!();
    eprintln!(
        "{} tokens, {:.1} tokens/s, stopped by {:?}",
        result.new_tokens,
        result.decode_tokens_per_second(),
        result.reason
    );
    Ok(())
}
