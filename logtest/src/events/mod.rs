//! The event log's checks, one module per part of its contract, and the
//! helpers they are written with (public, for a backend's own tests).

mod denials;
mod endpoints;
pub mod helpers;
mod intake;
mod operations;
mod outcomes;
mod queue;
mod sessions;
mod signing;
mod upkeep;

pub use denials::*;
pub use endpoints::*;
pub use intake::*;
pub use operations::*;
pub use outcomes::*;
pub use queue::*;
pub use sessions::*;
pub use signing::*;
pub use upkeep::*;
