//! `turbospark chat`: a multi-turn conversation on stdin/stdout.
//!
//! Each turn renders the whole conversation with the model's chat template (add_generation_prompt)
//! and generates on one [`turbospark::runtime::Session`] kept for the whole chat: the session reuses the prefix
//! its state already covers (the earlier turns), so a turn prefills only what is new. `--stats`
//! shows how many prompt tokens were reused.
//!
//! Ctrl-C during a reply cancels that reply (the partial text stays in the conversation, as it was
//! shown); at the prompt the first Ctrl-C prints a hint and the second exits; Ctrl-D (end of input)
//! exits. Commands: `/reset` starts a new conversation, `/exit` (or `/quit`) ends the chat. A turn
//! that fails (e.g. the conversation outgrew the context) prints `error: ...`, is dropped, and the
//! chat goes on.

use std::io::{self, BufRead, IsTerminal, Write};

use anyhow::{bail, Context, Result};
use turbospark::runtime::{ChatMessage, StopReason};

use crate::generate::{self, Interrupt, SamplingArgs};
use crate::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message opening the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Pass enable_thinking = false to the template (Qwen3-style templates).
    #[arg(long)]
    pub no_think: bool,
}

/// What a typed line asks for.
enum Line<'a> {
    Say(&'a str),
    Reset,
    Exit,
    Nothing,
}

fn classify(line: &str) -> Line<'_> {
    let text = line.trim_end_matches(['\n', '\r']);
    match text.trim() {
        "" => Line::Nothing,
        "/exit" | "/quit" => Line::Exit,
        "/reset" => Line::Reset,
        _ => Line::Say(text),
    }
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let config = args.sampling.config();
    let mut loaded = generate::load(&args.model, &args.sampling)?;
    if loaded.model.engine().chat.is_none() {
        bail!(
            "chat: the model has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)"
        );
    }
    let options = generate::render_options(args.no_think);
    let opening: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect();
    let mut messages = opening.clone();
    let interrupt = Interrupt::install(2)?;
    let interactive = io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chat ({}): /reset for a new conversation, /exit or Ctrl-D to leave",
            loaded.session.mode()
        );
    }
    let mut line = String::new();
    loop {
        if interactive {
            let mut out = io::stdout().lock();
            out.write_all(b"> ")
                .and_then(|()| out.flush())
                .context("writing to stdout")?;
        }
        line.clear();
        if io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading stdin")?
            == 0
        {
            return Ok(());
        }
        interrupt.typed();
        let text = match classify(&line) {
            Line::Nothing => continue,
            Line::Exit => return Ok(()),
            Line::Reset => {
                messages = opening.clone();
                loaded.session.reset()?;
                continue;
            }
            Line::Say(text) => text,
        };
        messages.push(ChatMessage::new("user", text));
        let turn = (|| -> Result<_> {
            let rendered = loaded.model.render_chat(&messages, &options)?;
            let prompt = loaded.model.encode(&rendered)?;
            interrupt.begin(loaded.session.cancel_flag());
            let result = generate::stream(&mut loaded, &prompt, &config);
            interrupt.end();
            result
        })();
        match turn {
            Ok(result) => {
                if result.reason == StopReason::Cancelled {
                    eprintln!("[reply cancelled]");
                }
                if args.sampling.stats {
                    generate::print_stats(
                        &result,
                        loaded.session.mode(),
                        loaded.model.device_name(),
                    );
                }
                messages.push(ChatMessage::new("assistant", result.text));
            }
            Err(err) if crate::is_broken_pipe(&err) => return Err(err),
            Err(err) => {
                crate::report(&err);
                eprintln!("(the turn was dropped; /reset starts a new conversation)");
                messages.pop();
                loaded.session.reset()?;
            }
        }
    }
}
