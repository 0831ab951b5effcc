// Inlined calls in Rust (tests/decode/test_inlined_frames.py): #[inline(always)]
// functions and closures inlined at -O, bodies that call #[inline(never)] functions.
use std::hint::black_box;

#[inline(never)]
fn leaf(x: u64) -> u64 {
    black_box(x * 3 + 1)
}

#[inline(always)]
fn square(x: u64) -> u64 {
    x.wrapping_mul(x)
}

#[inline(always)]
fn with_call(x: u64) -> u64 {
    let y = leaf(x);
    square(y).wrapping_add(square(x))
}

#[inline(never)]
fn work(n: u64) -> u64 {
    let mut acc = 0u64;
    let step = |i: u64, a: u64| with_call(i) ^ a;
    for i in 0..n {
        acc = acc.wrapping_add(step(i, acc));
        if acc & 1 == 1 {
            acc = acc.wrapping_add(leaf(i));
        }
    }
    acc
}

fn main() {
    let n = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    println!("{}", work(black_box(n)));
}
