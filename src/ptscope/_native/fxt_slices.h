/* Fuchsia trace duration-complete records for many slices at once: the hot part of the
 * FXT writer (src/ptscope/fxt/writer.py), with no Python in it so that a C caller (the
 * dlfilter, the Python binding src/ptscope/fxt/_cfxt.c) can share it.
 *
 * The caller owns the tables (strings, threads) and hands over the words it has already
 * resolved: the record header's fixed bits, each slice's name slot, and per argument
 * either one word for every slice or one per slice. This file only lays records out and
 * formats the ``drill`` strings; writer.py's numpy encoder (FxtWriter._encode_complete) is
 * its reference and the tests compare the two word for word.
 */
#ifndef PTSCOPE_FXT_SLICES_H
#define PTSCOPE_FXT_SLICES_H

#include <stddef.h>
#include <stdint.h>

/* One argument column. A slice carries it where ``present`` is nonzero (NULL: every
 * slice). Its first word is ``heads[i]`` (or ``head`` when ``heads`` is NULL); a two-word
 * argument has its second word in ``values[i]`` (NULL: a one-word argument). */
struct fxt_arg_column {
	const uint8_t *present;
	uint64_t head;
	const uint64_t *heads;
	const uint64_t *values;
};

/* The ``drill`` string argument every slice carries: ``prefix`` then ``SEC.NSEC,SEC.NSEC``
 * (perf times; seconds zero-filled to the width of the largest in the call), or, where
 * the slice has an anchor (occurrence > 0) and a count (> 0), ``SEC.NSEC`` (its start)
 * and `` --after 0xADDRESS:OCC --count N``. ``head`` is the argument header without its
 * size and payload bits. */
struct fxt_drill_column {
	const char *prefix;
	size_t prefix_len;
	uint64_t head;
	const int64_t *perf_start;
	const int64_t *perf_end;
	const uint64_t *anchor_ip;	   /* these three: all or none */
	const int64_t *anchor_occurrence;
	const int64_t *count;
};

/* The most words fxt_encode_complete() writes for these n slices. */
size_t fxt_complete_bound(size_t n, const struct fxt_arg_column *args, size_t nargs,
			  const struct fxt_drill_column *drill);

/* Writes the n records to ``out`` (fxt_complete_bound() words at least) and returns the
 * number of words written. ``header`` holds the record type, event type, thread and
 * category bits; the name slot goes in bits 48..63, the size and argument count are
 * filled here. ``start``/``end`` are ticks. */
size_t fxt_encode_complete(uint64_t *out, size_t n, uint64_t header, const int32_t *name_slots,
			   const uint64_t *start, const uint64_t *end,
			   const struct fxt_arg_column *args, size_t nargs,
			   const struct fxt_drill_column *drill);

#endif /* PTSCOPE_FXT_SLICES_H */
