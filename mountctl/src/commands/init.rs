//! `mountctl init`: create the runtime root. Of a root that exists already it is a no-op
//! that says so (exit 0): scripts and setup steps may run it every time.

use std::process::ExitCode;

use cowspace_store::{Error as StoreError, Store, StoreConfig};
use serde_json::json;

use crate::output::Ctx;

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let root = ctx.root.display().to_string();
    match Store::init(&ctx.root, StoreConfig::default()) {
        Ok(_) => {
            ctx.confirm(json!({"root": root, "created": true}), || {
                format!("initialised {root}")
            });
        }
        Err(StoreError::RootExists(_)) => {
            // Opened, so that a damaged root is not passed off as a usable one.
            Store::open(&ctx.root, StoreConfig::default())?;
            ctx.confirm(json!({"root": root, "created": false}), || {
                format!("{root} is initialised already; nothing to do")
            });
        }
        Err(e) => return Err(e.into()),
    }
    Ok(ExitCode::SUCCESS)
}
