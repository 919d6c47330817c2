//! Methods several Python classes share, written once.
//!
//! Each macro adds a `#[pymethods]` block of its own to the class it is
//! given (PyO3's `multiple-pymethods`), so a class's own block keeps only
//! what differs.

/// `close`, `closed`, `__enter__` and `__exit__` of a client class: the
/// class has `inner: Mutex<Option<C>>` (its Rust client) and `closed:
/// AtomicBool`, both closed by `close` through `crate::close_slot`; with
/// `also = $lazy`, `close` first closes the embedding connection in field
/// `$lazy`; with `lent = $lent` (a `crate::registered::Lent`), a client
/// that lent registered memory is kept, closed, instead of dropped.
/// `$close_doc` is `close`'s doc. `__exit__` calls `close`.
macro_rules! closable_client {
    ($class:ty, $close_doc:literal $(, also = $lazy:ident)? $(, lent = $lent:ident)?) => {
        impl $class {
            /// `" closed"` once `close()` has run, else `""`: the end of
            /// the class's `repr`.
            fn closed_mark(&self) -> &'static str {
                if self.closed() {
                    " closed"
                } else {
                    ""
                }
            }
        }

        #[pyo3::pymethods]
        impl $class {
            #[doc = $close_doc]
            fn close(&self, py: pyo3::Python<'_>) {
                $(self.$lazy.close(py);)?
                $(if self.$lent.keep(py, &self.inner, &self.closed) {
                    return;
                })?
                crate::close_slot(py, &self.inner, &self.closed);
            }

            /// True once `close()` has run.
            #[getter]
            fn closed(&self) -> bool {
                self.closed.load(std::sync::atomic::Ordering::Acquire)
            }

            fn __enter__(slf: pyo3::PyRef<'_, Self>) -> pyo3::PyRef<'_, Self> {
                slf
            }

            /// Closes the client; exceptions from the `with` body propagate.
            fn __exit__(
                &self,
                py: pyo3::Python<'_>,
                _exc_type: &pyo3::Bound<'_, pyo3::PyAny>,
                _exc: &pyo3::Bound<'_, pyo3::PyAny>,
                _traceback: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> bool {
                self.close(py);
                false
            }
        }
    };
}

/// The `addr` and `timeout` getters of a single-server client class: the
/// class keeps `addr: String` and `timeout: Duration` as given, so that
/// reading them needs neither the lock nor the network.
macro_rules! addr_and_timeout {
    ($class:ty) => {
        #[pyo3::pymethods]
        impl $class {
            /// The address this client connected to.
            #[getter]
            fn addr(&self) -> &str {
                &self.addr
            }

            /// The per-call timeout in seconds.
            #[getter]
            fn timeout(&self) -> f64 {
                self.timeout.as_secs_f64()
            }
        }
    };
}

/// The single-key and batched kv calls of a key-value client class
/// (`get`, `put`, `delete`, `mget`, `mput`): the class has `call(&self,
/// py, f)`, which runs `f` on its Rust client with the GIL released, and
/// that client has the calls of `fabrickv_client::Client` by the same
/// names. `$mget_how` and `$mput_how` finish the two batch calls' docs:
/// how the keys travel, and what an error leaves stored.
macro_rules! kv_calls {
    ($class:ty, $mget_how:literal, $mput_how:literal) => {
        #[pyo3::pymethods]
        impl $class {
            /// The value stored under `key`, or None if it is absent or expired.
            fn get<'py>(
                &self,
                py: pyo3::Python<'py>,
                key: &[u8],
            ) -> pyo3::PyResult<Option<pyo3::Bound<'py, pyo3::types::PyBytes>>> {
                let value = self.call(py, |c| c.get(key))?;
                Ok(value.map(|v| pyo3::types::PyBytes::new(py, &v)))
            }

            /// Stores `value` under `key`, expiring after `ttl` seconds if given.
            #[pyo3(signature = (key, value, ttl = None))]
            fn put(
                &self,
                py: pyo3::Python<'_>,
                key: &[u8],
                value: &[u8],
                ttl: Option<f64>,
            ) -> pyo3::PyResult<()> {
                let ttl = crate::ttl_of(ttl)?;
                self.call(py, |c| c.put_ttl(key, value, ttl))
            }

            /// Removes `key`; True if it was there.
            fn delete(&self, py: pyo3::Python<'_>, key: &[u8]) -> pyo3::PyResult<bool> {
                self.call(py, |c| c.delete(key))
            }

            #[doc = concat!(
                        "The values of `keys`, in order, None for each absent one; ",
                        $mget_how
                    )]
            fn mget<'py>(
                &self,
                py: pyo3::Python<'py>,
                keys: Vec<pyo3::Bound<'py, pyo3::types::PyBytes>>,
            ) -> pyo3::PyResult<Vec<Option<pyo3::Bound<'py, pyo3::types::PyBytes>>>> {
                let slices = crate::kv::key_slices(&keys);
                let mut buf = fabrickv_client::MgetBuf::new();
                self.call(py, |c| c.mget_into(&slices, &mut buf))?;
                Ok(crate::kv::buf_to_py(py, &buf))
            }

            #[doc = concat!(
                        "Stores many values: `mput([(key, value), ...])`, `mput({key: value})` ",
                        "or `mput(keys, values)`, expiring after `ttl` seconds if given. ",
                        $mput_how
                    )]
            #[pyo3(signature = (items, values = None, ttl = None))]
            fn mput<'py>(
                &self,
                py: pyo3::Python<'py>,
                items: &pyo3::Bound<'py, pyo3::PyAny>,
                values: Option<Vec<pyo3::Bound<'py, pyo3::types::PyBytes>>>,
                ttl: Option<f64>,
            ) -> pyo3::PyResult<()> {
                let ttl = crate::ttl_of(ttl)?;
                let pairs = crate::kv::pairs_of(items, values)?;
                let slices = crate::kv::pair_slices(&pairs);
                self.call(py, |c| c.mput(&slices, ttl))
            }
        }
    };
}

/// Every call of a KV-cache client class (`CacheClient`, `ClusterCache`),
/// written once over `crate::cache`'s functions: the class has `inner:
/// Mutex<Option<C>>` with `C: crate::cache::CacheOps`, and `buffer_bytes`
/// (each receive buffer's size). `$where` finishes `put`'s doc: where the
/// value goes.
macro_rules! cache_calls {
    ($class:ty, $where:literal) => {
        #[pyo3::pymethods]
        impl $class {
            /// The value of `key` as a new numpy array (uint8, 1-D, owning
            /// its memory: `arr.view(dtype)` or `np.frombuffer` reads it
            /// as another type), or None if it is absent or expired; with
            /// `out` (writable memory: numpy array, bytearray,
            /// memoryview, DLPack tensor) the value is copied into `out`
            /// from its first byte on and its length returned, as
            /// `get_into` does. `fabrickv.Error` with code
            /// `BUFFER_TOO_SMALL` if it is larger than the receive buffer
            /// (or than `out`, which is then untouched).
            #[pyo3(signature = (key, out = None))]
            fn get<'py>(
                &self,
                py: pyo3::Python<'py>,
                key: &pyo3::Bound<'py, pyo3::PyAny>,
                out: Option<&pyo3::Bound<'py, pyo3::PyAny>>,
            ) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::PyAny>> {
                use pyo3::IntoPyObjectExt;
                match out {
                    None => crate::cache::get_array(py, &self.inner, key)?.into_bound_py_any(py),
                    Some(out) => {
                        crate::cache::get_into(py, &self.inner, key, out)?.into_bound_py_any(py)
                    }
                }
            }

            /// Reads the value of `key` into `out` (writable C-contiguous
            /// memory of any dtype: numpy array, bytearray, memoryview, a
            /// DLPack tensor such as torch's), from its first byte on;
            /// returns the value's length in bytes, or None if the key is
            /// absent (`out` untouched). A value larger than `out` raises
            /// `fabrickv.Error` with code `BUFFER_TOO_SMALL` and leaves
            /// `out` untouched: the server checks the size before sending
            /// anything. Into memory from `register_buffer` the server
            /// writes the value itself, and it may exceed the receive
            /// buffer.
            fn get_into(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
                out: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<Option<usize>> {
                crate::cache::get_into(py, &self.inner, key, out)
            }

            /// Reads each of `keys` into its place: `outs` is a list of
            /// writable buffers (one per key), or one writable buffer
            /// with `offsets` (bytes) and `sizes` (one int for all, or one
            /// per key) cutting it into places. Returns each value's
            /// length, None for an absent key (its place untouched). As
            /// many keys as the receive buffers hold side by side are in
            /// flight at once, with the GIL released. On an error
            /// (`BUFFER_TOO_SMALL` for a value larger than its place, the
            /// place untouched) earlier places may have been filled, later
            /// ones are untouched; the message names the key's index.
            /// Where every place lies in memory from `register_buffer`
            /// the server writes the values there itself, every key in
            /// flight at once (so on an error later places may be filled
            /// too), and they may exceed the receive buffer.
            #[pyo3(signature = (keys, outs, *, offsets = None, sizes = None))]
            fn get_many_into(
                &self,
                py: pyo3::Python<'_>,
                keys: Vec<pyo3::Bound<'_, pyo3::PyAny>>,
                outs: &pyo3::Bound<'_, pyo3::PyAny>,
                offsets: Option<Vec<usize>>,
                sizes: Option<&pyo3::Bound<'_, pyo3::PyAny>>,
            ) -> pyo3::PyResult<Vec<Option<usize>>> {
                let keys = crate::cache::keys_of(&keys)?;
                let outs = crate::cache::Many::of("outs", keys.len(), outs, offsets, sizes, true)?;
                crate::cache::get_many_into(py, &self.inner, self.buffer_bytes, &keys, outs)
            }

            #[doc = concat!(
                        "Stores `value` (numpy array, any C-contiguous buffer, or a CPU tensor ",
                        "with `__dlpack__`, of any dtype, as raw bytes) under `key`",
                        $where,
                        ", expiring after `ttl` seconds if given; returns the value's generation, ",
                        "which changes whenever the key is written."
                    )]
            #[pyo3(signature = (key, value, ttl = None))]
            fn put(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
                value: &pyo3::Bound<'_, pyo3::PyAny>,
                ttl: Option<f64>,
            ) -> pyo3::PyResult<u64> {
                crate::cache::put(py, &self.inner, key, value, ttl)
            }

            /// Stores each `(key, value)` of `items`, all with the same
            /// `ttl`; returns their generations. To one server the values
            /// are pipelined (a round trip per batch, not per value). On an
            /// error the error names the first failing item's index: the
            /// items before it are stored, and those after it may be.
            #[pyo3(signature = (items, ttl = None))]
            fn put_many(
                &self,
                py: pyo3::Python<'_>,
                items: Vec<(pyo3::Bound<'_, pyo3::PyAny>, pyo3::Bound<'_, pyo3::PyAny>)>,
                ttl: Option<f64>,
            ) -> pyo3::PyResult<Vec<u64>> {
                crate::cache::put_many(py, &self.inner, items, ttl)
            }

            /// Stores each of `keys` from its place in `values`: a list of
            /// buffers (one per key), or one buffer with `offsets` (bytes)
            /// and `sizes` (one int for all, or one per key), read in place
            /// with the GIL released; all with the same `ttl`, pipelined as
            /// `put_many`'s. Returns the generations. On an error the error
            /// names the first failing item's index: the items before it
            /// are stored, and those after it may be.
            #[pyo3(signature = (keys, values, *, offsets = None, sizes = None, ttl = None))]
            fn put_many_from(
                &self,
                py: pyo3::Python<'_>,
                keys: Vec<pyo3::Bound<'_, pyo3::PyAny>>,
                values: &pyo3::Bound<'_, pyo3::PyAny>,
                offsets: Option<Vec<usize>>,
                sizes: Option<&pyo3::Bound<'_, pyo3::PyAny>>,
                ttl: Option<f64>,
            ) -> pyo3::PyResult<Vec<u64>> {
                let ttl = crate::ttl_of(ttl)?;
                let keys = crate::cache::keys_of(&keys)?;
                let values =
                    crate::cache::Many::of("values", keys.len(), values, offsets, sizes, false)?;
                crate::cache::put_many_of(py, &self.inner, &keys, &values, ttl, "put_many_from")
            }

            /// Removes `key`; True if it was there.
            fn delete(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<bool> {
                let keys = [key.clone()];
                Ok(crate::cache::key_ops(py, &self.inner, &keys, true)?[0])
            }

            /// Whether `key` is stored and not expired.
            fn exists(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<bool> {
                let keys = [key.clone()];
                Ok(crate::cache::key_ops(py, &self.inner, &keys, false)?[0])
            }

            /// Whether each of `keys` is stored and not expired, in order:
            /// one round trip per server for up to 1024 keys (all their
            /// requests in flight at once), not one per key.
            fn exists_many(
                &self,
                py: pyo3::Python<'_>,
                keys: Vec<pyo3::Bound<'_, pyo3::PyAny>>,
            ) -> pyo3::PyResult<Vec<bool>> {
                crate::cache::key_ops(py, &self.inner, &keys, false)
            }

            /// Removes each of `keys`; for each, in order, whether it was
            /// there. Sent as `exists_many` is.
            fn delete_many(
                &self,
                py: pyo3::Python<'_>,
                keys: Vec<pyo3::Bound<'_, pyo3::PyAny>>,
            ) -> pyo3::PyResult<Vec<bool>> {
                crate::cache::key_ops(py, &self.inner, &keys, true)
            }

            /// How many of `keys`, from the first, are stored: the length
            /// of the cached prefix of a prompt whose blocks `keys` names
            /// in order (`fabrickv.blocks.prefix_keys`). Counting stops at
            /// the first miss; keys are asked 1024 at a time, and none
            /// after a round that missed.
            fn prefix_hits(
                &self,
                py: pyo3::Python<'_>,
                keys: Vec<pyo3::Bound<'_, pyo3::PyAny>>,
            ) -> pyo3::PyResult<usize> {
                crate::cache::prefix_hits(py, &self.inner, &keys)
            }
        }
    };
}

/// `create_table` of a class that hands out embedding tables (`Client`,
/// `Cluster`): checks the arguments into a table spec (`crate::ps::dim_of`
/// and the others) and hands it to the class's own
/// `create_table_of(&self, py, &spec)`, which returns a `$table`; `$doc`
/// is the method's doc.
macro_rules! create_table {
    ($class:ty, $table:ty, $doc:literal) => {
        #[pyo3::pymethods]
        impl $class {
            #[doc = $doc]
            #[pyo3(signature = (name, dim, optimizer = "sgd", lr = 0.01, missing = "zeros", seed = 0))]
            #[allow(clippy::too_many_arguments)]
            fn create_table(
                &self,
                py: pyo3::Python<'_>,
                name: &str,
                dim: i64,
                optimizer: &str,
                lr: f64,
                missing: &str,
                seed: u64,
            ) -> pyo3::PyResult<$table> {
                // Checked in this order: dim, optimizer, missing, lr.
                let spec = fabrickv_wire::ps::TableSpec {
                    name: name.to_string(),
                    dim: crate::ps::dim_of(dim)?,
                    optimizer: crate::ps::optimizer_of(optimizer)?,
                    missing: crate::ps::missing_of(missing)?,
                    lr: crate::ps::lr_of(lr)?,
                    seed,
                };
                self.create_table_of(py, &spec)
            }
        }
    };
}

/// `put` and `push` of an embedding-table class (`Table`, `ClusterTable`),
/// written once: the class has `conn` (whose `call(py, f)` runs `f` on the
/// `$client` with the GIL released), its handle of the table in field
/// `$handle` (of type `$handle_ty`, as `$client::put` and `$client::push`
/// take it) and `dim_usize()`; `$where` ends the first sentence of each
/// doc.
macro_rules! table_writes {
    ($class:ty, $client:ty, $handle:ident: $handle_ty:ty, $where:literal) => {
        impl $class {
            /// Reads `keys` and `len(keys) x dim` floats (`what` names them
            /// in errors) and hands both to `op` (overwrite or gradient
            /// push), with the GIL released.
            fn send_vectors(
                &self,
                py: pyo3::Python<'_>,
                keys: &pyo3::Bound<'_, pyo3::PyAny>,
                values: &pyo3::Bound<'_, pyo3::PyAny>,
                what: &str,
                op: fn(&mut $client, &$handle_ty, &[u64], &[f32]) -> fabrickv_client::Result<()>,
            ) -> pyo3::PyResult<()> {
                let table = &self.$handle;
                crate::ps::with_vectors(keys, values, what, self.dim_usize(), |keys, values| {
                    self.conn.call(py, |c| op(c, table, keys, values))
                })
            }
        }

        #[pyo3::pymethods]
        impl $class {
            #[doc = concat!(
                "Stores `values` (shape `(len(keys), dim)` or flat) as the keys' vectors",
                $where,
                ", resetting their optimizer state."
            )]
            fn put(
                &self,
                py: pyo3::Python<'_>,
                keys: &pyo3::Bound<'_, pyo3::PyAny>,
                values: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<()> {
                self.send_vectors(py, keys, values, "values", <$client>::put)
            }

            #[doc = concat!(
                "Applies `grads` (shape `(len(keys), dim)` or flat) with the table's optimizer",
                $where,
                ", atomically per key; a key not yet stored starts from the table's initializer."
            )]
            fn push(
                &self,
                py: pyo3::Python<'_>,
                keys: &pyo3::Bound<'_, pyo3::PyAny>,
                grads: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<()> {
                self.send_vectors(py, keys, grads, "grads", <$client>::push)
            }
        }
    };
}
