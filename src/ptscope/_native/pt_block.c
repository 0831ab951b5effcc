/* The own decoder's block cache: see pt_block.h. */
#include "pt_block.h"

#include <stdlib.h>
#include <string.h>

#include "pt_image.h"
#include "pt_insn.h"

void pt_blocks_free(struct pt_blocks *b)
{
	for (size_t i = 0; i < b->nchunks; i++)
		free(b->chunks[i]);
	free(b->chunks);
	free(b->table);
	memset(b, 0, sizeof(*b));
}

static inline size_t block_hash(uint64_t addr)
{
	addr ^= addr >> 29;
	addr *= UINT64_C(0xbf58476d1ce4e5b9);
	addr ^= addr >> 32;
	return (size_t)addr;
}

static int table_grow(struct pt_blocks *b)
{
	size_t ncap = b->cap ? b->cap * 2 : 1024;
	struct pt_block **nt = calloc(ncap, sizeof(*nt));
	if (!nt)
		return -1;
	for (size_t i = 0; i < b->cap; i++) {
		struct pt_block *blk = b->table[i];
		if (!blk)
			continue;
		size_t j = block_hash(blk->start) & (ncap - 1);
		while (nt[j])
			j = (j + 1) & (ncap - 1);
		nt[j] = blk;
	}
	free(b->table);
	b->table = nt;
	b->cap = ncap;
	return 0;
}

static struct pt_block *block_new(struct pt_blocks *b)
{
	if (!b->nchunks || b->used == PT_BLOCKS_PER_CHUNK) {
		struct pt_block **nc = realloc(b->chunks, (b->nchunks + 1) * sizeof(*nc));
		if (!nc)
			return NULL;
		b->chunks = nc;
		struct pt_block *chunk = malloc(PT_BLOCKS_PER_CHUNK * sizeof(*chunk));
		if (!chunk)
			return NULL;
		b->chunks[b->nchunks++] = chunk;
		b->used = 0;
	}
	return &b->chunks[b->nchunks - 1][b->used++];
}

void pt_walk_code(struct pt_image *im, size_t space, uint64_t from, uint64_t to_ip,
		  struct pt_walk *w)
{
	struct pt_space *s = im->spaces[space];
	uint64_t ip = from;
	uint32_t n = 0;
	memset(w, 0, sizeof(*w));
	if (to_ip && ip == to_ip) {
		w->status = PT_WALK_REACHED;
		w->ip = ip;
		return;
	}
	for (;;) {
		const struct pt_map *m = pt_space_find(s, ip);
		if (!m) {
			w->status = PT_BLOCK_NO_MAP;
			break;
		}
		const struct pt_file *f = &im->files[m->file];
		uint64_t end = m->end;
		for (;;) {
			uint64_t off = pt_map_ip(im, m, ip);
			if (!f->data) { /* perf could not open the file */
				w->status = PT_BLOCK_NO_DATA;
				w->file = m->file;
				goto out;
			}
			if (off >= f->size) { /* a read past its end: fails every time */
				w->status = PT_BLOCK_BAD_INSN;
				goto out;
			}
			struct pt_insn insn;
			if (!pt_insn_decode(f->data + off, f->size - off, &insn)) {
				w->status = PT_BLOCK_BAD_INSN;
				goto out;
			}
			n++;
			if (pt_insn_is_branch(insn.kind)) {
				w->status = PT_BLOCK_OK;
				w->kind = insn.kind;
				w->op = insn.op;
				w->len = insn.length;
				w->rel = insn.rel;
				w->zero_call = insn.kind == PT_INSN_CALL && insn.rel == 0;
				goto out;
			}
			ip += insn.length;
			if (to_ip && ip == to_ip) {
				w->status = PT_WALK_REACHED;
				goto out;
			}
			if (ip >= end)
				break; /* on in the next map */
		}
	}
out:
	w->ip = ip;
	w->ninsn = w->status == PT_BLOCK_OK || w->status == PT_WALK_REACHED ? n : 0;
}

static struct pt_block *decode_block(struct pt_image *im, size_t space, struct pt_block *blk,
				     uint64_t addr)
{
	struct pt_walk w;
	pt_walk_code(im, space, addr, 0, &w);
	memset(blk, 0, sizeof(*blk));
	blk->start = addr;
	blk->branch_ip = w.ip;
	blk->ninsn = w.ninsn;
	blk->status = w.status;
	blk->file = w.file;
	blk->kind = w.kind;
	blk->op = w.op;
	blk->len = w.len;
	blk->rel = w.rel;
	blk->zero_call = w.zero_call;
	blk->target = w.ip + w.len + (uint64_t)(int64_t)w.rel;
	blk->epoch = im->spaces[space]->epoch;
	return blk;
}

struct pt_block *pt_block_at(struct pt_image *im, size_t space, uint64_t addr)
{
	struct pt_blocks *b = &im->spaces[space]->blocks;
	uint32_t epoch = im->spaces[space]->epoch;
	if ((b->count + 1) * 2 > b->cap && table_grow(b) < 0)
		return NULL;
	size_t j = block_hash(addr) & (b->cap - 1);
	for (;;) {
		struct pt_block *blk = b->table[j];
		if (!blk)
			break;
		if (blk->start == addr) {
			if (blk->epoch == epoch)
				return blk;
			/* decoded under other maps: a new one takes its slot (old successor
			 * pointers to it see its epoch and look again) */
			struct pt_block *fresh = block_new(b);
			if (!fresh)
				return NULL;
			b->table[j] = decode_block(im, space, fresh, addr);
			return fresh;
		}
		j = (j + 1) & (b->cap - 1);
	}
	struct pt_block *blk = block_new(b);
	if (!blk)
		return NULL;
	b->table[j] = decode_block(im, space, blk, addr);
	b->count++;
	return blk;
}
