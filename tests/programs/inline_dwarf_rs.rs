// Inlined Rust for the DWARF inline reader's tests (tests/decode/test_inline_info.py):
// #[inline(always)] functions, nested, a method, a closure, iterator adapters.
use std::env;

struct Acc {
    total: u64,
}

impl Acc {
    #[inline(always)]
    fn add(&mut self, v: u64) {
        self.total = self.total.wrapping_mul(31).wrapping_add(mix(v));
    }
}

#[inline(always)]
fn mix(x: u64) -> u64 {
    let y = x ^ (x >> 13);
    y.wrapping_mul(0x5bd1e995) ^ (y >> 15)
}

#[inline(always)]
fn twice(x: u64) -> u64 {
    mix(x) + mix(x + 1)
}

#[inline(never)]
fn run(n: u64) -> u64 {
    let mut acc = Acc { total: 0 };
    for i in 0..n {
        acc.add(twice(i));
    }
    let scale = |v: u64| v.wrapping_mul(n) + twice(v);
    (0..n).map(scale).filter(|v| v % 3 != 0).fold(acc.total, |a, b| a ^ b)
}

fn main() {
    let n = env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(100u64);
    println!("{}", run(n));
}
