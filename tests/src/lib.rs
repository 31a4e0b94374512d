//! Cross-crate integration tests: properties that tie the `gpu` crate (kernel side) to the `host`
//! crate (launch side). See `tests/tests/`.
