/* Python binding of the own Intel PT decoder (_native/pt_*.c): buffers in, columns out.
 *
 *   Decoder(trace, config, queues, files, sideband, symbols, options)
 *       trace: a buffer (the perf.data, mapped); config: dict (time_shift, time_mult,
 *       time_zero, per_cpu, have_sched_switch, max_non_turbo_ratio, cbr2khz,
 *       return_compression, branch_enable, ctl, mtc_period, tsc_ctc_ratio_n,
 *       tsc_ctc_ratio_d, unknown_fn); queues: [(tid, cpu, [(offset, size, reference,
 *       consecutive), ...]), ...] (offsets into trace); files: [(data or None, dso id,
 *       unknown function id, identity), ...]; sideband: a buffer of struct pt_sb
 *       records (sideband_layout() gives its fields); symbols: called with a file's index
 *       the first time an address in it is resolved, returns None or the columns (start,
 *       end, sym_start, sym_end: uint64; name, fn: uint32) as buffers; options: dict
 *       (insns, keep_all, to_end, pids, tids, time_limit, count_budget).
 *   Decoder.run(max_rows) -> bool (True: the trace has ended)
 *   Decoder.take() -> (columns, events, locations): the rows since the last take, as
 *       bytes (columns in BranchBatch order: pid, tid, time, flags, src, dst, insn, cyc,
 *       gap_delta, gap_insns, line_offsets, lines), the struct pt_event and struct
 *       pt_location records (event_layout(), location_layout()).
 *   Decoder.counters() -> dict
 *   flatten_symbols(start, end, name_len, binding, underscores, sys_prefix, pass_) ->
 *       (start, end, sym, sym_end): a DSO's symbols (columns: uint64, uint64, uint32,
 *       uint8 x 4, in perf's order of insertion) as perf's lookup answers them
 *       (pt_symtree.c): intervals and the symbol each finds, as bytes of uint64, uint64,
 *       uint32, and every symbol's end once perf fixed it (uint64).
 *   packets(buffer) -> [(offset, type, size, count, ip, payload), ...]
 *   psb_tsc(buffer, start, end) -> (tsc, offset) or None
 *   insn(code) -> (length, kind, op, rel) or None
 *   error_message(code) -> str
 *
 * run() lets other threads run while it decodes (the trace's writer), and takes the GIL
 * back only to ask for a file's symbols.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "pt_decoder.h"
#include "pt_feed.h"
#include "pt_image.h"
#include "pt_insn.h"
#include "pt_packet.h"
#include "pt_session.h"
#include "pt_symtree.h"

typedef struct {
	PyObject_HEAD
	Py_buffer trace;
	bool have_trace;
	Py_buffer *files; /* their data */
	size_t nfiles;
	Py_buffer sideband;
	bool have_sideband;
	struct pt_buffer **bufs;
	size_t nqueues;
	PyObject *symbols;
	PyObject *pending_error; /* raised by the symbols callback */
	PyThreadState *released;
	struct pt_image image;
	struct pt_feed feed;
	struct pt_session session;
	bool ready;
} Decoder;

static int get_u64(PyObject *dict, const char *key, uint64_t *out, bool required)
{
	PyObject *v = PyDict_GetItemString(dict, key);
	if (!v) {
		if (required) {
			PyErr_Format(PyExc_KeyError, "config lacks %s", key);
			return -1;
		}
		return 0;
	}
	unsigned long long x = PyLong_AsUnsignedLongLongMask(v);
	if (PyErr_Occurred())
		return -1;
	*out = x;
	return 0;
}

/* The symbols callback: the binding asks Python (with the GIL) for a file's symbols. */
static int load_symbols(void *ctx, uint32_t file)
{
	Decoder *self = ctx;
	if (self->released)
		PyEval_RestoreThread(self->released);
	int ret = 0;
	PyObject *res = PyObject_CallFunction(self->symbols, "I", file);
	if (!res) {
		ret = -1;
	} else if (res != Py_None) {
		/* 6 columns of symbols, then (optional) 3 of inlined code */
		Py_buffer b[9];
		int got = 0, want = PyTuple_Check(res) ? (int)PyTuple_GET_SIZE(res) : 0;
		if (want != 6 && want != 9) {
			PyErr_SetString(PyExc_TypeError, "symbols must be 6 or 9 columns");
			ret = -1;
		} else {
			for (; got < want; got++)
				if (PyObject_GetBuffer(PyTuple_GET_ITEM(res, got), &b[got],
						       PyBUF_SIMPLE) < 0)
					break;
			if (got < want) {
				ret = -1;
			} else {
				size_t n = (size_t)b[0].len / 8;
				size_t ni = want == 9 ? (size_t)b[6].len / 8 : 0;
				if ((size_t)b[1].len / 8 != n || (size_t)b[2].len / 8 != n ||
				    (size_t)b[3].len / 8 != n || (size_t)b[4].len / 4 != n ||
				    (size_t)b[5].len / 4 != n ||
				    (want == 9 && ((size_t)b[7].len / 8 != ni ||
						   (size_t)b[8].len / 4 != ni))) {
					PyErr_SetString(PyExc_ValueError, "symbol columns differ");
					ret = -1;
				} else if (pt_image_set_symbols(&self->image, file, b[0].buf, b[1].buf,
								b[2].buf, b[3].buf, b[4].buf,
								b[5].buf, n) < 0 ||
					   (ni && pt_image_set_inline(&self->image, file, b[6].buf,
								      b[7].buf, b[8].buf, ni) < 0)) {
					PyErr_NoMemory();
					ret = -1;
				}
			}
		}
		for (int i = 0; i < got; i++)
			PyBuffer_Release(&b[i]);
	}
	Py_XDECREF(res);
	if (ret < 0 && !self->pending_error) {
		PyObject *type, *value, *tb;
		PyErr_Fetch(&type, &value, &tb);
		PyErr_NormalizeException(&type, &value, &tb);
		self->pending_error = value ? value : type;
		if (value)
			Py_XDECREF(type);
		Py_XDECREF(tb);
	}
	PyErr_Clear();
	if (self->released)
		self->released = PyEval_SaveThread();
	return ret;
}

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds)
{
	PyObject *trace, *config, *queues, *files, *sideband, *symbols, *options;
	static char *kw[] = { "trace", "config", "queues", "files", "sideband", "symbols",
			      "options", NULL };
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O!O!OOO!", kw, &trace, &PyDict_Type, &config,
					 &PyList_Type, &queues, &PyList_Type, &files, &sideband,
					 &symbols, &PyDict_Type, &options))
		return -1;
	if (self->ready) {
		PyErr_SetString(PyExc_RuntimeError, "already initialised");
		return -1;
	}
	if (PyObject_GetBuffer(trace, &self->trace, PyBUF_SIMPLE) < 0)
		return -1;
	self->have_trace = true;
	if (PyObject_GetBuffer(sideband, &self->sideband, PyBUF_SIMPLE) < 0)
		return -1;
	self->have_sideband = true;
	Py_INCREF(symbols);
	self->symbols = symbols;

	struct pt_session_config cfg = { 0 };
	uint64_t v = 0;
#define U64(key, field, req)                                      \
	do {                                                      \
		v = 0;                                            \
		if (get_u64(config, key, &v, req) < 0)            \
			return -1;                                \
		field = v;                                        \
	} while (0)
	U64("time_shift", cfg.time_shift, true);
	U64("time_mult", cfg.time_mult, true);
	U64("time_zero", cfg.time_zero, true);
	U64("per_cpu", cfg.per_cpu, false);
	U64("have_sched_switch", cfg.have_sched_switch, false);
	U64("max_non_turbo_ratio", cfg.max_non_turbo_ratio, true);
	U64("cbr2khz", cfg.cbr2khz, true);
	U64("return_compression", cfg.dec.return_compression, true);
	U64("branch_enable", cfg.dec.branch_enable, true);
	U64("ctl", cfg.dec.ctl, false);
	U64("mtc_period", cfg.dec.mtc_period, false);
	U64("tsc_ctc_ratio_n", cfg.dec.tsc_ctc_ratio_n, false);
	U64("tsc_ctc_ratio_d", cfg.dec.tsc_ctc_ratio_d, false);
	U64("max_loops", cfg.dec.max_loops, false);
	U64("fup_with_nlip", cfg.dec.fup_with_nlip, false);
	U64("release_input", cfg.dec.release_input, false);
	cfg.dec.max_non_turbo_ratio = cfg.max_non_turbo_ratio;
	uint64_t unknown_fn = 0, insns = 0, keep_all = 0, to_end = 0;
	if (get_u64(config, "unknown_fn", &unknown_fn, true) < 0 ||
	    get_u64(options, "insns", &insns, false) < 0 ||
	    get_u64(options, "keep_all", &keep_all, false) < 0 ||
	    get_u64(options, "to_end", &to_end, false) < 0)
		return -1;
#undef U64

	pt_image_init(&self->image);
	self->image.unknown_fn = (uint32_t)unknown_fn;
	self->image.load_symbols = load_symbols;
	self->image.load_ctx = self;
	uint64_t time_limit = 0, count_budget = 0;
	if (get_u64(options, "time_limit", &time_limit, true) < 0 ||
	    get_u64(options, "count_budget", &count_budget, true) < 0)
		return -1;
	if (pt_feed_init(&self->feed, &self->image, keep_all, to_end, insns) < 0) {
		PyErr_NoMemory();
		return -1;
	}
	pt_feed_limits(&self->feed, time_limit, count_budget);
	pt_session_init(&self->session, &cfg, &self->image, &self->feed);
	self->ready = true; /* (from here on, dealloc frees the C state) */

	for (int side = 0; side < 2; side++) {
		PyObject *ids = PyDict_GetItemString(options, side ? "tids" : "pids");
		if (!ids || ids == Py_None)
			continue;
		PyObject *seq = PySequence_Fast(ids, "pids/tids must be a sequence");
		if (!seq)
			return -1;
		Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
		int32_t *v32 = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(*v32));
		if (!v32) {
			Py_DECREF(seq);
			PyErr_NoMemory();
			return -1;
		}
		for (Py_ssize_t i = 0; i < n; i++)
			v32[i] = (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
		Py_DECREF(seq);
		int err = side ? pt_feed_select(&self->feed, NULL, 0, v32, (size_t)n)
			       : pt_feed_select(&self->feed, v32, (size_t)n, NULL, 0);
		PyMem_Free(v32);
		if (PyErr_Occurred())
			return -1;
		if (err < 0) {
			PyErr_NoMemory();
			return -1;
		}
	}

	Py_ssize_t nfiles = PyList_GET_SIZE(files);
	self->files = PyMem_Calloc((size_t)(nfiles ? nfiles : 1), sizeof(Py_buffer));
	if (!self->files) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < nfiles; i++) {
		PyObject *data;
		unsigned int dso, ufn;
		int identity;
		if (!PyArg_ParseTuple(PyList_GET_ITEM(files, i), "OIIp", &data, &dso, &ufn, &identity))
			return -1;
		const uint8_t *p = NULL;
		size_t size = 0;
		if (data != Py_None) {
			if (PyObject_GetBuffer(data, &self->files[i], PyBUF_SIMPLE) < 0)
				return -1;
			self->nfiles = (size_t)i + 1;
			p = self->files[i].buf;
			size = (size_t)self->files[i].len;
		}
		if (pt_image_add_file(&self->image, p, size, dso, ufn, identity) < 0) {
			PyErr_NoMemory();
			return -1;
		}
	}
	self->nfiles = (size_t)nfiles;

	Py_ssize_t nq = PyList_GET_SIZE(queues);
	self->bufs = PyMem_Calloc((size_t)(nq ? nq : 1), sizeof(*self->bufs));
	if (!self->bufs) {
		PyErr_NoMemory();
		return -1;
	}
	self->nqueues = (size_t)nq;
	for (Py_ssize_t i = 0; i < nq; i++) {
		int tid, cpu;
		PyObject *blist;
		if (!PyArg_ParseTuple(PyList_GET_ITEM(queues, i), "iiO!", &tid, &cpu, &PyList_Type,
				      &blist))
			return -1;
		Py_ssize_t nb = PyList_GET_SIZE(blist);
		struct pt_buffer *bufs = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof(*bufs));
		if (!bufs) {
			PyErr_NoMemory();
			return -1;
		}
		self->bufs[i] = bufs;
		for (Py_ssize_t k = 0; k < nb; k++) {
			unsigned long long off, size, ref;
			int consecutive;
			if (!PyArg_ParseTuple(PyList_GET_ITEM(blist, k), "KKKp", &off, &size, &ref,
					      &consecutive))
				return -1;
			if (off > (unsigned long long)self->trace.len ||
			    size > (unsigned long long)self->trace.len - off) {
				PyErr_SetString(PyExc_ValueError, "a buffer lies outside the trace");
				return -1;
			}
			bufs[k] = (struct pt_buffer){ (const uint8_t *)self->trace.buf + off,
						      (size_t)size, ref, consecutive };
		}
		if (pt_session_add_queue(&self->session, tid, cpu, bufs, (size_t)nb) < 0) {
			PyErr_NoMemory();
			return -1;
		}
	}
	if (self->sideband.len % sizeof(struct pt_sb)) {
		PyErr_SetString(PyExc_ValueError, "sideband records have the wrong size");
		return -1;
	}
	pt_session_set_sideband(&self->session, self->sideband.buf,
				(size_t)self->sideband.len / sizeof(struct pt_sb));
	return 0;
}

static void Decoder_dealloc(Decoder *self)
{
	if (self->ready) {
		pt_session_free(&self->session);
		pt_feed_free(&self->feed);
		pt_image_free(&self->image);
	}
	if (self->bufs) {
		for (size_t i = 0; i < self->nqueues; i++)
			PyMem_Free(self->bufs[i]);
		PyMem_Free(self->bufs);
	}
	if (self->files) {
		for (size_t i = 0; i < self->nfiles; i++)
			if (self->files[i].obj)
				PyBuffer_Release(&self->files[i]);
		PyMem_Free(self->files);
	}
	if (self->have_trace)
		PyBuffer_Release(&self->trace);
	if (self->have_sideband)
		PyBuffer_Release(&self->sideband);
	Py_XDECREF(self->symbols);
	Py_XDECREF(self->pending_error);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Decoder_run(Decoder *self, PyObject *arg)
{
	Py_ssize_t max_rows = PyLong_AsSsize_t(arg);
	if (max_rows < 0 && PyErr_Occurred())
		return NULL;
	if (!self->ready) {
		PyErr_SetString(PyExc_RuntimeError, "not initialised");
		return NULL;
	}
	self->released = PyEval_SaveThread();
	int r = pt_session_run(&self->session, (size_t)max_rows);
	PyEval_RestoreThread(self->released);
	self->released = NULL;
	if (self->pending_error) {
		PyObject *e = self->pending_error;
		self->pending_error = NULL;
		PyErr_SetObject((PyObject *)Py_TYPE(e), e);
		Py_DECREF(e);
		return NULL;
	}
	if (r < 0) {
		PyErr_SetString(PyExc_MemoryError, self->session.message);
		return NULL;
	}
	return PyBool_FromLong(r == 1);
}

static PyObject *bytes_of(const struct pt_vec *v)
{
	return PyBytes_FromStringAndSize(v->p ? v->p : "", (Py_ssize_t)(v->n * v->size));
}

static PyObject *Decoder_take(Decoder *self, PyObject *Py_UNUSED(ignored))
{
	struct pt_feed *f = &self->feed;
	const struct pt_vec *cols[] = { &f->pid, &f->tid, &f->time, &f->flags, &f->src,
					&f->dst, &f->insn, &f->cyc, &f->gap_delta, &f->gap_insns,
					&f->line_offsets, &f->lines };
	size_t ncols = sizeof(cols) / sizeof(cols[0]);
	PyObject *tuple = PyTuple_New((Py_ssize_t)ncols);
	if (!tuple)
		return NULL;
	for (size_t i = 0; i < ncols; i++) {
		PyObject *b = bytes_of(cols[i]);
		if (!b) {
			Py_DECREF(tuple);
			return NULL;
		}
		PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, b);
	}
	PyObject *res = Py_BuildValue("(NNN)", tuple, bytes_of(&f->events), bytes_of(&f->locations));
	if (res)
		pt_feed_clear(f);
	return res;
}

static PyObject *Decoder_counters(Decoder *self, PyObject *Py_UNUSED(ignored))
{
	struct pt_feed *f = &self->feed;
	return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "samples", (unsigned long long)f->samples,
			     "branches_kept", (unsigned long long)f->kept, "branches_dropped",
			     (unsigned long long)f->dropped, "power", (unsigned long long)f->power,
			     "other", (unsigned long long)f->other, "blocks_unknown",
			     (unsigned long long)f->blocks_unknown);
}

static PyMethodDef Decoder_methods[] = {
	{ "run", (PyCFunction)Decoder_run, METH_O, "Decode until max_rows rows or the end." },
	{ "take", (PyCFunction)Decoder_take, METH_NOARGS, "The rows, events, locations so far." },
	{ "counters", (PyCFunction)Decoder_counters, METH_NOARGS, "The feed's counters." },
	{ NULL, NULL, 0, NULL },
};

static PyTypeObject DecoderType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptscope.decode._ptdecode.Decoder",
	.tp_basicsize = sizeof(Decoder),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "The own Intel PT decoder of one perf.data.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Decoder_init,
	.tp_dealloc = (destructor)Decoder_dealloc,
	.tp_methods = Decoder_methods,
};

static PyObject *packets(PyObject *Py_UNUSED(m), PyObject *arg)
{
	Py_buffer view;
	if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
		return NULL;
	PyObject *out = PyList_New(0);
	const uint8_t *p = view.buf;
	size_t len = (size_t)view.len, pos = 0;
	struct pt_packet_ctx ctx = { 0 };
	while (out && pos < len) {
		struct pt_packet pkt;
		memset(&pkt, 0, sizeof(pkt));
		size_t n = pt_packet_next(p + pos, len - pos, &ctx, &pkt);
		if (n == PT_NEED_MORE)
			break;
		pt_packet_update_ctx(&ctx, &pkt);
		PyObject *t = Py_BuildValue("(nIIIIK)", (Py_ssize_t)pos, (unsigned)pkt.type,
					    (unsigned)pkt.size, (unsigned)pkt.count,
					    (unsigned)pkt.ip, (unsigned long long)pkt.payload);
		if (!t || PyList_Append(out, t) < 0) {
			Py_XDECREF(t);
			Py_CLEAR(out);
			break;
		}
		Py_DECREF(t);
		pos += n;
	}
	PyBuffer_Release(&view);
	return out;
}

/* The TSC of the PSB+ at `start` of `buffer` (up to `end`), as perf's overlap search
 * reads it: (payload, offset of the TSC packet), or None where the PSB+ ends (PSBEND),
 * a packet is bad or cut, or `end` comes first. */
static PyObject *psb_tsc(PyObject *Py_UNUSED(m), PyObject *args)
{
	Py_buffer view;
	Py_ssize_t start, end;
	if (!PyArg_ParseTuple(args, "y*nn", &view, &start, &end))
		return NULL;
	if (start < 0 || end > view.len || start > end) {
		PyBuffer_Release(&view);
		PyErr_SetString(PyExc_ValueError, "psb_tsc: range outside the buffer");
		return NULL;
	}
	const uint8_t *p = view.buf;
	size_t pos = (size_t)start, stop = (size_t)end;
	struct pt_packet_ctx ctx = { 0 };
	PyObject *res = NULL;
	while (pos < stop) {
		struct pt_packet pkt;
		memset(&pkt, 0, sizeof(pkt));
		size_t n = pt_packet_next(p + pos, stop - pos, &ctx, &pkt);
		if (n == PT_NEED_MORE || pkt.type == PT_PKT_BAD || pkt.type == PT_PKT_PSBEND)
			break;
		if (pkt.type == PT_PKT_TSC) {
			res = Py_BuildValue("(Kn)", (unsigned long long)pkt.payload, (Py_ssize_t)pos);
			break;
		}
		pt_packet_update_ctx(&ctx, &pkt);
		pos += n;
	}
	PyBuffer_Release(&view);
	if (!res && !PyErr_Occurred())
		Py_RETURN_NONE;
	return res;
}

/* One instruction as the walker sees it (tests: against capstone). */
static PyObject *insn(PyObject *Py_UNUSED(m), PyObject *arg)
{
	Py_buffer view;
	if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
		return NULL;
	struct pt_insn in;
	int ok = pt_insn_decode(view.buf, (size_t)view.len, &in);
	PyBuffer_Release(&view);
	if (!ok)
		Py_RETURN_NONE;
	return Py_BuildValue("(iiii)", in.length, in.kind, in.op, in.rel);
}

static PyObject *flatten_symbols(PyObject *Py_UNUSED(m), PyObject *args)
{
	PyObject *objs[7];
	if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
			      &objs[5], &objs[6]))
		return NULL;
	Py_buffer b[7];
	int got = 0;
	PyObject *res = NULL;
	struct pt_sym_in *in = NULL;
	for (; got < 7; got++)
		if (PyObject_GetBuffer(objs[got], &b[got], PyBUF_SIMPLE) < 0)
			goto out;
	size_t n = (size_t)b[0].len / 8;
	const size_t widths[7] = { 8, 8, 4, 1, 1, 1, 1 };
	for (int i = 0; i < 7; i++) {
		if ((size_t)b[i].len != n * widths[i]) {
			PyErr_SetString(PyExc_ValueError, "symbol columns differ in length");
			goto out;
		}
	}
	in = PyMem_Malloc((n ? n : 1) * sizeof(*in));
	if (!in) {
		PyErr_NoMemory();
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		in[i].start = ((const uint64_t *)b[0].buf)[i];
		in[i].end = ((const uint64_t *)b[1].buf)[i];
		in[i].name_len = ((const uint32_t *)b[2].buf)[i];
		in[i].binding = ((const uint8_t *)b[3].buf)[i];
		in[i].underscores = ((const uint8_t *)b[4].buf)[i];
		in[i].sys_prefix = ((const uint8_t *)b[5].buf)[i];
		in[i].pass = ((const uint8_t *)b[6].buf)[i];
	}
	struct pt_symtree_out o;
	int err;
	Py_BEGIN_ALLOW_THREADS
	err = pt_symtree_flatten(in, n, &o);
	Py_END_ALLOW_THREADS
	if (err < 0) {
		PyErr_NoMemory();
		goto out;
	}
	res = Py_BuildValue("(y#y#y#y#)", (const char *)o.start, (Py_ssize_t)(o.n * 8),
			    (const char *)o.end, (Py_ssize_t)(o.n * 8), (const char *)o.sym,
			    (Py_ssize_t)(o.n * 4), (const char *)o.sym_end, (Py_ssize_t)(n * 8));
	pt_symtree_free(&o);
out:
	PyMem_Free(in);
	for (int i = 0; i < got; i++)
		PyBuffer_Release(&b[i]);
	return res;
}

static PyObject *error_message(PyObject *Py_UNUSED(m), PyObject *arg)
{
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(pt_error_message((int)code));
}

#define FIELD(s, f) #f, (Py_ssize_t)offsetof(struct s, f), (Py_ssize_t)sizeof(((struct s *)0)->f)

static PyObject *sideband_layout(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
	return Py_BuildValue(
		"(n[(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)])",
		(Py_ssize_t)sizeof(struct pt_sb), FIELD(pt_sb, time), FIELD(pt_sb, kind),
		FIELD(pt_sb, flags), FIELD(pt_sb, pid), FIELD(pt_sb, tid), FIELD(pt_sb, ppid),
		FIELD(pt_sb, ptid), FIELD(pt_sb, sample_pid), FIELD(pt_sb, sample_tid),
		FIELD(pt_sb, cpu), FIELD(pt_sb, start), FIELD(pt_sb, len), FIELD(pt_sb, pgoff),
		FIELD(pt_sb, file), FIELD(pt_sb, name), FIELD(pt_sb, aux_flags));
}

static PyObject *event_layout(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
	return Py_BuildValue("(n[(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)(snn)])",
			     (Py_ssize_t)sizeof(struct pt_event), FIELD(pt_event, kind),
			     FIELD(pt_event, row), FIELD(pt_event, pid), FIELD(pt_event, tid),
			     FIELD(pt_event, cpu), FIELD(pt_event, code), FIELD(pt_event, time),
			     FIELD(pt_event, ip), FIELD(pt_event, value));
}

static PyObject *location_layout(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
	return Py_BuildValue("(n[(snn)(snn)(snn)(snn)(snn)(snn)])",
			     (Py_ssize_t)sizeof(struct pt_location), FIELD(pt_location, ip),
			     FIELD(pt_location, offset), FIELD(pt_location, name),
			     FIELD(pt_location, dso), FIELD(pt_location, pid),
			     FIELD(pt_location, node));
}

static PyMethodDef methods[] = {
	{ "packets", packets, METH_O, "Every packet of a buffer of Intel PT bytes." },
	{ "insn", insn, METH_O, "(length, kind, op, rel) of an instruction, or None." },
	{ "psb_tsc", psb_tsc, METH_VARARGS, "The TSC of a PSB+ (perf's overlap search)." },
	{ "flatten_symbols", flatten_symbols, METH_VARARGS, "A DSO's symbols as perf finds them." },
	{ "error_message", error_message, METH_O, "perf's message for an error code." },
	{ "sideband_layout", sideband_layout, METH_NOARGS, "struct pt_sb: size, fields." },
	{ "event_layout", event_layout, METH_NOARGS, "struct pt_event: size, fields." },
	{ "location_layout", location_layout, METH_NOARGS, "struct pt_location: size, fields." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_ptdecode", "The own Intel PT decoder (C).", -1, methods,
};

PyMODINIT_FUNC PyInit__ptdecode(void)
{
	if (PyType_Ready(&DecoderType) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&module);
	if (!m)
		return NULL;
	Py_INCREF(&DecoderType);
	if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
		Py_DECREF(&DecoderType);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
