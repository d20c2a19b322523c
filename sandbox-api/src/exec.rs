//! One command to start in a long-lived sandbox, as its keeper receives it.

/// Largest exec request (its JSON), in bytes.
pub const MAX_EXEC_REQUEST_BYTES: usize = 256 * 1024;
/// One command to start in the sandbox.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ExecRequest {
    /// The command and its arguments (looked up through `PATH` without a `/`).
    pub argv: Vec<String>,
    /// Added to (or replacing entries of) the sandbox's environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// The working directory inside (default `/workspace`).
    #[serde(default)]
    pub workdir: Option<String>,
    /// A pseudo-terminal of this size (rows, columns) instead of the given descriptors.
    #[serde(default)]
    pub tty: Option<(u16, u16)>,
}
