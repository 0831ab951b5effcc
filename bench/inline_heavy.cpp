// bench/inline.py's workload: C++ at -O2 whose time goes into inlined code (operators,
// lambdas, std::sort's comparator and helpers, std::map's lookups, std::accumulate), with
// out-of-line calls in between.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <vector>

struct Vec2 {
	double x, y;
	Vec2 operator+(const Vec2 &o) const { return {x + o.x, y + o.y}; }
	Vec2 operator*(double k) const { return {x * k, y * k}; }
	double dot(const Vec2 &o) const { return x * o.x + y * o.y; }
};

__attribute__((noinline)) double norm2(const Vec2 &v) { return v.dot(v); }

static unsigned lcg(unsigned &s) { return s = s * 1664525u + 1013904223u; }

int main(int argc, char **argv)
{
	int n = argc > 1 ? std::atoi(argv[1]) : 20000;
	unsigned seed = 12345;
	std::vector<Vec2> pts(n);
	for (auto &p : pts)
		p = {double(lcg(seed) % 1000), double(lcg(seed) % 1000)};
	std::vector<int> order(n);
	std::iota(order.begin(), order.end(), 0);
	std::sort(order.begin(), order.end(),
		  [&](int a, int b) { return pts[a].dot(pts[a]) < pts[b].dot(pts[b]); });
	Vec2 sum = std::accumulate(pts.begin(), pts.end(), Vec2{0, 0},
				   [](const Vec2 &a, const Vec2 &b) { return a + b * 0.5; });
	std::map<int, int> buckets;
	for (int i : order)
		buckets[int(norm2(pts[i])) / 4096]++;
	long total = 0;
	for (const auto &[k, c] : buckets)
		total += long(k) * c;
	std::printf("%.1f %.1f %ld %zu\n", sum.x, sum.y, total, buckets.size());
	return 0;
}
