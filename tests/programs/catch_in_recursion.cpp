/* Minimised by tests/fidelity/fuzz.py --minimize 60 (uftrace disagreed at -O0): an
 * exception thrown in f16 is caught in f13, which is on the stack several times, mutually
 * recursive with f6 and f16; the catching activation is not the nearest one. */
#include <cstdio>
#include <csignal>
#define NI __attribute__((noinline, noclone))
static volatile long sink;
static long calls;
static long events;
struct Boom { long v; };
static int armed;
extern "C" {
NI long f6(long x);
long f10(long x);
static NI long f13(long x);
NI long f16(long x);
static long (*const table[2])(long) = {f10, f16};
NI long f6(long x) {
	long acc = x * 2 + 6;
	if (x <= 0 || ++calls > 500) { sink += acc; return acc; }
	acc += f13(x - 2);
	acc += f16(x - 2);
	return acc;
}
long f10(long x) {
	long acc = x * 2 + 10;
	if (x <= 0 || ++calls > 500) { sink += acc; return acc; }
	acc += f16(x - 2);
	return acc;
}
static NI long f13(long x) {
	long acc = x * 2 + 13;
	if (x <= 0 || ++calls > 500) { sink += acc; return acc; }
	acc += f16(x - 1);
	armed++;
	try { acc += f6(x - 1); } catch (const Boom &b) { acc += b.v; }
	armed--;
	sink += acc;
	return f10(x - 1);
}
NI long f16(long x) {
	long acc = x * 2 + 16;
	if (x <= 0 || ++calls > 500) { sink += acc; return acc; }
	acc += table[(unsigned long)(acc + x) % 2](x - 2);
	if (armed && ++events % 7 == 0) throw Boom{x};
	acc += f13(x - 2);
	return acc;
}
}
int main(int argc, char **argv) {
	(void)argv;
	long r = 0;
	r += f16(9 + argc - 1);
	printf("%ld %ld\n", r, (long)sink);
	return 0;
}
