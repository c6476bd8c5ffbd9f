/* raylog.producer._fastsend: the compiled fast path of Producer.send.
 *
 * Producer.send (raylog/producer/producer.py) is the reference and the
 * fallback. This module takes only its commonest case: a keyless message
 * without partition or timestamp that joins the open sticky batch of its
 * topic without sealing it. Everything else (a key, a partition, a
 * timestamp, no open batch, a full one, a full buffer, a value that is not
 * bytes, any argument it does not recognise) goes to the reference, which
 * takes the accumulator's lock.
 *
 *     KeylessSend(accumulator, reference, future_type, batch_type)
 *         a callable with the signature of Producer.send:
 *         (topic, value, key=None, *, partition=None, timestamp_ms=None)
 *
 * Why no lock: every field it touches (the accumulator's ``keyless`` and
 * ``buffered``, the open batch's ``values`` and ``size``) is changed only
 * with the accumulator's lock held. The fast path first checks that the
 * lock is free, then does all of its reads and writes without calling
 * anything that can run Python code or let go of the GIL (no allocation
 * of a tracked object, no call out), so no other thread can take the lock
 * and run meanwhile: to another thread the append is as atomic as one
 * done under the lock. A thread that holds the lock (the sender draining,
 * a caller sealing) sends this call to the reference, which waits for it.
 * The future is allocated before the check, since allocating a tracked
 * object may run the garbage collector and with it any Python code.
 *
 * The slots of the batch (ProducerBatch) and of the future (SendFuture) are
 * read and written at the offsets their ``__slots__`` descriptors give.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *acc;              /* the RecordAccumulator */
    PyObject *acc_dict;         /* its __dict__ (buffered lives there) */
    PyObject *locked;           /* acc.lock.locked */
    PyObject *keyless;          /* acc.keyless: topic -> open sticky batch */
    PyObject *reference;        /* Producer.send, bound */
    PyTypeObject *future_type;  /* SendFuture */
    PyTypeObject *batch_type;   /* ProducerBatch */
    Py_ssize_t batch_size;
    Py_ssize_t max_buffered;
    Py_ssize_t header_size;
    /* slot offsets of ProducerBatch */
    Py_ssize_t b_values, b_keys, b_timestamps, b_size, b_limit, b_future;
    /* slot offsets of SendFuture */
    Py_ssize_t f_batch, f_index;
} KeylessSend;

static PyObject *str_buffered, *str_key, *str_partition, *str_timestamp_ms;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* The offset of the object slot ``name`` of ``type`` (a __slots__ member). */
static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s has no slot %s", type->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", type->tp_name, name);
        return -1;
    }
    *out = member->offset;
    return 0;
}

static int
ssize_attr(PyObject *obj, const char *name, Py_ssize_t *out)
{
    PyObject *value = PyObject_GetAttrString(obj, name);
    if (value == NULL)
        return -1;
    *out = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *KeylessSend_vectorcall(PyObject *, PyObject *const *, size_t, PyObject *);

static PyObject *
KeylessSend_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *acc, *reference, *future_type, *batch_type;
    static char *kwlist[] = {"accumulator", "reference", "future_type", "batch_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!:KeylessSend", kwlist, &acc, &reference,
                                     &PyType_Type, &future_type, &PyType_Type, &batch_type))
        return NULL;
    KeylessSend *self = (KeylessSend *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = KeylessSend_vectorcall;
    Py_INCREF(acc);
    self->acc = acc;
    Py_INCREF(reference);
    self->reference = reference;
    Py_INCREF(future_type);
    self->future_type = (PyTypeObject *)future_type;
    Py_INCREF(batch_type);
    self->batch_type = (PyTypeObject *)batch_type;

    PyObject *lock = NULL;
    PyTypeObject *bt = self->batch_type, *ft = self->future_type;
    if (slot_offset(bt, "values", &self->b_values) < 0 || slot_offset(bt, "keys", &self->b_keys) < 0 ||
        slot_offset(bt, "timestamps", &self->b_timestamps) < 0 || slot_offset(bt, "size", &self->b_size) < 0 ||
        slot_offset(bt, "limit", &self->b_limit) < 0 || slot_offset(bt, "future", &self->b_future) < 0 ||
        slot_offset(ft, "_batch", &self->f_batch) < 0 || slot_offset(ft, "_index", &self->f_index) < 0)
        goto fail;
    if ((self->acc_dict = PyObject_GenericGetDict(acc, NULL)) == NULL || !PyDict_CheckExact(self->acc_dict))
        goto fail;
    if ((lock = PyObject_GetAttrString(acc, "lock")) == NULL)
        goto fail;
    if ((self->locked = PyObject_GetAttrString(lock, "locked")) == NULL)
        goto fail;
    if ((self->keyless = PyObject_GetAttrString(acc, "keyless")) == NULL)
        goto fail;
    if (!PyDict_CheckExact(self->keyless)) {
        PyErr_SetString(PyExc_TypeError, "accumulator.keyless must be a dict");
        goto fail;
    }
    if (ssize_attr(acc, "batch_size", &self->batch_size) < 0 ||
        ssize_attr(acc, "max_buffered", &self->max_buffered) < 0)
        goto fail;
    {
        PyObject *message = PyImport_ImportModule("raylog.storage.message");
        if (message == NULL)
            goto fail;
        int bad = ssize_attr(message, "HEADER_SIZE", &self->header_size);
        Py_DECREF(message);
        if (bad < 0)
            goto fail;
    }
    Py_DECREF(lock);
    return (PyObject *)self;
fail:
    Py_XDECREF(lock);
    Py_DECREF(self);
    return NULL;
}

static int
KeylessSend_traverse(KeylessSend *self, visitproc visit, void *arg)
{
    Py_VISIT(self->acc);
    Py_VISIT(self->acc_dict);
    Py_VISIT(self->locked);
    Py_VISIT(self->keyless);
    Py_VISIT(self->reference);
    Py_VISIT(self->future_type);
    Py_VISIT(self->batch_type);
    return 0;
}

static int
KeylessSend_clear(KeylessSend *self)
{
    Py_CLEAR(self->acc);
    Py_CLEAR(self->acc_dict);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->keyless);
    Py_CLEAR(self->reference);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->batch_type);
    return 0;
}

static void
KeylessSend_dealloc(KeylessSend *self)
{
    PyObject_GC_UnTrack(self);
    KeylessSend_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether the call is (topic, value) with key, partition and timestamp_ms
 * None or absent: the only calls the fast path takes. */
static int
plain_call(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 2 || nargs > 3)
        return 0;
    if (nargs == 3 && args[2] != Py_None)
        return 0;
    if (kwnames == NULL)
        return 1;
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (args[nargs + i] != Py_None)
            return 0;
        if (name == str_key) {
            if (nargs == 3)
                return 0;  /* (the reference raises: key given twice) */
        }
        else if (name != str_partition && name != str_timestamp_ms) {
            return 0;  /* not interned the same, or unknown: the reference decides */
        }
    }
    return 1;
}

static PyObject *
KeylessSend_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    KeylessSend *self = (KeylessSend *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->batch_size < 2 || !plain_call(args, nargs, kwnames) || !PyUnicode_CheckExact(args[0]) ||
        !PyBytes_CheckExact(args[1]))
        goto reference;
    PyObject *topic = args[0], *value = args[1];

    /* Allocated first: it may run the garbage collector (and any Python code). */
    PyObject *future = self->future_type->tp_alloc(self->future_type, 0);
    if (future == NULL)
        return NULL;
    PyObject *locked = PyObject_CallNoArgs(self->locked);
    if (locked == NULL) {
        Py_DECREF(future);
        return NULL;
    }
    Py_DECREF(locked);  /* (True or False: immortal enough) */
    if (locked != Py_False)
        goto drop_future;

    /* From here on to the return: nothing that can run Python code. */
    PyObject *batch = PyDict_GetItemWithError(self->keyless, topic);  /* borrowed */
    if (batch == NULL) {
        if (PyErr_Occurred())
            PyErr_Clear();
        goto drop_future;
    }
    if (!Py_IS_TYPE(batch, self->batch_type))
        goto drop_future;
    PyObject *values = SLOT(batch, self->b_values), *size_obj = SLOT(batch, self->b_size);
    PyObject *limit_obj = SLOT(batch, self->b_limit), *batch_future = SLOT(batch, self->b_future);
    if (values == NULL || !PyList_CheckExact(values) || SLOT(batch, self->b_keys) != Py_None ||
        SLOT(batch, self->b_timestamps) != Py_None || batch_future == NULL || size_obj == NULL ||
        limit_obj == NULL || !PyLong_CheckExact(size_obj) || !PyLong_CheckExact(limit_obj))
        goto drop_future;
    Py_ssize_t index = PyList_GET_SIZE(values);
    if (index + 1 >= self->batch_size)
        goto drop_future;  /* it would seal the batch: the reference does */
    PyObject *buffered_obj = PyDict_GetItemWithError(self->acc_dict, str_buffered);  /* borrowed */
    if (buffered_obj == NULL || !PyLong_CheckExact(buffered_obj)) {
        if (PyErr_Occurred())
            PyErr_Clear();
        goto drop_future;
    }
    Py_ssize_t buffered = PyLong_AsSsize_t(buffered_obj);
    Py_ssize_t size = PyLong_AsSsize_t(size_obj), limit = PyLong_AsSsize_t(limit_obj);
    Py_ssize_t grow = self->header_size + PyBytes_GET_SIZE(value);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        goto drop_future;
    }
    if (buffered >= self->max_buffered || size + grow > limit)
        goto drop_future;

    /* Untracked allocations only (ints), then the writes. */
    PyObject *new_size = PyLong_FromSsize_t(size + grow);
    PyObject *new_buffered = PyLong_FromSsize_t(buffered + 1);
    PyObject *index_obj = PyLong_FromSsize_t(index);
    if (new_size == NULL || new_buffered == NULL || index_obj == NULL) {
        Py_XDECREF(new_size);
        Py_XDECREF(new_buffered);
        Py_XDECREF(index_obj);
        Py_DECREF(future);
        return NULL;
    }
    if (PyList_Append(values, value) < 0) {
        Py_DECREF(new_size);
        Py_DECREF(new_buffered);
        Py_DECREF(index_obj);
        Py_DECREF(future);
        return NULL;
    }
    PyObject *old = SLOT(batch, self->b_size);
    SLOT(batch, self->b_size) = new_size;
    Py_DECREF(old);  /* an int: no finalizer */
    if (PyDict_SetItem(self->acc_dict, str_buffered, new_buffered) < 0) {
        /* (the key is there: this does not fail in practice) */
        Py_DECREF(new_buffered);
        Py_DECREF(index_obj);
        Py_DECREF(future);
        return NULL;
    }
    Py_DECREF(new_buffered);
    Py_INCREF(batch_future);
    SLOT(future, self->f_batch) = batch_future;
    SLOT(future, self->f_index) = index_obj;
    return future;

drop_future:
    Py_DECREF(future);
reference:
    return PyObject_Vectorcall(self->reference, args, nargs, kwnames);
}

static PyObject *
KeylessSend_call(PyObject *callable, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(callable, args, kwargs);
}

static PyMemberDef KeylessSend_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(KeylessSend, vectorcall), READONLY},
    {"reference", T_OBJECT, offsetof(KeylessSend, reference), READONLY,
     "the reference implementation (Producer.send, bound) every other call goes to"},
    {NULL},
};

static PyTypeObject KeylessSendType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "raylog.producer._fastsend.KeylessSend",
    .tp_doc = PyDoc_STR("Producer.send with its keyless case compiled (see the module docstring)."),
    .tp_basicsize = sizeof(KeylessSend),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = KeylessSend_new,
    .tp_dealloc = (destructor)KeylessSend_dealloc,
    .tp_traverse = (traverseproc)KeylessSend_traverse,
    .tp_clear = (inquiry)KeylessSend_clear,
    .tp_call = KeylessSend_call,
    .tp_vectorcall_offset = offsetof(KeylessSend, vectorcall),
    .tp_members = KeylessSend_members,
};

static struct PyModuleDef fastsend_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "raylog.producer._fastsend",
    .m_doc = PyDoc_STR("The compiled fast path of Producer.send (keyless messages joining an open batch)."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__fastsend(void)
{
    if (PyType_Ready(&KeylessSendType) < 0)
        return NULL;
    str_buffered = PyUnicode_InternFromString("buffered");
    str_key = PyUnicode_InternFromString("key");
    str_partition = PyUnicode_InternFromString("partition");
    str_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
    if (!str_buffered || !str_key || !str_partition || !str_timestamp_ms)
        return NULL;
    PyObject *module = PyModule_Create(&fastsend_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&KeylessSendType);
    if (PyModule_AddObject(module, "KeylessSend", (PyObject *)&KeylessSendType) < 0) {
        Py_DECREF(&KeylessSendType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
