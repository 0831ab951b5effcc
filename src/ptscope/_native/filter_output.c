/* The dlfilter's record stream: records written per sample into perf's stdout (or a
 * file), and ring mode's shared chunks handed over by chunk records (dlfilter.c's
 * comment, "Ring mode", says why and how perf's text stays in order).
 */
#include "filter_internal.h"

#include <time.h>

/* --------------------------------------------------------------- writing */

/* Waits until ptscope gives chunks back (it has all of them). */
static int ring_take_free(struct ring *r)
{
	while (!r->nfree) {
		ssize_t got = read(r->free_fd, r->free, r->chunks * sizeof(uint32_t));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0 || got % sizeof(uint32_t))
			return -1; /* ptscope went away, or wrote nonsense */
		r->nfree = (uint32_t)(got / sizeof(uint32_t));
		for (uint32_t i = 0; i < r->nfree; i++)
			if (r->free[i] >= r->chunks)
				return -1;
	}
	return 0;
}

int ring_publish(struct ptscope_filter *f, int last)
{
	struct ring *r = &f->ring;
	struct ptscope_chunk_rec c;
	memset(&c, 0, sizeof(c));
	c.tag = PTSCOPE_TAG_CHUNK;
	c.chunk = r->used ? r->cur : PTSCOPE_NO_CHUNK;
	c.length = r->used;
	if (fwrite_unlocked(&c, sizeof(c), 1, f->out) != 1 || fflush(f->out) != 0)
		return -1;
	r->pending = __fpending(f->out);
	if (!r->used || last)
		return 0;
	if (!r->nfree) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (ring_take_free(r) < 0)
			return -1;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		f->counters.ring_waits++;
		f->counters.ring_wait_ns += (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL +
						       (t1.tv_nsec - t0.tv_nsec));
	}
	r->cur = r->free[--r->nfree];
	r->used = 0;
	return 0;
}

void ring_write(struct ptscope_filter *f, const void *rec, size_t size)
{
	struct ring *r = &f->ring;
	const uint8_t *p = rec;
	emit_whole(f, size);
	if (f->failed)
		return;
	while (size) {
		if (r->used == r->chunk_bytes && ring_publish(f, 0) < 0) {
			f->failed = 1;
			return;
		}
		size_t room = r->chunk_bytes - r->used;
		size_t n = size < room ? size : room;
		memcpy(ring_cursor(r), p, n);
		r->used += (uint32_t)n;
		p += n;
		size -= n;
	}
}

void emit_header(struct ptscope_filter *f)
{
	struct ptscope_header_rec h;
	memset(&h, 0, sizeof(h));
	h.tag = PTSCOPE_TAG_HEADER;
	memcpy(h.magic, PTSCOPE_STREAM_MAGIC, sizeof(h.magic));
	h.version = PTSCOPE_STREAM_VERSION;
	h.branch_size = f->insns ? sizeof(struct ptscope_insns_branch_rec)
				 : sizeof(struct ptscope_branch_rec);
	h.location_size = sizeof(struct ptscope_location_rec);
	h.string_size = sizeof(struct ptscope_string_rec);
	h.power_size = sizeof(struct ptscope_power_rec);
	h.trailer_size = sizeof(struct ptscope_trailer_rec);
	h.lines_size = sizeof(struct ptscope_lines_rec);
	h.options = (f->keep_all ? PTSCOPE_OPT_KEEP_ALL : 0) | (f->insns ? PTSCOPE_OPT_INSNS : 0);
	emit(f, &h, sizeof(h));
}

/* ---------------------------------------------------- opening the stream */

void beat(struct ptscope_filter *f)
{
	if (f->beat_fd >= 0) {
		char byte = 0;
		ssize_t done = write(f->beat_fd, &byte, 1); /* a full pipe drops the beat */
		(void)done;
	}
}

int open_output(struct ptscope_filter *f, const char *target)
{
	if (!target || strcmp(target, "-") == 0 || strcmp(target, "stdout") == 0) {
		f->out = stdout;
		/* A large buffer: fewer pipe writes. Safe here: perf has printed nothing yet, and
		 * glibc flushes anything pending before switching buffers anyway. */
		setvbuf(stdout, NULL, _IOFBF, 1 << 20);
		return 0;
	}
	if (strncmp(target, "fd:", 3) == 0) {
		char *end;
		long fd = strtol(target + 3, &end, 10);
		if (*end || fd < 0)
			return -EINVAL;
		f->out = fdopen((int)fd, "wb");
	} else {
		f->out = fopen(target, "wb");
	}
	if (!f->out)
		return -errno;
	setvbuf(f->out, NULL, _IOFBF, 1 << 20);
	f->own_out = 1;
	return 0;
}

int ring_parse(const char *text, struct ring *r, int *memfd)
{
	long v[4];
	for (int k = 0; k < 4; k++) {
		char *end;
		v[k] = strtol(text, &end, 10);
		if (end == text || *end != (k < 3 ? ',' : '\0') || v[k] < 0)
			return -EINVAL;
		text = end + 1;
	}
	if (v[0] > 1 << 20 || v[1] > 1 << 20 || v[2] < 2 || v[2] > 1024 || v[3] < 4096 ||
	    v[3] > 1 << 26)
		return -EINVAL;
	*memfd = (int)v[0];
	r->free_fd = (int)v[1];
	r->chunks = (uint32_t)v[2];
	r->chunk_bytes = (uint32_t)v[3];
	return 0;
}

int ring_open(struct ptscope_filter *f, int memfd)
{
	struct ring *r = &f->ring;
	if (f->own_out)
		return -EINVAL; /* the chunk records go to perf's stdout, with perf's text */
	size_t bytes = (size_t)r->chunks * r->chunk_bytes;
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (base == MAP_FAILED)
		return -errno;
	close(memfd);
	r->free = malloc(r->chunks * sizeof(uint32_t));
	if (!r->free) {
		munmap(base, bytes);
		return -ENOMEM;
	}
	r->base = base;
	r->cur = 0;
	r->nfree = r->chunks - 1;
	for (uint32_t i = 0; i < r->nfree; i++)
		r->free[i] = r->chunks - 1 - i;
	/* Anything perf printed before us comes first. */
	r->pending = __fpending(f->out);
	return r->pending && ring_publish(f, 0) < 0 ? -EIO : 0;
}
