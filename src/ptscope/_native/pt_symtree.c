/* A DSO's symbols as perf 6.1 looks them up, flattened into intervals (pt_symtree.h).
 *
 * perf keeps a DSO's symbols in a red-black tree keyed by their start (equal starts to
 * the right), stretches those of size zero to the next one's start, drops duplicates by
 * its preference (choose_best_symbol), and finds an address by walking the tree from the
 * root: where symbols overlap (an `_init` stretched over the PLT, a label inside a
 * function, JIT entries rewritten) the answer depends on the tree's shape. So the tree is
 * built here exactly as perf builds it (the textbook red-black insertion and deletion,
 * which Linux's rbtree follows, in perf's order of operations) and then asked at every
 * point where its answer can change: the answers between two such points are all the
 * same, so a sorted list of intervals gives every lookup perf would give.
 */
#include "pt_symtree.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NIL 0 /* node 0 is the sentinel */

struct node {
	uint64_t start, end;
	uint32_t left, right, parent, sym;
	bool red;
};

struct tree {
	struct node *n;
	uint32_t root;
};

static void rotate_left(struct tree *t, uint32_t x)
{
	struct node *n = t->n;
	uint32_t y = n[x].right;
	n[x].right = n[y].left;
	if (n[y].left != NIL)
		n[n[y].left].parent = x;
	n[y].parent = n[x].parent;
	if (n[x].parent == NIL)
		t->root = y;
	else if (x == n[n[x].parent].left)
		n[n[x].parent].left = y;
	else
		n[n[x].parent].right = y;
	n[y].left = x;
	n[x].parent = y;
}

static void rotate_right(struct tree *t, uint32_t x)
{
	struct node *n = t->n;
	uint32_t y = n[x].left;
	n[x].left = n[y].right;
	if (n[y].right != NIL)
		n[n[y].right].parent = x;
	n[y].parent = n[x].parent;
	if (n[x].parent == NIL)
		t->root = y;
	else if (x == n[n[x].parent].right)
		n[n[x].parent].right = y;
	else
		n[n[x].parent].left = y;
	n[y].right = x;
	n[x].parent = y;
}

static void insert(struct tree *t, uint32_t z)
{
	struct node *n = t->n;
	uint32_t y = NIL, x = t->root;
	while (x != NIL) {
		y = x;
		x = n[z].start < n[x].start ? n[x].left : n[x].right;
	}
	n[z].parent = y;
	if (y == NIL)
		t->root = z;
	else if (n[z].start < n[y].start)
		n[y].left = z;
	else
		n[y].right = z;
	n[z].left = n[z].right = NIL;
	n[z].red = true;
	while (n[n[z].parent].red) {
		uint32_t p = n[z].parent, g = n[p].parent;
		if (p == n[g].left) {
			uint32_t u = n[g].right;
			if (n[u].red) {
				n[p].red = n[u].red = false;
				n[g].red = true;
				z = g;
			} else {
				if (z == n[p].right) {
					z = p;
					rotate_left(t, z);
					p = n[z].parent;
					g = n[p].parent;
				}
				n[p].red = false;
				n[g].red = true;
				rotate_right(t, g);
			}
		} else {
			uint32_t u = n[g].left;
			if (n[u].red) {
				n[p].red = n[u].red = false;
				n[g].red = true;
				z = g;
			} else {
				if (z == n[p].left) {
					z = p;
					rotate_right(t, z);
					p = n[z].parent;
					g = n[p].parent;
				}
				n[p].red = false;
				n[g].red = true;
				rotate_left(t, g);
			}
		}
	}
	n[t->root].red = false;
}

static void transplant(struct tree *t, uint32_t u, uint32_t v)
{
	struct node *n = t->n;
	if (n[u].parent == NIL)
		t->root = v;
	else if (u == n[n[u].parent].left)
		n[n[u].parent].left = v;
	else
		n[n[u].parent].right = v;
	n[v].parent = n[u].parent;
}

static uint32_t minimum(const struct tree *t, uint32_t x)
{
	while (t->n[x].left != NIL)
		x = t->n[x].left;
	return x;
}

static void erase(struct tree *t, uint32_t z)
{
	struct node *n = t->n;
	uint32_t y = z, x;
	bool y_red = n[y].red;
	if (n[z].left == NIL) {
		x = n[z].right;
		transplant(t, z, n[z].right);
	} else if (n[z].right == NIL) {
		x = n[z].left;
		transplant(t, z, n[z].left);
	} else {
		/* a node with two children is replaced by its successor */
		y = minimum(t, n[z].right);
		y_red = n[y].red;
		x = n[y].right;
		if (n[y].parent == z) {
			n[x].parent = y;
		} else {
			transplant(t, y, n[y].right);
			n[y].right = n[z].right;
			n[n[y].right].parent = y;
		}
		transplant(t, z, y);
		n[y].left = n[z].left;
		n[n[y].left].parent = y;
		n[y].red = n[z].red;
	}
	if (y_red)
		return;
	while (x != t->root && !n[x].red) {
		uint32_t p = n[x].parent;
		if (x == n[p].left) {
			uint32_t w = n[p].right;
			if (n[w].red) {
				n[w].red = false;
				n[p].red = true;
				rotate_left(t, p);
				w = n[n[x].parent].right;
			}
			if (!n[n[w].left].red && !n[n[w].right].red) {
				n[w].red = true;
				x = n[x].parent;
			} else {
				if (!n[n[w].right].red) {
					n[n[w].left].red = false;
					n[w].red = true;
					rotate_right(t, w);
					w = n[n[x].parent].right;
				}
				n[w].red = n[n[x].parent].red;
				n[n[x].parent].red = false;
				n[n[w].right].red = false;
				rotate_left(t, n[x].parent);
				x = t->root;
			}
		} else {
			uint32_t w = n[p].left;
			if (n[w].red) {
				n[w].red = false;
				n[p].red = true;
				rotate_right(t, p);
				w = n[n[x].parent].left;
			}
			if (!n[n[w].right].red && !n[n[w].left].red) {
				n[w].red = true;
				x = n[x].parent;
			} else {
				if (!n[n[w].left].red) {
					n[n[w].right].red = false;
					n[w].red = true;
					rotate_left(t, w);
					w = n[n[x].parent].left;
				}
				n[w].red = n[n[x].parent].red;
				n[n[x].parent].red = false;
				n[n[w].left].red = false;
				rotate_right(t, n[x].parent);
				x = t->root;
			}
		}
	}
	n[x].red = false;
}

static uint32_t first(const struct tree *t)
{
	return t->root == NIL ? NIL : minimum(t, t->root);
}

static uint32_t next(const struct tree *t, uint32_t x)
{
	const struct node *n = t->n;
	if (n[x].right != NIL)
		return minimum(t, n[x].right);
	uint32_t y = n[x].parent;
	while (y != NIL && x == n[y].right) {
		x = y;
		y = n[y].parent;
	}
	return y;
}

/* symbols__fixup_end(): a symbol of size zero ends where the next one starts, the last
 * one a page after the page it is in. */
static void fixup_end(struct tree *t)
{
	uint32_t cur = first(t);
	if (cur == NIL)
		return;
	for (uint32_t nd = next(t, cur); nd != NIL; nd = next(t, nd)) {
		uint32_t prev = cur;
		cur = nd;
		if (t->n[prev].end == t->n[prev].start)
			t->n[prev].end = t->n[cur].start;
	}
	if (t->n[cur].end == t->n[cur].start)
		t->n[cur].end = ((t->n[cur].start + 4095) & ~UINT64_C(4095)) + 4096;
}

/* choose_best_symbol(): whether a wins over b (a was inserted first). */
static bool a_wins(const struct node *a, const struct node *b, const struct pt_sym_in *in)
{
	const struct pt_sym_in *x = &in[a->sym], *y = &in[b->sym];
	uint64_t la = a->end - a->start, lb = b->end - b->start;
	if (lb == 0 && la > 0)
		return true;
	if (la == 0 && lb > 0)
		return false;
	bool wa = x->binding == 2, wb = y->binding == 2; /* STB_WEAK */
	if (wb && !wa)
		return true;
	if (wa && !wb)
		return false;
	bool ga = x->binding == 1, gb = y->binding == 1; /* STB_GLOBAL */
	if (ga && !gb)
		return true;
	if (gb && !ga)
		return false;
	if (y->underscores > x->underscores)
		return true;
	if (x->underscores > y->underscores)
		return false;
	if (x->name_len > y->name_len)
		return true;
	if (x->name_len < y->name_len)
		return false;
	return !x->sys_prefix; /* "SyS" syscall aliases lose */
}

/* symbols__fixup_duplicate(). */
static void fixup_duplicate(struct tree *t, const struct pt_sym_in *in)
{
	uint32_t nd = first(t);
	while (nd != NIL) {
		uint32_t cur = nd;
	again:
		nd = next(t, cur);
		if (nd == NIL)
			break;
		if (t->n[cur].start != t->n[nd].start)
			continue;
		if (a_wins(&t->n[cur], &t->n[nd], in)) {
			erase(t, nd);
			goto again;
		}
		nd = next(t, cur);
		erase(t, cur);
	}
}

/* symbols__find(). */
static uint32_t find(const struct tree *t, uint64_t ip)
{
	uint32_t x = t->root;
	while (x != NIL) {
		const struct node *s = &t->n[x];
		if (ip < s->start)
			x = s->left;
		else if (ip > s->end || (ip == s->end && ip != s->start))
			x = s->right;
		else
			return x;
	}
	return NIL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

int pt_symtree_flatten(const struct pt_sym_in *in, size_t n, struct pt_symtree_out *out)
{
	memset(out, 0, sizeof(*out));
	struct tree t = { calloc(n + 1, sizeof(struct node)), NIL };
	out->sym_end = malloc((n ? n : 1) * sizeof(uint64_t));
	uint64_t *points = malloc((3 * n + 1) * sizeof(uint64_t));
	if (!t.n || !out->sym_end || !points) {
		free(t.n);
		free(points);
		pt_symtree_free(out);
		return -ENOMEM;
	}
	/* perf's order: each pass inserted, then (for the ELF passes that inserted any)
	 * ends fixed and duplicates dropped */
	size_t i = 0;
	while (i < n) {
		uint8_t pass = in[i].pass;
		size_t added = 0;
		for (; i < n && in[i].pass == pass; i++) {
			struct node *nd = &t.n[i + 1];
			nd->start = in[i].start;
			nd->end = in[i].end;
			nd->sym = (uint32_t)i;
			insert(&t, (uint32_t)(i + 1));
			added++;
		}
		if (added && pass != PT_SYM_PASS_PLAIN) {
			fixup_end(&t);
			fixup_duplicate(&t, in);
		}
	}
	for (size_t k = 0; k < n; k++)
		out->sym_end[k] = t.n[k + 1].end;
	/* every point where a lookup's answer can change */
	size_t np = 0;
	for (uint32_t x = first(&t); x != NIL; x = next(&t, x)) {
		points[np++] = t.n[x].start;
		points[np++] = t.n[x].end;
		if (t.n[x].end == t.n[x].start)
			points[np++] = t.n[x].start + 1;
	}
	qsort(points, np, sizeof(*points), cmp_u64);
	size_t nu = 0;
	for (size_t k = 0; k < np; k++)
		if (!nu || points[nu - 1] != points[k])
			points[nu++] = points[k];
	size_t cap = 2 * nu + 1;
	out->start = malloc(cap * sizeof(uint64_t));
	out->end = malloc(cap * sizeof(uint64_t));
	out->sym = malloc(cap * sizeof(uint32_t));
	if (!out->start || !out->end || !out->sym) {
		free(t.n);
		free(points);
		pt_symtree_free(out);
		return -ENOMEM;
	}
	size_t m = 0;
	for (size_t k = 0; k < nu; k++) {
		uint64_t a = points[k];
		uint64_t limit = k + 1 < nu ? points[k + 1] : a + 1;
		/* the point itself, then (if there is room) everything up to the next one */
		uint64_t pieces[2][2] = { { a, a + 1 }, { a + 1, limit } };
		for (int p = 0; p < 2; p++) {
			uint64_t lo = pieces[p][0], hi = pieces[p][1];
			if (lo >= hi || (p == 1 && a + 1 == 0))
				continue;
			uint32_t x = find(&t, lo);
			if (x == NIL)
				continue;
			uint32_t sym = t.n[x].sym;
			if (m && out->end[m - 1] == lo && out->sym[m - 1] == sym) {
				out->end[m - 1] = hi;
				continue;
			}
			out->start[m] = lo;
			out->end[m] = hi;
			out->sym[m] = sym;
			m++;
		}
	}
	out->n = m;
	free(t.n);
	free(points);
	return 0;
}

void pt_symtree_free(struct pt_symtree_out *out)
{
	free(out->start);
	free(out->end);
	free(out->sym);
	free(out->sym_end);
	memset(out, 0, sizeof(*out));
}
