/* The streaming trace-segment engine for Python: ptscope.reconstruct._cengine.
 *
 * The engine itself is _native/engine.c (its rules, without Python); this file turns
 * Python's buffers (numpy columns) into its columns, its failure codes into exceptions,
 * and its output vectors into buffers numpy reads without a copy (Block). The landing-pad
 * lookups it asks for go to a Python callable (decode/landing_pads.py through
 * fast_engine.py), once per location.
 *
 * feed() lets other Python threads run while the engine works on a batch (the trace's
 * writer thread, fxt/background.py, encodes and compresses beside it): it holds the GIL
 * again only to ask a landing-pad question. Meanwhile the object refuses every other call
 * (`feeding`), so that no second thread can reach the engine's state.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine.h"

typedef struct {
	PyObject_HEAD
	Engine core;
	PyObject *landing_pads; /* location id -> [(start, end)] call sites landing there */
	Vec pairs;		/* the last answer of landing_pads, for the engine */
	bool feeding;		/* feed() runs without the GIL: nothing else may run */
} EngineObject;

/* The exception for a failure code (the engine's message says what). */
static PyObject *failed(EngineObject *self, int error)
{
	const char *message = self->core.message;
	switch (error) {
	case PTSCOPE_ENGINE_NOMEM:
		return PyErr_NoMemory();
	case PTSCOPE_ENGINE_BAD_INPUT:
		PyErr_SetString(PyExc_ValueError, message);
		return NULL;
	case PTSCOPE_ENGINE_OVERFLOW:
		PyErr_SetString(PyExc_OverflowError, message);
		return NULL;
	default: /* broken, finished, an internal inconsistency */
		PyErr_SetString(PyExc_RuntimeError, message);
		return NULL;
	}
}

/* The engine's landing-pad question, asked of the Python callable: a lookup that fails
 * knows no landing pad (the nearest frame wins). */
static size_t python_landing_pads(void *ctx, int32_t loc, const int64_t **pairs)
{
	EngineObject *self = ctx;
	self->pairs.n = 0;
	*pairs = NULL;
	PyGILState_STATE gil = PyGILState_Ensure(); /* feed() let it go */
	PyObject *res = PyObject_CallFunction(self->landing_pads, "i", loc);
	PyObject *seq = res ? PySequence_Fast(res, "landing pads: not a sequence") : NULL;
	size_t count = 0;
	if (seq) {
		Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
		if (n > 0 && (size_t)n * 2 > self->pairs.cap) {
			int64_t *v = realloc(self->pairs.v, (size_t)n * 2 * sizeof(int64_t));
			if (v) {
				self->pairs.v = v;
				self->pairs.cap = (size_t)n * 2;
			} else {
				n = 0;
			}
		}
		for (Py_ssize_t i = 0; i < n; i++) {
			long long a, b;
			if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "LL", &a, &b))
				break;
			self->pairs.v[2 * count] = a;
			self->pairs.v[2 * count + 1] = b;
			count++;
		}
	}
	Py_XDECREF(seq);
	Py_XDECREF(res);
	PyErr_Clear();
	PyGILState_Release(gil);
	*pairs = self->pairs.v;
	return count;
}

/* NULL with the exception while another thread's feed() runs the engine. */
#define IDLE(self)                                                                        \
	do {                                                                              \
		if ((self)->feeding) {                                                    \
			PyErr_SetString(PyExc_RuntimeError,                               \
					"the engine is in use by another thread");        \
			return NULL;                                                      \
		}                                                                         \
	} while (0)

/* NULL with the exception when the engine takes no more (see ptscope_engine_usable);
 * after IDLE, which every method checks first. */
#define USABLE(self, open)                                                                \
	do {                                                                              \
		int refused = ptscope_engine_usable(&(self)->core, (open));               \
		if (refused)                                                              \
			return failed((self), refused);                                   \
	} while (0)

static int engine_init(EngineObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"max_examples", "keep_slots", "axis", "spread", NULL};
	Py_ssize_t max_examples = 5;
	int keep_slots = 0, axis = AXIS_TIME, spread = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|npip", kwlist, &max_examples, &keep_slots,
					 &axis, &spread))
		return -1;
	int error = ptscope_engine_init(&self->core, max_examples < 0 ? 0 : (size_t)max_examples,
					keep_slots, axis, spread);
	return error ? (failed(self, error), -1) : 0;
}

static void engine_dealloc(EngineObject *self)
{
	ptscope_engine_free(&self->core);
	Py_XDECREF(self->landing_pads);
	free(self->pairs.v);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A 1-D buffer of `n` items of `size` bytes (any stride). */
typedef struct {
	Py_buffer view;
	const char *p;
	Py_ssize_t stride;
	bool held;
} Column;

static int column_get(Column *c, PyObject *obj, Py_ssize_t size, const char *name)
{
	if (PyObject_GetBuffer(obj, &c->view, PyBUF_STRIDED_RO) < 0)
		return -1;
	c->held = true;
	if (c->view.ndim != 1 || c->view.itemsize != size) {
		PyErr_Format(PyExc_ValueError, "%s must be a 1-D buffer of %zd-byte items", name,
			     size);
		return -1;
	}
	c->p = c->view.buf;
	c->stride = c->view.strides ? c->view.strides[0] : size;
	return 0;
}

static void columns_release(Column *cols, int n)
{
	for (int i = 0; i < n; i++)
		if (cols[i].held)
			PyBuffer_Release(&cols[i].view);
}



#define AT(col, type, i) (*(const type *)((col).p + (i) * (col).stride))

static ptscope_column as_column(const Column *c)
{
	return (ptscope_column){c->held ? c->p : NULL, c->stride};
}

static PyObject *engine_add_locations(EngineObject *self, PyObject *args)
{
	IDLE(self);
	PyObject *objs[4];
	if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]))
		return NULL;
	USABLE(self, false);
	static const char *names[] = {"function", "entry", "offset", "ip"};
	static const Py_ssize_t sizes[] = {4, 8, 8, 8};
	Column cols[4] = {0};
	for (int i = 0; i < 4; i++) {
		if (column_get(&cols[i], objs[i], sizes[i], names[i]) < 0) {
			columns_release(cols, 4);
			return NULL;
		}
	}
	Py_ssize_t n = cols[0].view.shape[0];
	for (int i = 1; i < 4; i++) {
		if (cols[i].view.shape[0] != n) {
			columns_release(cols, 4);
			PyErr_SetString(PyExc_ValueError, "location columns differ in length");
			return NULL;
		}
	}
	int error = ptscope_engine_add_locations(&self->core, as_column(&cols[0]),
						 as_column(&cols[1]), as_column(&cols[2]),
						 as_column(&cols[3]), (size_t)n);
	columns_release(cols, 4);
	if (error)
		return failed(self, error);
	return PyLong_FromSize_t(self->core.nloc);
}

/* Contiguous int32 columns (numpy arrays) of one length. */
static int int32_columns(Column *cols, PyObject **objs, int n, const char *what)
{
	for (int i = 0; i < n; i++) {
		if (column_get(&cols[i], objs[i], 4, what) < 0)
			return -1;
		if (cols[i].stride != 4 || cols[i].view.shape[0] != cols[0].view.shape[0]) {
			PyErr_Format(PyExc_ValueError, "%s: contiguous columns of one length", what);
			return -1;
		}
	}
	return 0;
}

static PyObject *engine_add_inline_nodes(EngineObject *self, PyObject *args)
{
	IDLE(self);
	PyObject *objs[2];
	if (!PyArg_ParseTuple(args, "OO", &objs[0], &objs[1]))
		return NULL;
	USABLE(self, false);
	Column cols[2] = {0};
	if (int32_columns(cols, objs, 2, "inlined bodies") < 0) {
		columns_release(cols, 2);
		return NULL;
	}
	int error = ptscope_engine_add_inline_nodes(&self->core, (const int32_t *)cols[0].p,
						    (const int32_t *)cols[1].p,
						    (size_t)cols[0].view.shape[0]);
	columns_release(cols, 2);
	if (error)
		return failed(self, error);
	return PyLong_FromSize_t(self->core.nnodes);
}

static PyObject *engine_set_location_nodes(EngineObject *self, PyObject *args)
{
	IDLE(self);
	Py_ssize_t first;
	PyObject *objs[1];
	if (!PyArg_ParseTuple(args, "nO", &first, &objs[0]))
		return NULL;
	USABLE(self, false);
	Column cols[1] = {0};
	if (first < 0) {
		PyErr_SetString(PyExc_ValueError, "negative location id");
		return NULL;
	}
	if (int32_columns(cols, objs, 1, "location nodes") < 0) {
		columns_release(cols, 1);
		return NULL;
	}
	int error = ptscope_engine_set_location_nodes(&self->core, (size_t)first,
						      (const int32_t *)cols[0].p,
						      (size_t)cols[0].view.shape[0]);
	columns_release(cols, 1);
	if (error)
		return failed(self, error);
	Py_RETURN_NONE;
}

static PyObject *engine_mark_function(EngineObject *self, PyObject *args)
{
	IDLE(self);
	int fn, flags;
	if (!PyArg_ParseTuple(args, "ii", &fn, &flags))
		return NULL;
	int error = ptscope_engine_mark_function(&self->core, fn, flags);
	if (error)
		return failed(self, error);
	Py_RETURN_NONE;
}

static PyObject *engine_set_landing_pads(EngineObject *self, PyObject *args)
{
	IDLE(self);
	PyObject *cb;
	if (!PyArg_ParseTuple(args, "O", &cb))
		return NULL;
	USABLE(self, false);
	if (cb != Py_None && !PyCallable_Check(cb)) {
		PyErr_SetString(PyExc_TypeError, "landing pads: a callable or None");
		return NULL;
	}
	Py_XDECREF(self->landing_pads);
	self->landing_pads = cb == Py_None ? NULL : Py_NewRef(cb);
	ptscope_engine_set_landing_pads(&self->core, cb == Py_None ? NULL : python_landing_pads,
					self);
	Py_RETURN_NONE;
}

static PyObject *engine_feed_batch(EngineObject *self, PyObject *args)
{
	IDLE(self);
	PyObject *objs[NCOLS + 3] = {0};
	if (!PyArg_ParseTuple(args, "OOOOOOOOO|OOO", &objs[0], &objs[1], &objs[2], &objs[3],
			      &objs[4], &objs[5], &objs[6], &objs[7], &objs[8], &objs[9],
			      &objs[10], &objs[11]))
		return NULL;
	bool has_lines = objs[9] && objs[9] != Py_None;
	Engine *e = &self->core;
	USABLE(self, true);
	static const char *names[] = {"pid", "tid",	   "time",	  "flags",    "src",
				      "dst", "insn_count", "cycle_count", "gap_delta"};
	static const Py_ssize_t sizes[] = {4, 4, 8, 4, 4, 4, 8, 8, 4};
	Column cols[NCOLS + 3] = {0};
	for (int i = 0; i < NCOLS; i++) {
		if (column_get(&cols[i], objs[i], sizes[i], names[i]) < 0) {
			columns_release(cols, NCOLS + 3);
			return NULL;
		}
	}
	Py_ssize_t n = cols[0].view.shape[0];
	for (int i = 1; i < NCOLS; i++) {
		if (cols[i].view.shape[0] != n) {
			columns_release(cols, NCOLS + 3);
			PyErr_SetString(PyExc_ValueError, "batch columns differ in length");
			return NULL;
		}
	}
	/* Code lines (instruction detail): row i's are lines[line_offsets[i]:line_offsets[i+1]]. */
	if (has_lines) {
		if (column_get(&cols[NCOLS], objs[9], 4, "line_offsets") < 0 ||
		    column_get(&cols[NCOLS + 1], objs[10] ? objs[10] : Py_None, 8, "lines") < 0) {
			columns_release(cols, NCOLS + 3);
			return NULL;
		}
		Py_ssize_t nl = cols[NCOLS + 1].view.shape[0];
		bool ok = cols[NCOLS].view.shape[0] == n + 1 && cols[NCOLS + 1].view.strides[0] == 8 &&
			  AT(cols[NCOLS], int32_t, 0) == 0 && AT(cols[NCOLS], int32_t, n) == nl;
		for (Py_ssize_t i = 0; ok && i < n; i++)
			ok = AT(cols[NCOLS], int32_t, i) <= AT(cols[NCOLS], int32_t, i + 1);
		if (!ok) {
			columns_release(cols, NCOLS + 3);
			PyErr_SetString(PyExc_ValueError, "line offsets do not fit the lines");
			return NULL;
		}
	}
	/* Where perf's clock moved on among a row's instructions (model.BranchEvent.gap_insns). */
	bool has_gap_insns = objs[11] && objs[11] != Py_None;
	if (has_gap_insns) {
		if (column_get(&cols[NCOLS + 2], objs[11], 2, "gap_insns") < 0) {
			columns_release(cols, NCOLS + 3);
			return NULL;
		}
		if (cols[NCOLS + 2].view.shape[0] != n) {
			columns_release(cols, NCOLS + 3);
			PyErr_SetString(PyExc_ValueError, "batch columns differ in length");
			return NULL;
		}
	}
	ptscope_column in[NCOLS + 3];
	for (int i = 0; i < NCOLS + 3; i++)
		in[i] = as_column(&cols[i]);
	int error;
	/* The columns' buffers stay held (cols) until the engine is done with them. */
	self->feeding = true;
	Py_BEGIN_ALLOW_THREADS
	error = ptscope_engine_feed(e, in, (size_t)n, has_lines ? &in[NCOLS] : NULL,
				    has_lines ? (const uint64_t *)cols[NCOLS + 1].p : NULL,
				    has_gap_insns ? &in[NCOLS + 2] : NULL);
	Py_END_ALLOW_THREADS
	self->feeding = false;
	columns_release(cols, NCOLS + 3);
	if (error)
		return failed(self, error);
	Py_RETURN_NONE;
}

/* engine.py: TraceSegmentEngine.decode_error. pid/tid < 0: unknown. Returns whether the
 * error was attributed to a thread (if not, Python keeps it as an orphan). */
static PyObject *engine_decode_error(EngineObject *self, PyObject *args)
{
	IDLE(self);
	long long pid, tid, time;
	int has_time;
	Py_ssize_t message;
	if (!PyArg_ParseTuple(args, "LLpLn", &pid, &tid, &has_time, &time, &message))
		return NULL;
	bool attributed;
	int error = ptscope_engine_decode_error(&self->core, pid, tid, has_time, time, message,
						&attributed);
	if (error)
		return failed(self, error);
	return PyBool_FromLong(attributed);
}

static PyObject *engine_counter(EngineObject *self, PyObject *args)
{
	IDLE(self);
	long long pid, tid, time, value;
	Py_ssize_t name;
	if (!PyArg_ParseTuple(args, "LLLnL", &pid, &tid, &time, &name, &value))
		return NULL;
	int error = ptscope_engine_counter(&self->core, pid, tid, time, name, value);
	if (error)
		return failed(self, error);
	Py_RETURN_NONE;
}

static PyObject *engine_end_segment(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	int error = ptscope_engine_end_segment(&self->core);
	if (error)
		return failed(self, error);
	Py_RETURN_NONE;
}

static PyObject *engine_close_all(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	int error = ptscope_engine_close_all(&self->core);
	if (error)
		return failed(self, error);
	Py_RETURN_NONE;
}

static PyObject *engine_slot_count(EngineObject *self, PyObject *args)
{
	IDLE(self);
	long long pid, tid;
	if (!PyArg_ParseTuple(args, "LL", &pid, &tid))
		return NULL;
	Thread *th = ptscope_engine_find_thread(&self->core, pid, tid);
	return PyLong_FromLongLong(th ? th->nslots : 0);
}

static PyObject *engine_stats(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	Engine *e = &self->core;
	return Py_BuildValue("(LLLLLLLL)", (long long)e->events, (long long)e->branches,
			     (long long)e->decode_errors, (long long)e->segments_started,
			     (long long)e->stitched, (long long)e->roots_inferred,
			     (long long)e->unexpected, (long long)e->ignored);
}

/* What the engine holds now: for tests and benchmarks of its memory. */
static PyObject *engine_memory(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	Engine *e = &self->core;
	size_t window = 0, waiters = 0, arena = 0, groups = 0, contexts = 0;
	for (size_t i = 0; i < e->nthreads; i++) {
		Thread *th = e->threads[i];
		contexts += th->nctx;
		window += th->nwin;
		waiters += th->nwait;
		arena += th->nfr;
		for (size_t g = 0; g < th->ngroups; g++)
			groups += th->groups[g].n;
	}
	return Py_BuildValue("{sLsLsnsnsnsnsLsn}", "live_frames", (long long)e->live_frames,
			     "peak_frames", (long long)e->peak_frames, "window_slots",
			     (Py_ssize_t)window, "waiters", (Py_ssize_t)waiters, "arena_frames",
			     (Py_ssize_t)arena, "held_frames", (Py_ssize_t)groups,
			     "slices_written", (long long)e->slices_out, "contexts",
			     (Py_ssize_t)contexts);
}

static PyObject *engine_lines_on(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	return PyBool_FromLong(self->core.lines_on);
}

/* Slices written and not yet taken. */
static PyObject *engine_pending(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	Engine *e = &self->core;
	return PyLong_FromSize_t(e->out[O_PID].n + e->inst[I_PID].n + e->ctr[N_PID].n);
}

/* The earliest time of any thread's first slot (no slice starts before it), or None. */
static PyObject *engine_first_time(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	if (!self->core.nthreads)
		Py_RETURN_NONE;
	return PyLong_FromLongLong(self->core.first_time);
}

static PyObject *engine_examples(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	Engine *e = &self->core;
	PyObject *list = PyList_New((Py_ssize_t)e->nexamples);
	if (!list)
		return NULL;
	for (size_t i = 0; i < e->nexamples; i++) {
		Example *x = &e->examples[i];
		PyObject *item = Py_BuildValue("(iLLii)", x->what, (long long)x->tid,
					       (long long)x->time, x->fn, x->fn2);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
	return list;
}

static PyObject *engine_thread_keys(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	Engine *e = &self->core;
	PyObject *list = PyList_New((Py_ssize_t)e->nthreads);
	if (!list)
		return NULL;
	for (size_t i = 0; i < e->nthreads; i++) {
		PyObject *item = Py_BuildValue("(LL)", (long long)e->threads[i]->pid,
					       (long long)e->threads[i]->tid);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
	return list;
}

/* -------------------------------------------------------- buffers handed out */

/* A block of memory handed to Python (numpy reads it through the buffer protocol). */
typedef struct {
	PyObject_HEAD
	void *data;
	Py_ssize_t nbytes;
} Block;

static int64_t empty_block_storage;

static void block_dealloc(Block *self)
{
	free(self->data);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int block_getbuffer(Block *self, Py_buffer *view, int flags)
{
	void *data = self->data ? self->data : &empty_block_storage;
	return PyBuffer_FillInfo(view, (PyObject *)self, data, self->nbytes, 0, flags);
}

static PyBufferProcs block_as_buffer = {
	.bf_getbuffer = (getbufferproc)block_getbuffer,
};

static PyTypeObject BlockType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptscope.reconstruct._cengine.Block",
	.tp_basicsize = sizeof(Block),
	.tp_dealloc = (destructor)block_dealloc,
	.tp_as_buffer = &block_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Memory handed over by the engine (read it with numpy.frombuffer).",
};

/* Wrap `data` (malloc'd, now owned by the block; freed here if wrapping fails). */
static PyObject *block_new(void *data, size_t nbytes)
{
	Block *b = PyObject_New(Block, &BlockType);
	if (!b) {
		free(data);
		return NULL;
	}
	b->data = data;
	b->nbytes = (Py_ssize_t)nbytes;
	return (PyObject *)b;
}

static PyObject *vec_block(Vec *a)
{
	if (a->n && a->n < a->cap) {
		/* Give back the growth slack (up to a third of a big array). */
		int64_t *v = realloc(a->v, a->n * sizeof(int64_t));
		if (v)
			a->v = v;
	}
	/* The next batch is likely about as big: room for it at its first slice, instead of
	 * growing from empty (each growth copies the column: a tenth of the engine's own
	 * time). Not now: this batch is still in memory until it is written. */
	a->hint = a->n + a->n / 4;
	PyObject *b = block_new(a->v, a->n * sizeof(int64_t));
	a->v = NULL;
	a->n = a->cap = 0;
	return b;
}

/* ------------------------------------------------------------ Python methods */

static PyObject *vecs_blocks(Vec *v, int n)
{
	PyObject *t = PyTuple_New(n);
	if (!t)
		return NULL;
	for (int i = 0; i < n; i++) {
		PyObject *b = vec_block(&v[i]);
		if (!b) {
			Py_DECREF(t);
			return NULL;
		}
		PyTuple_SET_ITEM(t, i, b);
	}
	return t;
}

/* Everything written since the last call: (slices, instants, counters), each a tuple of
 * int64 Blocks (slices: pid, tid, start, end, name id, address, instructions, cycles,
 * flags, start slot, end slot, perf time at start, perf time at end, code lines, anchor
 * address and occurrence at start; the slots empty unless keep_slots; instants: pid, tid,
 * time, message id; counters: pid, tid, time, name id, value). */
static PyObject *engine_take_output(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
	IDLE(self);
	Engine *e = &self->core;
	USABLE(self, false);
	PyObject *s = vecs_blocks(e->out, NOUT);
	PyObject *i = s ? vecs_blocks(e->inst, NINST) : NULL;
	PyObject *c = i ? vecs_blocks(e->ctr, NCTR) : NULL;
	PyObject *r = c ? PyTuple_Pack(3, s, i, c) : NULL;
	Py_XDECREF(s);
	Py_XDECREF(i);
	Py_XDECREF(c);
	return r;
}

/* ------------------------------------------------------ nesting by time alone */

/* Depth of each slice of one thread from the times alone, as a viewer nests them
 * (parents first: by start, then end descending, then the given order). Returns
 * (order, depth): the permutation in that order, and depth in that order. */
typedef struct {
	int64_t start, end;
	int64_t i;
} NestItem;

static int nest_cmp(const void *pa, const void *pb)
{
	const NestItem *a = pa, *b = pb;
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	if (a->end != b->end)
		return a->end > b->end ? -1 : 1;
	return a->i < b->i ? -1 : a->i > b->i;
}

static PyObject *nest_depths(PyObject *Py_UNUSED(module), PyObject *args)
{
	PyObject *so, *eo;
	if (!PyArg_ParseTuple(args, "OO", &so, &eo))
		return NULL;
	Column cols[2] = {0};
	if (column_get(&cols[0], so, 8, "start") < 0 || column_get(&cols[1], eo, 8, "end") < 0) {
		columns_release(cols, 2);
		return NULL;
	}
	Py_ssize_t n = cols[0].view.shape[0];
	if (cols[1].view.shape[0] != n) {
		columns_release(cols, 2);
		PyErr_SetString(PyExc_ValueError, "start and end differ in length");
		return NULL;
	}
	size_t m = n ? (size_t)n : 1;
	NestItem *items = malloc(m * sizeof(NestItem));
	int64_t *order = malloc(m * sizeof(int64_t));
	int32_t *depth = malloc(m * sizeof(int32_t));
	int64_t *stack = malloc(m * sizeof(int64_t));
	if (!items || !order || !depth || !stack) {
		free(items);
		free(order);
		free(depth);
		free(stack);
		columns_release(cols, 2);
		return PyErr_NoMemory();
	}
	for (Py_ssize_t i = 0; i < n; i++)
		items[i] = (NestItem){AT(cols[0], int64_t, i), AT(cols[1], int64_t, i), i};
	columns_release(cols, 2);
	qsort(items, (size_t)n, sizeof(NestItem), nest_cmp);
	size_t sp = 0;
	for (Py_ssize_t k = 0; k < n; k++) {
		NestItem *it = &items[k];
		/* A slice that ends where this one starts is done, unless this one is empty. */
		while (sp && stack[sp - 1] <= it->start &&
		       !(stack[sp - 1] == it->start && it->start == it->end))
			sp--;
		order[k] = it->i;
		depth[k] = (int32_t)sp;
		stack[sp++] = it->end;
	}
	free(items);
	free(stack);
	PyObject *a = block_new(order, (size_t)n * sizeof(int64_t));
	PyObject *b = a ? block_new(depth, (size_t)n * sizeof(int32_t)) : (free(depth), NULL);
	PyObject *r = b ? PyTuple_Pack(2, a, b) : NULL;
	Py_XDECREF(a);
	Py_XDECREF(b);
	return r;
}

static PyObject *py_classify(PyObject *Py_UNUSED(module), PyObject *arg)
{
	unsigned long long flags = PyLong_AsUnsignedLongLong(arg);
	if (flags == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	uint8_t ks = ptscope_classify(flags);
	return Py_BuildValue("(ii)", ks & 15, ks >> 4);
}

static PyMethodDef module_methods[] = {
	{"classify", py_classify, METH_O,
	 "classify(flags) -> (kind, state): what the engine makes of raw perf flags"},
	{"nest_depths", nest_depths, METH_VARARGS,
	 "nest_depths(start, end) -> (order, depth): int64 order and int32 depth of one "
	 "thread's slices nested by time (parents first)"},
	{NULL, NULL, 0, NULL},
};

static PyMethodDef engine_methods[] = {
	{"add_locations", (PyCFunction)engine_add_locations, METH_VARARGS,
	 "add_locations(function_ids, entries, offsets, ips) -> location count"},
	{"add_inline_nodes", (PyCFunction)engine_add_inline_nodes, METH_VARARGS,
	 "add_inline_nodes(parents, name_ids) -> node count (int32 arrays; node 0 is none)"},
	{"set_location_nodes", (PyCFunction)engine_set_location_nodes, METH_VARARGS,
	 "set_location_nodes(first_location, nodes): the inlined body of each location"},
	{"set_landing_pads", (PyCFunction)engine_set_landing_pads, METH_VARARGS,
	 "set_landing_pads(callable(location_id) -> [(start, end)] or None)"},
	{"mark_function", (PyCFunction)engine_mark_function, METH_VARARGS,
	 "mark_function(function_id, flags): 1 = its return switches stacks, 2 = a setjmp"},
	{"feed_batch", (PyCFunction)engine_feed_batch, METH_VARARGS,
	 "feed_batch(pid, tid, time, flags, src, dst, insn_count, cycle_count, gap_delta)"},
	{"decode_error", (PyCFunction)engine_decode_error, METH_VARARGS,
	 "decode_error(pid, tid, has_time, time, message_id) -> attributed"},
	{"counter", (PyCFunction)engine_counter, METH_VARARGS,
	 "counter(pid, tid, time, name_id, value)"},
	{"end_segment", (PyCFunction)engine_end_segment, METH_NOARGS, "end_segment()"},
	{"slot_count", (PyCFunction)engine_slot_count, METH_VARARGS, "slot_count(pid, tid)"},
	{"stats", (PyCFunction)engine_stats, METH_NOARGS,
	 "(events, branches, decode_errors, segments_started, stitched, roots_inferred, "
	 "unexpected, ignored)"},
	{"memory", (PyCFunction)engine_memory, METH_NOARGS,
	 "what the engine holds now (live frames, window, waiters, held spines...)"},
	{"lines_on", (PyCFunction)engine_lines_on, METH_NOARGS,
	 "whether some batch had code lines (slices then have i-cache footprints)"},
	{"pending", (PyCFunction)engine_pending, METH_NOARGS,
	 "slices, instants and counters written and not yet taken"},
	{"first_time", (PyCFunction)engine_first_time, METH_NOARGS,
	 "the earliest time any slice can start (None before any event)"},
	{"examples", (PyCFunction)engine_examples, METH_NOARGS,
	 "[(what, tid, time, fn, fn2)] for the unexpected events kept as examples"},
	{"thread_keys", (PyCFunction)engine_thread_keys, METH_NOARGS,
	 "[(pid, tid)] in order of appearance"},
	{"close_all", (PyCFunction)engine_close_all, METH_NOARGS,
	 "the end of the input: close every open frame and write everything"},
	{"take_output", (PyCFunction)engine_take_output, METH_NOARGS,
	 "(slices, instants, counters) written since the last call (see the C source)"},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptscope.reconstruct._cengine.Engine",
	.tp_basicsize = sizeof(EngineObject),
	.tp_dealloc = (destructor)engine_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "The streaming trace-segment engine (see fast_engine.FastEngine).",
	.tp_methods = engine_methods,
	.tp_init = (initproc)engine_init,
	.tp_new = PyType_GenericNew,
};

static struct PyModuleDef cengine_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "ptscope.reconstruct._cengine",
	.m_doc = "The streaming trace-segment engine in C (twin of reconstruct/engine.py).",
	.m_size = -1,
	.m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__cengine(void)
{
	ptscope_engine_setup();
	if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&BlockType) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&cengine_module);
	if (!m)
		return NULL;
	Py_INCREF(&EngineType);
	if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
		Py_DECREF(&EngineType);
		Py_DECREF(m);
		return NULL;
	}
	if (PyModule_AddIntConstant(m, "FLAG_TABLE_SIZE", FLAG_TABLE_SIZE) < 0 ||
	    PyModule_AddIntConstant(m, "NAME_UNTRACED", NAME_UNTRACED) < 0 ||
	    PyModule_AddIntConstant(m, "NAME_SYSCALL", NAME_SYSCALL) < 0 ||
	    PyModule_AddIntConstant(m, "MAX_RUN", MAX_RUN) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
