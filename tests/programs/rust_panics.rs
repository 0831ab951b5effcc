// Rust panics caught by std::panic::catch_unwind across several frames, and readable names
// (generics, trait methods, closures). Every function of ours logs its own enter and exit,
// and the code that caught a panic logs which activation it runs in, so the program says
// which frames a panic ended (the oracle for ptscope's stacks). The log is a u64 per event
// (id<<16 | function<<2 | kind: 1 enter, 2 exit, 3 a catch), written at exit to
// $PTSCOPE_RUST_LOG after a line of function names (tests/support/oracles.py:
// self_log_activations).
use std::cell::RefCell;
use std::panic;
use std::sync::atomic::{AtomicU64, Ordering};

const NAMES: [&str; 8] = ["after", "dive", "catcher", "guarded", "guard_catcher", "again", "shapes", "main"];

thread_local! {
    static LOG: RefCell<Vec<u64>> = RefCell::new(Vec::with_capacity(4096));
}
static NEXT: AtomicU64 = AtomicU64::new(0);

#[inline(never)]
fn push(v: u64) {
    LOG.with(|log| log.borrow_mut().push(v));
}

#[inline(never)]
fn enter(code: u64) -> u64 {
    let id = NEXT.fetch_add(1, Ordering::Relaxed) + 1;
    push(id << 16 | code << 2 | 1);
    id
}

#[inline(never)]
fn leave(id: u64) {
    push(id << 16 | 2);
}

#[inline(never)]
fn caught(id: u64) {
    push(id << 16 | 3);
}

#[inline(never)]
fn after() {
    let me = enter(0);
    leave(me);
}

// Several frames deep, nothing to drop: the unwinder goes straight to the catch.
#[inline(never)]
fn dive(n: u32) -> u32 {
    let me = enter(1);
    if n == 0 {
        panic!("deep");
    }
    let r = 1 + dive(n - 1);
    leave(me);
    r
}

#[inline(never)]
fn catcher() -> u32 {
    let me = enter(2);
    let r = match panic::catch_unwind(|| dive(4)) {
        Ok(v) => v,
        Err(_) => {
            caught(me);
            after();
            0
        }
    };
    leave(me);
    r
}

// Frames with something to drop: the unwinder runs each one's cleanup on the way out, and
// the cleanup calls a function of ours, which must nest under the frame being cleaned.
struct Guard(u64);

impl Drop for Guard {
    fn drop(&mut self) {
        after();
        leave(self.0);
    }
}

#[inline(never)]
fn guarded(n: u32) -> u32 {
    let guard = Guard(enter(3));
    if n == 0 {
        panic!("guarded");
    }
    let r = guarded(n - 1) + 1;
    drop(guard);
    r
}

#[inline(never)]
fn guard_catcher() -> u32 {
    let me = enter(4);
    let r = panic::catch_unwind(|| guarded(3)).unwrap_or_else(|_| {
        caught(me);
        after();
        0
    });
    leave(me);
    r
}

// Recursion: an older activation of the panicking function catches.
#[inline(never)]
fn again(n: u32) -> u32 {
    let me = enter(5);
    if n == 0 {
        panic!("again");
    }
    let r = if n == 3 {
        match panic::catch_unwind(|| again(n - 1)) {
            Ok(v) => v,
            Err(_) => {
                caught(me);
                after();
                0
            }
        }
    } else {
        again(n - 1) + 1
    };
    leave(me);
    r
}

// Names: a generic function, trait methods through a trait object.
trait Shape {
    fn area(&self) -> u64;
}

struct Square(u64);

impl Shape for Square {
    #[inline(never)]
    fn area(&self) -> u64 {
        self.0 * self.0
    }
}

#[inline(never)]
fn pick<T: Copy>(items: &[T], at: usize) -> T {
    items[at % items.len()]
}

#[inline(never)]
fn shapes() -> u64 {
    let me = enter(6);
    let boxed: Vec<Box<dyn Shape>> = vec![Box::new(Square(3))];
    let at = std::env::args().count(); // not known when compiling
    let r = boxed.iter().map(|s| s.area()).sum::<u64>() + pick(&[3u64, 9, 4], at);
    leave(me);
    r
}

fn write_log(path: &str) {
    let mut out = NAMES.join(" ").into_bytes();
    out.push(b'\n');
    LOG.with(|log| {
        for v in log.borrow().iter() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    });
    std::fs::write(path, out).expect("cannot write the log");
}

fn main() {
    panic::set_hook(Box::new(|_| {})); // no message: the catches are expected
    let me = enter(7);
    let total = catcher() + guard_catcher() + again(5) + shapes() as u32;
    leave(me);
    if let Ok(path) = std::env::var("PTSCOPE_RUST_LOG") {
        write_log(&path);
    }
    println!("rust {}", total);
}
