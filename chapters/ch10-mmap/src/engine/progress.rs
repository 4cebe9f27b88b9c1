//! [`LoadProgress`]: the loading line on a terminal, shown once a load runs for
//! [`PROGRESS_AFTER`].

use std::time::{Duration, Instant};

/// How long a load runs before it shows its progress: a load faster than this shows nothing.
pub const PROGRESS_AFTER: Duration = Duration::from_millis(1500);

/// A line on standard error saying how much of the model is loaded, once loading has run for
/// [`PROGRESS_AFTER`] (an 8B model repacks for seconds), rewritten in place and cleared when
/// the load ends. Only on a terminal: a log gets no progress lines.
pub struct LoadProgress {
    shown: std::rc::Rc<std::cell::Cell<bool>>,
    enabled: bool,
}

impl LoadProgress {
    /// Progress on standard error if `wanted` and it is a terminal.
    pub fn on_terminal(wanted: bool) -> LoadProgress {
        use std::io::IsTerminal;
        LoadProgress {
            shown: Default::default(),
            enabled: wanted && std::io::stderr().is_terminal(),
        }
    }

    /// The callback [`Engine::load_reporting`](super::Engine::load_reporting) calls.
    pub fn reporter(&self) -> Box<dyn Fn(u64, u64)> {
        let (shown, enabled, start) = (self.shown.clone(), self.enabled, Instant::now());
        let last = std::cell::Cell::new(u64::MAX); // the percentage shown last
        Box::new(move |done, total| {
            let percent = done * 100 / total.max(1);
            if enabled && percent != last.get() && start.elapsed() >= PROGRESS_AFTER {
                let gb = |b: u64| b as f64 / 1e9;
                eprint!(
                    "\rloading: {percent:>3}% ({:.1} of {:.1} GB)",
                    gb(done),
                    gb(total)
                );
                last.set(percent);
                shown.set(true);
            }
        })
    }

    /// Clear the line, if one was shown.
    pub fn finish(&self) {
        if self.shown.get() {
            eprint!("\r\x1b[K");
        }
    }
}
