/* The perf.data file and the shared state of an emulated recording (see perf_file.h).

   perf.data layout (file mode, docs/emulated-pt.md, "The perf.data we write"): the 104-byte
   header, the id array {7, 8}, two attrs (intel_pt//u: PMU type 8, id 7; dummy:u: the
   sideband, id 8), then the data section, which starts with AUXTRACE_INFO, and right
   after the data the feature sections. No file descriptor stays open between calls: the
   emulated program may close any descriptor it did not open (closefrom()), and one of ours
   reused for its own file would be a disaster. */
#define _GNU_SOURCE
#include "perf_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#define HEADER_SIZE 104
#define ATTR_SIZE 128
#define FILE_ATTR_SIZE (ATTR_SIZE + 16)
#define IDS_OFFSET HEADER_SIZE
#define ATTRS_OFFSET (IDS_OFFSET + 16)
#define DATA_OFFSET (ATTRS_OFFSET + 2 * FILE_ATTR_SIZE)
#define SAMPLE_ID_SIZE 24
#define NAME_ALIGN 64

#define PMU_TYPE_INTEL_PT 8
#define ID_PT 7
#define ID_SIDEBAND 8
#define SAMPLE_TYPE (0x1 | 0x2 | 0x4 | 0x10000) /* IP | TID | TIME | IDENTIFIER */
#define PT_CONFIG (0x1 | 0x2 | 0x400 | 0x2000)   /* pt | cyc | tsc | branch */

/* attr flag bits */
#define F_DISABLED (1ULL << 0)
#define F_INHERIT (1ULL << 1)
#define F_EXCLUDE_KERNEL (1ULL << 5)
#define F_EXCLUDE_HV (1ULL << 6)
#define F_MMAP (1ULL << 8)
#define F_COMM (1ULL << 9)
#define F_ENABLE_ON_EXEC (1ULL << 12)
#define F_TASK (1ULL << 13)
#define F_SAMPLE_ID_ALL (1ULL << 18)
#define F_EXCLUDE_GUEST (1ULL << 20)
#define F_MMAP2 (1ULL << 23)
#define F_COMM_EXEC (1ULL << 24)
#define PT_FLAGS                                                                               \
	(F_DISABLED | F_INHERIT | F_EXCLUDE_KERNEL | F_EXCLUDE_HV | F_ENABLE_ON_EXEC |          \
	 F_SAMPLE_ID_ALL | F_EXCLUDE_GUEST)
#define DUMMY_FLAGS (PT_FLAGS | F_MMAP | F_COMM | F_TASK | F_MMAP2 | F_COMM_EXEC)

/* record types and misc bits */
enum {
	R_COMM = 3,
	R_EXIT = 4,
	R_FORK = 7,
	R_MMAP2 = 10,
	R_AUX = 11,
	R_ITRACE_START = 12,
	R_AUXTRACE_INFO = 70,
	R_AUXTRACE = 71,
};
#define MISC_USER 2
#define MISC_COMM_EXEC (1 << 13)
#define MISC_BUILD_ID_SIZE (1 << 15)

/* feature bits, in file order */
enum {
	FEAT_BUILD_ID = 2,
	FEAT_OSRELEASE = 4,
	FEAT_VERSION = 5,
	FEAT_ARCH = 6,
	FEAT_NRCPUS = 7,
	FEAT_CPUID = 9,
	FEAT_CMDLINE = 11,
	FEAT_EVENT_DESC = 12,
	FEAT_AUXTRACE = 18,
};

#define SLOT_CAPACITY (1u << 16)
#define INDEX_CAPACITY (1u << 20)
#define IDS_CAPACITY 4096u
#define STATE_PAGE 4096
#define JIT_PAGE 4096

static struct emu_state *state;
static char perf_path[PATH_MAX];
static char jit_path[PATH_MAX];
static uint8_t *static_features; /* the features that never change, one blob per bit */
static size_t static_sizes[FEAT_AUXTRACE + 1];
static size_t static_offsets[FEAT_AUXTRACE + 1];

/* -- little byte buffer ------------------------------------------------------------------ */

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static int buf_room(struct buf *b, size_t more)
{
	if (b->n + more <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->n + more)
		cap *= 2;
	uint8_t *p = realloc(b->p, cap);
	if (!p)
		return -1;
	b->p = p;
	b->cap = cap;
	return 0;
}

static void put(struct buf *b, const void *p, size_t n)
{
	if (buf_room(b, n) == 0) {
		memcpy(b->p + b->n, p, n);
		b->n += n;
	}
}

static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }

static void put_zeros(struct buf *b, size_t n)
{
	if (buf_room(b, n) == 0) {
		memset(b->p + b->n, 0, n);
		b->n += n;
	}
}

/* A perf header string: u32 length, then the text, NUL, zeros up to a multiple of 64. */
static void put_feature_string(struct buf *b, const char *s)
{
	size_t raw = strlen(s) + 1;
	size_t padded = (raw + NAME_ALIGN - 1) / NAME_ALIGN * NAME_ALIGN;
	put_u32(b, (uint32_t)padded);
	put(b, s, raw - 1);
	put_zeros(b, padded - raw + 1);
}

/* -- records ------------------------------------------------------------------------------ */

static size_t record_header(uint8_t *out, uint32_t type, uint16_t misc, size_t size)
{
	uint32_t t = type;
	uint16_t s = (uint16_t)size;
	memcpy(out, &t, 4);
	memcpy(out + 4, &misc, 2);
	memcpy(out + 6, &s, 2);
	return 8;
}

static size_t sample_id(uint8_t *out, uint32_t pid, uint32_t tid, uint64_t time, uint64_t id)
{
	memcpy(out, &pid, 4);
	memcpy(out + 4, &tid, 4);
	memcpy(out + 8, &time, 8);
	memcpy(out + 16, &id, 8);
	return SAMPLE_ID_SIZE;
}

/* A NUL-terminated string padded with zeros to a multiple of 8. */
static size_t cstring8(uint8_t *out, const char *s, size_t max)
{
	size_t n = strnlen(s, max);
	size_t padded = (n + 1 + 7) / 8 * 8;
	memcpy(out, s, n);
	memset(out + n, 0, padded - n);
	return padded;
}

size_t pf_comm(uint8_t *out, uint32_t pid, uint32_t tid, const char *name, uint64_t time, int exec)
{
	size_t n = 8;
	memcpy(out + n, &pid, 4);
	memcpy(out + n + 4, &tid, 4);
	n += 8;
	n += cstring8(out + n, name, 15);
	n += sample_id(out + n, pid, tid, time, ID_SIDEBAND);
	record_header(out, R_COMM, (uint16_t)(MISC_USER | (exec ? MISC_COMM_EXEC : 0)), n);
	return n;
}

size_t pf_fork_exit(uint8_t *out, int exit, uint32_t pid, uint32_t ppid, uint32_t tid,
		    uint32_t ptid, uint64_t time)
{
	size_t n = 8;
	uint32_t ids[4] = {pid, ppid, tid, ptid};
	memcpy(out + n, ids, 16);
	memcpy(out + n + 16, &time, 8);
	n += 24;
	n += sample_id(out + n, pid, tid, time, ID_SIDEBAND);
	record_header(out, exit ? R_EXIT : R_FORK, 0, n);
	return n;
}

size_t pf_mmap2(uint8_t *out, uint32_t pid, uint32_t tid, uint64_t start, uint64_t len,
		uint64_t pgoff, const char *path, uint64_t time)
{
	struct stat st;
	uint32_t maj = 0, mnr = 0;
	uint64_t ino = 0, zero = 0;
	uint32_t prot = 5, flags = 2; /* PROT_READ|PROT_EXEC, MAP_PRIVATE */
	if (stat(path, &st) == 0) {
		maj = major(st.st_dev);
		mnr = minor(st.st_dev);
		ino = st.st_ino;
	}
	size_t n = 8;
	memcpy(out + n, &pid, 4);
	memcpy(out + n + 4, &tid, 4);
	memcpy(out + n + 8, &start, 8);
	memcpy(out + n + 16, &len, 8);
	memcpy(out + n + 24, &pgoff, 8);
	memcpy(out + n + 32, &maj, 4);
	memcpy(out + n + 36, &mnr, 4);
	memcpy(out + n + 40, &ino, 8);
	memcpy(out + n + 48, &zero, 8);
	memcpy(out + n + 56, &prot, 4);
	memcpy(out + n + 60, &flags, 4);
	n += 64;
	n += cstring8(out + n, path, PATH_MAX - 1);
	n += sample_id(out + n, pid, tid, time, ID_SIDEBAND);
	record_header(out, R_MMAP2, MISC_USER, n);
	return n;
}

size_t pf_itrace_start(uint8_t *out, uint32_t pid, uint32_t tid, uint64_t time)
{
	size_t n = 8;
	memcpy(out + n, &pid, 4);
	memcpy(out + n + 4, &tid, 4);
	n += 8;
	n += sample_id(out + n, pid, tid, time, ID_PT);
	record_header(out, R_ITRACE_START, 0, n);
	return n;
}

/* -- the attrs and the features that never change ------------------------------------------ */

static void attr(uint8_t out[ATTR_SIZE], uint32_t type, uint64_t config, uint64_t flags)
{
	uint32_t size = ATTR_SIZE;
	uint64_t period = 1, sample_type = SAMPLE_TYPE;
	memset(out, 0, ATTR_SIZE);
	memcpy(out, &type, 4);
	memcpy(out + 4, &size, 4);
	memcpy(out + 8, &config, 8);
	memcpy(out + 16, &period, 8);
	memcpy(out + 24, &sample_type, 8);
	memcpy(out + 40, &flags, 8);
}

static int build_static_features(const struct perf_file_info *info)
{
	struct buf b = {0};
	struct utsname u;
	uint8_t a[ATTR_SIZE];
	const int bits[] = {FEAT_OSRELEASE, FEAT_VERSION, FEAT_ARCH,      FEAT_NRCPUS,
			    FEAT_CPUID,     FEAT_CMDLINE, FEAT_EVENT_DESC};
	for (size_t k = 0; k < sizeof bits / sizeof bits[0]; k++) {
		int bit = bits[k];
		size_t start = b.n;
		static_offsets[bit] = start;
		switch (bit) {
		case FEAT_OSRELEASE:
			put_feature_string(&b, info->os_release ? info->os_release
					       : (uname(&u) == 0 ? u.release : "unknown"));
			break;
		case FEAT_VERSION:
			put_feature_string(&b, "6.1.0-ptscope-emulated");
			break;
		case FEAT_ARCH:
			put_feature_string(&b, "x86_64");
			break;
		case FEAT_NRCPUS:
			put_u32(&b, 1);
			put_u32(&b, 1);
			break;
		case FEAT_CPUID:
			put_feature_string(&b, "GenuineIntel,6,142,10");
			break;
		case FEAT_CMDLINE: {
			uint32_t count = 1;
			for (char *const *arg = info->cmdline; arg && *arg; arg++)
				count++;
			put_u32(&b, count);
			put_feature_string(&b, "ptscope");
			for (char *const *arg = info->cmdline; arg && *arg; arg++)
				put_feature_string(&b, *arg);
			break;
		}
		case FEAT_EVENT_DESC:
			put_u32(&b, 2);
			put_u32(&b, ATTR_SIZE);
			attr(a, PMU_TYPE_INTEL_PT, PT_CONFIG, PT_FLAGS);
			put(&b, a, ATTR_SIZE);
			put_u32(&b, 1);
			put_feature_string(&b, "intel_pt//u");
			put_u64(&b, ID_PT);
			attr(a, 1, 9, DUMMY_FLAGS); /* PERF_TYPE_SOFTWARE, PERF_COUNT_SW_DUMMY */
			put(&b, a, ATTR_SIZE);
			put_u32(&b, 1);
			put_feature_string(&b, "dummy:u");
			put_u64(&b, ID_SIDEBAND);
			break;
		}
		static_sizes[bit] = b.n - start;
	}
	if (!b.p)
		return -1;
	static_features = b.p;
	return 0;
}

/* -- checkpoint ---------------------------------------------------------------------------- */

static void put_build_ids(struct buf *b)
{
	for (uint32_t k = 0; k < state->ids_count; k++) {
		const struct emu_build_id *e =
		    (const void *)((const char *)state + state->ids_offset +
				   (uint64_t)k * sizeof(struct emu_build_id));
		size_t name = (e->path_len + 1 + NAME_ALIGN - 1) / NAME_ALIGN * NAME_ALIGN;
		uint8_t head[36] = {0};
		int32_t pid = -1;
		record_header(head, 0, MISC_USER | MISC_BUILD_ID_SIZE, 36 + name);
		memcpy(head + 8, &pid, 4);
		memcpy(head + 12, e->id, e->len);
		head[32] = e->len;
		put(b, head, 36);
		put(b, e->path, e->path_len);
		put_zeros(b, name - e->path_len);
	}
}

static void put_index(struct buf *b)
{
	const struct emu_index_entry *index =
	    (const void *)((const char *)state + state->index_offset);
	put_u64(b, state->index_count);
	put(b, index, (size_t)state->index_count * sizeof *index);
}

/* The feature sections for the current data: the table of {offset, size}, then the blobs. */
static int features(struct buf *out, uint64_t at, uint64_t bitmap[4])
{
	static const int bits[] = {FEAT_BUILD_ID, FEAT_OSRELEASE, FEAT_VERSION,
				   FEAT_ARCH,     FEAT_NRCPUS,    FEAT_CPUID,
				   FEAT_CMDLINE,  FEAT_EVENT_DESC, FEAT_AUXTRACE};
	const size_t count = sizeof bits / sizeof bits[0];
	struct buf blobs = {0};
	uint64_t table[2 * 9];
	memset(bitmap, 0, 4 * sizeof *bitmap);
	for (size_t k = 0; k < count; k++) {
		int bit = bits[k];
		size_t start = blobs.n;
		if (bit == FEAT_BUILD_ID)
			put_build_ids(&blobs);
		else if (bit == FEAT_AUXTRACE)
			put_index(&blobs);
		else
			put(&blobs, static_features + static_offsets[bit], static_sizes[bit]);
		table[2 * k] = at + 16 * count + start;
		table[2 * k + 1] = blobs.n - start;
		bitmap[bit / 64] |= 1ULL << (bit % 64);
	}
	put(out, table, sizeof table);
	put(out, blobs.p, blobs.n);
	free(blobs.p);
	return out->p ? 0 : -1;
}

static void file_header(uint8_t out[HEADER_SIZE], uint64_t data_size, const uint64_t bitmap[4])
{
	uint64_t h[12] = {HEADER_SIZE, FILE_ATTR_SIZE, ATTRS_OFFSET, 2 * FILE_ATTR_SIZE,
			  DATA_OFFSET, data_size,      0,            0,
			  bitmap[0],   bitmap[1],      bitmap[2],    bitmap[3]};
	memcpy(out, "PERFILE2", 8);
	memcpy(out + 8, h, 12 * 8);
}

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
	const uint8_t *q = p;
	while (n) {
		ssize_t w = pwrite(fd, q, n, (off_t)off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		q += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/* Write `len` bytes of records at the end of the data (NULL: none), then the features and
   the header. Called with the lock held. */
static int append_locked(int fd, const void *records, size_t len)
{
	struct buf feat = {0};
	uint64_t bitmap[4];
	uint64_t end = state->data_end + len;
	if (features(&feat, end, bitmap) != 0) {
		errno = ENOMEM;
		return -1;
	}
	/* Allocate everything before writing anything: a full disk fails here, with the file
	   still consistent as of the last checkpoint. */
	int err = posix_fallocate(fd, (off_t)state->data_end, (off_t)(len + feat.n));
	if (err && err != EOPNOTSUPP && err != EINVAL) {
		free(feat.p);
		errno = err;
		return -1;
	}
	if ((len && write_all(fd, records, len, state->data_end) != 0) ||
	    write_all(fd, feat.p, feat.n, end) != 0) {
		free(feat.p);
		return -1;
	}
	if (end + feat.n > state->written_end)
		state->written_end = end + feat.n;
	free(feat.p);
	uint8_t header[HEADER_SIZE];
	file_header(header, end - DATA_OFFSET, bitmap);
	if (write_all(fd, header, HEADER_SIZE, 0) != 0)
		return -1;
	state->data_end = end;
	return 0;
}

void pf_lock(void)
{
	int r = pthread_mutex_lock(&state->lock);
	if (r == EOWNERDEAD) /* a process died holding it: the state is still consistent */
		pthread_mutex_consistent(&state->lock);
}

void pf_unlock(void)
{
	pthread_mutex_unlock(&state->lock);
}

int pf_append(const void *records, size_t len)
{
	int fd = open(perf_path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -1;
	pf_lock();
	int r = append_locked(fd, records, len);
	int saved = errno;
	pf_unlock();
	close(fd);
	errno = saved;
	return r;
}

uint64_t pf_reserve_chunk(uint32_t pid, uint32_t tid, uint64_t time_ns, uint32_t queue,
			  uint64_t offset, uint64_t size, uint64_t reference)
{
	uint8_t rec[128];
	size_t n = 8;
	uint64_t zero = 0;
	/* AUX: where this buffer sits in the queue's stream */
	memcpy(rec + n, &offset, 8);
	memcpy(rec + n + 8, &size, 8);
	memcpy(rec + n + 16, &zero, 8);
	n += 24;
	n += sample_id(rec + n, pid, tid, time_ns, ID_PT);
	record_header(rec, R_AUX, 0, n);
	size_t aux = n;
	/* AUXTRACE: its payload follows the 48-byte record and is not counted in its size */
	uint8_t *a = rec + aux;
	int32_t cpu = -1;
	uint32_t reserved = 0;
	record_header(a, R_AUXTRACE, 0, 48);
	memcpy(a + 8, &size, 8);
	memcpy(a + 16, &offset, 8);
	memcpy(a + 24, &reference, 8);
	memcpy(a + 32, &queue, 4);
	memcpy(a + 36, &tid, 4);
	memcpy(a + 40, &cpu, 4);
	memcpy(a + 44, &reserved, 4);
	n = aux + 48;

	int fd = open(perf_path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return 0;
	pf_lock();
	uint64_t payload = 0;
	if (state->index_count >= state->index_capacity) {
		errno = EFBIG;
		goto out;
	}
	uint64_t at = state->data_end;
	/* The payload is written first (zeros: allocated, not written), then the records and
	   the features that make it part of the file. */
	int err = posix_fallocate(fd, (off_t)(at + n), (off_t)size);
	if (err && err != EOPNOTSUPP && err != EINVAL) {
		errno = err;
		goto out;
	}
	/* The payload must read as zeros (PAD packets): clear what earlier feature sections
	   left there. */
	static const uint8_t zeros[4096];
	for (uint64_t z = at + n; z < state->written_end && z < at + n + size;) {
		uint64_t piece = state->written_end - z;
		if (piece > sizeof zeros)
			piece = sizeof zeros;
		if (write_all(fd, zeros, (size_t)piece, z) != 0)
			goto out;
		z += piece;
	}
	if (write_all(fd, rec, n, at) != 0)
		goto out;
	struct emu_index_entry *index = (void *)((char *)state + state->index_offset);
	index[state->index_count].offset = at + aux;
	index[state->index_count].size = 48;
	state->index_count++;
	uint64_t saved_end = state->data_end;
	state->data_end = at + n + size;
	if (append_locked(fd, NULL, 0) != 0) {
		state->index_count--;
		state->data_end = saved_end;
		goto out;
	}
	payload = at + n;
out:;
	int saved = errno;
	pf_unlock();
	close(fd);
	errno = saved;
	return payload;
}

void pf_add_build_id(const char *path, const uint8_t *id, size_t len)
{
	size_t path_len = strlen(path);
	if (!len || len > 20 || path_len >= EMU_PATH_MAX)
		return;
	pf_lock();
	struct emu_build_id *ids = (void *)((char *)state + state->ids_offset);
	uint32_t k;
	for (k = 0; k < state->ids_count; k++)
		if (ids[k].path_len == path_len && memcmp(ids[k].path, path, path_len) == 0)
			break;
	if (k == state->ids_count && k < state->ids_capacity) {
		memset(&ids[k], 0, sizeof ids[k]);
		memcpy(ids[k].id, id, len);
		ids[k].len = (uint8_t)len;
		ids[k].path_len = (uint32_t)path_len;
		memcpy(ids[k].path, path, path_len);
		state->ids_count++;
	}
	pf_unlock();
}

uint64_t pf_alloc_jit(uint64_t size)
{
	uint64_t at = 0;
	pf_lock();
	int fd = open(jit_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		goto out;
	if (state->jit_size == 0) {
		/* The header page (docs/file-formats.md, "JIT code"): magic, version, page size. */
		uint8_t header[JIT_PAGE] = "PTSCOPE-JITCODE";
		uint32_t version = 1, page = JIT_PAGE;
		memcpy(header + 16, &version, 4);
		memcpy(header + 20, &page, 4);
		if (write_all(fd, header, JIT_PAGE, 0) != 0)
			goto close;
		state->jit_size = JIT_PAGE;
	}
	if (size && posix_fallocate(fd, (off_t)state->jit_size, (off_t)size) != 0)
		goto close;
	at = state->jit_size;
	state->jit_size += size;
close:
	close(fd);
out:
	pf_unlock();
	return at;
}

const char *pf_path(void) { return perf_path; }
struct emu_state *pf_state(void) { return state; }

struct emu_slot *pf_slot(uint32_t index)
{
	return (struct emu_slot *)((char *)state + state->slots_offset) + index;
}

/* -- creation ------------------------------------------------------------------------------ */

static int fail(char *error, size_t size, const char *what, const char *path)
{
	snprintf(error, size, "%s %s: %s", what, path, strerror(errno));
	return -1;
}

int pf_create(const char *dir, const struct perf_file_info *info, uint64_t limit, char *error,
	      size_t error_size)
{
	char state_path[PATH_MAX];
	if (snprintf(perf_path, sizeof perf_path, "%s/perf.data", dir) >= (int)sizeof perf_path ||
	    snprintf(state_path, sizeof state_path, "%s/" EMU_STATE_NAME, dir) >=
		(int)sizeof state_path ||
	    snprintf(jit_path, sizeof jit_path, "%s/jitted-code.bin", dir) >= (int)sizeof jit_path) {
		snprintf(error, error_size, "recording directory path too long: %s", dir);
		return -1;
	}
	/* The state: a sparse file, mapped shared (forked processes inherit the mapping). */
	uint64_t slots = STATE_PAGE;
	uint64_t index = slots + (uint64_t)SLOT_CAPACITY * sizeof(struct emu_slot);
	uint64_t ids = index + (uint64_t)INDEX_CAPACITY * sizeof(struct emu_index_entry);
	uint64_t total = ids + (uint64_t)IDS_CAPACITY * sizeof(struct emu_build_id);
	int fd = open(state_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return fail(error, error_size, "cannot create", state_path);
	if (ftruncate(fd, (off_t)total) != 0) {
		close(fd);
		return fail(error, error_size, "cannot size", state_path);
	}
	void *map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return fail(error, error_size, "cannot map", state_path);
	state = map;
	state->version = EMU_STATE_VERSION;
	state->header_size = sizeof *state;
	state->slots_offset = slots;
	state->slot_size = sizeof(struct emu_slot);
	state->slot_capacity = SLOT_CAPACITY;
	state->limit = limit;
	state->budget_left = limit ? (int64_t)limit : INT64_MAX;
	state->data_offset = DATA_OFFSET;
	state->index_offset = index;
	state->index_capacity = INDEX_CAPACITY;
	state->ids_offset = ids;
	state->ids_capacity = IDS_CAPACITY;
	pthread_mutexattr_t attr_;
	pthread_mutexattr_init(&attr_);
	pthread_mutexattr_setpshared(&attr_, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&attr_, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&state->lock, &attr_);
	pthread_mutexattr_destroy(&attr_);

	if (build_static_features(info) != 0) {
		snprintf(error, error_size, "out of memory");
		return -1;
	}
	/* perf.data: header, ids, attrs, AUXTRACE_INFO, features. */
	fd = open(perf_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return fail(error, error_size, "cannot create", perf_path);
	uint8_t head[DATA_OFFSET] = {0};
	uint64_t ids_[2] = {ID_PT, ID_SIDEBAND};
	memcpy(head + IDS_OFFSET, ids_, 16);
	uint8_t *attrs = head + ATTRS_OFFSET;
	attr(attrs, PMU_TYPE_INTEL_PT, PT_CONFIG, PT_FLAGS);
	uint64_t ref[2] = {IDS_OFFSET, 8};
	memcpy(attrs + ATTR_SIZE, ref, 16);
	attr(attrs + FILE_ATTR_SIZE, 1, 9, DUMMY_FLAGS);
	ref[0] = IDS_OFFSET + 8;
	memcpy(attrs + FILE_ATTR_SIZE + ATTR_SIZE, ref, 16);
	state->data_end = DATA_OFFSET;
	uint8_t auxinfo[8 + 8 + 17 * 8];
	uint64_t priv[17] = {
	    PMU_TYPE_INTEL_PT, info->time_shift, info->time_mult,
	    0,     /* time_zero */
	    1,     /* cap_user_time_zero: timed decoding */
	    0x400, /* TSC bit */
	    0x800, /* noretcomp bit */
	    0,     /* have_sched_switch */
	    0,     /* snapshot mode */
	    0,     /* per-cpu mmaps: no, a queue per thread */
	    0x200, /* MTC bit */
	    0x3c000, /* MTC frequency bits */
	    0, 0,  /* TSC:CTC ratio */
	    0x2,   /* CYC bit */
	    info->ratio,
	    0, /* filter string length */
	};
	uint32_t type = 1, zero = 0; /* PERF_AUXTRACE_INTEL_PT */
	record_header(auxinfo, R_AUXTRACE_INFO, 0, sizeof auxinfo);
	memcpy(auxinfo + 8, &type, 4);
	memcpy(auxinfo + 12, &zero, 4);
	memcpy(auxinfo + 16, priv, sizeof priv);
	if (write_all(fd, head, sizeof head, 0) != 0) {
		close(fd);
		return fail(error, error_size, "cannot write", perf_path);
	}
	pf_lock();
	int r = append_locked(fd, auxinfo, sizeof auxinfo);
	pf_unlock();
	close(fd);
	if (r != 0)
		return fail(error, error_size, "cannot write", perf_path);
	/* The magic last: a state file with it is complete. */
	memcpy(state->magic, EMU_STATE_MAGIC, 8);
	return 0;
}
