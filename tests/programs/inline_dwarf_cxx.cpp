// Inlined C++ for the DWARF inline reader's tests (tests/decode/test_inline_info.py):
// methods (qualified names), templates, lambdas, std::sort and std::vector's inlined
// internals, and a namespace function inlined at several call sites.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

namespace geo {

struct Point {
    int x, y;
    int norm() const { return x * x + y * y; }
    Point scaled(int k) const { return {x * k, y * k}; }
};

template <typename T>
inline T clamp_to(T v, T lo, T hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

inline int weight(const Point& p) { return clamp_to(p.norm(), 0, 1000); }

}  // namespace geo

__attribute__((noinline)) long score(std::vector<geo::Point>& pts, int k) {
    std::sort(pts.begin(), pts.end(),
              [](const geo::Point& a, const geo::Point& b) { return a.norm() < b.norm(); });
    long total = std::accumulate(pts.begin(), pts.end(), 0L, [k](long t, const geo::Point& p) {
        return t + geo::weight(p.scaled(k));
    });
    auto twice = [&total](int v) { total += 2 * v; };
    for (const auto& p : pts) twice(geo::weight(p));
    return total;
}

__attribute__((noinline)) int pick(const std::vector<geo::Point>& pts) {
    int best = 0;
    for (const auto& p : pts) best = std::max(best, geo::weight(p) + geo::clamp_to(p.x, -5, 5));
    return best;
}

int main(int argc, char** argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 50;
    std::vector<geo::Point> pts;
    for (int i = 0; i < n; i++) pts.push_back({i % 7 - 3, i % 11 - 5});
    std::printf("%ld %d\n", score(pts, argc), pick(pts));
    return 0;
}
