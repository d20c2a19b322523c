//! git's fsmonitor hook for workspaces: git asks what changed instead of looking at
//! every file (docs/git.md).
//!
//! An import of a git checkout gives its `.git/index` git's fsmonitor extension with a
//! token of its own (recorded in the snapshot, [`cowspace_store::Snapshot::git_fsmonitor`])
//! and every entry it made agree with the served files marked valid, and names
//! `mountctl git-fsmonitor` as the hook in `.git/config`. git then runs the hook with the
//! index's token and looks only at the paths it answers.
//!
//! A workspace knows what changed since its base: its private state holds every path
//! written, created or deleted, and nothing else (the upper layer of overlay and fuse
//! workspaces; for full-tree workspaces, the entries whose stamp changed). So the
//! answer is that list, and it is right for any token that describes the base or a
//! later state of this workspace:
//! - the import's token, when the base is the import that wrote it;
//! - `cowspace:1:<base id>`, the token this hook gives whenever it cannot vouch for the
//!   one it got (git then checks every file once and keeps the new token).
//!
//! Any other token (another tool's, or an import token in a capture, whose index may
//! describe an older tree) gets the answer "everything may have changed". So does a
//! directory that is not a live workspace the hook can find. Nothing is ever left out:
//! paths under `.git/` are the only ones not named, and git tracks none there.

mod hook;
mod setup;

pub use hook::{Answer, answer, answer_in_sandbox};
pub use setup::{
    HOOK_COMMAND, MOUNTCTL_ENV, OLDEST_GIT, SANDBOX_TOKENS_ENV, SANDBOX_TRUSTED_ENV,
    SANDBOX_UPPER_ENV, SANDBOX_WORKTREE_ENV, git_reads_the_extension, hook_command, hook_program,
    sandbox_setup,
};
