//! The store's integration tests, in one binary: one module per area, sharing `common`.

mod common;

mod adopt;
mod corrupt;
mod crash;
mod diff_links;
mod edit;
mod faults;
mod fixture_v1;
mod gc;
mod groups;
mod image;
mod import_git;
mod import_tar;
mod laws;
mod layering;
mod open;
mod pipeline;
mod repack;
mod repair;
mod roundtrip;
mod statcache;
mod symlink_links;
