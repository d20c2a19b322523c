//! One remote's object store client (the `object_store` crate's S3 client), with a
//! blocking face: the store and the daemon's FUSE threads are not async.
//!
//! Credentials come from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and
//! `AWS_SESSION_TOKEN`), else from the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, default `~/.aws/credentials`, profile `AWS_PROFILE` or
//! `default`): never from arguments, never from the root's index.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use cowspace_store::remote::RemoteConfig;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as KeyPath;
use object_store::{
    ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion,
};

use crate::error::{Error, Result};

/// Seconds a connection attempt may take.
const CONNECT_TIMEOUT_SECS: u64 = 3;
/// Seconds one request may take.
const REQUEST_TIMEOUT_SECS: u64 = 60;
/// Retries of a failed request (5xx, 429, connection errors), and their time budget: a
/// read through a workspace waits at most this long for a remote that is down.
const MAX_RETRIES: usize = 2;
const RETRY_BUDGET_SECS: u64 = 10;

/// The runtime every remote client runs on (two threads; made at first use).
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cowspace-remote")
        .enable_all()
        .build()
        .map_err(Error::io("start thread", "cowspace-remote"))?;
    // Made by another thread meanwhile: that one is kept, this one dropped.
    Ok(RT.get_or_init(|| rt))
}

/// `s3://BUCKET[/PREFIX]` split into bucket and prefix (no leading or trailing `/`).
pub fn parse_url(url: &str) -> Result<(String, String)> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| {
        Error::Invalid(format!(
            "remote URL {url:?}: write it as s3://BUCKET/PREFIX"
        ))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let ok_bucket = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !ok_bucket {
        return Err(Error::Invalid(format!(
            "remote URL {url:?}: the bucket name {bucket:?} must have 3 to 63 lowercase \
             letters, digits, '-' or '.'"
        )));
    }
    let prefix = prefix.trim_matches('/').to_string();
    if prefix.split('/').any(|s| s == "." || s == "..") {
        return Err(Error::Invalid(format!(
            "remote URL {url:?}: no '.' or '..' in the prefix"
        )));
    }
    Ok((bucket.to_string(), prefix))
}

/// Access key, secret and session token.
type Credentials = (String, String, Option<String>);

fn credentials() -> Result<Credentials> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let (Some(k), Some(s)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok((k, s, env("AWS_SESSION_TOKEN")));
    }
    let file = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".aws/credentials")));
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    if let Some(file) = &file
        && let Ok(text) = std::fs::read_to_string(file)
        && let Some(c) = from_credentials_file(&text, &profile)
    {
        return Ok(c);
    }
    Err(Error::Invalid(format!(
        "no credentials for the remote: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
         write them to {} under [{profile}] (aws_access_key_id, aws_secret_access_key)",
        file.map_or("~/.aws/credentials".into(), |f| f.display().to_string())
    )))
}

/// The keys of `[profile]` in an AWS shared credentials file.
fn from_credentials_file(text: &str, profile: &str) -> Option<Credentials> {
    let mut in_profile = false;
    let (mut key, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') && line.ends_with(']') {
            in_profile = line[1..line.len() - 1].trim() == profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().to_string();
            match k.trim() {
                "aws_access_key_id" => key = Some(v),
                "aws_secret_access_key" => secret = Some(v),
                "aws_session_token" => token = Some(v),
                _ => {}
            }
        }
    }
    Some((key?, secret?, token))
}

/// What a conditional write found.
#[derive(Debug, PartialEq, Eq)]
pub enum Cas {
    Written,
    /// Someone else's write came first (or the object is not at the version given).
    Lost,
}

/// A client for one remote, with keys relative to its prefix.
pub struct Client {
    pub name: String,
    s3: AmazonS3,
    prefix: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("name", &self.name).finish()
    }
}

impl Client {
    pub fn open(cfg: &RemoteConfig) -> Result<Client> {
        let (bucket, prefix) = parse_url(&cfg.url)?;
        let (key, secret, token) = credentials()?;
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&bucket)
            .with_region(cfg.region.as_deref().unwrap_or("us-east-1"))
            .with_access_key_id(key)
            .with_secret_access_key(secret)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(RetryConfig {
                max_retries: MAX_RETRIES,
                retry_timeout: Duration::from_secs(RETRY_BUDGET_SECS),
                ..Default::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(CONNECT_TIMEOUT_SECS))
                    .with_timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
                    .with_allow_http(
                        cfg.endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http://")),
                    ),
            );
        if let Some(t) = token {
            b = b.with_token(t);
        }
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
        }
        let s3 = b
            .build()
            .map_err(|e| Error::Invalid(format!("remote {}: {e}", cfg.name)))?;
        Ok(Client {
            name: cfg.name.clone(),
            s3,
            prefix,
        })
    }

    fn key(&self, rel: &str) -> KeyPath {
        if self.prefix.is_empty() {
            KeyPath::from(rel)
        } else {
            KeyPath::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// The key below the prefix of a full key.
    fn rel(&self, full: &KeyPath) -> String {
        let s = full.as_ref();
        if self.prefix.is_empty() {
            s.to_string()
        } else {
            s.strip_prefix(&format!("{}/", self.prefix))
                .unwrap_or(s)
                .to_string()
        }
    }

    fn err(&self, rel: &str, e: object_store::Error) -> Error {
        Error::Store(cowspace_store::Error::Remote {
            remote: self.name.clone(),
            object: rel.to_string(),
            why: one_line(&e),
        })
    }

    /// An object's bytes and ETag, or `None` when there is none.
    pub fn get(&self, rel: &str) -> Result<Option<(Vec<u8>, Option<String>)>> {
        let key = self.key(rel);
        runtime()?.block_on(async {
            match self.s3.get_opts(&key, GetOptions::default()).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    let bytes = r.bytes().await.map_err(|e| self.err(rel, e))?;
                    Ok(Some((bytes.to_vec(), etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.err(rel, e)),
            }
        })
    }

    /// Byte ranges of an object (`get_ranges` coalesces neighbouring ranges).
    pub fn get_ranges(&self, rel: &str, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        let key = self.key(rel);
        runtime()?.block_on(async {
            let got = self
                .s3
                .get_ranges(&key, ranges)
                .await
                .map_err(|e| self.err(rel, e))?;
            Ok(got.into_iter().map(|b| b.to_vec()).collect())
        })
    }

    /// Whether an object exists.
    pub fn exists(&self, rel: &str) -> Result<bool> {
        let key = self.key(rel);
        runtime()?.block_on(async {
            match self.s3.head(&key).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(self.err(rel, e)),
            }
        })
    }

    /// Writes an object that must not exist yet (`If-None-Match: *`). `Lost` when it
    /// exists (for content-named objects: the same bytes, already there).
    pub fn put_new(&self, rel: &str, bytes: Vec<u8>) -> Result<Cas> {
        self.put(rel, bytes, PutMode::Create)
    }

    /// Replaces an object at the version `etag` (`If-Match`).
    pub fn put_if(&self, rel: &str, bytes: Vec<u8>, etag: Option<String>) -> Result<Cas> {
        self.put(
            rel,
            bytes,
            PutMode::Update(UpdateVersion {
                e_tag: etag,
                version: None,
            }),
        )
    }

    fn put(&self, rel: &str, bytes: Vec<u8>, mode: PutMode) -> Result<Cas> {
        let key = self.key(rel);
        runtime()?.block_on(async {
            let opts = PutOptions {
                mode,
                ..Default::default()
            };
            match self.s3.put_opts(&key, PutPayload::from(bytes), opts).await {
                Ok(_) => Ok(Cas::Written),
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => Ok(Cas::Lost),
                Err(e) => Err(self.err(rel, e)),
            }
        })
    }

    pub fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        runtime()?.block_on(async {
            match self.s3.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.err(rel, e)),
            }
        })
    }

    /// Every object below `rel_prefix`: (key below the remote's prefix, size, modified
    /// at in seconds since the epoch).
    pub fn list(&self, rel_prefix: &str) -> Result<Vec<(String, u64, i64)>> {
        let key = self.key(rel_prefix.trim_end_matches('/'));
        runtime()?.block_on(async {
            let metas: Vec<object_store::ObjectMeta> = self
                .s3
                .list(Some(&key))
                .try_collect()
                .await
                .map_err(|e| self.err(rel_prefix, e))?;
            Ok(metas
                .into_iter()
                .map(|m| (self.rel(&m.location), m.size, m.last_modified.timestamp()))
                .collect())
        })
    }

    /// One listing request below the prefix (answers or fails: `remote add`, `doctor`).
    pub fn probe(&self) -> Result<()> {
        let key = self.key("refs");
        runtime()?.block_on(async {
            self.s3
                .list_with_delimiter(Some(&key))
                .await
                .map(|_| ())
                .map_err(|e| self.err("refs/", e))
        })
    }
}

/// An `object_store` error on one line, without its `Debug` dump.
fn one_line(e: &object_store::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_credential_files() {
        assert_eq!(
            parse_url("s3://chunks/a/b/").unwrap(),
            ("chunks".into(), "a/b".into())
        );
        assert_eq!(
            parse_url("s3://chunks").unwrap(),
            ("chunks".into(), String::new())
        );
        assert!(parse_url("http://chunks/a").is_err());
        assert!(parse_url("s3://Bad_Bucket/a").is_err());
        assert!(parse_url("s3://chunks/../x").is_err());
        let f = "[other]\naws_access_key_id = X\naws_secret_access_key=Y\n[default]\n\
                 aws_access_key_id = AK\naws_secret_access_key = SK\n";
        assert_eq!(
            from_credentials_file(f, "default"),
            Some(("AK".into(), "SK".into(), None))
        );
        assert_eq!(from_credentials_file(f, "other").unwrap().0, "X");
        assert_eq!(from_credentials_file(f, "none"), None);
    }
}
