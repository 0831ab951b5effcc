/* Python binding of the C slice encoder (src/ptscope/_native/fxt_slices.c):
 *
 *   encode_complete(header, name_slots, start, end, args, drill[, out]) -> bytes | int
 *
 * name_slots: int32 buffer of n; start, end: 8-byte buffers of n (ticks); args: a sequence
 * of (present, head, values): present None or a 1-byte buffer of n, head an int or an
 * 8-byte buffer of n, values None or an 8-byte buffer of n; drill: None or (head, prefix
 * bytes, perf_start, perf_end, anchor_ip, anchor_occurrence, count), the last three None
 * or 8-byte buffers of n. Buffers must be C-contiguous. The result is the records' words,
 * little-endian, as FxtWriter._encode_complete returns them; with `out` (a writable buffer
 * of at least the records' bound, fxt_complete_bound()), they are written there and their
 * number of words is returned.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include "fxt_slices.h"

#define MAX_ARGS 32

typedef struct {
	Py_buffer views[4 * MAX_ARGS + 8];
	int held;
} Buffers;

static void release(Buffers *b)
{
	for (int i = 0; i < b->held; i++)
		PyBuffer_Release(&b->views[i]);
	b->held = 0;
}

/* obj as a C-contiguous buffer (`flags`: PyBUF_WRITABLE too, or 0) of n items of `size`
 * bytes; NULL (and an exception) if not. */
static void *buffer_of(Buffers *b, PyObject *obj, Py_ssize_t n, Py_ssize_t size,
		       const char *what, int flags)
{
	if (b->held == (int)(sizeof b->views / sizeof b->views[0])) {
		PyErr_SetString(PyExc_ValueError, "too many columns");
		return NULL;
	}
	Py_buffer *v = &b->views[b->held];
	if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | flags) < 0)
		return NULL;
	b->held++;
	if (v->itemsize != size || v->len != n * size) {
		PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes", what, n,
			     size);
		return NULL;
	}
	return v->buf;
}

static const void *column(Buffers *b, PyObject *obj, Py_ssize_t n, Py_ssize_t size,
			  const char *what)
{
	return buffer_of(b, obj, n, size, what, 0);
}

static const void *optional_column(Buffers *b, PyObject *obj, Py_ssize_t n, Py_ssize_t size,
				   const char *what, bool *ok)
{
	if (obj == Py_None)
		return NULL;
	const void *p = column(b, obj, n, size, what);
	*ok = p != NULL;
	return p;
}

static PyObject *encode_complete(PyObject *Py_UNUSED(module), PyObject *const *argv,
				 Py_ssize_t argc)
{
	if (argc != 6 && argc != 7) {
		PyErr_SetString(PyExc_TypeError, "encode_complete takes 6 or 7 arguments");
		return NULL;
	}
	uint64_t header = PyLong_AsUnsignedLongLong(argv[0]);
	if (PyErr_Occurred())
		return NULL;
	Buffers b = {.held = 0};
	PyObject *result = NULL;
	PyObject *seq = NULL;
	struct fxt_arg_column args[MAX_ARGS];
	struct fxt_drill_column drill;
	bool ok = true;

	if (PyObject_GetBuffer(argv[1], &b.views[0], PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	b.held = 1;
	Py_ssize_t n = b.views[0].len / 4;
	if (b.views[0].itemsize != 4) {
		PyErr_SetString(PyExc_ValueError, "name_slots: expected 4-byte items");
		goto done;
	}
	const int32_t *slots = b.views[0].buf;
	const uint64_t *start = column(&b, argv[2], n, 8, "start");
	const uint64_t *end = start ? column(&b, argv[3], n, 8, "end") : NULL;
	if (!end)
		goto done;

	seq = PySequence_Fast(argv[4], "args must be a sequence");
	if (!seq)
		goto done;
	Py_ssize_t nargs = PySequence_Fast_GET_SIZE(seq);
	if (nargs > MAX_ARGS) {
		PyErr_SetString(PyExc_ValueError, "too many args");
		goto done;
	}
	for (Py_ssize_t a = 0; a < nargs; a++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, a);
		if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
			PyErr_SetString(PyExc_TypeError, "an arg is (present, head, values)");
			goto done;
		}
		struct fxt_arg_column *c = &args[a];
		PyObject *head = PyTuple_GET_ITEM(item, 1);
		c->present = optional_column(&b, PyTuple_GET_ITEM(item, 0), n, 1, "present", &ok);
		c->values = optional_column(&b, PyTuple_GET_ITEM(item, 2), n, 8, "values", &ok);
		c->heads = NULL;
		c->head = 0;
		if (!ok)
			goto done;
		if (PyLong_Check(head)) {
			c->head = PyLong_AsUnsignedLongLong(head);
			if (PyErr_Occurred())
				goto done;
		} else if (!(c->heads = column(&b, head, n, 8, "head"))) {
			goto done;
		}
	}

	const struct fxt_drill_column *drill_p = NULL;
	if (argv[5] != Py_None) {
		PyObject *d = argv[5];
		if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 7 ||
		    !PyBytes_Check(PyTuple_GET_ITEM(d, 1))) {
			PyErr_SetString(PyExc_TypeError,
					"drill is (head, prefix bytes, perf_start, perf_end, "
					"anchor_ip, anchor_occurrence, count)");
			goto done;
		}
		drill.head = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(d, 0));
		if (PyErr_Occurred())
			goto done;
		drill.prefix = PyBytes_AS_STRING(PyTuple_GET_ITEM(d, 1));
		drill.prefix_len = (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(d, 1));
		drill.perf_start = column(&b, PyTuple_GET_ITEM(d, 2), n, 8, "perf_start");
		drill.perf_end = drill.perf_start
					 ? column(&b, PyTuple_GET_ITEM(d, 3), n, 8, "perf_end")
					 : NULL;
		if (!drill.perf_end)
			goto done;
		drill.anchor_ip = optional_column(&b, PyTuple_GET_ITEM(d, 4), n, 8, "anchor_ip", &ok);
		drill.anchor_occurrence =
			optional_column(&b, PyTuple_GET_ITEM(d, 5), n, 8, "anchor_occurrence", &ok);
		drill.count = optional_column(&b, PyTuple_GET_ITEM(d, 6), n, 8, "count", &ok);
		if (!ok)
			goto done;
		if (!drill.anchor_ip != !drill.anchor_occurrence || !drill.anchor_ip != !drill.count) {
			PyErr_SetString(PyExc_ValueError,
					"anchor_ip, anchor_occurrence and count: all or none");
			goto done;
		}
		drill_p = &drill;
	}

	size_t bound = fxt_complete_bound((size_t)n, args, (size_t)nargs, drill_p);
	if (bound > (size_t)PY_SSIZE_T_MAX / 8) {
		PyErr_NoMemory();
		goto done;
	}
	uint64_t *into;
	Py_buffer out = {.obj = NULL};
	if (argc == 7 && argv[6] != Py_None) {
		/* A reused buffer: no fresh pages to fault in for every chunk. */
		if (PyObject_GetBuffer(argv[6], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
			goto done;
		if ((size_t)out.len < bound * 8) {
			PyBuffer_Release(&out);
			PyErr_SetString(PyExc_ValueError, "out is smaller than the records' bound");
			goto done;
		}
		into = out.buf;
	} else {
		result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(bound * 8));
		if (!result)
			goto done;
		into = (uint64_t *)PyBytes_AS_STRING(result);
	}
	size_t words;
	Py_BEGIN_ALLOW_THREADS
	words = fxt_encode_complete(into, (size_t)n, header, slots, start, end, args,
				    (size_t)nargs, drill_p);
	Py_END_ALLOW_THREADS
	if (out.obj) {
		PyBuffer_Release(&out);
		result = PyLong_FromSize_t(words);
	} else if (_PyBytes_Resize(&result, (Py_ssize_t)(words * 8)) < 0) {
		result = NULL;
	}
done:
	Py_XDECREF(seq);
	release(&b);
	return result;
}

/* complete_bound(n, one_word_args, two_word_args, drill_prefix_len) -> int: the words an
 * `out` buffer needs (fxt_complete_bound(); drill_prefix_len < 0: no drill string, and
 * its anchor counted whenever there is one). */
static PyObject *complete_bound(PyObject *Py_UNUSED(module), PyObject *args)
{
	Py_ssize_t n, one, two, prefix;
	if (!PyArg_ParseTuple(args, "nnnn", &n, &one, &two, &prefix))
		return NULL;
	if (n < 0 || one < 0 || two < 0 || one + two > MAX_ARGS) {
		PyErr_SetString(PyExc_ValueError, "bad counts");
		return NULL;
	}
	static const uint64_t any_value;
	struct fxt_arg_column cols[MAX_ARGS] = {{0}};
	for (Py_ssize_t a = one; a < one + two; a++)
		cols[a].values = &any_value;
	struct fxt_drill_column drill = {.prefix_len = (size_t)prefix, .anchor_ip = &any_value};
	return PyLong_FromSize_t(
		fxt_complete_bound((size_t)n, cols, (size_t)(one + two), prefix < 0 ? NULL : &drill));
}

/* add_totals(name_id, start, end, calls, total): calls[name_id[i]] += 1 and
 * total[name_id[i]] += end[i] - start[i] for every slice i (fxt/totals.py's per-function
 * totals, whose numpy twin takes two bincounts per chunk); name_id int32, the others int64,
 * calls and total writable, both as long as the name table. */
static PyObject *add_totals(PyObject *Py_UNUSED(module), PyObject *const *argv, Py_ssize_t argc)
{
	if (argc != 5) {
		PyErr_SetString(PyExc_TypeError, "add_totals takes 5 arguments");
		return NULL;
	}
	Py_ssize_t n = PyObject_Length(argv[0]), names = PyObject_Length(argv[3]);
	if (n < 0 || names < 0)
		return NULL;
	Buffers b = {.held = 0};
	PyObject *result = NULL;
	const int32_t *id = column(&b, argv[0], n, 4, "name_id");
	const int64_t *start = id ? column(&b, argv[1], n, 8, "start") : NULL;
	const int64_t *end = start ? column(&b, argv[2], n, 8, "end") : NULL;
	int64_t *calls = end ? buffer_of(&b, argv[3], names, 8, "calls", PyBUF_WRITABLE) : NULL;
	int64_t *total = calls ? buffer_of(&b, argv[4], names, 8, "total", PyBUF_WRITABLE) : NULL;
	if (!total)
		goto done;
	for (Py_ssize_t i = 0; i < n; i++) {
		if (id[i] < 0 || id[i] >= names) {
			PyErr_SetString(PyExc_ValueError, "a name id is outside the name table");
			goto done;
		}
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		calls[id[i]]++;
		total[id[i]] += end[i] - start[i];
	}
	result = Py_None;
	Py_INCREF(result);
done:
	release(&b);
	return result;
}

static PyMethodDef methods[] = {
	{"add_totals", (PyCFunction)(void (*)(void))add_totals, METH_FASTCALL,
	 "Per-function call counts and total durations of a chunk of slices, added in place."},
	{"encode_complete", (PyCFunction)(void (*)(void))encode_complete, METH_FASTCALL,
	 "Duration-complete records for a chunk of slices, as little-endian words."},
	{"complete_bound", complete_bound, METH_VARARGS,
	 "The words encode_complete's `out` buffer needs for these slices and args."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_cfxt", "The FXT writer's C slice encoder.", -1, methods,
};

PyMODINIT_FUNC PyInit__cfxt(void)
{
	return PyModule_Create(&module);
}
