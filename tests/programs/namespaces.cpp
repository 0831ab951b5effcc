// Functions in nested namespaces, one of them overloaded: triggers name them as the trace
// shows them (demangled, without parameters), or with parameters to pick an overload.
#include <cstdio>
#include <cstdlib>

namespace outer {
namespace inner {
__attribute__((noinline)) int catcher(int x) { return x * 3 + 1; }
__attribute__((noinline)) int twice(int x) { return 2 * x; }
__attribute__((noinline)) double twice(double x) { return 2 * x; }
}  // namespace inner
}  // namespace outer

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 3;
    long sum = 0;
    for (int i = 0; i < n; i++) {
        sum += outer::inner::catcher(i) + outer::inner::twice(i);
        sum += static_cast<long>(outer::inner::twice(0.5 * i));
    }
    std::printf("namespaces %ld\n", sum);
    return 0;
}
