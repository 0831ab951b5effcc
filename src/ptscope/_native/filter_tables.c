/* The dlfilter's tables (filter_tables.h): what is not inline. */
#include "filter_tables.h"

#include <errno.h>

/* -------------------------------------------------------- string interning */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ULL;
	}
	return mix64(h);
}

static int str_table_grow(struct str_table *t)
{
	size_t ncap = t->cap ? t->cap * 2 : 1024;
	struct str_slot *ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return -1;
	for (size_t i = 0; i < t->cap; i++) {
		struct str_slot *s = &t->slots[i];
		if (!s->text)
			continue;
		size_t j = s->hash & (ncap - 1);
		while (ns[j].text)
			j = (j + 1) & (ncap - 1);
		ns[j] = *s;
	}
	free(t->slots);
	t->slots = ns;
	t->cap = ncap;
	return 0;
}

uint32_t str_intern(struct str_table *t, const char *s, size_t len, int *is_new)
{
	*is_new = 0;
	if ((t->count + 1) * 2 > t->cap && str_table_grow(t) < 0)
		return 0;
	uint64_t h = hash_bytes(s, len);
	size_t j = h & (t->cap - 1);
	while (t->slots[j].text) {
		struct str_slot *e = &t->slots[j];
		if (e->hash == h && e->len == len && memcmp(e->text, s, len) == 0)
			return e->id;
		j = (j + 1) & (t->cap - 1);
	}
	char *copy = malloc(len + 1);
	if (!copy)
		return 0;
	memcpy(copy, s, len);
	copy[len] = 0;
	t->count++;
	t->slots[j] = (struct str_slot){ .hash = h, .text = copy, .len = (uint32_t)len,
					 .id = (uint32_t)t->count };
	*is_new = 1;
	return (uint32_t)t->count;
}

void str_table_free(struct str_table *t)
{
	for (size_t i = 0; i < t->cap; i++)
		free(t->slots[i].text);
	free(t->slots);
	memset(t, 0, sizeof(*t));
}

/* ------------------------------------------------------- open addressing */

/* The location and block caches are open-addressing tables (linear probing, a power of two
 * slots, at most half full). Double one: `slots` holds `*cap` elements of `size` bytes;
 * every used one is placed again by its hash into a new array, returned (the old one is
 * freed, `*cap` updated), or NULL when out of memory. Rare: the callbacks cost nothing. */
static void *table_grow(void *slots, size_t *cap, size_t size, size_t first_cap,
			int (*used)(const void *), uint64_t (*hash)(const void *))
{
	size_t ncap = *cap ? *cap * 2 : first_cap;
	char *ns = calloc(ncap, size);
	if (!ns)
		return NULL;
	const char *old = slots;
	for (size_t i = 0; i < *cap; i++) {
		const void *s = old + i * size;
		if (!used(s))
			continue;
		size_t j = hash(s) & (ncap - 1);
		while (used(ns + j * size))
			j = (j + 1) & (ncap - 1);
		memcpy(ns + j * size, s, size);
	}
	free(slots);
	*cap = ncap;
	return ns;
}

/* ------------------------------------------------------------ location cache */

static int loc_used(const void *slot)
{
	return ((const struct loc_slot *)slot)->id != 0;
}

static uint64_t loc_slot_hash(const void *slot)
{
	const struct loc_slot *s = slot;
	return loc_hash(s->addr, s->meta);
}

int loc_table_grow(struct loc_table *t)
{
	struct loc_slot *ns =
		table_grow(t->slots, &t->cap, sizeof(*t->slots), 4096, loc_used, loc_slot_hash);
	if (!ns)
		return -1;
	t->slots = ns;
	return 0;
}

/* --------------------------------------------------------------- id maps */

static int id_map_grow(struct id_map *m)
{
	size_t ncap = m->cap ? m->cap * 2 : 256;
	uint64_t *nk = calloc(ncap, sizeof(*nk));
	uint32_t *nv = calloc(ncap, sizeof(*nv));
	if (!nk || !nv) {
		free(nk);
		free(nv);
		return -1;
	}
	for (size_t i = 0; i < m->cap; i++) {
		if (!m->vals[i])
			continue;
		size_t j = mix64(m->keys[i]) & (ncap - 1);
		while (nv[j])
			j = (j + 1) & (ncap - 1);
		nk[j] = m->keys[i];
		nv[j] = m->vals[i];
	}
	free(m->keys);
	free(m->vals);
	m->keys = nk;
	m->vals = nv;
	m->cap = ncap;
	return 0;
}

long id_map_get(struct id_map *m, uint64_t key, int *is_new)
{
	*is_new = 0;
	if ((m->count + 1) * 2 > m->cap && id_map_grow(m) < 0)
		return -1;
	size_t j = mix64(key) & (m->cap - 1);
	while (m->vals[j]) {
		if (m->keys[j] == key)
			return (long)m->vals[j] - 1;
		j = (j + 1) & (m->cap - 1);
	}
	m->keys[j] = key;
	m->vals[j] = (uint32_t)++m->count;
	*is_new = 1;
	return (long)m->count - 1;
}

void id_map_free(struct id_map *m)
{
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

/* ------------------------------------------------------------- block cache */

static int block_used(const void *slot)
{
	return ((const struct block_slot *)slot)->used;
}

static uint64_t block_slot_hash(const void *slot)
{
	const struct block_slot *s = slot;
	return block_hash(s->start, s->end, s->meta);
}

int block_table_grow(struct block_table *t)
{
	struct block_slot *ns =
		table_grow(t->slots, &t->cap, sizeof(*t->slots), 4096, block_used, block_slot_hash);
	if (!ns)
		return -1;
	t->slots = ns;
	return 0;
}

/* ------------------------------------------------------------------ id lists */

int id_list_parse(const char *text, struct id_list *list)
{
	size_t cap = 1;
	for (const char *c = text; *c; c++)
		cap += *c == ',';
	list->ids = calloc(cap, sizeof(*list->ids));
	if (!list->ids)
		return -ENOMEM;
	list->count = 0;
	while (*text) {
		char *end;
		long id = strtol(text, &end, 10);
		if (end == text || id < 0 || id > INT32_MAX || (*end && *end != ','))
			return -EINVAL;
		list->ids[list->count++] = (int32_t)id;
		text = *end ? end + 1 : end;
	}
	return list->count ? 0 : -EINVAL;
}

int id_list_selects(const struct id_list *list, int32_t id)
{
	if (!list->count)
		return 1;
	for (size_t i = 0; i < list->count; i++)
		if (list->ids[i] == id)
			return 1;
	return 0;
}
