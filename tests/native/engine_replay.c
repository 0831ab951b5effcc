/* Replays a log of engine calls (written by tests/native/test_engine_library.py) through
 * _native/engine.c alone, without Python, and prints every output column: the proof that
 * the engine library gives what the Python extension gives, for the dlfilter to link it.
 *
 * Log lines (integers separated by spaces):
 *   I max_examples keep_slots axis spread       (first)
 *   P loc n a1 b1 .. an bn                       landing-pad answers (before W)
 *   W                                            set_landing_pads
 *   L n, then n lines "fn entry offset ip"       add_locations
 *   M fn flags                                   mark_function
 *   B n has_lines has_gap, then n rows of the 9 columns (+ gap_insns), and with lines a
 *     line of n + 1 offsets and a line "count lines..."                      feed
 *   E pid tid has_time time message              decode_error
 *   C pid tid time name value                    counter
 *   S                                            end_segment
 *   Z                                            close_all
 * Output: "slices K v..." for each slice column K, "instants K v...", "counters K v...",
 * or "error CODE MESSAGE" and exit 1 at the first failure. */
#include "engine.h"

#include <stdio.h>

static long long next(void)
{
	long long v;
	if (scanf("%lld", &v) != 1) {
		fprintf(stderr, "replay: bad log\n");
		exit(2);
	}
	return v;
}

static struct {
	int32_t loc;
	size_t n;
	int64_t *pairs;
} answers[4096];
static size_t nanswers;

static size_t landing(void *ctx, int32_t loc, const int64_t **pairs)
{
	(void)ctx;
	for (size_t i = 0; i < nanswers; i++) {
		if (answers[i].loc == loc) {
			*pairs = answers[i].pairs;
			return answers[i].n;
		}
	}
	*pairs = NULL;
	return 0;
}

static void check(Engine *e, int error)
{
	if (error) {
		printf("error %d %s\n", error, e->message);
		exit(1);
	}
}

static void print_vecs(const char *what, Vec *v, int n)
{
	for (int k = 0; k < n; k++) {
		printf("%s %d", what, k);
		for (size_t i = 0; i < v[k].n; i++)
			printf(" %lld", (long long)v[k].v[i]);
		printf("\n");
	}
}

int main(void)
{
	static Engine e;
	ptscope_engine_setup();
	char cmd[2];
	while (scanf("%1s", cmd) == 1) {
		switch (cmd[0]) {
		case 'I': {
			long long m = next(), k = next(), a = next(), s = next();
			check(&e, ptscope_engine_init(&e, (size_t)m, k, (int)a, s));
			break;
		}
		case 'P': {
			answers[nanswers].loc = (int32_t)next();
			size_t n = (size_t)next();
			answers[nanswers].n = n;
			answers[nanswers].pairs = malloc((2 * n + 1) * sizeof(int64_t));
			for (size_t i = 0; i < 2 * n; i++)
				answers[nanswers].pairs[i] = next();
			nanswers++;
			break;
		}
		case 'W':
			ptscope_engine_set_landing_pads(&e, landing, NULL);
			break;
		case 'L': {
			size_t n = (size_t)next();
			int32_t *fn = malloc((n + 1) * 4);
			int64_t *entry = malloc((n + 1) * 8), *off = malloc((n + 1) * 8);
			uint64_t *ip = malloc((n + 1) * 8);
			for (size_t i = 0; i < n; i++) {
				fn[i] = (int32_t)next();
				entry[i] = next();
				off[i] = next();
				ip[i] = (uint64_t)next();
			}
			check(&e, ptscope_engine_add_locations(
					  &e, (ptscope_column){(const char *)fn, 4},
					  (ptscope_column){(const char *)entry, 8},
					  (ptscope_column){(const char *)off, 8},
					  (ptscope_column){(const char *)ip, 8}, n));
			free(fn), free(entry), free(off), free(ip);
			break;
		}
		case 'M': {
			long long fn = next(), flags = next();
			check(&e, ptscope_engine_mark_function(&e, (int)fn, (int)flags));
			break;
		}
		case 'B': {
			size_t n = (size_t)next();
			int has_lines = (int)next(), has_gap = (int)next();
			static const int size[NCOLS] = {4, 4, 8, 4, 4, 4, 8, 8, 4};
			char *col[NCOLS];
			for (int k = 0; k < NCOLS; k++)
				col[k] = malloc((n + 1) * 8);
			uint16_t *gap = malloc((n + 1) * 2);
			for (size_t i = 0; i < n; i++) {
				for (int k = 0; k < NCOLS; k++) {
					long long v = next();
					if (size[k] == 4)
						((int32_t *)col[k])[i] = (int32_t)v;
					else
						((int64_t *)col[k])[i] = v;
				}
				if (has_gap)
					gap[i] = (uint16_t)next();
			}
			int32_t *offsets = malloc((n + 2) * 4);
			uint64_t *lines = NULL;
			if (has_lines) {
				for (size_t i = 0; i <= n; i++)
					offsets[i] = (int32_t)next();
				size_t nl = (size_t)next();
				lines = malloc((nl + 1) * 8);
				for (size_t i = 0; i < nl; i++)
					lines[i] = (uint64_t)next();
			}
			ptscope_column cols[NCOLS];
			for (int k = 0; k < NCOLS; k++)
				cols[k] = (ptscope_column){col[k], size[k]};
			ptscope_column off = {(const char *)offsets, 4}, g = {(const char *)gap, 2};
			check(&e, ptscope_engine_feed(&e, cols, n, has_lines ? &off : NULL, lines,
						      has_gap ? &g : NULL));
			for (int k = 0; k < NCOLS; k++)
				free(col[k]);
			free(gap), free(offsets), free(lines);
			break;
		}
		case 'E': {
			long long pid = next(), tid = next(), has = next(), t = next(), m = next();
			bool attributed;
			check(&e, ptscope_engine_decode_error(&e, pid, tid, has, t, m, &attributed));
			break;
		}
		case 'C': {
			long long pid = next(), tid = next(), t = next(), name = next(), v = next();
			check(&e, ptscope_engine_counter(&e, pid, tid, t, name, v));
			break;
		}
		case 'S':
			check(&e, ptscope_engine_end_segment(&e));
			break;
		case 'Z':
			check(&e, ptscope_engine_close_all(&e));
			break;
		default:
			fprintf(stderr, "replay: unknown command %s\n", cmd);
			return 2;
		}
	}
	print_vecs("slices", e.out, NOUT);
	print_vecs("instants", e.inst, NINST);
	print_vecs("counters", e.ctr, NCTR);
	ptscope_engine_free(&e);
	return 0;
}
