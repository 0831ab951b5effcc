// C++ names as the trace shows them: templates, a lambda, operators, an anonymous
// namespace, and one function template instance whose name is over 40,000 characters (400
// long type names in its template arguments), which perf leaves mangled.
#include <cstdio>

#define LONG_TYPE(n) a_type_whose_name_is_long_so_that_one_instance_has_a_name_of_over_forty_thousand_characters_in_all_##n
#define TYPE(n) struct LONG_TYPE(n) {};
#define TYPES10(n) TYPE(n##0) TYPE(n##1) TYPE(n##2) TYPE(n##3) TYPE(n##4) TYPE(n##5) TYPE(n##6) TYPE(n##7) TYPE(n##8) TYPE(n##9)
#define TYPES100(n) TYPES10(n##0) TYPES10(n##1) TYPES10(n##2) TYPES10(n##3) TYPES10(n##4) TYPES10(n##5) TYPES10(n##6) TYPES10(n##7) TYPES10(n##8) TYPES10(n##9)
#define ARG(n) LONG_TYPE(n),
#define ARGS10(n) ARG(n##0) ARG(n##1) ARG(n##2) ARG(n##3) ARG(n##4) ARG(n##5) ARG(n##6) ARG(n##7) ARG(n##8) ARG(n##9)
#define ARGS100(n) ARGS10(n##0) ARGS10(n##1) ARGS10(n##2) ARGS10(n##3) ARGS10(n##4) ARGS10(n##5) ARGS10(n##6) ARGS10(n##7) ARGS10(n##8) ARGS10(n##9)

TYPES100(1) TYPES100(2) TYPES100(3) TYPES100(4)
struct end_of_list {};

template <typename... T> __attribute__((noinline)) int huge(int x) { return x + (int)sizeof...(T); }

namespace shapes {
template <typename T> struct Box {
    T v;
    __attribute__((noinline)) Box operator+(const Box &o) const { return Box{v + o.v}; }
    __attribute__((noinline)) bool operator<(const Box &o) const { return v < o.v; }
};
namespace {
__attribute__((noinline)) int hidden(int x) { return x * 7; }
}  // namespace
template <typename F> __attribute__((noinline)) int apply(F f, int x) { return f(x); }
}  // namespace shapes

int main() {
    shapes::Box<long> a{1}, b{2};
    auto c = a + b;
    int k = shapes::apply([](int x) __attribute__((noinline)) { return shapes::hidden(x) + 1; }, 3);
    int h = huge<ARGS100(1) ARGS100(2) ARGS100(3) ARGS100(4) end_of_list>(1);
    std::printf("names %ld %d %d %d\n", c.v, (int)(a < b), k, h);
    return 0;
}
