//! Running a model with a planted bug and requiring loom to catch it, and running a
//! model's body on a stack deep enough for a whole connection.

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
    expect_caught_with(bug, loom::model::Builder::new(), model)
}

/// [`expect_caught`] with the model run by `builder` (as [`connection_builder`] makes).
pub fn expect_caught_with<F>(bug: Bug, builder: loom::model::Builder, model: F) -> String
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
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.check(model)));
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

/// The stack, in words, of [`on_deep_stack`]'s thread: 512 KiB, far below a real thread's
/// and far above what a connection's deepest call takes.
const DEEP_STACK_WORDS: usize = 1 << 16;

/// Runs `body` on a loom thread of its own with a stack of [`DEEP_STACK_WORDS`] and waits
/// for it. Loom runs a model's threads as coroutines of 32 KiB stacks; a model that drives
/// whole connections (a send through the driver, the core, the endpoint and the
/// provider's claim) goes deeper than that. The thread adds no interleaving of its own:
/// the model's thread only waits for it.
pub fn on_deep_stack(body: impl FnOnce() + Send + 'static) {
    loom::thread::Builder::new()
        .stack_size(DEEP_STACK_WORDS)
        .spawn(body)
        .expect("spawn the model's thread")
        .join()
        .expect("the model's thread");
}

/// Branches, at most, of one execution of a model that drives whole connections.
const CONNECTION_BRANCHES: usize = 4_000;

/// A loom builder (with the environment's settings, `LOOM_MAX_PREEMPTIONS` among them) for
/// a model that drives whole connections: loom's default of 1 000 branches an execution
/// counts every atomic step of two connections' setup and traffic, which take about 1 500
/// without spinning anywhere. A model that spins still hits the bound.
pub fn connection_builder() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = CONNECTION_BRANCHES;
    builder
}
