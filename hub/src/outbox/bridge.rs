//! The WebSub bridge.
