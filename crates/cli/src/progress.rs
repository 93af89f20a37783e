//! Progress indicators on stderr (indicatif), drawn only when stderr is a terminal so logs and
//! pipes never receive control sequences. A hidden indicator costs nothing and needs no `if`s at
//! the call sites.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Prompts at least this long show a prefill bar; shorter ones finish before a bar would help.
pub const PREFILL_BAR_MIN_TOKENS: usize = 256;

fn target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A spinner for work of unknown length (loading a model).
pub fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, target());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A bar over `total` units (prompt tokens, windows).
pub fn bar(total: usize, message: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total as u64), target());
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_string());
    bar
}
