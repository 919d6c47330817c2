//! Caller memory, in and out: the bytes behind whatever a Python caller
//! hands a put, a push or an `out=`, seen in place, without a copy.
//!
//! [`Mem::input`] and [`Mem::output`] accept, tried in this order:
//!
//! - `bytes` (inputs only): immutable, borrowed as they are;
//! - any object with the buffer protocol (numpy arrays, `bytearray`,
//!   `memoryview`, `array.array`, `mmap`, ...), through a `Py_buffer`
//!   held for as long as the [`Mem`] lives;
//! - any object with `__dlpack__` (torch, jax, cupy's host arrays,
//!   numpy's own) whose tensor lives in memory the CPU reads (device
//!   `kDLCPU` or `kDLCUDAHost`), through the DLPack capsule it returns,
//!   held likewise. This is how a torch tensor, which has no buffer
//!   protocol, and a bfloat16 tensor, which numpy cannot hold, get in.
//!
//! Anything else is a TypeError naming what was given; memory that is not
//! C-contiguous, or lives on an accelerator, a ValueError saying so. The
//! element type travels along ([`Elem`]) so that a caller that needs one
//! (tables want float32) refuses the others by name.
//!
//! Soundness. A [`Mem`] is a raw pointer and a length, plus what keeps
//! that memory alive and in place: the `bytes` object (immutable), the
//! held `Py_buffer` (an exporter may neither free nor move its memory
//! while a view is out: a `bytearray` refuses to resize with BufferError,
//! numpy refuses `resize` of an array with views), or the DLPack capsule
//! (the producer's deleter, which drops the tensor's hold on its
//! storage, runs only when the capsule dies, and this module never
//! consumes it). So the pointer is valid for the life of the `Mem`, on
//! any thread, which is why it is `Send` and `Sync`. What it cannot stop
//! is another thread writing that memory during a call that reads or
//! fills it: as with numpy's own functions that release the GIL, the
//! contents are then unspecified, never a fault of this process. Within
//! one call the slices made from a `Mem` ([`Mem::bytes`],
//! [`Mem::bytes_mut`], [`Mem::floats_mut`]) live one at a time, and
//! outputs that share memory are written one after another, so no two
//! `&mut` to the same bytes exist at once.

use std::ffi::c_void;
use std::ptr::NonNull;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyCapsuleMethods, PyDict, PyTuple};

/// What an element of caller memory is, as far as the calls care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Signed integers.
    Int,
    /// Unsigned integers (and raw bytes: `B`, `c`).
    Uint,
    /// IEEE floats (float16, float32, float64).
    Float,
    /// bfloat16 (DLPack's `kDLBfloat`).
    Bfloat,
    /// Booleans.
    Bool,
    /// Complex numbers, structs, big-endian data, anything else: stored
    /// as raw bytes by the cache, refused by the tables.
    Other,
}

/// The element type of caller memory: its kind and its size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elem {
    /// The kind, for the calls that need a given type.
    pub(crate) kind: Kind,
    /// Bytes per element.
    pub(crate) bytes: usize,
}

impl Elem {
    /// float32: what the embedding tables hold.
    pub(crate) const F32: Elem = Elem {
        kind: Kind::Float,
        bytes: 4,
    };

    /// Whether this is a raw byte (uint8, int8, char): memory a caller
    /// may hand over for any type, sized in bytes.
    pub(crate) fn is_byte(self) -> bool {
        self.bytes == 1 && matches!(self.kind, Kind::Uint | Kind::Int)
    }

    /// The type's name as numpy and torch print it, for errors.
    pub(crate) fn name(self) -> String {
        let bits = self.bytes * 8;
        match self.kind {
            Kind::Int => format!("int{bits}"),
            Kind::Uint => format!("uint{bits}"),
            Kind::Float => format!("float{bits}"),
            Kind::Bfloat => format!("bfloat{bits}"),
            Kind::Bool => "bool".to_string(),
            Kind::Other => format!("an opaque {}-byte type", self.bytes),
        }
    }
}

/// What keeps a [`Mem`]'s memory alive and in place.
enum Keep {
    /// A `bytes` object: immutable, so its memory never moves.
    Bytes(#[allow(dead_code)] Py<PyBytes>),
    /// A held buffer view; released (with the GIL) when dropped.
    Buffer(#[allow(dead_code)] PyUntypedBuffer),
    /// A DLPack capsule, not consumed: its destructor frees the tensor.
    Capsule(#[allow(dead_code)] Py<PyCapsule>),
}

/// Caller memory seen in place: a pointer, its length in bytes, its
/// element type and shape, and what keeps it alive (see the module doc).
pub(crate) struct Mem {
    /// The first byte (dangling but aligned when `len` is 0).
    ptr: NonNull<u8>,
    /// Bytes, all of them one C-contiguous block.
    len: usize,
    /// The element type.
    elem: Elem,
    /// The shape, in elements (one dimension for `bytes`).
    shape: Vec<usize>,
    /// Whether the owner allows writing.
    writable: bool,
    /// Keeps the memory alive; read by nothing, dropped last.
    _keep: Keep,
}

// SAFETY: the memory behind `ptr` stays valid and in place for as long as
// `_keep` lives, whatever thread the `Mem` is on (module doc); `_keep`'s
// own types are `Send` and `Sync` (`Py<T>`, `PyUntypedBuffer`). Access to
// the bytes goes through `&self` (shared reads) and `&mut self` (the one
// writer), so Rust's rules hold for every slice made from it.
unsafe impl Send for Mem {}
// SAFETY: as for `Send`: `&Mem` only gives shared reads.
unsafe impl Sync for Mem {}

/// Whether memory is to be read or written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

impl Mem {
    /// The memory of `obj`, to be read (a put's value, a push's
    /// gradients). `what` names the argument in errors.
    pub(crate) fn input(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Mem> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            let bytes = b.as_bytes();
            return Ok(Mem {
                ptr: NonNull::new(bytes.as_ptr().cast_mut()).unwrap_or(NonNull::dangling()),
                len: bytes.len(),
                elem: Elem {
                    kind: Kind::Uint,
                    bytes: 1,
                },
                shape: vec![bytes.len()],
                writable: false,
                _keep: Keep::Bytes(b.clone().unbind()),
            });
        }
        Mem::of(obj, what, Access::Read)
    }

    /// The memory of `obj`, to be filled (an `out=`): refused with a
    /// TypeError if its owner marks it read-only, before anything is asked
    /// of a server.
    pub(crate) fn output(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Mem> {
        if obj.is_instance_of::<PyBytes>() {
            return Err(PyTypeError::new_err(format!(
                "{what} must be writable memory (bytearray, numpy array, memoryview, a \
                 DLPack tensor); bytes are read-only"
            )));
        }
        Mem::of(obj, what, Access::Write)
    }

    fn of(obj: &Bound<'_, PyAny>, what: &str, access: Access) -> PyResult<Mem> {
        let py = obj.py();
        let buffer_err = match PyUntypedBuffer::get(obj) {
            Ok(buf) => return Mem::of_buffer(obj, buf, what, access),
            Err(e) => e,
        };
        if obj.hasattr(intern!(py, "__dlpack__"))? {
            return Mem::of_dlpack(obj, what, access);
        }
        if buffer_err.is_instance_of::<PyTypeError>(py) {
            return Err(PyTypeError::new_err(format!(
                "{what} must be a numpy array, an object with the buffer protocol (bytes, \
                 bytearray, memoryview) or a CPU tensor with __dlpack__, not {}",
                type_name(obj)
            )));
        }
        Err(PyValueError::new_err(format!(
            "{what}: cannot view this {}'s memory: {}",
            type_name(obj),
            buffer_err.value(py)
        )))
    }

    fn of_buffer(
        obj: &Bound<'_, PyAny>,
        buf: PyUntypedBuffer,
        what: &str,
        access: Access,
    ) -> PyResult<Mem> {
        if !buf.is_c_contiguous() {
            return Err(not_contiguous(what, obj));
        }
        if access == Access::Write && buf.readonly() {
            return Err(read_only(what, obj));
        }
        let elem = elem_of_format(buf.format().to_bytes(), buf.item_size());
        let len = buf.len_bytes();
        let ptr = NonNull::new(buf.buf_ptr().cast::<u8>()).unwrap_or(NonNull::dangling());
        Ok(Mem {
            ptr,
            len,
            elem,
            shape: buf.shape().to_vec(),
            writable: !buf.readonly(),
            _keep: Keep::Buffer(buf),
        })
    }

    fn of_dlpack(obj: &Bound<'_, PyAny>, what: &str, access: Access) -> PyResult<Mem> {
        let py = obj.py();
        let export = obj.getattr(intern!(py, "__dlpack__"))?;
        // DLPack 1.0 producers return a versioned tensor, which says
        // whether it is read-only; older ones refuse the keyword.
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "max_version"), PyTuple::new(py, [1u32, 0])?)?;
        let capsule = match export.call((), Some(&kwargs)) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<PyTypeError>(py) => export.call0()?,
            Err(e) => return Err(dlpack_refused(what, obj, &e)),
        };
        let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
            PyTypeError::new_err(format!(
                "{what}: {}.__dlpack__() did not return a capsule",
                type_name(obj)
            ))
        })?;
        let (tensor, read_only_flag) = if capsule.is_valid_checked(Some(VERSIONED)) {
            let p = capsule.pointer_checked(Some(VERSIONED))?;
            // SAFETY: a capsule named "dltensor_versioned" holds a
            // `DLManagedTensorVersioned` (DLPack 1.0), alive while the
            // capsule is; we only read it.
            let m = unsafe { &*p.as_ptr().cast::<DLManagedTensorVersioned>() };
            if m.version.major != 1 {
                return Err(PyValueError::new_err(format!(
                    "{what}: DLPack version {}.{} is not one this module reads (1.x)",
                    m.version.major, m.version.minor
                )));
            }
            (&m.dl_tensor, m.flags & DLPACK_FLAG_READ_ONLY != 0)
        } else if capsule.is_valid_checked(Some(UNVERSIONED)) {
            let p = capsule.pointer_checked(Some(UNVERSIONED))?;
            // SAFETY: a capsule named "dltensor" holds a
            // `DLManagedTensor`, alive while the capsule is.
            let m = unsafe { &*p.as_ptr().cast::<DLManagedTensor>() };
            (&m.dl_tensor, false)
        } else {
            return Err(PyTypeError::new_err(format!(
                "{what}: {}.__dlpack__() returned a capsule that is not an unused DLPack tensor",
                type_name(obj)
            )));
        };
        if !matches!(tensor.device.device_type, DL_CPU | DL_CUDA_HOST) {
            return Err(PyValueError::new_err(format!(
                "{what} lives on a device the CPU cannot read (DLPack device type {}): copy \
                 it to the CPU first (torch: `t.cpu()`)",
                tensor.device.device_type
            )));
        }
        let elem = elem_of_dlpack(tensor.dtype).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{what}: DLPack type code {} of {} bits x {} lanes is not a type this module \
                 reads",
                tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
            ))
        })?;
        let ndim = usize::try_from(tensor.ndim)
            .map_err(|_| PyValueError::new_err(format!("{what}: negative ndim")))?;
        // SAFETY: `shape` (and `strides` where not null) point to `ndim`
        // int64s owned by the tensor (DLPack's contract).
        let shape_raw: &[i64] = if ndim == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
        };
        let strides: Option<&[i64]> = if tensor.strides.is_null() || ndim == 0 {
            None
        } else {
            Some(unsafe { std::slice::from_raw_parts(tensor.strides, ndim) })
        };
        let shape: Vec<usize> = shape_raw
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| PyValueError::new_err(format!("{what}: negative dimension")))?;
        if let Some(strides) = strides {
            if !c_contiguous(&shape, strides) {
                return Err(not_contiguous(what, obj));
            }
        }
        if access == Access::Write && read_only_flag {
            return Err(read_only(what, obj));
        }
        let count = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| PyValueError::new_err(format!("{what}: size overflows")))?;
        let len = count
            .checked_mul(elem.bytes)
            .ok_or_else(|| PyValueError::new_err(format!("{what}: size overflows")))?;
        let offset = usize::try_from(tensor.byte_offset)
            .map_err(|_| PyValueError::new_err(format!("{what}: byte offset overflows")))?;
        let ptr = if len == 0 || tensor.data.is_null() {
            NonNull::dangling()
        } else {
            // SAFETY: DLPack puts the first element at data + byte_offset,
            // inside the tensor's allocation.
            NonNull::new(unsafe { tensor.data.cast::<u8>().add(offset) })
                .unwrap_or(NonNull::dangling())
        };
        Ok(Mem {
            ptr,
            len,
            elem,
            shape,
            writable: !read_only_flag,
            _keep: Keep::Capsule(capsule.unbind()),
        })
    }

    /// Bytes of the memory.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The element type.
    pub(crate) fn elem(&self) -> Elem {
        self.elem
    }

    /// The shape, in elements.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The memory as bytes, to read.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is one live block (module doc), and
        // `&self` lends it shared.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The memory as bytes, to fill. Only outputs ([`Mem::output`]) are
    /// writable; an input's memory is never handed out mutably.
    pub(crate) fn bytes_mut(&mut self) -> PyResult<&mut [u8]> {
        if !self.writable {
            return Err(PyBufferError::new_err("this memory is read-only"));
        }
        // SAFETY: as for `bytes`, and `&mut self` makes this the one
        // slice of it alive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// The memory as float32s, to read: refused (ValueError) if its start
    /// is not 4-byte aligned or its length not a multiple of 4.
    pub(crate) fn floats(&self, what: &str) -> PyResult<&[f32]> {
        bytemuck::try_cast_slice(self.bytes()).map_err(|e| misaligned(what, e))
    }

    /// The memory as float32s, to fill; refused as [`Mem::floats`] is.
    pub(crate) fn floats_mut(&mut self, what: &str) -> PyResult<&mut [f32]> {
        let bytes = self.bytes_mut()?;
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| misaligned(what, e))
    }
}

/// The error of memory that cannot be seen as float32s.
fn misaligned(what: &str, e: bytemuck::PodCastError) -> PyErr {
    PyValueError::new_err(format!(
        "{what} must start on a 4-byte boundary and hold whole float32s to be read as \
         float32 ({e:?}); numpy arrays and tensors always do, a memoryview slice may not"
    ))
}

/// The name of `obj`'s type, for error messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string())
}

fn not_contiguous(what: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    PyValueError::new_err(format!(
        "{what} must be one C-contiguous block of memory; this {} is strided (numpy: \
         np.ascontiguousarray(a); torch: t.contiguous())",
        type_name(obj)
    ))
}

fn read_only(what: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} must be writable memory; this {} is read-only",
        type_name(obj)
    ))
}

fn dlpack_refused(what: &str, obj: &Bound<'_, PyAny>, e: &PyErr) -> PyErr {
    let py = obj.py();
    let why = e.value(py).to_string();
    if e.is_instance_of::<PyBufferError>(py) || e.is_instance_of::<PyValueError>(py) {
        PyValueError::new_err(format!(
            "{what}: this {} refused to export its memory: {why}",
            type_name(obj)
        ))
    } else {
        PyTypeError::new_err(format!(
            "{what}: {}.__dlpack__() failed: {why}",
            type_name(obj)
        ))
    }
}

/// Whether `strides` (in elements) lay `shape` out row-major with no
/// gaps. Dimensions of extent 1 may have any stride; an empty tensor is
/// contiguous.
fn c_contiguous(shape: &[usize], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected: i64 = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = match i64::try_from(d).ok().and_then(|d| expected.checked_mul(d)) {
            Some(e) => e,
            None => return false,
        };
    }
    true
}

/// The element type of a buffer's struct-module format (`"f"`, `"<e"`,
/// `"B"`, ...) of `item_size` bytes. Big-endian data (`>`, `!`) and
/// anything but one plain code is [`Kind::Other`].
fn elem_of_format(format: &[u8], item_size: usize) -> Elem {
    let (order, code) = match format {
        [c] => (b'@', *c),
        [o, c] => (*o, *c),
        _ => (b'?', 0),
    };
    let native = matches!(order, b'@' | b'=')
        || (order == b'<' && cfg!(target_endian = "little"))
        || (order == b'>' && cfg!(target_endian = "big"));
    let kind = match code {
        _ if !native => Kind::Other,
        b'e' | b'f' | b'd' => Kind::Float,
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => Kind::Int,
        b'B' | b'c' | b'H' | b'I' | b'L' | b'Q' | b'N' => Kind::Uint,
        b'?' => Kind::Bool,
        _ => Kind::Other,
    };
    Elem {
        kind,
        bytes: item_size,
    }
}

/// The element type of a DLPack dtype; `None` for vector lanes and sizes
/// that are not whole bytes.
fn elem_of_dlpack(t: DLDataType) -> Option<Elem> {
    if t.lanes != 1 || t.bits == 0 || t.bits % 8 != 0 {
        return None;
    }
    let kind = match t.code {
        DL_INT => Kind::Int,
        DL_UINT => Kind::Uint,
        DL_FLOAT => Kind::Float,
        DL_BFLOAT => Kind::Bfloat,
        DL_BOOL => Kind::Bool,
        _ => Kind::Other,
    };
    Some(Elem {
        kind,
        bytes: usize::from(t.bits / 8),
    })
}

// DLPack's ABI (dlpack.h, v1.0), the part this module reads.

/// The capsule name of a DLPack 1.0 tensor.
const VERSIONED: &std::ffi::CStr = c"dltensor_versioned";
/// The capsule name of a pre-1.0 tensor.
const UNVERSIONED: &std::ffi::CStr = c"dltensor";
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const DLPACK_FLAG_READ_ONLY: u64 = 1;
/// `kDLCPU`.
const DL_CPU: i32 = 1;
/// `kDLCUDAHost`: pinned host memory, which the CPU reads as its own.
const DL_CUDA_HOST: i32 = 3;
/// `kDLInt`, `kDLUInt`, `kDLFloat`, `kDLBfloat`, `kDLBool`.
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_BOOL: u8 = 6;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}
