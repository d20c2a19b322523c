//! The cowspace store.
