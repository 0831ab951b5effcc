/* The dlfilter's inlined code: the runs file the pipeline writes before perf starts
 * (--dlarg inline=PATH; docs/file-formats.md, "Inline runs"), and each DSO's runs found by
 * the name perf gives it. filter_blocks.c splits blocks at them. */
#include "filter_internal.h"

#define INLINE_MAGIC "PTSINLN"
#define INLINE_VERSION 1u

static int load_failed(struct inline_file *in, const char *path, const char *why)
{
	fprintf(stderr, "ptscope dlfilter: inline runs '%s': %s\n", path, why);
	free(in->data);
	free(in->dsos);
	memset(in, 0, sizeof(*in));
	return -EINVAL;
}

int inline_load(struct inline_file *in, const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return load_failed(in, path, strerror(errno));
	size_t cap = 1 << 16, n = 0;
	uint8_t *data = malloc(cap);
	for (;;) {
		if (!data) {
			fclose(fp);
			return load_failed(in, path, "out of memory");
		}
		n += fread(data + n, 1, cap - n, fp);
		if (n < cap)
			break;
		uint8_t *more = realloc(data, cap * 2);
		if (!more)
			free(data);
		data = more;
		cap *= 2;
	}
	int bad = ferror(fp);
	fclose(fp);
	in->data = data;
	if (bad)
		return load_failed(in, path, "read error");
	if (n < 16 || memcmp(data, INLINE_MAGIC, 8) != 0)
		return load_failed(in, path, "not an inline runs file");
	uint32_t version, count;
	memcpy(&version, data + 8, 4);
	memcpy(&count, data + 12, 4);
	if (version != INLINE_VERSION)
		return load_failed(in, path, "another version");
	if (count > n / 16)
		return load_failed(in, path, "damaged");
	in->dsos = calloc(count ? count : 1, sizeof(*in->dsos));
	if (!in->dsos)
		return load_failed(in, path, "out of memory");
	size_t at = 16;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t len;
		uint64_t runs;
		if (n - at < 16)
			return load_failed(in, path, "damaged");
		memcpy(&len, data + at, 4);
		memcpy(&runs, data + at + 8, 8);
		at += 16;
		size_t name_bytes = ((size_t)len + 8) & ~(size_t)7; /* NUL-terminated, padded */
		if (name_bytes > n - at || runs > (n - at - name_bytes) / 20)
			return load_failed(in, path, "damaged");
		struct inline_dso *d = &in->dsos[i];
		d->name = (const char *)data + at;
		if (d->name[len] != 0)
			return load_failed(in, path, "damaged");
		at += name_bytes;
		d->runs.start = (const uint64_t *)(data + at);
		d->runs.end = d->runs.start + runs;
		d->runs.node = (const int32_t *)(d->runs.end + runs);
		d->runs.n = (size_t)runs;
		at += (size_t)runs * 20;
		at = (at + 7) & ~(size_t)7;
		if (at > n)
			return load_failed(in, path, "damaged");
	}
	in->ndsos = count;
	return 0;
}

void inline_free(struct inline_file *in)
{
	free(in->data);
	free(in->dsos);
	memset(in, 0, sizeof(*in));
}

/* The runs of the DSO perf names `dso` (its string pointer is perf's, stable while the DSO
 * lives: remembered, so that a name is compared once). NULL: no inlined code known. */
const struct inline_runs *inline_runs_of(struct inline_file *in, const char *dso)
{
	if (!dso || !in->ndsos)
		return NULL;
	for (size_t k = 0; k < INLINE_SEEN; k++)
		if (in->seen[k].name == dso)
			return in->seen[k].runs;
	const struct inline_runs *found = NULL;
	for (size_t i = 0; i < in->ndsos; i++)
		if (strcmp(in->dsos[i].name, dso) == 0) {
			found = &in->dsos[i].runs;
			break;
		}
	in->seen[in->next_seen] = (struct inline_seen){ dso, found };
	in->next_seen = (in->next_seen + 1) % INLINE_SEEN;
	return found;
}
