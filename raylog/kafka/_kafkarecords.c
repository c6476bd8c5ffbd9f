/* raylog.kafka._kafkarecords: the per-record loops of Kafka's record format
 * v2 in C, for the Kafka front door (raylog/kafka/records.py holds the
 * reference in Python and the batch header; this module sees only the
 * records section of a batch, uncompressed).
 *
 * A record, as Kafka's format v2 lays it out (varint: zigzag, 7 bits a byte,
 * least significant first; varlong the same up to 64 bits):
 *
 *     length          varint   bytes of the record after this field
 *     attributes      int8     unused (0)
 *     timestampDelta  varlong  timestamp - the batch's firstTimestamp
 *     offsetDelta     varint   offset - the batch's baseOffset
 *     keyLength       varint   -1: a null key
 *     key             bytes
 *     valueLength     varint   -1: a null value
 *     value           bytes
 *     headerCount     varint   then each header: keyLength varint, key,
 *                              valueLength varint (-1: null), value
 *
 * parse(records, count) -> (keys, values, timestamp_deltas) | None
 *     The ``count`` records of a records section (a bytes-like object):
 *     keys (bytes or None), values (bytes or None), timestamp deltas (int),
 *     each a list. None when a record has headers (raylog's message format
 *     carries none: the caller refuses the batch). ValueError when the
 *     section is malformed: a varint past 10 bytes or past the end, a
 *     length that does not fit, a record whose fields do not end where its
 *     length says, bytes left over, fewer records than ``count``.
 *
 * encode(records, first_timestamp, base_offset) -> (records section, max timestamp)
 *     Records ``(offset, timestamp, key, value)`` (key None or bytes-like,
 *     value bytes-like) as a records section: attributes 0, the deltas from
 *     ``first_timestamp`` and ``base_offset``, no headers; and the largest
 *     timestamp. TypeError for a record that is not such a tuple.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- varints ------------------------------------------------------------- */

/* Reads a zigzag varint at *pos (< end); 0 on success, -1 when malformed. */
static int
read_varint(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos, int64_t *out)
{
    uint64_t z = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= end || shift > 63)
            return -1;
        unsigned char b = buf[p++];
        z |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
    }
    *pos = p;
    *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return 0;
}

/* Writes ``value`` as a zigzag varint at out; the bytes written (at most 10). */
static inline int
write_varint(unsigned char *out, int64_t value)
{
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 0;
    while (z >= 0x80) {
        out[n++] = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    out[n++] = (unsigned char)z;
    return n;
}

static inline int
varint_size(int64_t value)
{
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

/* -- parse --------------------------------------------------------------- */

static PyObject *
malformed(Py_ssize_t record, const char *what)
{
    PyErr_Format(PyExc_ValueError, "record %zd of the batch is malformed: %s", record, what);
    return NULL;
}

/* A bytes object of buf[*pos : *pos + length] (None for length -1). */
static PyObject *
take_bytes(const unsigned char *buf, Py_ssize_t limit, Py_ssize_t *pos, int64_t length)
{
    if (length == -1)
        Py_RETURN_NONE;
    if (length < 0 || length > limit - *pos)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize((const char *)buf + *pos, (Py_ssize_t)length);
    *pos += (Py_ssize_t)length;
    return out;
}

static PyObject *
kafkarecords_parse(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "parse(records, count) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "the record count is negative");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *keys = PyList_New(0), *values = PyList_New(0), *deltas = PyList_New(0);
    PyObject *result = NULL;
    if (keys == NULL || values == NULL || deltas == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, key_len, value_len, headers;
        if (read_varint(buf, end, &pos, &length) < 0) {
            malformed(i, "its length is cut off or too long");
            goto done;
        }
        if (length < 6 || length > end - pos) {
            malformed(i, "its length does not fit the batch");
            goto done;
        }
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        if (read_varint(buf, record_end, &pos, &ts_delta) < 0 || read_varint(buf, record_end, &pos, &offset_delta) < 0
            || read_varint(buf, record_end, &pos, &key_len) < 0) {
            malformed(i, "a varint is cut off or too long");
            goto done;
        }
        PyObject *key = take_bytes(buf, record_end, &pos, key_len);
        if (key == NULL) {
            if (!PyErr_Occurred())
                malformed(i, "its key does not fit the record");
            goto done;
        }
        int failed = PyList_Append(keys, key);
        Py_DECREF(key);
        if (failed)
            goto done;
        if (read_varint(buf, record_end, &pos, &value_len) < 0) {
            malformed(i, "a varint is cut off or too long");
            goto done;
        }
        PyObject *value = take_bytes(buf, record_end, &pos, value_len);
        if (value == NULL) {
            if (!PyErr_Occurred())
                malformed(i, "its value does not fit the record");
            goto done;
        }
        failed = PyList_Append(values, value);
        Py_DECREF(value);
        if (failed)
            goto done;
        if (read_varint(buf, record_end, &pos, &headers) < 0) {
            malformed(i, "a varint is cut off or too long");
            goto done;
        }
        if (headers != 0) {
            if (headers < 0) {
                malformed(i, "its header count is negative");
                goto done;
            }
            result = Py_None; /* headers: refused by the caller */
            Py_INCREF(result);
            goto done;
        }
        if (pos != record_end) {
            malformed(i, "its fields do not end where its length says");
            goto done;
        }
        PyObject *delta = PyLong_FromLongLong((long long)ts_delta);
        if (delta == NULL)
            goto done;
        failed = PyList_Append(deltas, delta);
        Py_DECREF(delta);
        if (failed)
            goto done;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes follow the batch's %zd records", end - pos, count);
        goto done;
    }
    result = PyTuple_Pack(3, keys, values, deltas);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(deltas);
    PyBuffer_Release(&view);
    return result;
}

/* -- encode -------------------------------------------------------------- */

static PyObject *
kafkarecords_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode(records, first_timestamp, base_offset) takes 3 arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "records must be a sequence");
    if (seq == NULL)
        return NULL;
    long long first_ts = PyLong_AsLongLong(args[1]);
    long long base = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_buffer *keys = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    Py_buffer *values = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    long long *offsets = PyMem_Malloc((n ? n : 1) * sizeof(long long));
    long long *stamps = PyMem_Malloc((n ? n : 1) * sizeof(long long));
    char *has_key = PyMem_Calloc(n ? n : 1, 1);
    char *has_value = PyMem_Calloc(n ? n : 1, 1);
    PyObject *result = NULL, *out = NULL;
    if (!keys || !values || !offsets || !stamps || !has_key || !has_value) {
        PyErr_NoMemory();
        goto done;
    }
    /* first pass: the fields and the section's size */
    Py_ssize_t total = 0;
    long long max_ts = first_ts;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = items[i];
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 4) {
            PyErr_Format(PyExc_TypeError, "record %zd is not an (offset, timestamp, key, value) tuple", i);
            goto done;
        }
        offsets[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 0));
        stamps[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 1));
        if (PyErr_Occurred())
            goto done;
        PyObject *key = PyTuple_GET_ITEM(rec, 2);
        if (key != Py_None) {
            if (PyObject_GetBuffer(key, &keys[i], PyBUF_SIMPLE) < 0)
                goto done;
            has_key[i] = 1;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(rec, 3), &values[i], PyBUF_SIMPLE) < 0)
            goto done;
        has_value[i] = 1;
        if (stamps[i] > max_ts)
            max_ts = stamps[i];
        int64_t key_len = has_key[i] ? (int64_t)keys[i].len : -1;
        int64_t body = 1 + varint_size(stamps[i] - first_ts) + varint_size(offsets[i] - base) + varint_size(key_len)
                       + (key_len > 0 ? key_len : 0) + varint_size(values[i].len) + values[i].len + 1;
        total += varint_size(body) + body;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t key_len = has_key[i] ? (int64_t)keys[i].len : -1;
        int64_t body = 1 + varint_size(stamps[i] - first_ts) + varint_size(offsets[i] - base) + varint_size(key_len)
                       + (key_len > 0 ? key_len : 0) + varint_size(values[i].len) + values[i].len + 1;
        w += write_varint(w, body);
        *w++ = 0; /* attributes */
        w += write_varint(w, stamps[i] - first_ts);
        w += write_varint(w, offsets[i] - base);
        w += write_varint(w, key_len);
        if (key_len > 0) {
            memcpy(w, keys[i].buf, (size_t)key_len);
            w += key_len;
        }
        w += write_varint(w, values[i].len);
        memcpy(w, values[i].buf, (size_t)values[i].len);
        w += values[i].len;
        *w++ = 0; /* no headers */
    }
    result = Py_BuildValue("(OL)", out, max_ts);
done:
    for (Py_ssize_t i = 0; keys && values && has_key && has_value && i < n; i++) {
        if (has_key[i])
            PyBuffer_Release(&keys[i]);
        if (has_value[i])
            PyBuffer_Release(&values[i]);
    }
    PyMem_Free(keys);
    PyMem_Free(values);
    PyMem_Free(offsets);
    PyMem_Free(stamps);
    PyMem_Free(has_key);
    PyMem_Free(has_value);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef kafkarecords_methods[] = {
    {"parse", (PyCFunction)(void (*)(void))kafkarecords_parse, METH_FASTCALL,
     "parse(records, count) -> (keys, values, timestamp_deltas) | None (a record has headers)"},
    {"encode", (PyCFunction)(void (*)(void))kafkarecords_encode, METH_FASTCALL,
     "encode(records, first_timestamp, base_offset) -> (records section, max timestamp)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kafkarecords_module = {
    PyModuleDef_HEAD_INIT, "_kafkarecords",
    "The per-record loops of Kafka's record format v2 (see raylog/kafka/records.py).", -1, kafkarecords_methods,
};

PyMODINIT_FUNC
PyInit__kafkarecords(void)
{
    return PyModule_Create(&kafkarecords_module);
}
