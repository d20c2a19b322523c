//! Shared helpers for the end-to-end tests: locating the built binaries, temporary roots.
#![forbid(unsafe_code)]
