//! Progress bars for long steps (indicatif), drawn on stderr only when it is a terminal:
//! logs, CI and `2>file` stay free of bar lines. Results still go to stdout through
//! [`Progress::println`], which clears the bar around the line.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `len` steps (or a spinner when `len` is 0), hidden when stderr is not a tty.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(len: u64, what: &str) -> Progress {
        let bar = if len == 0 { ProgressBar::new_spinner() } else { ProgressBar::new(len) };
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        bar.set_draw_target(target);
        let template = if len == 0 {
            "{spinner} {prefix} {msg} [{elapsed}]"
        } else {
            "{prefix} [{bar:30}] {pos}/{len} {msg} [{elapsed}, eta {eta}]"
        };
        // The templates are constants; a bad one would only lose the styling.
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_string());
        // Ticks keep the elapsed time moving while one long step runs.
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// What the current step is.
    pub fn step(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// A result line on stdout, with the bar cleared around it.
    pub fn println(&self, line: impl AsRef<str>) {
        self.bar.suspend(|| println!("{}", line.as_ref()));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
