//! `mountctl init`: create the runtime root.

use std::process::ExitCode;

use cowspace_store::{Store, StoreConfig};
use serde_json::json;

use crate::output::Ctx;

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    Store::init(&ctx.root, StoreConfig::default())?;
    let root = ctx.root.display().to_string();
    ctx.emit(json!({"root": root}), || format!("initialised {root}"));
    Ok(ExitCode::SUCCESS)
}
