/* The dlfilter record stream's branch runs read in C: the common case of
 * RecordStreamParser._branch_records (decode/dlfilter_stream.py), which stays the
 * reference and handles everything else.
 *
 *   scan_tags(buf, pos, n, size) -> (stop, first_lines, last_branch)
 *   check_run(buf, pos, n, size, nloc, budget) -> (spent, lines) | None
 *   fill_run(buf, pos, n, size, table_ids, pid, tid, time, flags, src, dst, insn_count,
 *            cycle_count, gap_delta, gap_insns, line_offsets, lines) -> None
 *
 * A run is n branch records of `size` bytes at `pos` (72: plain; 88: with instruction
 * detail, each with its one range of code lines). check_run() says whether the fast path
 * applies: every location id in 1..nloc-1, every time below TIME_LIMIT and no gap reaching
 * before 0, every count below 2^40 and their sum (`spent`) within `budget`, and (detail)
 * every range at most twice its branch's instructions and at most MAX_LINES lines in all.
 * Where any of these fails it returns None and Python takes the run, to report the damage
 * exactly as before. fill_run() writes the columns of a BranchBatch into the given arrays
 * (contiguous, of the batch's dtypes; src/dst are the stream's location ids mapped through
 * table_ids), the lines one after the other with n + 1 offsets.
 *
 * scan_tags() reads the first byte of n rows of `size` bytes at `pos`, where a run of branch
 * records may be (lines records among them): `stop` is the first row whose tag is neither
 * a branch's nor a lines record's (n: none), `first_lines` the first lines record before
 * it and `last_branch` the last branch record before it (-1: none). The parser decides
 * from these where its run ends (RecordStreamParser._run_length; its numpy twin is the
 * reference).
 *
 * One pass of C replaces about twenty numpy passes over the same megabyte, each of them
 * a strided walk through 88-byte rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "record_format.h"

#define TIME_LIMIT (1ULL << 61)	 /* model.TIME_LIMIT */
#define SMALL_COUNT (1ULL << 40) /* dlfilter_stream._SMALL_COUNT */
#define MAX_LINES (1ULL << 24)	 /* dlfilter_stream._MAX_LINES */

static int run_of(PyObject *obj, Py_buffer *view, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t size)
{
	if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
		return -1;
	if (size != sizeof(struct ptscope_branch_rec) &&
	    size != sizeof(struct ptscope_insns_branch_rec)) {
		PyBuffer_Release(view);
		PyErr_SetString(PyExc_ValueError, "a branch record is 72 or 88 bytes");
		return -1;
	}
	if (pos < 0 || n < 0 || pos > view->len || (view->len - pos) / size < n) {
		PyBuffer_Release(view);
		PyErr_SetString(PyExc_ValueError, "the run is not inside the buffer");
		return -1;
	}
	return 0;
}

static PyObject *scan_tags(PyObject *Py_UNUSED(m), PyObject *args)
{
	PyObject *obj;
	Py_ssize_t pos, n, size;
	if (!PyArg_ParseTuple(args, "Onnn", &obj, &pos, &n, &size))
		return NULL;
	Py_buffer view;
	if (run_of(obj, &view, pos, n, size) < 0)
		return NULL;
	const unsigned char *p = (const unsigned char *)view.buf + pos;
	Py_ssize_t stop = n, first_lines = -1, last_branch = -1;
	Py_BEGIN_ALLOW_THREADS
	for (Py_ssize_t i = 0; i < n; i++, p += size) {
		if (*p == PTSCOPE_TAG_BRANCH) {
			last_branch = i;
		} else if (*p == PTSCOPE_TAG_LINES) {
			if (first_lines < 0)
				first_lines = i;
		} else {
			stop = i;
			break;
		}
	}
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&view);
	return Py_BuildValue("nnn", stop, first_lines, last_branch);
}

static PyObject *check_run(PyObject *Py_UNUSED(m), PyObject *args)
{
	PyObject *obj;
	Py_ssize_t pos, n, size;
	unsigned long long nloc, budget;
	if (!PyArg_ParseTuple(args, "OnnnKK", &obj, &pos, &n, &size, &nloc, &budget))
		return NULL;
	Py_buffer view;
	if (run_of(obj, &view, pos, n, size) < 0)
		return NULL;
	bool detail = size == sizeof(struct ptscope_insns_branch_rec);
	const unsigned char *p = (const unsigned char *)view.buf + pos;
	uint64_t spent = 0, lines = 0;
	bool ok = true;
	Py_BEGIN_ALLOW_THREADS
	/* Every row's test without a branch per condition (`&`, not `&&`): one per row. */
	for (Py_ssize_t i = 0; ok && i < n; i++, p += size) {
		uint64_t time = ptscope_u64_at(p, PTSCOPE_BRANCH_AT(time));
		uint64_t insns = ptscope_u64_at(p, PTSCOPE_BRANCH_AT(insn_cnt));
		uint64_t cycles = ptscope_u64_at(p, PTSCOPE_BRANCH_AT(cyc_cnt));
		uint32_t ip_loc = ptscope_u32_at(p, PTSCOPE_BRANCH_AT(ip_loc));
		uint32_t addr_loc = ptscope_u32_at(p, PTSCOPE_BRANCH_AT(addr_loc));
		uint64_t count = detail ? ptscope_u64_at(p, PTSCOPE_LINE_COUNT_AT) : 0;
		ok = (p[0] == PTSCOPE_TAG_BRANCH) & (ip_loc != 0) & (ip_loc < nloc) &
		     (addr_loc != 0) & (addr_loc < nloc) & (time < TIME_LIMIT) &
		     (ptscope_u32_at(p, PTSCOPE_BRANCH_AT(gap_delta)) <= time) &
		     (insns < SMALL_COUNT) & (cycles < SMALL_COUNT) & (count <= 2 * insns) &
		     (count <= MAX_LINES);
		spent += insns + cycles; /* below 2^41 each: no wrap-around */
		lines += count;
	}
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&view);
	if (!ok || spent > budget || lines > MAX_LINES)
		Py_RETURN_NONE;
	return Py_BuildValue("KK", (unsigned long long)spent, (unsigned long long)lines);
}

enum { C_PID, C_TID, C_TIME, C_FLAGS, C_SRC, C_DST, C_INSN, C_CYC, C_GAP, C_GAPN, NCOLS };
static const Py_ssize_t ITEM[NCOLS] = {4, 4, 8, 4, 4, 4, 8, 8, 4, 2};

static PyObject *fill_run(PyObject *Py_UNUSED(m), PyObject *const *argv, Py_ssize_t argc)
{
	if (argc != 5 + NCOLS + 2) {
		PyErr_SetString(PyExc_TypeError, "fill_run takes 17 arguments");
		return NULL;
	}
	Py_ssize_t pos = PyLong_AsSsize_t(argv[1]), n = PyLong_AsSsize_t(argv[2]);
	Py_ssize_t size = PyLong_AsSsize_t(argv[3]);
	if (PyErr_Occurred())
		return NULL;
	Py_buffer view, ids, cols[NCOLS + 2];
	int held = 0;
	PyObject *result = NULL;
	if (run_of(argv[0], &view, pos, n, size) < 0)
		return NULL;
	if (PyObject_GetBuffer(argv[4], &ids, PyBUF_C_CONTIGUOUS) < 0)
		goto out_view;
	if (ids.itemsize != 4) {
		PyErr_SetString(PyExc_ValueError, "table_ids: expected int32");
		goto out_ids;
	}
	for (; held < NCOLS + 2; held++) {
		Py_buffer *c = &cols[held];
		if (PyObject_GetBuffer(argv[5 + held], c, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
			goto out_cols;
		Py_ssize_t item = held < NCOLS ? ITEM[held] : held == NCOLS ? 4 : 8;
		Py_ssize_t want = held < NCOLS ? n : held == NCOLS ? n + 1 : -1;
		if (c->itemsize != item || (want >= 0 && c->len != want * item)) {
			held++;
			PyErr_SetString(PyExc_ValueError, "a column has the wrong type or length");
			goto out_cols;
		}
	}
	bool detail = size == sizeof(struct ptscope_insns_branch_rec);
	const int32_t *table = ids.buf;
	Py_ssize_t ntable = ids.len / 4;
	int32_t *pid = cols[C_PID].buf, *tid = cols[C_TID].buf, *src = cols[C_SRC].buf,
		*dst = cols[C_DST].buf, *offsets = cols[NCOLS].buf;
	int64_t *time = cols[C_TIME].buf;
	uint32_t *flags = cols[C_FLAGS].buf, *gap = cols[C_GAP].buf;
	uint64_t *insn = cols[C_INSN].buf, *cyc = cols[C_CYC].buf, *lines = cols[NCOLS + 1].buf;
	uint16_t *gapn = cols[C_GAPN].buf;
	Py_ssize_t nlines = cols[NCOLS + 1].len / 8;
	const unsigned char *p = (const unsigned char *)view.buf + pos;
	Py_ssize_t at = 0;
	bool fits = true;
	/* (no Python in the loop: other threads run meanwhile, the engine's or a reader's) */
	Py_BEGIN_ALLOW_THREADS
	for (Py_ssize_t i = 0; i < n; i++, p += size) {
		uint32_t ip_loc = ptscope_u32_at(p, PTSCOPE_BRANCH_AT(ip_loc));
		uint32_t addr_loc = ptscope_u32_at(p, PTSCOPE_BRANCH_AT(addr_loc));
		uint64_t first = detail ? ptscope_u64_at(p, PTSCOPE_LINE_FIRST_AT) : 0;
		uint64_t count = detail ? ptscope_u64_at(p, PTSCOPE_LINE_COUNT_AT) : 0;
		if (ip_loc >= ntable || addr_loc >= ntable || count > (uint64_t)(nlines - at)) {
			fits = false;
			break;
		}
		pid[i] = (int32_t)ptscope_u32_at(p, PTSCOPE_BRANCH_AT(pid));
		tid[i] = (int32_t)ptscope_u32_at(p, PTSCOPE_BRANCH_AT(tid));
		time[i] = (int64_t)ptscope_u64_at(p, PTSCOPE_BRANCH_AT(time));
		flags[i] = ptscope_u32_at(p, PTSCOPE_BRANCH_AT(flags));
		src[i] = table[ip_loc];
		dst[i] = table[addr_loc];
		insn[i] = ptscope_u64_at(p, PTSCOPE_BRANCH_AT(insn_cnt));
		cyc[i] = ptscope_u64_at(p, PTSCOPE_BRANCH_AT(cyc_cnt));
		gap[i] = ptscope_u32_at(p, PTSCOPE_BRANCH_AT(gap_delta));
		gapn[i] = ptscope_u16_at(p, PTSCOPE_BRANCH_AT(gap_insns));
		offsets[i] = (int32_t)at;
		for (uint64_t k = 0; k < count; k++)
			lines[at++] = first + k;
	}
	Py_END_ALLOW_THREADS
	if (!fits) {
		PyErr_SetString(PyExc_ValueError, "the run does not fit the table or lines");
		goto out_cols;
	}
	offsets[n] = (int32_t)at;
	result = Py_NewRef(Py_None);
out_cols:
	while (held > 0)
		PyBuffer_Release(&cols[--held]);
out_ids:
	PyBuffer_Release(&ids);
out_view:
	PyBuffer_Release(&view);
	return result;
}

static PyMethodDef methods[] = {
	{"scan_tags", scan_tags, METH_VARARGS,
	 "(stop, first_lines, last_branch) of the rows where a run of branch records may be."},
	{"check_run", check_run, METH_VARARGS,
	 "(spent, lines) of a run of branch records the fast path takes, or None."},
	{"fill_run", (PyCFunction)(void (*)(void))fill_run, METH_FASTCALL,
	 "The columns of a run of branch records, written into the given arrays."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_crecords", "The dlfilter stream's branch runs, read in C.", -1,
	methods,
};

PyMODINIT_FUNC PyInit__crecords(void)
{
	return PyModule_Create(&module);
}
