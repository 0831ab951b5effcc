/* Duration-complete records for many slices at once: see fxt_slices.h. */
#include "fxt_slices.h"

#include <string.h>

#define AFTER " --after 0x"
#define OCCURRENCE ":"
#define COUNT " --count "
#define NS_PER_S 1000000000LL
#define MAX_DIGITS 20 /* of a 64-bit number, in decimal; 16 in hex */

/* The decimal digits of v (>= 0), at least one. */
static unsigned decimal_width(uint64_t v)
{
	unsigned w = 1;
	while (v >= 10) {
		v /= 10;
		w++;
	}
	return w;
}

static unsigned hex_width(uint64_t v)
{
	return (unsigned)(64 - __builtin_clzll(v | 1) + 3) / 4;
}

/* "00".."99": two digits per division (the drill strings are most of the encoding). */
static const char PAIRS[201] = "0001020304050607080910111213141516171819"
			       "2021222324252627282930313233343536373839"
			       "4041424344454647484950515253545556575859"
			       "6061626364656667686970717273747576777879"
			       "8081828384858687888990919293949596979899";

/* v as exactly `digits` zero-filled decimal digits (the low ones). */
static char *put_decimal(char *p, uint64_t v, unsigned digits)
{
	unsigned k = digits;
	for (; k >= 2; k -= 2) {
		memcpy(p + k - 2, PAIRS + 2 * (v % 100), 2);
		v /= 100;
	}
	if (k)
		p[0] = (char)('0' + v % 10);
	return p + digits;
}

/* "00".."ff", for two hex digits at a time. */
static const char HEX_PAIRS[513] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
    "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"
    "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
    "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
    "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
    "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";

static char *put_hex(char *p, uint64_t v, unsigned digits)
{
	unsigned k = digits;
	for (; k >= 2; k -= 2) {
		memcpy(p + k - 2, HEX_PAIRS + 2 * (v & 255), 2);
		v >>= 8;
	}
	if (k)
		p[0] = HEX_PAIRS[2 * (v & 15) + 1];
	return p + digits;
}

static char *put_text(char *p, const char *text, size_t len)
{
	memcpy(p, text, len);
	return p + len;
}

/* The drill prefix, the same for every slice of a call, padded so that it is copied a word
 * at a time (a copy of a length known only at run time is a call into libc). */
#define PREFIX_WORDS 32
struct padded_prefix {
	uint64_t words[PREFIX_WORDS];
	const char *text; /* the prefix itself */
	size_t len, nwords; /* nwords 0: too long, copied as it is */
};

static void pad_prefix(struct padded_prefix *pp, const char *prefix, size_t len)
{
	pp->text = prefix;
	pp->len = len;
	pp->nwords = (len + 7) / 8;
	if (pp->nwords > PREFIX_WORDS) {
		pp->nwords = 0;
		return;
	}
	memset(pp->words, 0, sizeof pp->words);
	memcpy(pp->words, prefix, len);
}

/* Writes up to 7 bytes past the prefix, which what follows overwrites. */
static char *put_prefix(char *p, const struct padded_prefix *pp)
{
	if (!pp->nwords)
		return put_text(p, pp->text, pp->len);
	for (size_t k = 0; k < pp->nwords; k++)
		memcpy(p + 8 * k, &pp->words[k], 8);
	return p + pp->len;
}

/* v < 10^9 as nine zero-filled digits: a digit and four pairs, each a division by a
 * constant (two of every drill string's numbers; the loop above cost twice as much). */
static char *put_nine(char *p, uint32_t v)
{
	uint32_t low = v % 100000000u;
	p[0] = (char)('0' + v / 100000000u);
	memcpy(p + 1, PAIRS + 2 * (low / 1000000u), 2);
	memcpy(p + 3, PAIRS + 2 * (low / 10000u % 100u), 2);
	memcpy(p + 5, PAIRS + 2 * (low / 100u % 100u), 2);
	memcpy(p + 7, PAIRS + 2 * (low % 100u), 2);
	return p + 9;
}

static char *put_time(char *p, int64_t t, unsigned sec_width)
{
	uint64_t u = t > 0 ? (uint64_t)t : 0;
	p = put_decimal(p, u / NS_PER_S, sec_width);
	*p++ = '.';
	return put_nine(p, (uint32_t)(u % NS_PER_S));
}

/* A batch's times, formatted: a slice's times and its neighbours' mostly fall in the same
 * 100 us, so the seconds and the first four digits after the point are kept from the last
 * time formatted, and only the last five digits are written anew (two of every drill
 * string's numbers: the encoder's instructions at 60k went 1.14 -> 0.89 G). */
#define TIME_LOW 100000u /* the last five digits */
struct time_text {
	uint64_t high;	     /* u / TIME_LOW of the time in `text`; UINT64_MAX: none yet */
	unsigned sec_width;  /* the batch's seconds width */
	char text[16];	     /* "S.NNNN": seconds, the point and four digits */
};

static void time_text_init(struct time_text *c, unsigned sec_width)
{
	c->high = UINT64_MAX;
	c->sec_width = sec_width;
	memset(c->text, 0, sizeof c->text);
}

/* Writes up to 16 bytes from p, at most 5 past the time (sec_width <= 11, and a time in
 * int64 ns has at most 10 digits of seconds), which what follows overwrites: a comma and
 * the next time, or the string's 8 bytes of padding. */
static inline __attribute__((always_inline)) char *put_time_cached(char *p, int64_t t,
								    struct time_text *c)
{
	uint64_t u = t > 0 ? (uint64_t)t : 0;
	uint64_t high = u / TIME_LOW;
	unsigned head = c->sec_width + 5; /* "S.NNNN" */
	if (high != c->high) {
		char full[32] = {0};
		put_time(full, t, c->sec_width);
		memcpy(c->text, full, 16);
		c->high = high;
	}
	memcpy(p, c->text, 16);
	uint32_t low = (uint32_t)(u - high * TIME_LOW);
	p += head;
	p[0] = (char)('0' + low / 10000u);
	memcpy(p + 1, PAIRS + 2 * (low / 100u % 100u), 2);
	memcpy(p + 3, PAIRS + 2 * (low % 100u), 2);
	return p + 5;
}

/* The seconds' width: that of the latest time (at least 0) among the n slices. */
static unsigned seconds_width(size_t n, const struct fxt_drill_column *d)
{
	int64_t latest = 0;
	for (size_t i = 0; i < n; i++) {
		if (d->perf_start[i] > latest)
			latest = d->perf_start[i];
		if (d->perf_end[i] > latest)
			latest = d->perf_end[i];
	}
	return decimal_width((uint64_t)latest / NS_PER_S);
}

static size_t drill_most_bytes(const struct fxt_drill_column *d, unsigned sec_width)
{
	size_t n = d->prefix_len + 2 * (sec_width + 10) + 1;
	if (d->anchor_ip)
		n += sizeof AFTER - 1 + 16 + sizeof OCCURRENCE - 1 + MAX_DIGITS + sizeof COUNT - 1 +
		     MAX_DIGITS;
	return n;
}

size_t fxt_complete_bound(size_t n, const struct fxt_arg_column *args, size_t nargs,
			  const struct fxt_drill_column *drill)
{
	size_t per = 3;
	for (size_t a = 0; a < nargs; a++)
		per += args[a].values ? 2 : 1;
	if (drill)
		per += 1 + (drill_most_bytes(drill, MAX_DIGITS) + 7) / 8;
	return n * per;
}

/* Slice i's drill string at `text` (zero-padded to whole words); its length. The 8 bytes
 * after the string are written too (the padding, and what the record's next word, its
 * end time, overwrites). A slice with an anchor gets its start time only: the anchor and
 * the count say where the call begins and ends, and the end time's digits were a quarter
 * of the compressed trace (60k: 38.1 -> 28.9 MB without them). */
static size_t drill_text(char *text, const struct fxt_drill_column *d, size_t i,
			 struct time_text *tt, const struct padded_prefix *pp)
{
	char *p = put_time_cached(put_prefix(text, pp), d->perf_start[i], tt);
	if (d->anchor_ip && d->anchor_occurrence[i] > 0 && d->count[i] > 0) {
		uint64_t ip = d->anchor_ip[i];
		uint64_t occ = (uint64_t)d->anchor_occurrence[i];
		uint64_t cnt = (uint64_t)d->count[i];
		p = put_text(p, AFTER, sizeof AFTER - 1);
		p = put_hex(p, ip, hex_width(ip));
		p = put_text(p, OCCURRENCE, sizeof OCCURRENCE - 1);
		p = put_decimal(p, occ, decimal_width(occ));
		p = put_text(p, COUNT, sizeof COUNT - 1);
		p = put_decimal(p, cnt, decimal_width(cnt));
	} else {
		*p++ = ',';
		p = put_time_cached(p, d->perf_end[i], tt);
	}
	size_t len = (size_t)(p - text);
	memset(p, 0, 8);
	return len;
}

size_t fxt_encode_complete(uint64_t *out, size_t n, uint64_t header, const int32_t *name_slots,
			   const uint64_t *start, const uint64_t *end,
			   const struct fxt_arg_column *args, size_t nargs,
			   const struct fxt_drill_column *drill)
{
	struct padded_prefix pp;
	struct time_text tt;
	if (drill) {
		pad_prefix(&pp, drill->prefix, drill->prefix_len);
		time_text_init(&tt, seconds_width(n, drill));
	}
	uint64_t *w = out;
	for (size_t i = 0; i < n; i++) {
		uint64_t *rec = w;
		uint64_t count = 0;
		w += 2; /* header, start */
		for (size_t a = 0; a < nargs; a++) {
			const struct fxt_arg_column *c = &args[a];
			if (c->present && !c->present[i])
				continue;
			*w++ = c->heads ? c->heads[i] : c->head;
			if (c->values)
				*w++ = c->values[i];
			count++;
		}
		if (drill) {
			/* The string is written straight into the record's words (little-endian,
			 * as FXT is), after its header word. */
			size_t len = drill_text((char *)(w + 1), drill, i, &tt, &pp);
			uint64_t words = 1 + (len + 7) / 8;
			*w = drill->head | (words << 4) | ((0x8000 | (uint64_t)len) << 32);
			w += words;
			count++;
		}
		*w++ = end[i];
		uint64_t size = (uint64_t)(w - rec);
		rec[0] = header | ((uint64_t)(uint32_t)name_slots[i] << 48) | (size << 4) |
			 (count << 20);
		rec[1] = start[i];
	}
	return (size_t)(w - out);
}
