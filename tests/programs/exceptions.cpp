// C++ exceptions thrown through several frames and caught.
#include <cstdio>
#include <stdexcept>

__attribute__((noinline)) static int thrower(int n) {
    if (n % 3 == 0) throw std::runtime_error("boom");
    return n;
}
__attribute__((noinline)) static int middle(int n) { return thrower(n) + 1; }
__attribute__((noinline)) static int outer(int n) { return middle(n) * 2; }

int main() {
    int caught = 0, sum = 0;
    for (int i = 0; i < 4; i++) {
        try {
            sum += outer(i);
        } catch (const std::exception &e) {
            caught++;
        }
    }
    std::printf("exceptions %d %d\n", caught, sum);
    return 0;
}
