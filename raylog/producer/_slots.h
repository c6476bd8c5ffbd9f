/* Slots of the producer's Python objects (ProducerBatch, BatchFuture,
 * SendFuture: classes with __slots__), read and written at the offsets
 * their member descriptors give; shared by _fastsend.c and _groupfill.c. */

#ifndef RAYLOG_PRODUCER_SLOTS_H
#define RAYLOG_PRODUCER_SLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* The offset of the object slot ``name`` of ``type`` (a __slots__ member). */
static inline int
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

/* The value of an int slot, or -1 (no error set) when it is not an exact
 * int that fits. */
static inline Py_ssize_t
int_slot(PyObject *obj, Py_ssize_t offset)
{
    PyObject *value = SLOT(obj, offset);
    if (value == NULL || !PyLong_CheckExact(value))
        return -1;
    Py_ssize_t out = PyLong_AsSsize_t(value);
    if (out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return out;
}

#endif
