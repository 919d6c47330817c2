"""DLPack producers for the tests that need one numpy cannot be: a
bfloat16 tensor (numpy has no such type), a tensor on another device, and
a wrapper that shows a numpy array through `__dlpack__` alone (so the
module reads numpy's own capsule rather than its buffer protocol).

The bfloat16 producer builds an unversioned `DLManagedTensor` with ctypes
over memory a numpy array owns; the capsule has no destructor, and the
producer object keeps the array and the struct alive, as a real
producer's manager context would."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# DLPack's type codes and devices used here.
DL_BFLOAT = 4
DL_CPU = 1
DL_CUDA = 2


class RawTensor:
    """A tensor seen only through `__dlpack__`: `bits` per element of type
    `code` over the bytes of `storage` (a C-contiguous numpy array it
    keeps), with the given `shape` and, if given, element `strides`."""

    def __init__(self, storage: npt.NDArray[Any], code: int, bits: int,
                 shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
                 device: int = DL_CPU) -> None:
        assert storage.flags.c_contiguous
        self.storage = storage
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = storage.ctypes.data
        t.device = _DLDevice(device, 0)
        t.ndim = len(shape)
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = (ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
                     if self._strides is not None else None)
        t.byte_offset = 0

    def __dlpack__(self, **_kwargs: Any) -> Any:
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._managed.dl_tensor.device.device_type, 0)


def bf16_tensor(values: npt.NDArray[np.float32]) -> RawTensor:
    """A bfloat16 tensor of `values` (rounded toward zero: the top half of
    each float32), over a uint16 array the returned tensor keeps."""
    bits = (np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> 16)
    storage = np.ascontiguousarray(bits.astype(np.uint16))
    return RawTensor(storage, DL_BFLOAT, 16, storage.shape)


class DlpackOnly:
    """A numpy array shown through `__dlpack__` and `__dlpack_device__`
    alone: numpy's own DLPack export, with no buffer protocol beside it."""

    def __init__(self, array: npt.NDArray[Any]) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        device: tuple[int, int] = self.array.__dlpack_device__()
        return device
