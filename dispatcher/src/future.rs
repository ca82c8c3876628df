//! Waiting on something that may not exist, in the dispatcher's event
//! loops.

/// `future`'s output, or never when there is none: a `select!` branch on
/// something that may not exist (a scan in flight, a retry deadline).
pub(crate) async fn or_never<F: Future>(future: Option<F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}
