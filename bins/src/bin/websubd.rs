//! websubd: the hub service.

fn main() {
    println!("websubd {}", env!("CARGO_PKG_VERSION"));
}
