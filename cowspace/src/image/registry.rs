//! An image source on an OCI distribution registry (the `/v2/` API): manifests by tag or
//! digest, blobs streamed, anonymous, basic or bearer-token access.
//!
//! Written here, on `reqwest`'s blocking client, because the Rust registry clients
//! (`oci-client`, `oci-distribution`) are async and buffer or spool what they fetch,
//! while the store's import reads a layer as one `Read` stream while its own threads
//! compress: a blocking response body is exactly that. This file holds only the
//! protocol's small part an import needs (GET of manifests and blobs, the token dance);
//! every byte it returns is checked against its digest by the import, not here.
//!
//! Scheme: plain HTTP for a registry on the loopback (`127.0.0.1`, `localhost`, `[::1]`,
//! as docker treats them), HTTPS with the system's roots for any other.
//!
//! Credentials never come from arguments: `COWSPACE_REGISTRY_AUTH=USER:PASSWORD` in the
//! environment, else the docker configuration file (`$DOCKER_CONFIG/config.json` or
//! `~/.docker/config.json`, its `auths.HOST.auth`, as `docker login` writes it;
//! credential helpers are not run).

use std::io::Read;
use std::time::Duration;

use base64::Engine;
use cowspace_store::error::{Error, Result};
use cowspace_store::image::verify::check_digest;
use cowspace_store::image::{ACCEPTED_MANIFESTS, Blob, ImageSource, MAX_MANIFEST_BYTES, Top};
use reqwest::StatusCode;
use reqwest::blocking::{Client, Response};
use reqwest::header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};

/// The environment variable holding `USER:PASSWORD` for the registry.
pub const AUTH_ENV: &str = "COWSPACE_REGISTRY_AUTH";
/// How long a connection may take to open, and a read to bring anything.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest token answer read.
const MAX_TOKEN_BYTES: u64 = 1 << 20;

/// An image reference: `HOST[:PORT]/REPO[:TAG][@DIGEST]` (no host: Docker Hub).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// As the user names it (`docker.io` for Docker Hub).
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Reference> {
        let bad = |why: &str| {
            Error::Invalid(format!(
                "image reference {}: {why}; expected HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST], \
                 e.g. 127.0.0.1:5000/tools/busybox:1.36",
                cowspace_store::error::shown(s)
            ))
        };
        if s.contains("://") {
            return Err(bad(
                "no scheme is given (http is used for a loopback registry, https otherwise)",
            ));
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => {
                check_digest(d)?;
                (n, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (first, rest) = name.split_once('/').unwrap_or(("", name));
        let (registry, path) = if !first.is_empty()
            && (first.contains('.') || first.contains(':') || first == "localhost")
        {
            (first.to_string(), rest.to_string())
        } else {
            ("docker.io".to_string(), name.to_string())
        };
        let (repo, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r.to_string(), Some(t.to_string())),
            _ => (path.clone(), None),
        };
        if repo.is_empty()
            || !repo.split('/').all(|seg| {
                !seg.is_empty()
                    && seg.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
            })
        {
            return Err(bad(
                "the repository must be lowercase letters, digits, '.', '_', '-' and '/'",
            ));
        }
        if let Some(t) = &tag
            && (t.is_empty()
                || t.len() > 128
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(bad("a tag is 1 to 128 letters, digits, '.', '_' or '-'"));
        }
        let repository = if registry == "docker.io" && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".into())
        } else {
            tag
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What the manifest is fetched by: the digest when given, else the tag.
    fn object(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .expect("a tag or a digest")
    }

    /// The host the API is on.
    fn api_host(&self) -> &str {
        if self.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }

    /// Whether the registry is on the loopback (then plain HTTP).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => self.registry.split(':').next().unwrap_or(""),
        };
        matches!(host, "127.0.0.1" | "localhost" | "::1")
    }

    /// A ref name for the image when none is given: `images/HOST/REPO/TAG` (a `:` of
    /// the host as `-`; by digest, `sha256-` and its first 16 hex digits).
    pub fn default_ref(&self) -> String {
        let last = match (&self.tag, &self.digest) {
            // A checked digest: `sha256:` and 64 hex digits.
            (_, Some(d)) => {
                let hex = &d["sha256:".len()..];
                format!("sha256-{}", &hex[..16])
            }
            (Some(t), None) => t.clone(),
            (None, None) => "latest".into(),
        };
        format!(
            "images/{}/{}/{last}",
            self.registry.replace([':', '[', ']'], "-"),
            self.repository
        )
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// How requests are authorised.
enum Auth {
    None,
    Basic(String, String),
    Bearer(String),
}

/// A registry repository as an [`ImageSource`].
pub struct Registry {
    reference: Reference,
    client: Client,
    base: String,
    creds: Option<(String, String)>,
    auth: Auth,
}

impl Registry {
    pub fn new(reference: Reference) -> Result<Registry> {
        let client = Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // The blocking client applies this to the response's head and to each read of
            // its body, not to the whole transfer: a large layer may take longer.
            .timeout(READ_TIMEOUT)
            .user_agent(concat!("cowspace/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| remote(&reference, "client", e.to_string()))?;
        let scheme = if reference.is_loopback() {
            "http"
        } else {
            "https"
        };
        let base = format!(
            "{scheme}://{}/v2/{}",
            reference.api_host(),
            reference.repository
        );
        let creds = credentials(&reference)?;
        Ok(Registry {
            reference,
            client,
            base,
            creds,
            auth: Auth::None,
        })
    }

    /// GET `url` (authorising when the registry asks), failing on anything but 2xx.
    fn get(&mut self, url: &str, accept: Option<&str>, what: &str) -> Result<Response> {
        let mut asked = false;
        loop {
            let mut req = self.client.get(url);
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            req = match &self.auth {
                Auth::None => req,
                Auth::Basic(u, p) => req.basic_auth(u, Some(p)),
                Auth::Bearer(t) => req.bearer_auth(t),
            };
            let resp = req
                .send()
                .map_err(|e| remote(&self.reference, what, describe(&e)))?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED && !asked {
                asked = true;
                let challenge = resp
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                self.authorise(&challenge)?;
                continue;
            }
            if status.is_success() {
                return Ok(resp);
            }
            return Err(match status {
                StatusCode::NOT_FOUND => Error::NotFound {
                    what: "image object",
                    name: format!("{what} of {} (HTTP 404)", self.reference),
                },
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    let fix = match self.creds {
                        Some(_) => " with the credentials given".to_string(),
                        None => format!(
                            "; give credentials with {AUTH_ENV}=USER:PASSWORD or `docker login`"
                        ),
                    };
                    Error::Invalid(format!(
                        "{}: the registry refused access to {what} (HTTP {status}){fix}",
                        self.reference
                    ))
                }
                _ => remote(&self.reference, what, format!("HTTP {status}")),
            });
        }
    }

    /// Answers a `WWW-Authenticate` challenge: basic with the credentials, or a bearer
    /// token fetched from the realm it names (with the credentials when there are some).
    fn authorise(&mut self, challenge: &str) -> Result<()> {
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        let params = parse_params(params);
        if scheme.eq_ignore_ascii_case("basic") {
            let Some((u, p)) = self.creds.clone() else {
                return Err(Error::Invalid(format!(
                    "{} needs credentials: set {AUTH_ENV}=USER:PASSWORD or run `docker login {}`",
                    self.reference, self.reference.registry
                )));
            };
            self.auth = Auth::Basic(u, p);
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(remote(
                &self.reference,
                "authorisation",
                format!("unknown challenge {challenge:?}"),
            ));
        }
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| {
                remote(
                    &self.reference,
                    "authorisation",
                    "a bearer challenge without a realm".into(),
                )
            })?;
        let mut query: Vec<(String, String)> = params
            .iter()
            .filter(|(k, _)| k == "service" || k == "scope")
            .cloned()
            .collect();
        if !query.iter().any(|(k, _)| k == "scope") {
            query.push((
                "scope".into(),
                format!("repository:{}:pull", self.reference.repository),
            ));
        }
        let url = reqwest::Url::parse_with_params(&realm, &query).map_err(|e| {
            remote(
                &self.reference,
                "authorisation",
                format!("token realm {realm:?}: {e}"),
            )
        })?;
        let mut req = self.client.get(url);
        if let Some((u, p)) = &self.creds {
            req = req.basic_auth(u, Some(p));
        }
        let resp = req
            .send()
            .map_err(|e| remote(&self.reference, "token", describe(&e)))?;
        if !resp.status().is_success() {
            return Err(Error::Invalid(format!(
                "{}: the token service refused (HTTP {}){}",
                self.reference,
                resp.status(),
                if self.creds.is_none() {
                    format!("; give credentials with {AUTH_ENV}=USER:PASSWORD")
                } else {
                    String::new()
                }
            )));
        }
        let mut body = Vec::new();
        resp.take(MAX_TOKEN_BYTES)
            .read_to_end(&mut body)
            .map_err(|e| remote(&self.reference, "token", e.to_string()))?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| remote(&self.reference, "token", format!("not JSON: {e}")))?;
        let token = v["token"]
            .as_str()
            .or(v["access_token"].as_str())
            .ok_or_else(|| remote(&self.reference, "token", "no token in the answer".into()))?;
        self.auth = Auth::Bearer(token.to_string());
        Ok(())
    }

    fn manifest_bytes(&mut self, object: &str) -> Result<(Vec<u8>, Option<String>)> {
        let url = format!("{}/manifests/{object}", self.base);
        let accept = ACCEPTED_MANIFESTS.join(", ");
        let resp = self.get(&url, Some(&accept), &format!("manifest {object}"))?;
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
            .filter(|v| !v.is_empty());
        let mut bytes = Vec::new();
        resp.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| remote(&self.reference, "manifest", e.to_string()))?;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::Invalid(format!(
                "{}: manifest {object} is larger than {MAX_MANIFEST_BYTES} bytes",
                self.reference
            )));
        }
        Ok((bytes, media_type))
    }
}

impl ImageSource for Registry {
    fn describe(&self) -> String {
        self.reference.to_string()
    }

    fn top(&mut self) -> Result<Top> {
        let object = self.reference.object().to_string();
        let (bytes, media_type) = self.manifest_bytes(&object)?;
        Ok(Top::Fetched {
            bytes,
            media_type,
            expected: self.reference.digest.clone(),
        })
    }

    fn manifest(&mut self, blob: &Blob) -> Result<Vec<u8>> {
        Ok(self.manifest_bytes(&blob.digest)?.0)
    }

    fn blob(&mut self, blob: &Blob) -> Result<Box<dyn Read + '_>> {
        let url = format!("{}/blobs/{}", self.base, blob.digest);
        let resp = self.get(&url, None, &format!("blob {}", blob.digest))?;
        Ok(Box::new(resp))
    }
}

fn remote(r: &Reference, object: &str, why: String) -> Error {
    Error::Remote {
        remote: r.registry.clone(),
        object: object.to_string(),
        why,
    }
}

/// A transport error with its causes (reqwest's own message is only the outermost).
fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// `k1="v1",k2=v2` of a challenge.
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let (v, after) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.push((k, v.to_string()));
        rest = after.trim_start_matches([',', ' ']);
    }
    out
}

/// The credentials for `r`'s registry, from the environment or the docker config file.
fn credentials(r: &Reference) -> Result<Option<(String, String)>> {
    if let Ok(v) = std::env::var(AUTH_ENV) {
        let (u, p) = v
            .split_once(':')
            .ok_or_else(|| Error::Invalid(format!("{AUTH_ENV} must be USER:PASSWORD")))?;
        return Ok(Some((u.to_string(), p.to_string())));
    }
    let dir = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => std::path::PathBuf::from(d),
        None => match std::env::var_os("HOME") {
            Some(h) => std::path::PathBuf::from(h).join(".docker"),
            None => return Ok(None),
        },
    };
    let path = dir.join("config.json");
    let Ok(text) = std::fs::read(&path) else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| Error::Invalid(format!("{} is not JSON: {e}", path.display())))?;
    let keys: Vec<String> = if r.registry == "docker.io" {
        vec![
            "https://index.docker.io/v1/".into(),
            "docker.io".into(),
            "index.docker.io".into(),
        ]
    } else {
        vec![
            r.registry.clone(),
            format!("https://{}", r.registry),
            format!("http://{}", r.registry),
        ]
    };
    for k in keys {
        if let Some(auth) = v["auths"][&k]["auth"].as_str() {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .map_err(|e| {
                    Error::Invalid(format!(
                        "{}: auths.{k}.auth is not base64: {e}",
                        path.display()
                    ))
                })?;
            let s = String::from_utf8(raw).map_err(|_| {
                Error::Invalid(format!("{}: auths.{k}.auth is not UTF-8", path.display()))
            })?;
            let (u, p) = s.split_once(':').ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: auths.{k}.auth is not USER:PASSWORD",
                    path.display()
                ))
            })?;
            return Ok(Some((u.to_string(), p.to_string())));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = Reference::parse("127.0.0.1:5000/tools/busybox:1.36").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "tools/busybox");
        assert_eq!(r.tag.as_deref(), Some("1.36"));
        assert!(r.is_loopback());
        assert_eq!(r.default_ref(), "images/127.0.0.1-5000/tools/busybox/1.36");
        let r = Reference::parse("python").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "library/python")
        );
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert!(!r.is_loopback());
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = Reference::parse(&format!("localhost:5000/x@{d}")).unwrap();
        assert_eq!(r.digest.as_deref(), Some(d.as_str()));
        assert_eq!(r.tag, None);
        assert_eq!(
            r.default_ref(),
            format!("images/localhost-5000/x/sha256-{}", "ab".repeat(8))
        );
        for bad in [
            "http://x.io/a:b",
            "x.io/A",
            "x.io/a:",
            "x.io/a@sha256:zz",
            "x.io//a",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn challenge_parameters() {
        let p = parse_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        );
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[1], ("service".into(), "registry.example".into()));
        assert_eq!(p[2], ("scope".into(), "repository:a/b:pull".into()));
    }
}
