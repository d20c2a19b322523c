//! The certificate authority of one sandbox, and the leaf certificates it signs.
//!
//! [`CaPem::generate`] makes a fresh authority (an ECDSA P-256 key and a self-signed
//! certificate allowed to sign leaves only, path length 0). The process that starts the
//! sandbox makes it, installs the certificate inside the sandbox as a trusted root, and
//! hands the key to the proxy over its control socket: the key is never inside the
//! sandbox. The proxy signs one leaf per host name on first use ([`LeafCache`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::{Deserialize, Serialize};

use super::SecretValue;

/// Most leaf certificates kept; past it the cache is emptied and refilled on demand.
pub const MAX_CACHED_LEAVES: usize = 1024;

/// An authority as it crosses the control socket. `Debug` does not show the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaPem {
    /// The subject's common name (the issuer name of every leaf).
    pub common_name: String,
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: SecretValue,
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "cowspace");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl CaPem {
    /// A new authority named `common_name`.
    pub fn generate(common_name: &str) -> Result<CaPem, rcgen::Error> {
        let key = KeyPair::generate()?;
        let cert = ca_params(common_name).self_signed(&key)?;
        Ok(CaPem {
            common_name: common_name.to_string(),
            cert_pem: cert.pem(),
            key_pem: SecretValue(key.serialize_pem()),
        })
    }
}

/// Signs and keeps leaf certificates for host names.
pub(crate) struct LeafCache {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl LeafCache {
    pub fn new(
        ca: &CaPem,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<LeafCache, String> {
        use rustls::pki_types::pem::PemObject;
        let key = KeyPair::from_pem(&ca.key_pem.0)
            .map_err(|e| format!("the certificate authority's key does not load: {e}"))?;
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())
            .map_err(|e| format!("the certificate authority's certificate does not load: {e}"))?;
        Ok(LeafCache {
            issuer: Issuer::new(ca_params(&ca.common_name), key),
            ca_der,
            leaves: Mutex::new(HashMap::new()),
            provider,
        })
    }

    /// The server configuration presenting a leaf for `host` (made on first use).
    pub fn config_for(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if let Some(c) = self
            .leaves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
        {
            return Ok(c.clone());
        }
        let failed = |e: rcgen::Error| format!("cannot sign a certificate for {host}: {e}");
        let key = KeyPair::generate().map_err(failed)?;
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(failed)?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = std::time::SystemTime::now();
        params.not_before = (now - std::time::Duration::from_secs(24 * 3600)).into();
        params.not_after = (now + std::time::Duration::from_secs(90 * 24 * 3600)).into();
        let leaf = params.signed_by(&key, &self.issuer).map_err(failed)?;
        let chain = vec![leaf.der().clone(), self.ca_der.clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| format!("TLS configuration for {host}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if leaves.len() >= MAX_CACHED_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_authority_signs_leaves_and_hides_its_key() {
        let ca = CaPem::generate("test CA").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let cache = LeafCache::new(&ca, provider).unwrap();
        let a = cache.config_for("api.example.com").unwrap();
        let b = cache.config_for("api.example.com").unwrap();
        assert!(Arc::ptr_eq(&a, &b), "leaves are cached per host");
    }
}
