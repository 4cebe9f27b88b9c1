//! What chapter 9's tests share: the GPU, or a plain report that there is none.

use ch09::Gpu;
use std::io::Write;
use std::sync::{Arc, Once};

/// Set (to anything but `0`) where a missing GPU adapter must fail the tests: `.ci/run`, which
/// installs Mesa's lavapipe first.
pub const REQUIRE_GPU: &str = "LLM_RS_REQUIRE_GPU";

/// The GPU the tests share; `None` on a machine with no adapter (no Vulkan driver), after
/// saying so once on the terminal — unless [`REQUIRE_GPU`] is set, when it is a failure.
pub fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::shared() {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var(REQUIRE_GPU).is_ok_and(|v| v != "0") => {
            panic!("{e} ({REQUIRE_GPU} is set)")
        }
        Err(e) => {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                // Past the test harness's capture, so that it shows in a plain `cargo test`.
                let _ = writeln!(
                    std::io::stderr(),
                    "\nchapter 9: GPU tests skipped: {e}\n  (set {REQUIRE_GPU}=1 to make a missing \
                     adapter a failure)\n"
                );
            });
            None
        }
    }
}
