/* Pages of anonymous code, put where perf can read them (see code_pages.h). */
#define _GNU_SOURCE
#include "code_pages.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf_file.h"

#define PAGE 4096u

struct code_page {
	uint64_t base;
	uint64_t file_offset;
	struct code_page *next;
	uint8_t data[PAGE];
	uint8_t known[PAGE]; /* 1 where data holds code that ran */
};

static size_t bucket(const struct code_pages *cp, uint64_t base)
{
	return (size_t)((base / PAGE) * 0x9e3779b97f4a7c15ULL >> 40) % cp->nbuckets;
}

static struct code_page *find(struct code_pages *cp, uint64_t base)
{
	if (!cp->nbuckets)
		return NULL;
	for (struct code_page *p = cp->buckets[bucket(cp, base)]; p; p = p->next)
		if (p->base == base)
			return p;
	return NULL;
}

static void insert(struct code_pages *cp, struct code_page *page)
{
	if (cp->count >= cp->nbuckets) {
		size_t n = cp->nbuckets ? cp->nbuckets * 2 : 64;
		struct code_page **b = calloc(n, sizeof *b);
		if (!b)
			return;
		struct code_pages grown = {b, n, cp->count};
		for (size_t k = 0; k < cp->nbuckets; k++)
			for (struct code_page *p = cp->buckets[k], *next; p; p = next) {
				next = p->next;
				size_t i = bucket(&grown, p->base);
				p->next = b[i];
				b[i] = p;
			}
		free(cp->buckets);
		*cp = grown;
	}
	size_t i = bucket(cp, page->base);
	page->next = cp->buckets[i];
	cp->buckets[i] = page;
	cp->count++;
}

static void put(struct code_pages *cp, int fd, uint64_t base, size_t at, const uint8_t *piece,
		size_t n, code_page_mapped mapped, void *ctx)
{
	struct code_page *page = find(cp, base);
	if (page && memcmp(page->data + at, piece, n) == 0) {
		int all = 1;
		for (size_t k = 0; k < n && all; k++)
			all = page->known[at + k];
		if (all)
			return;
	}
	int conflict = 0;
	if (page)
		for (size_t k = 0; k < n && !conflict; k++)
			conflict = page->known[at + k] && page->data[at + k] != piece[k];
	if (!page || conflict) {
		/* A new version of the page: it keeps what is known of the old one, for code
		   around the change that may still run. */
		uint64_t offset = pf_alloc_jit(PAGE);
		if (!offset)
			return;
		struct code_page *fresh = calloc(1, sizeof *fresh);
		if (!fresh)
			return;
		fresh->base = base;
		fresh->file_offset = offset;
		if (page) {
			memcpy(fresh->data, page->data, PAGE);
			memcpy(fresh->known, page->known, PAGE);
			if (pwrite(fd, fresh->data, PAGE, (off_t)offset) != PAGE)
				return;
			page->base = UINT64_MAX; /* retired: lookups find the new version */
		}
		insert(cp, fresh);
		page = fresh;
		mapped(base, offset, ctx);
	}
	memcpy(page->data + at, piece, n);
	memset(page->known + at, 1, n);
	if (pwrite(fd, piece, n, (off_t)(page->file_offset + at)) != (ssize_t)n)
		return;
}

void code_pages_add(struct code_pages *cp, const char *path, uint64_t addr, const uint8_t *code,
		    size_t n, code_page_mapped mapped, void *ctx)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0 && pf_alloc_jit(0) == 0) /* creates the file */
		return;
	if (fd < 0)
		fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return;
	while (n) {
		uint64_t base = addr & ~(uint64_t)(PAGE - 1);
		size_t at = (size_t)(addr - base);
		size_t piece = PAGE - at < n ? PAGE - at : n;
		put(cp, fd, base, at, code, piece, mapped, ctx);
		addr += piece;
		code += piece;
		n -= piece;
	}
	close(fd);
}
