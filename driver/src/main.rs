//! The reference `range` driver (SPEC §8). Built under issue #7; this binary only says so.

fn main() {
    eprintln!("range-driver: not implemented yet (issue #7)");
    std::process::exit(2);
}
