//! Running a model with a planted bug and requiring loom to catch it.

use std::sync::Mutex;

use tierbuf_pool::sync::planted::{Bug, plant};

/// Planted bugs are process-wide switches: models that plant them run one at a time.
static PLANTED_MODELS: Mutex<()> = Mutex::new(());

/// Runs `model` under `loom::model` with `bug` planted and returns loom's failure
/// message; panics if loom explores every interleaving without finding the bug.
pub fn expect_caught<F>(bug: Bug, model: F) -> String
where
    F: Fn() + Sync + Send + 'static,
{
    let _one_at_a_time = PLANTED_MODELS
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let _planted = plant(bug);
    let previous_hook = std::panic::take_hook();
    // The expected panic would otherwise print a backtrace-like report for every variant.
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loom::model(model)));
    std::panic::set_hook(previous_hook);
    match outcome {
        Ok(()) => panic!("loom explored every interleaving and did not catch {bug:?}"),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".to_string());
            println!("planted {bug:?}: loom caught it: {message}");
            message
        }
    }
}
