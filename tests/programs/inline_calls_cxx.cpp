// Inlined calls in C++ (tests/decode/test_inlined_frames.py): lambdas, templates,
// methods and std::accumulate inlined at -O2, bodies that call out-of-line functions.
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

static volatile int sink;

__attribute__((noinline)) int leaf(int x) { return sink = x * 5 + 2; }

namespace geo {
struct Point {
	int x, y;
	__attribute__((always_inline)) inline int dot(const Point &o) const { return x * o.x + y * o.y; }
	__attribute__((always_inline)) inline Point scaled(int k) const { return {x * k, leaf(y) * k}; }
};

template <typename F> __attribute__((always_inline)) inline int apply_twice(F f, int v)
{
	return f(f(v));
}
} // namespace geo

__attribute__((noinline)) int work(const std::vector<int> &v)
{
	int total = std::accumulate(v.begin(), v.end(), 0);
	auto bump = [&](int x) __attribute__((always_inline)) { return leaf(x) + total; };
	geo::Point p{total & 15, 3};
	for (int i : v) {
		total += geo::apply_twice(bump, i) & 255;
		total ^= p.scaled(i & 3).dot(p);
	}
	return total;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? std::atoi(argv[1]) : 12;
	std::vector<int> v;
	for (int i = 0; i < n; i++)
		v.push_back(i * 7 % 11);
	std::printf("%d\n", work(v));
	return 0;
}
