//! The `cowspace` library's integration tests, one binary: the runtime with a
//! materializer double (no root, no mounts) and sweep's handling of records.

mod plaindir;
mod sweep;
