//! A two-turn conversation with the model's chat template; the second turn reuses the first turn's
//! state (only its new tokens are prefilled), and a temperature samples the replies.
//!
//! ```sh
//! cargo run --release -p turbospark --example chat -- [MODEL_DIR]
//! ```

use turbospark::{ChatMessage, GenerationConfig, Model, RenderOptions, Shaping};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| turbospark::EMBEDDED_MODEL.to_string());
    let model = Model::open(&dir)?;
    let mut session = model.session()?;
    let options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let config = GenerationConfig {
        shaping: Shaping {
            temperature: 0.7,
            top_p: 0.8,
            ..Shaping::greedy()
        },
        seed: 42,
        ..GenerationConfig::greedy(48)
    };

    let mut messages = vec![ChatMessage::new("user", "Write a haiku about the sea.")];
    let reply = session.chat(&messages, &options, &config, |_| {})?;
    println!("assistant: {}\n", reply.text);
    messages.push(ChatMessage::new("assistant", reply.text));
    messages.push(ChatMessage::new("user", "Now one about the mountains."));
    let reply = session.chat(&messages, &options, &config, |_| {})?;
    println!("assistant: {}", reply.text);
    println!(
        "(second turn: {} of {} prompt tokens reused)",
        reply.reused_tokens, reply.prompt_tokens
    );
    Ok(())
}
