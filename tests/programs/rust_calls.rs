// Rust: recursion, generics, dynamic dispatch through a trait object, closures, iterators.
trait Shape {
    fn area(&self) -> u64;
}

struct Square(u64);
struct Rect(u64, u64);

impl Shape for Square {
    #[inline(never)]
    fn area(&self) -> u64 {
        self.0 * self.0
    }
}

impl Shape for Rect {
    #[inline(never)]
    fn area(&self) -> u64 {
        self.0 * self.1
    }
}

#[inline(never)]
fn fib(n: u64) -> u64 {
    if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
}

#[inline(never)]
fn total(shapes: &[Box<dyn Shape>]) -> u64 {
    shapes.iter().map(|s| s.area()).sum()
}

#[inline(never)]
fn largest<T: PartialOrd + Copy>(items: &[T]) -> T {
    let mut best = items[0];
    for &item in items {
        if item > best {
            best = item;
        }
    }
    best
}

fn main() {
    let shapes: Vec<Box<dyn Shape>> = vec![Box::new(Square(3)), Box::new(Rect(2, 5))];
    let sum = total(&shapes) + fib(10) + largest(&[3u64, 9, 4]);
    println!("rust {}", sum);
}
