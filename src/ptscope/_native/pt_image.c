/* Address spaces for the own decoder: see pt_image.h. */
#include "pt_image.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int pt_image_init(struct pt_image *im)
{
	memset(im, 0, sizeof(*im));
	return 0;
}

static void inline_free(struct pt_symbols *s)
{
	free(s->inl_start);
	free(s->inl_end);
	free(s->inl_node);
	s->inl_start = s->inl_end = NULL;
	s->inl_node = NULL;
	s->ninl = 0;
}

static void symbols_free(struct pt_symbols *s)
{
	free(s->start);
	free(s->end);
	free(s->sym_start);
	free(s->sym_end);
	free(s->name);
	free(s->fn);
	inline_free(s);
	memset(s, 0, sizeof(*s));
}

void pt_image_free(struct pt_image *im)
{
	for (size_t i = 0; i < im->nfiles; i++)
		symbols_free(&im->files[i].syms);
	free(im->files);
	for (size_t i = 0; i < im->nspaces; i++) {
		struct pt_space *s = im->spaces[i];
		if (!s)
			continue;
		free(s->maps);
		pt_blocks_free(&s->blocks);
		free(s);
	}
	free(im->spaces);
	memset(im, 0, sizeof(*im));
}

long pt_image_add_file(struct pt_image *im, const uint8_t *data, size_t size, uint32_t dso,
		       uint32_t unknown_fn, bool identity)
{
	if (im->nfiles == im->capfiles) {
		size_t ncap = im->capfiles ? im->capfiles * 2 : 64;
		struct pt_file *nf = realloc(im->files, ncap * sizeof(*nf));
		if (!nf)
			return -1;
		im->files = nf;
		im->capfiles = ncap;
	}
	struct pt_file *f = &im->files[im->nfiles];
	memset(f, 0, sizeof(*f));
	f->data = data;
	f->size = data ? size : 0;
	f->dso = dso;
	f->unknown_fn = unknown_fn;
	f->identity = identity;
	return (long)im->nfiles++;
}

static uint64_t *copy64(const uint64_t *v, size_t n)
{
	uint64_t *out = malloc((n ? n : 1) * sizeof(*out));
	if (out && n)
		memcpy(out, v, n * sizeof(*out));
	return out;
}

static uint32_t *copy32(const uint32_t *v, size_t n)
{
	uint32_t *out = malloc((n ? n : 1) * sizeof(*out));
	if (out && n)
		memcpy(out, v, n * sizeof(*out));
	return out;
}

int pt_image_set_symbols(struct pt_image *im, uint32_t file, const uint64_t *start,
			 const uint64_t *end, const uint64_t *sym_start, const uint64_t *sym_end,
			 const uint32_t *name, const uint32_t *fn, size_t n)
{
	if (file >= im->nfiles)
		return -EINVAL;
	struct pt_file *f = &im->files[file];
	symbols_free(&f->syms);
	struct pt_symbols s = {
		.start = copy64(start, n),
		.end = copy64(end, n),
		.sym_start = copy64(sym_start, n),
		.sym_end = copy64(sym_end, n),
		.name = copy32(name, n),
		.fn = copy32(fn, n),
		.n = n,
	};
	if (!s.start || !s.end || !s.sym_start || !s.sym_end || !s.name || !s.fn) {
		symbols_free(&s);
		return -ENOMEM;
	}
	f->syms = s;
	f->symbols_loaded = true;
	return 0;
}

int pt_image_set_inline(struct pt_image *im, uint32_t file, const uint64_t *start,
			const uint64_t *end, const int32_t *node, size_t n)
{
	if (file >= im->nfiles)
		return -EINVAL;
	struct pt_symbols *s = &im->files[file].syms;
	inline_free(s);
	s->inl_start = copy64(start, n);
	s->inl_end = copy64(end, n);
	s->inl_node = malloc((n ? n : 1) * sizeof(int32_t));
	if (!s->inl_start || !s->inl_end || !s->inl_node) {
		inline_free(s);
		return -ENOMEM;
	}
	if (n)
		memcpy(s->inl_node, node, n * sizeof(int32_t));
	s->ninl = n;
	im->inlined |= n > 0;
	return 0;
}

static long add_space(struct pt_image *im, struct pt_space *s)
{
	if (im->nspaces == im->capspaces) {
		size_t ncap = im->capspaces ? im->capspaces * 2 : 16;
		struct pt_space **ns = realloc(im->spaces, ncap * sizeof(*ns));
		if (!ns)
			return -1;
		im->spaces = ns;
		im->capspaces = ncap;
	}
	im->spaces[im->nspaces] = s;
	return (long)im->nspaces++;
}

long pt_image_new_space(struct pt_image *im)
{
	struct pt_space *s = calloc(1, sizeof(*s));
	if (!s)
		return -1;
	long i = add_space(im, s);
	if (i < 0)
		free(s);
	return i;
}

long pt_image_clone_space(struct pt_image *im, size_t from)
{
	long i = pt_image_new_space(im);
	if (i < 0)
		return -1;
	struct pt_space *src = im->spaces[from], *dst = im->spaces[i];
	if (src->n) {
		dst->maps = malloc(src->n * sizeof(*dst->maps));
		if (!dst->maps)
			return -1;
		memcpy(dst->maps, src->maps, src->n * sizeof(*dst->maps));
		dst->n = dst->cap = src->n;
	}
	return i;
}

static int reserve_maps(struct pt_space *s, size_t more)
{
	if (s->n + more <= s->cap)
		return 0;
	size_t ncap = s->cap ? s->cap : 16;
	while (ncap < s->n + more)
		ncap *= 2;
	struct pt_map *nm = realloc(s->maps, ncap * sizeof(*nm));
	if (!nm)
		return -ENOMEM;
	s->maps = nm;
	s->cap = ncap;
	return 0;
}

int pt_image_map(struct pt_image *im, size_t space, uint64_t start, uint64_t len,
		 uint64_t pgoff, uint32_t file)
{
	struct pt_space *s = im->spaces[space];
	uint64_t end = start + len;
	if (!len || end < start)
		return 0; /* perf never finds a map of size 0 */
	if (reserve_maps(s, 2) < 0)
		return -ENOMEM;
	/* The maps before, the pieces of those it overlaps, the new one, the maps after. */
	size_t first = 0;
	while (first < s->n && s->maps[first].end <= start)
		first++;
	size_t last = first;
	while (last < s->n && s->maps[last].start < end)
		last++;
	struct pt_map keep[2];
	size_t nkeep = 0;
	if (last > first) {
		const struct pt_map *a = &s->maps[first], *z = &s->maps[last - 1];
		if (a->start < start)
			keep[nkeep++] = (struct pt_map){ a->start, start, a->pgoff, a->file };
		if (z->end > end) {
			struct pt_map after = { end, z->end, z->pgoff + (end - z->start), z->file };
			keep[nkeep++] = after;
		}
	}
	struct pt_map mid[3];
	size_t nmid = 0;
	if (nkeep && keep[0].end == start)
		mid[nmid++] = keep[0];
	mid[nmid++] = (struct pt_map){ start, end, pgoff, file };
	for (size_t i = 0; i < nkeep; i++)
		if (keep[i].start == end)
			mid[nmid++] = keep[i];
	size_t removed = last - first;
	memmove(&s->maps[first + nmid], &s->maps[last], (s->n - last) * sizeof(*s->maps));
	memcpy(&s->maps[first], mid, nmid * sizeof(*mid));
	s->n = s->n - removed + nmid;
	s->hint = 0;
	/* Code decoded before may have run from what this replaces, or have failed where it
	 * now maps: the blocks decoded so far are stale. */
	if (s->blocks.count)
		s->epoch++;
	return 0;
}

int pt_image_resolve(struct pt_image *im, size_t space, uint64_t addr, struct pt_resolved *out)
{
	const struct pt_map *m = pt_space_find(im->spaces[space], addr);
	out->dso = 0;
	out->name = 0;
	out->fn = im->unknown_fn;
	out->offset = -1;
	out->node = 0;
	if (!m)
		return 0;
	uint32_t fi = m->file;
	struct pt_file *f = &im->files[fi];
	out->dso = f->dso;
	out->fn = f->unknown_fn;
	if (!f->symbols_loaded) {
		f->symbols_loaded = true; /* asked once, whatever the answer */
		if (im->load_symbols && im->load_symbols(im->load_ctx, fi) < 0)
			return -1;
		f = &im->files[fi];
	}
	const struct pt_symbols *sy = &f->syms;
	uint64_t a = pt_map_ip(im, m, addr), next;
	if (sy->ninl)
		out->node = pt_symbols_node(sy, a, &next);
	size_t lo = 0, hi = sy->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (sy->end[mid] <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo >= sy->n || sy->start[lo] > a)
		return 0;
	out->name = sy->name[lo];
	out->fn = sy->fn[lo];
	if (a >= sy->sym_start[lo] && a < sy->sym_end[lo])
		out->offset = (int64_t)(a - sy->sym_start[lo]);
	else /* perf's own symoff, a u32: only met at a symbol of size zero */
		out->offset = (int64_t)(uint32_t)(a - m->start - sy->sym_start[lo]);
	return 0;
}
