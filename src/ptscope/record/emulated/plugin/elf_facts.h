/* What the recorder needs to know about an ELF file to describe it to perf: its type, entry,
   interpreter, executable segments (each becomes an MMAP2 record at the file offset perf
   reads code from) and GNU build-id (perf buildid-list, archives). */
#ifndef PTSCOPE_ELF_FACTS_H
#define PTSCOPE_ELF_FACTS_H

#include <limits.h>
#include <stdint.h>

#define ELF_MAX_EXEC_SEGMENTS 16

struct elf_segment {
	uint64_t vaddr, size, offset; /* page-aligned */
};

struct elf_facts {
	int dyn;                      /* ET_DYN: loaded at a base chosen at run time */
	uint64_t entry;
	char interp[PATH_MAX];        /* "" when none */
	struct elf_segment exec[ELF_MAX_EXEC_SEGMENTS];
	int nexec;
	uint64_t lowest_exec_vaddr;   /* of the first executable PT_LOAD, not page-aligned */
	uint8_t build_id[20];
	int build_id_len;
};

/* Read an x86-64 ELF file's facts: 0, or -1 if it is not one (or cannot be read). */
int elf_read(const char *path, struct elf_facts *out);

#endif
