//! Methods several Python classes share, written once.
//!
//! Each macro adds a `#[pymethods]` block of its own to the class it is
//! given (PyO3's `multiple-pymethods`), so a class's own block keeps only
//! what differs.

/// `close`, `closed`, `__enter__` and `__exit__` of a client class: the
/// class has `inner: Mutex<Option<C>>` (its Rust client) and `closed:
/// AtomicBool`, both closed by `close` through `crate::close_slot`; with
/// `also = $lazy`, `close` first closes the embedding connection in field
/// `$lazy`. `$close_doc` is `close`'s doc. `__exit__` calls `close`.
macro_rules! closable_client {
    ($class:ty, $close_doc:literal $(, also = $lazy:ident)?) => {
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

/// `get` and `get_into` of a KV-cache client class: the class has
/// `inner: Mutex<Option<C>>` with `C: crate::cache::BufferedReads`, read
/// by `crate::cache::read`.
/// `$get_doc` and `$get_into_doc` are the two methods' docs.
macro_rules! cache_reads {
    ($class:ty, $get_doc:literal, $get_into_doc:literal) => {
        #[pyo3::pymethods]
        impl $class {
            #[doc = $get_doc]
            fn get<'py>(
                &self,
                py: pyo3::Python<'py>,
                key: &pyo3::Bound<'py, pyo3::PyAny>,
            ) -> pyo3::PyResult<Option<pyo3::Bound<'py, pyo3::types::PyBytes>>> {
                let key = crate::cache::key_of(key)?;
                crate::cache::read(py, &self.inner, key, usize::MAX, |v| {
                    Ok(pyo3::types::PyBytes::new(py, v))
                })
            }

            #[doc = $get_into_doc]
            fn get_into(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
                out: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<Option<usize>> {
                let key = crate::cache::key_of(key)?;
                let out = crate::cache::out_of(out)?;
                let cap = numpy::PyUntypedArrayMethods::len(&out);
                crate::cache::read(py, &self.inner, key, cap, |v| {
                    crate::cache::copy_out(&out, v)?;
                    Ok(v.len())
                })
            }
        }
    };
}

/// `put`, `delete` and `exists` of a KV-cache client class: the class has
/// `inner: Mutex<Option<C>>`, whose client `crate::cache::with_locked`
/// lends to `f` (`f` releases the GIL for the network call; `delete` and
/// `exists` through `crate::cache::on_key`), and `C` has the calls of
/// `fabrickv_client::CacheClient` by the same names.
/// `$put_where` finishes `put`'s doc: where the value goes.
macro_rules! cache_writes {
    ($class:ty, $put_where:literal) => {
        #[pyo3::pymethods]
        impl $class {
            #[doc = concat!(
                        "Stores `value` (any C-contiguous buffer, as raw bytes) under `key`",
                        $put_where,
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
                let key = crate::cache::key_of(key)?;
                let value = crate::cache::Value::of(value)?;
                let value = value.as_slice()?;
                let ttl = crate::ttl_of(ttl)?;
                crate::cache::with_locked(py, &self.inner, |c| {
                    py.detach(|| c.put(key, value, ttl))
                        .map_err(crate::to_py_err)
                })
            }

            /// Removes `key`; True if it was there.
            fn delete(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<bool> {
                crate::cache::on_key(py, &self.inner, key, |c, k| c.delete(k))
            }

            /// Whether `key` is stored and not expired.
            fn exists(
                &self,
                py: pyo3::Python<'_>,
                key: &pyo3::Bound<'_, pyo3::PyAny>,
            ) -> pyo3::PyResult<bool> {
                crate::cache::on_key(py, &self.inner, key, |c, k| c.exists(k))
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
