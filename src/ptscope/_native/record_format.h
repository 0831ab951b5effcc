/* The dlfilter record stream: fixed-size little-endian records, mirrored in
 * src/ptscope/decode/record_format.py and documented in docs/file-formats.md.
 *
 * Every record starts with a tag byte in 0xF8..0xFF. No line of text starts with such a
 * byte (they are never the first byte of a UTF-8 character), so perf's own text lines
 * (decode errors) can share the stream: a reader at a record boundary either sees a tag
 * (a record) or anything else (a text line up to '\n').
 *
 * Change any layout => bump PTSCOPE_STREAM_VERSION (and the Python mirror).
 */
#ifndef PTSCOPE_RECORD_FORMAT_H
#define PTSCOPE_RECORD_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PTSCOPE_STREAM_MAGIC "PTSCOPE" /* 7 bytes after the header's tag byte */
#define PTSCOPE_STREAM_VERSION 6u
#define PTSCOPE_FLAG_INLINE (1u << 30) /* engine.h: BF_INLINE */

enum ptscope_tag {
	PTSCOPE_TAG_CHUNK = 0xF7,    /* ring mode, on perf's stdout only: a chunk is ready */
	PTSCOPE_TAG_HEADER = 0xF8,   /* first record of every stream */
	PTSCOPE_TAG_STRING = 0xF9,   /* an interned symbol or DSO name (bytes follow) */
	PTSCOPE_TAG_LOCATION = 0xFA, /* an address resolved once: symbol, offset, DSO */
	PTSCOPE_TAG_BRANCH = 0xFB,   /* one kept branch sample */
	PTSCOPE_TAG_POWER = 0xFC,    /* one cbr (core-to-bus ratio) sample */
	PTSCOPE_TAG_TRAILER = 0xFD,  /* last record: counters; its absence means truncation */
	PTSCOPE_TAG_LINES = 0xFE,    /* more code lines of the branch record that follows */
};

/* Sentinel ids: string id 0 = no name (unknown symbol / no DSO). Real ids count from 1. */
#define PTSCOPE_NO_STRING 0u
/* Offset of an address from its symbol's start when the symbol is unknown. */
#define PTSCOPE_NO_OFFSET (-1)

#pragma pack(push, 1)

struct ptscope_header_rec { /* 32 bytes */
	uint8_t tag;               /* PTSCOPE_TAG_HEADER */
	char magic[7];             /* "PTSCOPE" */
	uint32_t version;          /* PTSCOPE_STREAM_VERSION */
	uint16_t branch_size;      /* sizeof(struct ptscope_branch_rec), or with
				    * PTSCOPE_OPT_INSNS sizeof(struct ptscope_insns_branch_rec) */
	uint16_t location_size;    /* sizeof(struct ptscope_location_rec) */
	uint16_t string_size;      /* sizeof(struct ptscope_string_rec), without the bytes */
	uint16_t power_size;       /* sizeof(struct ptscope_power_rec) */
	uint16_t trailer_size;     /* sizeof(struct ptscope_trailer_rec) */
	uint16_t options;          /* PTSCOPE_OPT_* the filter ran with */
	uint16_t lines_size;       /* sizeof(struct ptscope_lines_rec) */
	uint16_t reserved;
	uint32_t reserved2;
};

#define PTSCOPE_OPT_KEEP_ALL 1u /* same-function jumps were not dropped */
#define PTSCOPE_OPT_INSNS 2u    /* instruction detail: exact counts and code lines */

struct ptscope_string_rec { /* 12 bytes, then `length` bytes (no NUL) */
	uint8_t tag;     /* PTSCOPE_TAG_STRING */
	uint8_t reserved[3];
	uint32_t id;     /* 1, 2, 3... in stream order */
	uint32_t length;
};

struct ptscope_location_rec { /* 40 bytes */
	uint8_t tag;      /* PTSCOPE_TAG_LOCATION */
	uint8_t reserved[3];
	uint32_t id;      /* 1, 2, 3... in stream order */
	uint64_t ip;      /* the address */
	int64_t offset;   /* from the symbol's start; PTSCOPE_NO_OFFSET if no symbol */
	uint32_t symbol;  /* string id, PTSCOPE_NO_STRING if unknown */
	uint32_t dso;     /* string id, PTSCOPE_NO_STRING if no mapping */
	int32_t pid;      /* the process whose address space it was resolved in */
	int32_t node;     /* the innermost inlined body at ip (--dlarg inline=), 0: none */
};

struct ptscope_branch_rec { /* 72 bytes */
	uint8_t tag;        /* PTSCOPE_TAG_BRANCH */
	uint8_t cpumode;    /* PERF_RECORD_MISC_CPUMODE_MASK bits of the sample */
	uint16_t gap_insns; /* with gap_delta: the instructions after the thread's previous
			     * kept branch up to and including that dropped jump, as counted
			     * (exact with PTSCOPE_OPT_INSNS); 0 if unknown or over 65535 */
	uint32_t flags;     /* PERF_DLFILTER_FLAG_* (raw: bits above 12 may be set), or
			     * PTSCOPE_FLAG_INLINE: no branch but the first instruction of
			     * another inlined body (ip = addr = that instruction) */
	int32_t pid;
	int32_t tid;
	uint64_t time;      /* perf time, ns */
	uint64_t ip;        /* branch source */
	uint64_t addr;      /* branch target */
	uint64_t insn_cnt;  /* instructions since the thread's previous kept branch's count
			     * (with PTSCOPE_OPT_INSNS: the exact number of instructions
			     * executed after the thread's previous kept branch instruction, up
			     * to and including this one; see docs/file-formats.md) */
	uint64_t cyc_cnt;   /* cycles, likewise (both include those of dropped branches) */
	uint32_t ip_loc;    /* location id of ip */
	uint32_t addr_loc;  /* location id of addr */
	int32_t cpu;
	uint32_t gap_delta; /* time minus the time of the first same-function jump dropped
			     * since the thread's previous kept branch, when later than that
			     * branch; 0 if none (or more than 2^32 ns back) */
};

struct ptscope_power_rec { /* 32 bytes */
	uint8_t tag;       /* PTSCOPE_TAG_POWER */
	uint8_t reserved[3];
	int32_t pid;
	int32_t tid;
	int32_t cpu;
	uint64_t time;
	uint32_t cbr;      /* core-to-bus ratio */
	uint32_t freq_mhz; /* the frequency perf computed from it */
};

/* One range of 64-byte code lines (address >> 6): first .. first + count - 1. */
struct ptscope_line_range {
	uint64_t first;
	uint64_t count;
};

/* With PTSCOPE_OPT_INSNS every branch record comes with the code lines its insn_cnt
 * instructions touched, as ascending, disjoint, non-adjacent ranges: the last (highest)
 * range follows the branch record in the same record (count 0: no code ran, or none could
 * be counted); the others, in the rare case of more than one, are in lines records right
 * before it. A lines record has the size of this record, so that a run of branch and
 * lines records is read as one array of equal-sized rows. */
struct ptscope_insns_branch_rec { /* 88 bytes */
	struct ptscope_branch_rec branch;
	struct ptscope_line_range last;
};

#define PTSCOPE_LINES_PER_REC 5

struct ptscope_lines_rec { /* 88 bytes */
	uint8_t tag;       /* PTSCOPE_TAG_LINES */
	uint8_t ranges;    /* 1..PTSCOPE_LINES_PER_REC ranges used */
	uint8_t reserved[6];
	struct ptscope_line_range range[5]; /* PTSCOPE_LINES_PER_REC */
};

struct ptscope_trailer_rec { /* 104 bytes */
	uint8_t tag;       /* PTSCOPE_TAG_TRAILER */
	uint8_t reserved[7];
	uint64_t samples;          /* every sample perf handed to the filter */
	uint64_t branches_kept;    /* branch records written */
	uint64_t branches_dropped; /* same-function jumps dropped */
	uint64_t power;            /* power records written */
	uint64_t other;            /* samples of other events (psb, instructions...), of
				    * threads left out by pid=/tid=, or past until=, ignored */
	uint64_t locations;        /* location records written */
	uint64_t strings;          /* string records written */
	uint64_t lines;            /* lines records written */
	uint64_t blocks_decoded;   /* basic blocks decoded into the block cache */
	uint64_t blocks_unknown;   /* blocks whose instructions could not be counted (no
				    * start known, code unreadable or not decodable to the
				    * branch): their instructions are missing from insn_cnt */
	uint64_t ring_waits;       /* ring mode: times perf had no free chunk left and read
				    * ptscope's pipe for more (blocking until it gave one
				    * back), and how long those reads took in all (ns): what
				    * a bigger ring, or a steadier reader, would give back */
	uint64_t ring_wait_ns;
};

/* Ring mode (the `ring=` argument): the records go into chunks of a memory area shared with
 * ptscope instead of through perf's stdout, and this 16-byte record, written into stdout,
 * says that a chunk is full (or cut short) and may be read. perf's own text (decode
 * errors, task events) printed before it came after the chunk's records: the reader
 * takes the chunk, then that text. A record may continue in the next chunk. */
struct ptscope_chunk_rec { /* 16 bytes */
	uint8_t tag;       /* PTSCOPE_TAG_CHUNK */
	uint8_t reserved[3];
	uint32_t chunk;    /* index of the chunk; PTSCOPE_NO_CHUNK: none (only text before) */
	uint32_t length;   /* bytes of records in it */
	uint32_t reserved2;
};

#define PTSCOPE_NO_CHUNK UINT32_MAX

#pragma pack(pop)

_Static_assert(sizeof(struct ptscope_header_rec) == 32, "header layout");
_Static_assert(sizeof(struct ptscope_string_rec) == 12, "string layout");
_Static_assert(sizeof(struct ptscope_location_rec) == 40, "location layout");
_Static_assert(sizeof(struct ptscope_branch_rec) == 72, "branch layout");
_Static_assert(sizeof(struct ptscope_power_rec) == 32, "power layout");
_Static_assert(sizeof(struct ptscope_insns_branch_rec) == 88, "insns branch layout");
_Static_assert(sizeof(struct ptscope_lines_rec) == sizeof(struct ptscope_insns_branch_rec),
	       "lines layout");
_Static_assert(sizeof(struct ptscope_trailer_rec) == 104, "trailer layout");
_Static_assert(sizeof(struct ptscope_chunk_rec) == 16, "chunk layout");

/* A branch record's fields read where they lie, for readers of the stream: records start
 * at any byte offset, and a load of a constant size is one move (copying whole records,
 * or a size chosen at run time, was most of a reader's time). */
#define PTSCOPE_BRANCH_AT(member) offsetof(struct ptscope_branch_rec, member)
#define PTSCOPE_LINE_FIRST_AT offsetof(struct ptscope_insns_branch_rec, last.first)
#define PTSCOPE_LINE_COUNT_AT offsetof(struct ptscope_insns_branch_rec, last.count)

static inline uint64_t ptscope_u64_at(const void *p, size_t at)
{
	uint64_t v;
	memcpy(&v, (const unsigned char *)p + at, sizeof v);
	return v;
}

static inline uint32_t ptscope_u32_at(const void *p, size_t at)
{
	uint32_t v;
	memcpy(&v, (const unsigned char *)p + at, sizeof v);
	return v;
}

static inline uint16_t ptscope_u16_at(const void *p, size_t at)
{
	uint16_t v;
	memcpy(&v, (const unsigned char *)p + at, sizeof v);
	return v;
}

#endif /* PTSCOPE_RECORD_FORMAT_H */
