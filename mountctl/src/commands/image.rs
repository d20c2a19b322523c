//! `mountctl image`: OCI images imported or pulled into the store, listed, shown, removed.

use std::process::ExitCode;

use cowspace::image::{ImageRequest, list, show};
use cowspace_store::image::ImageReport;

use crate::cli::{ImageCommand, ImageFlags};
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, c: ImageCommand) -> anyhow::Result<ExitCode> {
    match c {
        ImageCommand::Import {
            source,
            ref_name,
            opts,
        } => {
            let report =
                cowspace::image::import(&ctx.root, &source, &request(Some(ref_name), opts))?;
            imported(ctx, &report)
        }
        ImageCommand::Pull {
            reference,
            ref_name,
            opts,
        } => {
            ctx.note(&format!("pulling {reference}"));
            let report = cowspace::image::pull(&ctx.root, &reference, &request(ref_name, opts))?;
            imported(ctx, &report)
        }
        ImageCommand::List => {
            let images = list(&ctx.root)?;
            let mut text = String::new();
            for i in &images {
                text.push_str(&format!(
                    "{}  {}  {:<12} {:>10}  {} layers  {}\n",
                    i.snapshot.short(),
                    &i.digest[..("sha256:".len() + 12).min(i.digest.len())],
                    i.platform,
                    bytes(i.size),
                    i.layers,
                    i.name
                ));
            }
            ctx.emit(serde_json::to_value(&images)?, || {
                text.trim_end().to_string()
            });
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Show { name } => {
            let s = show(&ctx.root, &name)?;
            let i = &s.info;
            let list = |v: &[String]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(" ")
                }
            };
            let mut text = format!(
                "snapshot     {}\nreference    {}\ndigest       {}\nmanifest     {}\nplatform     {}\nsize         {} in {} layers\n",
                s.snapshot,
                i.reference,
                i.digest,
                i.manifest_digest,
                i.platform,
                bytes(i.size),
                i.layers.len()
            );
            for l in &i.layers {
                text.push_str(&format!("  layer      {} {}\n", l.digest, bytes(l.size)));
            }
            text.push_str(&format!(
                "entrypoint   {}\ncmd          {}\nworking dir  {}\nuser         {}\nports        {}\n",
                list(&i.entrypoint),
                list(&i.cmd),
                i.working_dir.as_deref().unwrap_or("-"),
                i.user.as_deref().unwrap_or("-"),
                list(&i.exposed_ports)
            ));
            for e in &i.env {
                text.push_str(&format!("env          {e}\n"));
            }
            ctx.emit(serde_json::to_value(&s)?, || text.trim_end().to_string());
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Remove { name } => {
            let id = ctx.runtime()?.image_remove(&name)?;
            ctx.emit(
                serde_json::json!({"removed": name, "snapshot": id}),
                || {
                    format!(
                        "removed image ref {name} (snapshot {}: `mountctl gc` frees what nothing else holds)",
                        id.short()
                    )
                },
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn request(ref_name: Option<String>, opts: ImageFlags) -> ImageRequest {
    ImageRequest {
        ref_name,
        platform: opts.platform,
        message: opts.message,
    }
}

fn imported(ctx: &Ctx, r: &ImageReport) -> anyhow::Result<ExitCode> {
    let value = serde_json::to_value(r)?;
    ctx.emit(value, || {
        if !ctx.quiet {
            eprintln!(
                "imported image {} ({}, {} layers, {} compressed): {} files, {}; stored {} new in {:.0} ms",
                r.digest,
                r.platform,
                r.layers.len(),
                bytes(r.layers.iter().map(|l| l.size).sum()),
                r.import.files,
                bytes(r.import.bytes),
                bytes(r.import.new_bytes_stored),
                r.import.elapsed_ms
            );
            for w in &r.import.warnings {
                eprintln!("warning: {w}");
            }
            if let Some(n) = &r.import.ref_name {
                eprintln!("ref {n} -> {}", r.import.snapshot.short());
            }
        }
        r.import.snapshot.to_string()
    });
    Ok(ExitCode::SUCCESS)
}
