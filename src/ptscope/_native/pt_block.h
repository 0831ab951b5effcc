/* The own decoder's block cache (pt_block.c): code decoded once, walked many times.
 *
 * A block is what the walker goes through without a packet: the instructions from an
 * address up to and including the first branch (perf's walk, whose unit this is). It is
 * decoded the first time the walk starts there, and remembers where control went next:
 * its successors (the direct target, the fall-through or return point) and the last
 * target a TIP gave it, as pointers to other blocks, so that a TNT bit costs a test and a
 * load, not a lookup (../shared/docs/pt-decoding.md, "What makes an exact walker fast").
 *
 * Blocks live as long as their space. When the space's maps change where code was
 * decoded, its epoch moves on and every block of an older epoch counts as missing: it is
 * decoded again from the new maps when it is next needed.
 */
#ifndef PTSCOPE_PT_BLOCK_H
#define PTSCOPE_PT_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Why a walk from the block's start stops before a branch. */
enum pt_block_status {
	PT_BLOCK_OK,	   /* ends with a branch */
	PT_BLOCK_NO_MAP,   /* `branch_ip` is in no map */
	PT_BLOCK_BAD_INSN, /* the bytes at `branch_ip` are no instruction */
	PT_BLOCK_NO_DATA,  /* `branch_ip` is in `file`, whose bytes cannot be read */
};

struct pt_block {
	uint64_t start;
	uint64_t branch_ip; /* its branch (or where the walk failed) */
	uint64_t target;    /* a direct branch's target */
	struct pt_block *taken, *fall; /* successors found so far (NULL: not yet) */
	struct pt_block *tip_block;    /* where the last TIP from here went (tip_ip) */
	uint64_t tip_ip;
	uint32_t ninsn; /* instructions up to and including the branch (or before the failure) */
	uint32_t epoch;
	uint32_t file;	/* PT_BLOCK_NO_DATA: the file */
	int32_t rel;
	uint8_t kind;	/* pt_insn_kind of the branch */
	uint8_t op;	/* its pt_insn_op */
	uint8_t len;	/* its length */
	uint8_t status; /* pt_block_status */
	uint8_t zero_call; /* a direct call to the next instruction (not pushed) */
	/* The feed's memos (pt_feed.c): the location of the branch as a source, and of the
	 * last target a branch from it went to (dst_addr), valid while the space's epoch is
	 * loc_epoch + 1 (0: none yet). */
	uint64_t dst_addr;
	uint32_t src_loc, src_fn, dst_loc, dst_fn;
	int32_t src_node, dst_node;
	uint32_t loc_epoch;
};

#define PT_BLOCKS_PER_CHUNK 4096

struct pt_blocks {
	struct pt_block **table; /* open addressing by start; NULL: empty */
	size_t cap, count;	 /* cap: a power of two */
	struct pt_block **chunks;
	size_t nchunks, used; /* blocks used in the last chunk */
};

struct pt_image;

void pt_blocks_free(struct pt_blocks *b);

/* The block starting at addr in space `space` of the image (decoded now if there is none
 * of the space's epoch), or NULL when out of memory. */
struct pt_block *pt_block_at(struct pt_image *im, size_t space, uint64_t addr);

/* A walk through the code of a space from an address, instruction by instruction, as
 * perf's walk goes: to the first branch, or to `to_ip` when it is met first (0: none), or
 * to where the code cannot be read. */
#define PT_WALK_REACHED 0xff /* status: stopped at to_ip (not counted) */
struct pt_walk {
	uint64_t ip;	/* the branch, the failure, or to_ip */
	uint32_t ninsn; /* instructions walked (the branch included) */
	uint32_t file;	/* PT_BLOCK_NO_DATA: the file */
	int32_t rel;
	uint8_t status; /* pt_block_status or PT_WALK_REACHED */
	uint8_t kind, op, len, zero_call;
};
void pt_walk_code(struct pt_image *im, size_t space, uint64_t from, uint64_t to_ip,
		  struct pt_walk *w);

#endif
