//! The filesystem cores speak no wire protocol: only the FUSE server (`fsd/src/fuse/`)
//! and the modules that mount a session (`view/mod.rs`, `cow/mod.rs`) name `fuser`, so a
//! second protocol serves the same cores through `filesystem::FileSystem`.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read fsd/src") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn only_the_fuse_server_and_the_mounting_modules_name_fuser() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed = [
        src.join("fuse"),
        src.join("view/mod.rs"),
        src.join("cow/mod.rs"),
        src.join("main.rs"),
    ];
    let mut files = Vec::new();
    for core in ["filesystem", "view", "cow"] {
        sources(&src.join(core), &mut files);
    }
    assert!(
        files.len() > 20,
        "the cores' sources were not found under {src:?}"
    );
    let mut found = Vec::new();
    for f in files {
        if allowed.iter().any(|a| f.starts_with(a)) {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read a source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("fuser") {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a filesystem core names the FUSE library (move the wire part to fsd/src/fuse/):\n{}",
        found.join("\n")
    );
}
