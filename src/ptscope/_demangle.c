/* C++ and Rust names demangled exactly as perf 6.1 demangles symbols: libiberty's
 * cplus_demangle() with no options (no parameters, no return types, Rust hashes
 * dropped), the library perf links (demangle.py, perf_symbol_name()).
 *
 *   demangle(names: list[bytes]) -> list[str | None]  (None: not a mangled name)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

extern char *cplus_demangle(const char *mangled, int options);

static PyObject *demangle(PyObject *Py_UNUSED(m), PyObject *arg)
{
	PyObject *seq = PySequence_Fast(arg, "demangle takes a list of names");
	if (!seq)
		return NULL;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	PyObject *out = PyList_New(n);
	for (Py_ssize_t i = 0; out && i < n; i++) {
		PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
		const char *name = PyBytes_AsString(item);
		if (!name) {
			Py_CLEAR(out);
			break;
		}
		char *d = cplus_demangle(name, 0);
		PyObject *v;
		if (d) {
			v = PyUnicode_DecodeUTF8(d, (Py_ssize_t)strlen(d), "surrogateescape");
			free(d);
		} else {
			Py_INCREF(Py_None);
			v = Py_None;
		}
		if (!v) {
			Py_CLEAR(out);
			break;
		}
		PyList_SET_ITEM(out, i, v);
	}
	Py_DECREF(seq);
	return out;
}

static PyMethodDef methods[] = {
	{ "demangle", demangle, METH_O, "libiberty's cplus_demangle(name, 0) of each name." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_demangle", "perf's demangling (libiberty).", -1, methods,
};

PyMODINIT_FUNC PyInit__demangle(void)
{
	return PyModule_Create(&module);
}
