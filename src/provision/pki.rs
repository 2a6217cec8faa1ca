//! The pieces of X.509 kprov needs: kubeadm's CA pin, the sha256 of the CA certificate's
//! DER-encoded SubjectPublicKeyInfo (what `--discovery-token-ca-cert-hash` holds), and a
//! certificate's subject, issuer and validity (`get certificates`). Parsing is `x509-cert`'s
//! (RustCrypto's DER); PEM is RFC 7468's strict form, which kubeadm and openssl write.
//!
//! Caveat: it reads structure, it verifies nothing (no signature, no chain): what it reports
//! is what the host's file says, which is what the components on that host will present.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use x509_cert::Certificate;
use x509_cert::der::{Decode, Encode};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PkiError {
    #[error("no PEM CERTIFICATE block found")]
    NoPem,
    #[error("invalid PEM CERTIFICATE block: {0}")]
    Pem(String),
    #[error("invalid base64: {0}")]
    Base64(String),
    #[error("malformed certificate DER: {0}")]
    Der(String),
}

/// Hex sha256 of the SubjectPublicKeyInfo of the first certificate in `pem`.
pub(crate) fn ca_cert_hash(pem: &str) -> Result<String, PkiError> {
    let cert = Certificate::from_der(&pem_certificate(pem)?).map_err(der_error)?;
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(der_error)?;
    Ok(hex::encode(Sha256::digest(spki)))
}

/// What `get certificates` shows of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertInfo {
    /// The subject's common name (empty when it has none).
    pub(crate) subject: String,
    /// The issuer's common name.
    pub(crate) issuer: String,
    pub(crate) not_before: chrono::DateTime<chrono::Utc>,
    pub(crate) not_after: chrono::DateTime<chrono::Utc>,
}

/// Subject, issuer and validity of the first certificate in `pem`.
pub(crate) fn cert_info_pem(pem: &str) -> Result<CertInfo, PkiError> {
    cert_info(&pem_certificate(pem)?)
}

/// Standard base64 (kubeconfig `*-data` fields); whitespace is skipped.
pub(crate) fn decode_base64(text: &str) -> Result<Vec<u8>, PkiError> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| PkiError::Base64(e.to_string()))
}

/// The DER of the first `CERTIFICATE` block: files such as a kubeconfig's CA bundle may hold
/// more than one, and text before the first (openssl's `-text` output) is ignored.
fn pem_certificate(pem: &str) -> Result<Vec<u8>, PkiError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find(BEGIN).ok_or(PkiError::NoPem)?;
    let stop = pem[start..].find(END).ok_or(PkiError::NoPem)? + start + END.len();
    let (label, der) = x509_cert::der::pem::decode_vec(&pem.as_bytes()[start..stop])
        .map_err(|e| PkiError::Pem(e.to_string()))?;
    if label != "CERTIFICATE" {
        return Err(PkiError::NoPem);
    }
    Ok(der)
}

fn der_error(e: x509_cert::der::Error) -> PkiError {
    PkiError::Der(e.to_string())
}

/// Subject, issuer and validity of a DER certificate.
pub(crate) fn cert_info(der: &[u8]) -> Result<CertInfo, PkiError> {
    let tbs = Certificate::from_der(der)
        .map_err(der_error)?
        .tbs_certificate;
    let time = |t: x509_cert::time::Time| chrono::DateTime::<chrono::Utc>::from(t.to_system_time());
    Ok(CertInfo {
        subject: common_name(&tbs.subject),
        issuer: common_name(&tbs.issuer),
        not_before: time(tbs.validity.not_before),
        not_after: time(tbs.validity.not_after),
    })
}

/// The first commonName of a Name, whichever string type encodes it.
fn common_name(name: &x509_cert::name::Name) -> String {
    use x509_cert::der::asn1::{Ia5StringRef, PrintableStringRef, Utf8StringRef};
    let Some(value) = name
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .find(|atv| atv.oid == const_oid_cn())
        .map(|atv| &atv.value)
    else {
        return String::new();
    };
    if let Ok(s) = value.decode_as::<Utf8StringRef<'_>>() {
        return s.as_str().to_string();
    }
    if let Ok(s) = value.decode_as::<PrintableStringRef<'_>>() {
        return s.as_str().to_string();
    }
    if let Ok(s) = value.decode_as::<Ia5StringRef<'_>>() {
        return s.as_str().to_string();
    }
    String::from_utf8_lossy(value.value()).into_owned()
}

/// id-at-commonName, 2.5.4.3.
fn const_oid_cn() -> x509_cert::der::asn1::ObjectIdentifier {
    x509_cert::der::asn1::ObjectIdentifier::new_unwrap("2.5.4.3")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // A self-signed CA made with `openssl req -x509 -newkey ec -pkeyopt
    // ec_paramgen_curve:prime256v1 -subj /CN=kubernetes -days 3650 -nodes`; its pin was
    // computed with `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der |
    // sha256sum`, kubeadm's documented recipe.
    const CA: &str = include_str!("testdata/ca.crt");
    const CA_HASH: &str = include_str!("testdata/ca.hash");
    // `openssl x509 -noout -dates`: Nov 21 11:16:51 2026 GMT / Nov 18 11:16:51 2036 GMT.
    const NOT_BEFORE: &str = "2026-11-21T11:16:51+00:00";
    const NOT_AFTER: &str = "2036-11-18T11:16:51+00:00";

    #[test]
    fn matches_openssl() {
        assert_eq!(ca_cert_hash(CA).unwrap(), CA_HASH.trim());
    }

    #[test]
    fn errors() {
        assert_eq!(ca_cert_hash("nothing"), Err(PkiError::NoPem));
        assert!(matches!(
            ca_cert_hash("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"),
            Err(PkiError::Pem(_))
        ));
        assert!(matches!(decode_base64("!!"), Err(PkiError::Base64(_))));
        assert_eq!(decode_base64("Zm9v\nYmFy").unwrap(), b"foobar");
        assert!(matches!(
            ca_cert_hash("-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----"),
            Err(PkiError::Der(_))
        ));
    }

    #[test]
    fn cert_info_matches_openssl() {
        // `openssl x509 -noout -subject -issuer -dates` on testdata/ca.crt.
        let info = cert_info_pem(CA).unwrap();
        assert_eq!(info.subject, "kubernetes");
        assert_eq!(info.issuer, "kubernetes");
        assert_eq!(info.not_before.to_rfc3339(), NOT_BEFORE);
        assert_eq!(info.not_after.to_rfc3339(), NOT_AFTER);
    }

    #[test]
    fn text_around_the_block_and_a_second_certificate_are_ignored() {
        let bundle = format!("Certificate:\n    Data: ...\n{CA}\n{CA}");
        assert_eq!(ca_cert_hash(&bundle).unwrap(), CA_HASH.trim());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = cert_info(&bytes);
        }

        #[test]
        fn never_panics_on_text(body in "[A-Za-z0-9+/=\n]{0,200}") {
            let _ = ca_cert_hash(&format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----"));
        }
    }
}
