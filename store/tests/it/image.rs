//! Image import from OCI layouts built here: layers applied in order with whiteouts and
//! opaque directories, platforms picked from an index, metadata recorded, and hostile
//! images (unsafe entries, lying digests and sizes, missing blobs, bad configs) refused
//! with the right kind and nothing stored.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use cowspace_store::image::info::ImageInfo;
use cowspace_store::image::{ImageOptions, Platform, layout};
use cowspace_store::{ErrorKind, Source, Store, StoreConfig};
use sha2::{Digest, Sha256};

use crate::common;

fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// A tar entry with a raw name (so unsafe names can be written).
fn raw(b: &mut tar::Builder<Vec<u8>>, ty: u8, name: &[u8], link: &[u8], mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::new(ty));
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_mtime(1);
    h.set_device_major(1).unwrap();
    h.set_device_minor(3).unwrap();
    let old = h.as_old_mut();
    old.name = [0; 100];
    old.name[..name.len()].copy_from_slice(name);
    old.linkname = [0; 100];
    old.linkname[..link.len()].copy_from_slice(link);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn f(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    raw(b, b'0', name.as_bytes(), b"", 0o644, data);
}

fn d(b: &mut tar::Builder<Vec<u8>>, name: &str) {
    raw(b, b'5', name.as_bytes(), b"", 0o755, b"");
}

/// A layer: the uncompressed tar and its gzip.
struct Layer {
    tar: Vec<u8>,
    gz: Vec<u8>,
}

fn layer(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    let tar = b.into_inner().unwrap();
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&tar).unwrap();
    Layer {
        gz: e.finish().unwrap(),
        tar,
    }
}

/// An OCI layout directory being written.
struct Oci {
    dir: PathBuf,
    index: Vec<serde_json::Value>,
}

impl Oci {
    fn new(dir: &Path) -> Oci {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Oci {
            dir: dir.to_path_buf(),
            index: vec![],
        }
    }

    fn blob(&self, bytes: &[u8]) -> (String, u64) {
        let d = sha(bytes);
        fs::write(self.dir.join("blobs/sha256").join(&d[7..]), bytes).unwrap();
        (d, bytes.len() as u64)
    }

    /// Writes config and manifest for `layers`; returns the manifest's descriptor.
    fn image(&self, layers: &[&Layer], arch: &str, env: &[&str]) -> serde_json::Value {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha(&l.tar)).collect();
        let config = serde_json::json!({
            "architecture": arch, "os": "linux",
            "config": {"Env": env, "WorkingDir": "/work", "User": "1000:1000",
                       "Cmd": ["/bin/sh"], "ExposedPorts": {"8080/tcp": {}}},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        self.manifest(layers, &serde_json::to_vec(&config).unwrap(), arch)
    }

    fn manifest(&self, layers: &[&Layer], config: &[u8], arch: &str) -> serde_json::Value {
        let (cd, cs) = self.blob(config);
        let ls: Vec<_> = layers
            .iter()
            .map(|l| {
                let (d, s) = self.blob(&l.gz);
                serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": s})
            })
            .collect();
        let m = serde_json::json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
            "layers": ls,
        });
        let (md, ms) = self.blob(&serde_json::to_vec(&m).unwrap());
        serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
                           "platform": {"os": "linux", "architecture": arch}})
    }

    fn tag(&mut self, mut desc: serde_json::Value, tag: &str) {
        desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
        self.index.push(desc);
        let index = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": self.index});
        fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }
}

fn opts(reference: &str, r: &str) -> ImageOptions {
    ImageOptions {
        ref_name: Some(r.into()),
        reference: reference.into(),
        platform: Some(Platform::parse("linux/amd64").unwrap()),
        ..Default::default()
    }
}

fn import(
    store: &Store,
    spec: &str,
    r: &str,
) -> cowspace_store::Result<cowspace_store::image::ImageReport> {
    let mut src = layout::open(spec)?;
    store.import_image(src.as_mut(), &opts(spec, r))
}

fn export_listing(store: &Store, snap: &cowspace_store::SnapshotId, dest: &Path) -> Vec<String> {
    store.export_dir(snap, dest).unwrap();
    common::listing(dest)
}

fn base_layer() -> Layer {
    layer(|b| {
        d(b, "./");
        d(b, "etc/");
        f(b, "etc/gone", b"whited out\n");
        f(b, "etc/kept", b"kept\n");
        f(b, "etc/replaced", b"old\n");
        d(b, "opq/");
        f(b, "opq/old1", b"1\n");
        d(b, "opq/sub/");
        f(b, "opq/sub/old2", b"2\n");
        raw(b, b'0', b"bin/su", b"", 0o4755, b"setuid\n");
        raw(
            b,
            b'2',
            b"etc/localtime",
            b"/usr/share/zoneinfo/UTC",
            0o777,
            b"",
        );
        raw(b, b'3', b"dev/null", b"", 0o666, b"");
        f(b, "big.bin", &common::noise(7, 3_000_000));
    })
}

fn top_layer() -> Layer {
    layer(|b| {
        f(b, "opq/new-before", b"this layer's, before the marker\n");
        f(b, "etc/.wh.gone", b"");
        f(b, "opq/.wh..wh..opq", b"");
        f(b, "opq/new-after", b"after the marker\n");
        f(b, "etc/replaced", b"new\n");
        f(b, "etc/.wh.replaced", b"");
    })
}

#[test]
fn layers_apply_in_order_with_whiteouts_and_opaque_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let mut oci = Oci::new(&tmp.path().join("img"));
    let (l1, l2) = (base_layer(), top_layer());
    let desc = oci.image(&[&l1, &l2], "amd64", &["PATH=/bin", "MARK=yes"]);
    oci.tag(desc, "v1");
    let spec = format!("{}:v1", tmp.path().join("img").display());
    let rep = import(&store, &spec, "images/test").unwrap();
    let out = export_listing(&store, &rep.import.snapshot, &tmp.path().join("out"));
    let names: Vec<&str> = out.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert!(!names.contains(&"etc/gone"), "{out:#?}");
    assert!(names.contains(&"etc/kept"));
    // A whiteout hides only lower layers: this layer's own replacement stays.
    assert_eq!(
        fs::read(tmp.path().join("out/etc/replaced")).unwrap(),
        b"new\n"
    );
    assert!(
        !names.contains(&"opq/old1") && !names.contains(&"opq/sub"),
        "{out:#?}"
    );
    assert!(names.contains(&"opq/new-before") && names.contains(&"opq/new-after"));
    assert!(!names.iter().any(|n| n.contains(".wh.")), "{out:#?}");
    // Set-uid kept (made inert by nosuid at use), device nodes left out with a warning.
    assert!(
        out.iter().any(|l| l.starts_with("f bin/su 4755")),
        "{out:#?}"
    );
    assert!(!names.contains(&"dev/null"));
    assert!(rep.import.warnings.iter().any(|w| w.contains("dev/null")));
    // An absolute symlink is fine in a root filesystem.
    assert!(out.contains(&"l etc/localtime -> /usr/share/zoneinfo/UTC".to_string()));
    // Metadata.
    let snap = store.snapshot(&rep.import.snapshot).unwrap();
    let Source::Image {
        manifest, digest, ..
    } = &snap.source
    else {
        panic!("{:?}", snap.source)
    };
    assert_eq!(&rep.digest, digest);
    assert_eq!(sha(manifest.as_bytes()), rep.manifest_digest);
    let info = ImageInfo::of(&snap).unwrap().unwrap();
    assert_eq!(info.env, ["PATH=/bin", "MARK=yes"]);
    assert_eq!(info.working_dir.as_deref(), Some("/work"));
    assert_eq!(info.user.as_deref(), Some("1000:1000"));
    assert_eq!(info.exposed_ports, ["8080/tcp"]);
    assert_eq!(info.layers.len(), 2);
    assert_eq!(
        store.get_ref("images/test").unwrap(),
        Some(rep.import.snapshot)
    );

    // Dedup: an image sharing the base layer stores only its own new bytes.
    let l3 = layer(|b| f(b, "only-in-second", b"second\n"));
    let desc = oci.image(&[&l1, &l3], "amd64", &[]);
    oci.tag(desc, "v2");
    let rep2 = import(
        &store,
        &format!("{}:v2", tmp.path().join("img").display()),
        "images/second",
    )
    .unwrap();
    assert!(
        rep2.import.new_bytes_stored < 100_000,
        "{}",
        rep2.import.new_bytes_stored
    );
}

#[test]
fn an_index_gives_the_platform_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let mut oci = Oci::new(&tmp.path().join("img"));
    let amd = layer(|b| f(b, "arch", b"amd64\n"));
    let arm = layer(|b| f(b, "arch", b"arm64\n"));
    let (ma, mr) = (
        oci.image(&[&amd], "amd64", &[]),
        oci.image(&[&arm], "arm64", &[]),
    );
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [ma, mr]});
    let (id, is) = oci.blob(&serde_json::to_vec(&index).unwrap());
    oci.tag(serde_json::json!({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": id, "size": is}), "multi");
    let spec = format!("{}:multi", tmp.path().join("img").display());
    for (arch, want) in [("amd64", "amd64\n"), ("arm64", "arm64\n")] {
        let mut src = layout::open(&spec).unwrap();
        let mut o = opts(&spec, &format!("m/{arch}"));
        o.platform = Some(Platform::parse(&format!("linux/{arch}")).unwrap());
        let rep = store.import_image(src.as_mut(), &o).unwrap();
        assert_eq!(rep.digest, id, "the index's digest is the image's");
        assert_ne!(rep.manifest_digest, id);
        let out = tmp.path().join(format!("out-{arch}"));
        store.export_dir(&rep.import.snapshot, &out).unwrap();
        assert_eq!(fs::read_to_string(out.join("arch")).unwrap(), want);
    }
    let mut src = layout::open(&spec).unwrap();
    let mut o = opts(&spec, "m/s390x");
    o.platform = Some(Platform::parse("linux/s390x").unwrap());
    let e = store.import_image(src.as_mut(), &o).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("linux/amd64, linux/arm64"), "{e}");
}

/// Each hostile image is refused with its kind, and nothing is stored or named.
#[test]
fn hostile_images_are_refused_and_nothing_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let good = std::rc::Rc::new(layer(|b| f(b, "big.bin", &common::noise(9, 2_000_000))));
    let (g1, g2, g3, g4, g5) = (good.clone(), good.clone(), good.clone(), good.clone(), good);

    type Case = (
        &'static str,
        ErrorKind,
        &'static str,
        Box<dyn Fn(&Oci) -> serde_json::Value>,
    );
    let evil = |name: &'static [u8], ty: u8, link: &'static [u8]| {
        move |o: &Oci| {
            let bad = layer(|b| {
                f(b, "ok", b"ok\n");
                raw(b, ty, name, link, 0o644, b"x");
            });
            o.image(&[&base_layer(), &bad], "amd64", &[])
        }
    };
    let cases: Vec<Case> = vec![
        (
            "absolute path",
            ErrorKind::InvalidInput,
            "absolute",
            Box::new(evil(b"/etc/evil", b'0', b"")),
        ),
        (
            "dotdot",
            ErrorKind::InvalidInput,
            "..",
            Box::new(evil(b"a/../../evil", b'0', b"")),
        ),
        (
            "hard link out",
            ErrorKind::InvalidInput,
            "hard link",
            Box::new(evil(b"hl", b'1', b"../etc/passwd")),
        ),
        (
            "hard link to nothing",
            ErrorKind::InvalidInput,
            "hard link",
            Box::new(evil(b"hl", b'1', b"nothere")),
        ),
        (
            "write through a symlink",
            ErrorKind::InvalidInput,
            "symlink",
            Box::new(evil(b"etc/localtime/x", b'0', b"")),
        ),
        (
            "unknown type",
            ErrorKind::InvalidInput,
            "entry type",
            Box::new(evil(b"weird", b'Z', b"")),
        ),
        (
            "whiteout escaping",
            ErrorKind::InvalidInput,
            "whiteout",
            Box::new(evil(b"etc/.wh...", b'0', b"")),
        ),
        (
            "empty whiteout",
            ErrorKind::InvalidInput,
            "whiteout",
            Box::new(evil(b"etc/.wh.", b'0', b"")),
        ),
        (
            "layer digest mismatch",
            ErrorKind::Corrupt,
            "hashes to",
            Box::new(move |o: &Oci| {
                let d = o.image(&[&*g1], "amd64", &[]);
                // Overwrite the layer blob with other bytes of the same size.
                let m: serde_json::Value = serde_json::from_slice(&blob_bytes(o, &d)).unwrap();
                let ld = m["layers"][0]["digest"].as_str().unwrap().to_string();
                let p = o.dir.join("blobs/sha256").join(&ld[7..]);
                let mut bytes = fs::read(&p).unwrap();
                let n = bytes.len();
                bytes[n / 2] ^= 0xff;
                fs::write(p, bytes).unwrap();
                d
            }),
        ),
        (
            "missing blob",
            ErrorKind::NotFound,
            "blobs/sha256",
            Box::new(move |o: &Oci| {
                let d = o.image(&[&*g2], "amd64", &[]);
                let m: serde_json::Value = serde_json::from_slice(&blob_bytes(o, &d)).unwrap();
                let ld = m["layers"][0]["digest"].as_str().unwrap().to_string();
                fs::remove_file(o.dir.join("blobs/sha256").join(&ld[7..])).unwrap();
                d
            }),
        ),
        (
            "config not JSON",
            ErrorKind::InvalidInput,
            "config",
            Box::new(move |o: &Oci| o.manifest(&[&*g3], b"this is not JSON", "amd64")),
        ),
        (
            "diff id mismatch",
            ErrorKind::Corrupt,
            "diff_id",
            Box::new(move |o: &Oci| {
                let config = serde_json::json!({"architecture": "amd64", "os": "linux",
                    "rootfs": {"type": "layers", "diff_ids": [sha(b"other")]}});
                o.manifest(&[&*g4], &serde_json::to_vec(&config).unwrap(), "amd64")
            }),
        ),
        (
            "huge declared size",
            ErrorKind::InvalidInput,
            "declares",
            Box::new(move |o: &Oci| {
                let mut d = o.image(&[&*g5], "amd64", &[]);
                let mut m: serde_json::Value = serde_json::from_slice(&blob_bytes(o, &d)).unwrap();
                m["layers"][0]["size"] = serde_json::json!(1u64 << 60);
                let (md, ms) = o.blob(&serde_json::to_vec(&m).unwrap());
                d["digest"] = md.into();
                d["size"] = ms.into();
                d
            }),
        ),
    ];
    for (i, (what, kind, needle, make)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("img{i}"));
        let mut oci = Oci::new(&dir);
        let desc = make(&oci);
        oci.tag(desc, "t");
        let before_packs = common::pack_files(&root).len();
        let e = import(&store, &format!("{}:t", dir.display()), "evil").expect_err(what);
        assert_eq!(e.kind(), kind, "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
        assert!(store.snapshot_ids().unwrap().is_empty(), "{what}");
        assert_eq!(store.get_ref("evil").unwrap(), None, "{what}");
        assert_eq!(
            common::pack_files(&root).len(),
            before_packs,
            "{what}: packs removed"
        );
    }
}

fn blob_bytes(o: &Oci, desc: &serde_json::Value) -> Vec<u8> {
    let d = desc["digest"].as_str().unwrap();
    fs::read(o.dir.join("blobs/sha256").join(&d[7..])).unwrap()
}

/// An image whose first layers an image in the store already has starts from that
/// image's tree: those layers are not fetched (here their blobs are gone from the
/// layout, so a fetch would fail), and the result is the tree a full import makes,
/// hard links included.
#[test]
fn layers_an_image_in_the_store_holds_are_not_fetched_again() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let l1 = layer(|b| {
        f(b, "etc/base", b"base\n");
        raw(b, b'1', b"etc/base-link", b"etc/base", 0o644, b"");
        f(b, "etc/gone", b"gone\n");
        raw(b, b'2', b"lib", b"usr/lib", 0o777, b"");
    });
    let (l2, l3) = (base_layer(), top_layer());
    let mut oci = Oci::new(&tmp.path().join("img"));
    let first = oci.image(&[&l1, &l2], "amd64", &[]);
    oci.tag(first, "base");
    let derived = oci.image(&[&l1, &l2, &l3], "amd64", &["X=1"]);
    oci.tag(derived, "derived");
    let spec = |t: &str| format!("{}:{t}", tmp.path().join("img").display());
    // The same derived image in a store of its own, imported in full.
    let full_store = Store::init(&tmp.path().join("full"), StoreConfig::default()).unwrap();
    let full = import(&full_store, &spec("derived"), "d").unwrap();
    assert!(full.reused_from.is_none());

    let base = import(&store, &spec("base"), "images/base").unwrap();
    // The shared layers' blobs go: only the third can be read now.
    for l in [&l1, &l2] {
        let (digest, _) = oci.blob(&l.gz);
        fs::remove_file(tmp.path().join("img/blobs/sha256").join(&digest[7..])).unwrap();
    }
    let rep = import(&store, &spec("derived"), "images/derived").unwrap();
    assert_eq!(rep.reused_from.as_ref(), Some(&base.import.snapshot));
    let reused: Vec<bool> = rep.layers.iter().map(|l| l.reused).collect();
    assert_eq!(reused, [true, true, false]);
    assert_eq!(
        rep.import.root, full.import.root,
        "the tree differs from a full import's"
    );
    let a = export_listing(&store, &rep.import.snapshot, &tmp.path().join("a"));
    let b = export_listing(&full_store, &full.import.snapshot, &tmp.path().join("b"));
    assert_eq!(a, b);
    // Without an image of those layers in the store (its ref gone), the blobs are needed.
    store
        .delete_ref("images/base", base.import.snapshot)
        .unwrap();
    store
        .delete_ref("images/derived", rep.import.snapshot)
        .unwrap();
    let e = import(&store, &spec("derived"), "images/again").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}
