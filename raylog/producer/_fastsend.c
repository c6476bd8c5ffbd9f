/* raylog.producer._fastsend: the compiled fast paths of Producer.send and
 * of send_batch's keyed calls.
 *
 * GroupFill (_groupfill.c) places a keyed call's groups of messages into
 * their partitions' open batches, under the accumulator's lock; it says
 * what it does where it is defined. The rest of this comment is about
 * KeylessSend.
 *
 * Producer.send (raylog/producer/producer.py) is the reference and the
 * fallback. This module takes only its commonest cases, a keyless message
 * without partition or timestamp:
 *
 *   - batch_size above 1: it joins the open sticky batch of its topic
 *     without sealing it;
 *   - batch_size 1, a topic of one partition: its batch (sealed as it is
 *     made) joins the partition's queue of sealed batches while a sender
 *     worker is draining that queue (no wake-up needed).
 *
 * Everything else (a key, a partition, a timestamp, no open batch, a full
 * one, a full buffer, a sleeping sender, a value that is not bytes, any
 * argument it does not recognise) goes to the reference, which takes the
 * accumulator's lock.
 *
 *     KeylessSend(view, reference, future_type, batch_type, batch_future_type)
 *         a callable with the signature of Producer.send:
 *         (topic, value, key=None, *, partition=None, timestamp_ms=None)
 *
 * ``view`` is RecordAccumulator.compiled_send_view(), a CompiledSendView
 * (raylog/producer/accumulator.py): the only part of the accumulator this
 * code uses. Its fields are read by name once, here: ``locked``, ``fields``
 * (the accumulator's attribute dict: ``closed``, ``sender_waiting``,
 * ``on_seal`` read, ``buffered`` read and incremented), ``keyless``,
 * ``partition_counts``, ``limits``, ``ready``, ``draining``, ``compressed``,
 * ``batch_size``, ``max_buffered``.
 *
 * Why no lock: every field it touches (the view's ``keyless`` and
 * ``buffered``, the open batch's ``values`` and ``size``) is changed only
 * with the accumulator's lock held. The fast path first checks that the
 * lock is free, then does all of its reads and writes without calling
 * anything that can run Python code or let go of the GIL (no allocation
 * of a tracked object, no call out), so no other thread can take the lock
 * and run meanwhile: to another thread the append is as atomic as one
 * done under the lock. A thread that holds the lock (the sender draining,
 * a caller sealing) sends this call to the reference, which waits for it.
 * Every tracked object (the futures, a batch of one) is allocated before
 * the check, since allocating one may run the garbage collector and with
 * it any Python code.
 *
 * The slots of a batch (ProducerBatch), of its future (BatchFuture) and of
 * a message's future (SendFuture) are read and written at the offsets
 * their ``__slots__`` descriptors give; a batch of one is filled as
 * ``ProducerBatch(topic, 0, None, limit, compressed, [value])`` would be
 * (tests/producer/test_fastsend.py compares every slot).
 *
 * Untracked: a batch of one, its future and its list of values are left
 * out of the garbage collector (a producer with batch_size 1 and a full
 * buffer holds hundreds of thousands of them, and the collector's passes
 * over them cost more than the sends). None of them can be part of a
 * reference cycle while queued: the list holds one bytes object, the batch
 * its list, its future and atomic values, the future the list and atomic
 * values. A cycle can form only once the future gets an error (its
 * traceback's frames may hold the batch) or callbacks (they may hold the
 * message's future): ``track(obj)`` puts such an object back under the
 * collector, and BatchFuture.fail, BatchFuture.on_done and the sender's
 * resolving of a failed batch call it first.
 */

#include "_slots.h"

/* _groupfill.c */
extern PyTypeObject raylog_GroupFillType;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *view;             /* the accumulator's CompiledSendView */
    PyObject *acc_dict;         /* view.fields: the accumulator's attribute dict (buffered lives there) */
    PyObject *locked;           /* view.locked: the lock's locked() */
    PyObject *keyless;          /* view.keyless: topic -> open sticky batch */
    PyObject *reference;        /* Producer.send, bound */
    PyTypeObject *future_type;  /* SendFuture */
    PyTypeObject *batch_type;   /* ProducerBatch */
    PyTypeObject *batch_future_type;  /* BatchFuture */
    PyObject *counts;           /* view.partition_counts: topic -> partitions */
    PyObject *limits;           /* view.limits: topic -> max_message_bytes */
    PyObject *ready;            /* view.ready: (topic, partition) -> deque of sealed batches */
    PyObject *draining;         /* view.draining: (topic, partition) -> batches a worker holds */
    PyObject *compressed;       /* view.compressed (a bool) */
    PyObject *time_time;        /* time.time */
    PyObject *deque_type;       /* collections.deque */
    PyObject *deque_append;     /* collections.deque.append */
    PyObject *zero_float;       /* 0.0: the deadline of a sealed batch */
    Py_ssize_t batch_size;
    Py_ssize_t max_buffered;
    Py_ssize_t header_size;
    /* slot offsets of ProducerBatch */
    Py_ssize_t b_values, b_keys, b_timestamps, b_headers, b_size, b_limit, b_future;
    Py_ssize_t b_topic, b_partition, b_created, b_deadline;
    /* slot offsets of SendFuture */
    Py_ssize_t f_batch, f_index;
    /* slot offsets of BatchFuture */
    Py_ssize_t bf_topic, bf_partition, bf_values, bf_keys, bf_compressed, bf_done, bf_base, bf_offsets,
        bf_error, bf_event, bf_callbacks, bf_reap;
} KeylessSend;

static PyObject *str_buffered, *str_key, *str_partition, *str_timestamp_ms, *str_closed, *str_sender_waiting,
    *str_on_seal;

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
    PyObject *view, *reference, *future_type, *batch_type, *batch_future_type;
    static char *kwlist[] = {"view", "reference", "future_type", "batch_type", "batch_future_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!O!:KeylessSend", kwlist, &view, &reference,
                                     &PyType_Type, &future_type, &PyType_Type, &batch_type, &PyType_Type,
                                     &batch_future_type))
        return NULL;
    KeylessSend *self = (KeylessSend *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = KeylessSend_vectorcall;
    Py_INCREF(view);
    self->view = view;
    Py_INCREF(reference);
    self->reference = reference;
    Py_INCREF(future_type);
    self->future_type = (PyTypeObject *)future_type;
    Py_INCREF(batch_type);
    self->batch_type = (PyTypeObject *)batch_type;
    Py_INCREF(batch_future_type);
    self->batch_future_type = (PyTypeObject *)batch_future_type;

    PyTypeObject *bt = self->batch_type, *ft = self->future_type;
    if (slot_offset(bt, "values", &self->b_values) < 0 || slot_offset(bt, "keys", &self->b_keys) < 0 ||
        slot_offset(bt, "timestamps", &self->b_timestamps) < 0 || slot_offset(bt, "size", &self->b_size) < 0 ||
        slot_offset(bt, "headers", &self->b_headers) < 0 ||
        slot_offset(bt, "limit", &self->b_limit) < 0 || slot_offset(bt, "future", &self->b_future) < 0 ||
        slot_offset(bt, "topic", &self->b_topic) < 0 || slot_offset(bt, "partition", &self->b_partition) < 0 ||
        slot_offset(bt, "created", &self->b_created) < 0 || slot_offset(bt, "deadline", &self->b_deadline) < 0 ||
        slot_offset(ft, "_batch", &self->f_batch) < 0 || slot_offset(ft, "_index", &self->f_index) < 0)
        goto fail;
    PyTypeObject *bft = self->batch_future_type;
    if (slot_offset(bft, "topic", &self->bf_topic) < 0 || slot_offset(bft, "partition", &self->bf_partition) < 0 ||
        slot_offset(bft, "_values", &self->bf_values) < 0 || slot_offset(bft, "_keys", &self->bf_keys) < 0 ||
        slot_offset(bft, "_compressed", &self->bf_compressed) < 0 || slot_offset(bft, "_done", &self->bf_done) < 0 ||
        slot_offset(bft, "_base", &self->bf_base) < 0 || slot_offset(bft, "_offsets", &self->bf_offsets) < 0 ||
        slot_offset(bft, "_error", &self->bf_error) < 0 || slot_offset(bft, "_event", &self->bf_event) < 0 ||
        slot_offset(bft, "_callbacks", &self->bf_callbacks) < 0 || slot_offset(bft, "_reap", &self->bf_reap) < 0)
        goto fail;
    if ((self->acc_dict = PyObject_GetAttrString(view, "fields")) == NULL)
        goto fail;
    if (!PyDict_CheckExact(self->acc_dict)) {
        PyErr_SetString(PyExc_TypeError, "view.fields must be a dict");
        goto fail;
    }
    if ((self->locked = PyObject_GetAttrString(view, "locked")) == NULL)
        goto fail;
    if ((self->keyless = PyObject_GetAttrString(view, "keyless")) == NULL)
        goto fail;
    if (!PyDict_CheckExact(self->keyless)) {
        PyErr_SetString(PyExc_TypeError, "view.keyless must be a dict");
        goto fail;
    }
    if ((self->counts = PyObject_GetAttrString(view, "partition_counts")) == NULL ||
        (self->limits = PyObject_GetAttrString(view, "limits")) == NULL ||
        (self->ready = PyObject_GetAttrString(view, "ready")) == NULL ||
        (self->draining = PyObject_GetAttrString(view, "draining")) == NULL ||
        (self->compressed = PyObject_GetAttrString(view, "compressed")) == NULL)
        goto fail;
    if (!PyDict_CheckExact(self->counts) || !PyDict_CheckExact(self->limits) || !PyDict_CheckExact(self->ready) ||
        !PyDict_CheckExact(self->draining) || !PyBool_Check(self->compressed)) {
        PyErr_SetString(PyExc_TypeError, "the view's partition_counts, limits, ready and draining must be dicts");
        goto fail;
    }
    {
        PyObject *time_module = PyImport_ImportModule("time");
        if (time_module == NULL)
            goto fail;
        self->time_time = PyObject_GetAttrString(time_module, "time");
        Py_DECREF(time_module);
        PyObject *collections = PyImport_ImportModule("collections");
        if (collections == NULL)
            goto fail;
        self->deque_type = PyObject_GetAttrString(collections, "deque");
        Py_DECREF(collections);
        if (self->time_time == NULL || self->deque_type == NULL)
            goto fail;
        if ((self->deque_append = PyObject_GetAttrString(self->deque_type, "append")) == NULL)
            goto fail;
        if ((self->zero_float = PyFloat_FromDouble(0.0)) == NULL)
            goto fail;
    }
    if (ssize_attr(view, "batch_size", &self->batch_size) < 0 ||
        ssize_attr(view, "max_buffered", &self->max_buffered) < 0)
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
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
KeylessSend_traverse(KeylessSend *self, visitproc visit, void *arg)
{
    Py_VISIT(self->view);
    Py_VISIT(self->acc_dict);
    Py_VISIT(self->locked);
    Py_VISIT(self->keyless);
    Py_VISIT(self->reference);
    Py_VISIT(self->future_type);
    Py_VISIT(self->batch_type);
    Py_VISIT(self->batch_future_type);
    Py_VISIT(self->counts);
    Py_VISIT(self->limits);
    Py_VISIT(self->ready);
    Py_VISIT(self->draining);
    Py_VISIT(self->compressed);
    Py_VISIT(self->time_time);
    Py_VISIT(self->deque_type);
    Py_VISIT(self->deque_append);
    return 0;
}

static int
KeylessSend_clear(KeylessSend *self)
{
    Py_CLEAR(self->view);
    Py_CLEAR(self->acc_dict);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->keyless);
    Py_CLEAR(self->reference);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->batch_type);
    Py_CLEAR(self->batch_future_type);
    Py_CLEAR(self->counts);
    Py_CLEAR(self->limits);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->draining);
    Py_CLEAR(self->compressed);
    Py_CLEAR(self->time_time);
    Py_CLEAR(self->deque_type);
    Py_CLEAR(self->deque_append);
    Py_CLEAR(self->zero_float);
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

/* Set the object slot at ``offset`` of a fresh object (its slots are NULL). */
static inline void
fill(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    Py_INCREF(value);
    SLOT(obj, offset) = value;
}

/* An exact int of a dict, as a C value; -1 when missing, not an exact int
 * or negative (no error set). */
static Py_ssize_t
dict_ssize(PyObject *dict, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(dict, key);  /* borrowed */
    if (value == NULL || !PyLong_CheckExact(value)) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t out = PyLong_AsSsize_t(value);
    if (out == -1)
        PyErr_Clear();
    return out;
}

/* batch_size 1 (see the module docstring): 1 sent (*out: its future), 0
 * for the reference, -1 error. */
static int
send_alone(KeylessSend *self, PyObject *topic, PyObject *value, PyObject **out)
{
    if (dict_ssize(self->counts, topic) != 1)
        return 0;  /* not known yet, or sticky over several partitions */
    PyObject *limit = PyDict_GetItemWithError(self->limits, topic);  /* borrowed */
    if (limit == NULL || !PyLong_CheckExact(limit)) {
        PyErr_Clear();
        return 0;
    }
    /* Everything allocated first (a tracked object may run the collector). */
    PyObject *zero = PyLong_FromLong(0);
    PyObject *created = PyObject_CallNoArgs(self->time_time);
    PyObject *values = PyList_New(1);
    PyObject *size = PyLong_FromSsize_t(self->header_size + PyBytes_GET_SIZE(value));
    PyObject *tp = zero == NULL ? NULL : PyTuple_Pack(2, topic, zero);
    PyObject *batch_future = self->batch_future_type->tp_alloc(self->batch_future_type, 0);
    PyObject *batch = self->batch_type->tp_alloc(self->batch_type, 0);
    PyObject *future = self->future_type->tp_alloc(self->future_type, 0);
    PyObject *new_buffered = NULL;
    int status = -1;
    if (!zero || !created || !values || !size || !tp || !batch_future || !batch || !future)
        goto done;
    Py_INCREF(value);
    PyList_SET_ITEM(values, 0, value);
    PyObject_GC_UnTrack(values);  /* bytes only, and never more: it cannot be part of a cycle */
    fill(batch_future, self->bf_topic, topic);
    fill(batch_future, self->bf_partition, zero);
    fill(batch_future, self->bf_values, values);
    fill(batch_future, self->bf_keys, Py_None);
    fill(batch_future, self->bf_compressed, self->compressed);
    fill(batch_future, self->bf_done, Py_False);
    fill(batch_future, self->bf_base, Py_None);
    fill(batch_future, self->bf_offsets, Py_None);
    fill(batch_future, self->bf_error, Py_None);
    fill(batch_future, self->bf_event, Py_None);
    fill(batch_future, self->bf_callbacks, Py_None);
    fill(batch_future, self->bf_reap, Py_None);
    fill(batch, self->b_topic, topic);
    fill(batch, self->b_partition, zero);
    fill(batch, self->b_values, values);
    fill(batch, self->b_keys, Py_None);
    fill(batch, self->b_timestamps, Py_None);
    fill(batch, self->b_headers, Py_None);
    fill(batch, self->b_created, created);
    fill(batch, self->b_deadline, self->zero_float);
    fill(batch, self->b_size, size);
    fill(batch, self->b_limit, limit);
    fill(batch, self->b_future, batch_future);
    fill(future, self->f_batch, batch_future);
    fill(future, self->f_index, zero);
    /* Left out of the garbage collector while queued (see "Untracked"). */
    PyObject_GC_UnTrack(batch_future);
    PyObject_GC_UnTrack(batch);

    PyObject *locked = PyObject_CallNoArgs(self->locked);
    if (locked == NULL)
        goto done;
    Py_DECREF(locked);
    status = 0;
    if (locked != Py_False)
        goto done;
    /* From here on to the append: nothing that can run Python code. */
    if (PyDict_GetItemWithError(self->acc_dict, str_closed) != Py_False ||
        PyDict_GetItemWithError(self->acc_dict, str_on_seal) != NULL)  /* an on_seal hook (audit) */
        goto clear;
    Py_ssize_t buffered = dict_ssize(self->acc_dict, str_buffered);
    if (buffered < 0 || buffered >= self->max_buffered)
        goto clear;
    PyObject *queue = PyDict_GetItemWithError(self->ready, tp);  /* borrowed */
    if (queue == NULL || !Py_IS_TYPE(queue, (PyTypeObject *)self->deque_type))
        goto clear;
    PyObject *waiting = PyDict_GetItemWithError(self->acc_dict, str_sender_waiting);  /* borrowed */
    if (waiting != Py_False) {
        if (waiting != Py_True || PyDict_Contains(self->draining, tp) != 1)
            goto clear;  /* the sender must be woken: under the lock, by the reference */
    }
    if ((new_buffered = PyLong_FromSsize_t(buffered + 1)) == NULL) {
        status = -1;
        goto done;
    }
    PyObject *call[2] = {queue, batch};
    PyObject *appended = PyObject_Vectorcall(self->deque_append, call, 2, NULL);
    if (appended == NULL) {
        status = -1;
        goto done;
    }
    Py_DECREF(appended);
    if (PyDict_SetItem(self->acc_dict, str_buffered, new_buffered) < 0) {
        status = -1;
        goto done;
    }
    *out = future;
    future = NULL;
    status = 1;
    goto done;
clear:
    PyErr_Clear();
done:
    Py_XDECREF(new_buffered);
    Py_XDECREF(zero);
    Py_XDECREF(created);
    Py_XDECREF(values);
    Py_XDECREF(size);
    Py_XDECREF(tp);
    Py_XDECREF(batch_future);
    Py_XDECREF(batch);
    Py_XDECREF(future);
    return status;
}

static PyObject *
KeylessSend_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    KeylessSend *self = (KeylessSend *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!plain_call(args, nargs, kwnames) || !PyUnicode_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]))
        goto reference;
    PyObject *topic = args[0], *value = args[1];
    if (self->batch_size == 1) {
        PyObject *sent = NULL;
        int status = send_alone(self, topic, value, &sent);
        if (status < 0)
            return NULL;
        if (status > 0)
            return sent;
        goto reference;
    }

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
    Py_ssize_t buffered = dict_ssize(self->acc_dict, str_buffered);
    if (buffered < 0)
        goto drop_future;
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

static PyObject *
fastsend_track(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj))
        PyObject_GC_Track(obj);
    Py_RETURN_NONE;
}

static PyMethodDef fastsend_methods[] = {
    {"track", fastsend_track, METH_O,
     PyDoc_STR("track(obj): put an object the compiled send left untracked back under the garbage collector")},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef KeylessSend_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(KeylessSend, vectorcall), READONLY},
    {"reference", T_OBJECT, offsetof(KeylessSend, reference), READONLY,
     "the reference implementation (Producer.send, bound) every other call goes to"},
    {"__wrapped__", T_OBJECT, offsetof(KeylessSend, reference), READONLY,
     "the reference (inspect.signature and help show its signature)"},
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
    .m_doc = PyDoc_STR("The compiled fast paths of Producer.send (keyless messages) and of send_batch's keyed "
                        "groups (see the source's comments)."),
    .m_size = -1,
    .m_methods = fastsend_methods,
};

PyMODINIT_FUNC
PyInit__fastsend(void)
{
#ifdef Py_GIL_DISABLED
    /* Without a GIL the append is no longer atomic to other threads: the
     * producer runs the reference instead. */
    PyErr_SetString(PyExc_ImportError, "raylog.producer._fastsend needs the GIL (a free-threaded build has none)");
    return NULL;
#endif
    if (PyType_Ready(&KeylessSendType) < 0 || PyType_Ready(&raylog_GroupFillType) < 0)
        return NULL;
    str_buffered = PyUnicode_InternFromString("buffered");
    str_key = PyUnicode_InternFromString("key");
    str_partition = PyUnicode_InternFromString("partition");
    str_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
    str_closed = PyUnicode_InternFromString("closed");
    str_sender_waiting = PyUnicode_InternFromString("sender_waiting");
    str_on_seal = PyUnicode_InternFromString("on_seal");
    if (!str_buffered || !str_key || !str_partition || !str_timestamp_ms || !str_closed || !str_sender_waiting ||
        !str_on_seal)
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
    Py_INCREF(&raylog_GroupFillType);
    if (PyModule_AddObject(module, "GroupFill", (PyObject *)&raylog_GroupFillType) < 0) {
        Py_DECREF(&raylog_GroupFillType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
