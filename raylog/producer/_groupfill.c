/* raylog.producer._fastsend.GroupFill: the keyed groups of send_batch
 * into their partitions' open batches (part of the _fastsend extension;
 * _fastsend.c adds the type to the module).
 *
 * GroupFill(batch_type) is a callable made once per producer:
 *
 *     fill(groups, start, open, topic, batch_size, header_size, parts, seal, open_batch)
 *         -> (taken, stop)
 *
 * ``groups`` as raylog.producer.partitioner.group_by_partition makes them:
 * (partition, positions, values, keys, total, largest). From
 * ``groups[start]`` on, each group's messages join its partition's open
 * batch, ``open_batch(topic, partition)`` making one (with keys) when there
 * is none, a slice per batch as BulkAppends._append_groups and _fill do in
 * Python (the reference): a slice fills the batch up to ``batch_size``
 * messages; its values and keys are appended, the batch's size grows by
 * the slice's headers and bytes, ``(batch.future, first, count,
 * positions)`` is appended to ``parts`` and ``seal(batch)`` is called when
 * the batch is full. It stops at the first group it cannot place whole:
 * keyless messages (partition -1), or a slice its open batch cannot take
 * as it is (no keys, timestamps, past its limit in bytes). What is left of
 * that group then replaces it in ``groups``, and ``stop`` is its index
 * (``len(groups)`` when all are placed): the reference places it and calls
 * again from the next, so that groups are placed in the reference's order.
 * ``taken`` counts the messages placed (the caller adds them to
 * ``buffered``). Called with the accumulator's lock held, so it may call
 * Python code (``seal``, ``open_batch``) like the reference. */

#include "_slots.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *batch_type;
    Py_ssize_t b_values, b_keys, b_timestamps, b_size, b_limit, b_future;
} GroupFill;

static PyObject *GroupFill_vectorcall(PyObject *, PyObject *const *, size_t, PyObject *);

static PyObject *
GroupFill_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *batch_type;
    static char *kwlist[] = {"batch_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!:GroupFill", kwlist, &PyType_Type, &batch_type))
        return NULL;
    GroupFill *self = (GroupFill *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = GroupFill_vectorcall;
    Py_INCREF(batch_type);
    self->batch_type = (PyTypeObject *)batch_type;
    PyTypeObject *bt = self->batch_type;
    if (slot_offset(bt, "values", &self->b_values) < 0 || slot_offset(bt, "keys", &self->b_keys) < 0 ||
        slot_offset(bt, "timestamps", &self->b_timestamps) < 0 || slot_offset(bt, "size", &self->b_size) < 0 ||
        slot_offset(bt, "limit", &self->b_limit) < 0 || slot_offset(bt, "future", &self->b_future) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
GroupFill_traverse(GroupFill *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch_type);
    return 0;
}

static int
GroupFill_clear(GroupFill *self)
{
    Py_CLEAR(self->batch_type);
    return 0;
}

static void
GroupFill_dealloc(GroupFill *self)
{
    PyObject_GC_UnTrack(self);
    GroupFill_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether ``batch`` is one this code may append to: a ProducerBatch with
 * lists of values and keys, no timestamps, int size and limit. */
static int
batch_usable(GroupFill *self, PyObject *batch)
{
    if (!Py_IS_TYPE(batch, self->batch_type))
        return 0;
    PyObject *values = SLOT(batch, self->b_values), *keys = SLOT(batch, self->b_keys);
    return values != NULL && keys != NULL && SLOT(batch, self->b_timestamps) == Py_None &&
           PyList_CheckExact(values) && PyList_CheckExact(keys) &&
           PyList_GET_SIZE(keys) == PyList_GET_SIZE(values) && SLOT(batch, self->b_future) != NULL &&
           int_slot(batch, self->b_size) >= 0 && int_slot(batch, self->b_limit) >= 0;
}

/* The group's messages from ``j`` on, as a group of the same shape. */
static PyObject *
group_rest(PyObject *group, Py_ssize_t j)
{
    PyObject *positions = PyTuple_GET_ITEM(group, 1), *values = PyTuple_GET_ITEM(group, 2);
    PyObject *keys = PyTuple_GET_ITEM(group, 3);
    Py_ssize_t k = PyList_GET_SIZE(values), total = 0, largest = 0;
    if (j == 0) {
        Py_INCREF(group);
        return group;
    }
    for (Py_ssize_t i = j; i < k; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t len = PyBytes_GET_SIZE(PyList_GET_ITEM(values, i)) + (key == Py_None ? 0 : PyBytes_GET_SIZE(key));
        total += len;
        if (len > largest)
            largest = len;
    }
    return Py_BuildValue("(ONNNnn)", PyTuple_GET_ITEM(group, 0), PyList_GetSlice(positions, j, k),
                         PyList_GetSlice(values, j, k), PyList_GetSlice(keys, j, k), total, largest);
}

/* Whether a group is of the shape group_by_partition makes, with bytes
 * values and bytes keys (the compiled fill takes nothing else). */
static int
group_usable(PyObject *group, Py_ssize_t *p)
{
    if (!PyTuple_CheckExact(group) || PyTuple_GET_SIZE(group) != 6 || !PyLong_CheckExact(PyTuple_GET_ITEM(group, 0)))
        return 0;
    PyObject *positions = PyTuple_GET_ITEM(group, 1), *values = PyTuple_GET_ITEM(group, 2);
    PyObject *keys = PyTuple_GET_ITEM(group, 3);
    if (!PyList_CheckExact(positions) || !PyList_CheckExact(values) || !PyList_CheckExact(keys))
        return 0;
    Py_ssize_t k = PyList_GET_SIZE(values);
    if (k == 0 || PyList_GET_SIZE(positions) != k || PyList_GET_SIZE(keys) != k)
        return 0;
    for (Py_ssize_t i = 0; i < k; i++)
        if (!PyBytes_CheckExact(PyList_GET_ITEM(values, i)) || !PyBytes_CheckExact(PyList_GET_ITEM(keys, i)))
            return 0;
    *p = PyLong_AsSsize_t(PyTuple_GET_ITEM(group, 0));
    if (*p == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return *p >= 0;
}

static PyObject *
GroupFill_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    GroupFill *self = (GroupFill *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 9 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError,
                        "GroupFill takes 9 positional arguments: groups, start, open, topic, batch_size, "
                        "header_size, parts, seal, open_batch");
        return NULL;
    }
    PyObject *groups = args[0], *open = args[2], *topic = args[3], *parts = args[6], *seal = args[7];
    PyObject *open_batch = args[8];
    if (!PyList_CheckExact(groups) || !PyDict_CheckExact(open) || !PyList_CheckExact(parts)) {
        PyErr_SetString(PyExc_TypeError, "GroupFill: groups and parts must be lists, open a dict");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t batch_size = PyLong_AsSsize_t(args[4]), header_size = PyLong_AsSsize_t(args[5]);
    if ((start == -1 || batch_size == -1 || header_size == -1) && PyErr_Occurred())
        return NULL;
    if (batch_size < 1 || header_size < 0 || start < 0) {
        PyErr_SetString(PyExc_ValueError, "GroupFill: batch_size must be at least 1, start and header_size "
                                          "not negative");
        return NULL;
    }
    Py_ssize_t taken = 0, g;
    /* (``groups`` is the caller's own list, made for this call) */
    for (g = start; g < PyList_GET_SIZE(groups); g++) {
        PyObject *group = PyList_GET_ITEM(groups, g);
        Py_ssize_t p, j = 0, k;
        if (!group_usable(group, &p))
            break;
        PyObject *positions = PyTuple_GET_ITEM(group, 1), *gvalues = PyTuple_GET_ITEM(group, 2);
        PyObject *gkeys = PyTuple_GET_ITEM(group, 3);
        k = PyList_GET_SIZE(gvalues);
        while (j < k) {
            PyObject *key = PyTuple_Pack(2, topic, PyTuple_GET_ITEM(group, 0)), *batch;
            if (key == NULL)
                goto fail;
            batch = PyDict_GetItemWithError(open, key);  /* borrowed */
            Py_DECREF(key);
            if (batch != NULL)
                Py_INCREF(batch);  /* (seal may drop the open dict's reference) */
            else if (PyErr_Occurred())
                goto fail;
            else if ((batch = PyObject_CallFunctionObjArgs(open_batch, topic, PyTuple_GET_ITEM(group, 0), NULL)) ==
                     NULL)
                goto fail;
            if (!batch_usable(self, batch)) {
                Py_DECREF(batch);
                break;
            }
            PyObject *values = SLOT(batch, self->b_values), *keys = SLOT(batch, self->b_keys);
            Py_ssize_t first = PyList_GET_SIZE(values), take = batch_size - first, grow = 0;
            Py_ssize_t size = int_slot(batch, self->b_size), limit = int_slot(batch, self->b_limit);
            if (take > k - j)
                take = k - j;
            for (Py_ssize_t i = j; i < j + take; i++)
                grow += header_size + PyBytes_GET_SIZE(PyList_GET_ITEM(gvalues, i)) +
                        PyBytes_GET_SIZE(PyList_GET_ITEM(gkeys, i));
            if (take <= 0 || grow > limit - size) {
                Py_DECREF(batch);
                break;  /* (the reference decides: seal, split by bytes) */
            }
            int whole = j == 0 && take == k;
            PyObject *where = whole ? (Py_INCREF(positions), positions) : PyList_GetSlice(positions, j, j + take);
            PyObject *part = where == NULL ? NULL
                                           : Py_BuildValue("(OnnN)", SLOT(batch, self->b_future), first, take, where);
            PyObject *new_size = PyLong_FromSsize_t(size + grow);
            if (part == NULL || new_size == NULL || PyList_Append(parts, part) < 0) {
                Py_XDECREF(part);
                Py_XDECREF(new_size);
                Py_DECREF(batch);
                goto fail;
            }
            Py_DECREF(part);
            PyObject *vslice = whole ? (Py_INCREF(gvalues), gvalues) : PyList_GetSlice(gvalues, j, j + take);
            PyObject *kslice = whole ? (Py_INCREF(gkeys), gkeys) : PyList_GetSlice(gkeys, j, j + take);
            int bad = vslice == NULL || kslice == NULL || PyList_SetSlice(values, first, first, vslice) < 0 ||
                      PyList_SetSlice(keys, first, first, kslice) < 0;
            Py_XDECREF(vslice);
            Py_XDECREF(kslice);
            if (bad) {
                Py_DECREF(new_size);
                Py_DECREF(batch);
                goto fail;
            }
            PyObject *old = SLOT(batch, self->b_size);
            SLOT(batch, self->b_size) = new_size;
            Py_XDECREF(old);
            taken += take;
            j += take;
            if (first + take >= batch_size) {
                PyObject *sealed = PyObject_CallOneArg(seal, batch);
                if (sealed == NULL) {
                    Py_DECREF(batch);
                    goto fail;
                }
                Py_DECREF(sealed);
            }
            Py_DECREF(batch);
        }
        if (j < k) {
            if (j > 0) {
                PyObject *left = group_rest(group, j);
                if (left == NULL || PyList_SetItem(groups, g, left) < 0)  /* (steals left) */
                    goto fail;
            }
            break;
        }
    }
    return Py_BuildValue("(nn)", taken, g);
fail:
    /* (as in the reference, the messages placed before an error stay
     * placed and uncounted: only a failing seal or memory error gets here) */
    return NULL;
}

static PyObject *
GroupFill_call(PyObject *callable, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(callable, args, kwargs);
}

static PyMemberDef GroupFill_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(GroupFill, vectorcall), READONLY},
    {NULL},
};

PyTypeObject raylog_GroupFillType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "raylog.producer._fastsend.GroupFill",
    .tp_doc = PyDoc_STR("The keyed groups of send_batch into their open batches (see the source's comment)."),
    .tp_basicsize = sizeof(GroupFill),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = GroupFill_new,
    .tp_dealloc = (destructor)GroupFill_dealloc,
    .tp_traverse = (traverseproc)GroupFill_traverse,
    .tp_clear = (inquiry)GroupFill_clear,
    .tp_call = GroupFill_call,
    .tp_vectorcall_offset = offsetof(GroupFill, vectorcall),
    .tp_members = GroupFill_members,
};
